"""Extenders in the service's shape: a worker that asks in the background (a pass never
waits for the network), and one recovered from the log sends again what was asked and
never answered."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from engine.config import parse_config
from engine.engine import Engine
from events.memory import MemoryLog
from events.types import Envelope, ExtenderAnswered, PodBound
from shards.worker import ShardWorker
from tests.builders import make_node, make_pod
from tests.shards.extender_server import Behaviour, ExtenderServer

DEADLINE = 60.0


@pytest.fixture
def extender() -> Iterator[ExtenderServer]:
    server = ExtenderServer(Behaviour(reject=lambda n: "" if n == "b" else "not b")).start()
    try:
        yield server
    finally:
        server.stop()


def configured(url: str, **extra: object) -> Engine:
    entry = {"urlPrefix": url, "filterVerb": "filter", **extra}
    return Engine(
        parse_config(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "extenders": [entry],
            }
        )
    )


async def inputs(log: MemoryLog) -> None:
    events = [make_node(n).cpu(8).memory("8Gi").added() for n in ("a", "b", "c")]
    events.append(make_pod("p").cpu(1).submitted())
    await log.append([Envelope(event=e, producer="ingest") for e in events])


async def bound(log: MemoryLog) -> dict[str, str]:
    return {
        e.event.pod: e.event.node for e in await log.read(0, 0) if isinstance(e.event, PodBound)
    }


async def until(condition: object, worker: ShardWorker) -> None:
    """Poll ``worker`` until ``condition()`` (an async callable) holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while not await condition():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not met in time"
        await worker.poll()
        await asyncio.sleep(0.01)


async def test_a_background_worker_places_once_the_answer_is_in_the_log(
    extender: ExtenderServer,
) -> None:
    log = MemoryLog()
    await inputs(log)
    worker = ShardWorker(configured(extender.url), log)
    worker.asker.background = True
    await worker.poll()  # the pass asks; the call runs on its own

    async def placed() -> bool:
        return await bound(log) == {"default/p": "b"}

    await until(placed, worker)
    assert worker.stats()["extender_calls"] == 1


async def test_a_recovered_worker_sends_again_what_was_never_answered(
    extender: ExtenderServer,
) -> None:
    log = MemoryLog()
    await inputs(log)
    first = ShardWorker(configured(extender.url), log)
    first.asker.background = True
    extender.behaviour.delay = 30  # the call hangs ...
    await first.poll()
    await first.asker.close()  # ... and the worker dies with it in flight
    assert not any(isinstance(e.event, ExtenderAnswered) for e in await log.read(0, 0))
    extender.behaviour.delay = 0
    second = await ShardWorker.recover(log, configured(extender.url).config)

    async def placed() -> bool:
        return await bound(log) == {"default/p": "b"}

    await until(placed, second)
    answers = [e.event for e in await log.read(0, 0) if isinstance(e.event, ExtenderAnswered)]
    assert [a.pods for a in answers] == [("default/p",)]


async def test_a_hanging_extender_delays_only_the_pods_of_the_profiles_it_serves(
    extender: ExtenderServer,
) -> None:
    extender.behaviour.delay = 30  # it answers nothing in time
    engine = Engine(
        parse_config(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "profiles": [{"schedulerName": "default-scheduler"}, {"schedulerName": "guarded"}],
                "extenders": [
                    {
                        "urlPrefix": extender.url,
                        "filterVerb": "filter",
                        "httpTimeout": "20s",
                        "profiles": ["guarded"],
                    }
                ],
            }
        )
    )
    log = MemoryLog()
    events = [make_node(n).cpu(8).memory("8Gi").added() for n in ("a", "b")]
    events.append(make_pod("slow").cpu(1).scheduler("guarded").submitted())
    await log.append([Envelope(event=e, producer="ingest") for e in events])
    worker = ShardWorker(engine, log)
    worker.asker.background = True
    await worker.poll()  # "slow" is asked about, in the background
    await log.append([Envelope(event=make_pod("free").cpu(1).submitted(), producer="ingest")])

    async def free_placed() -> bool:
        return "default/free" in await bound(log)

    await until(free_placed, worker)  # long before the extender's 20 s are up
    assert "default/slow" not in await bound(log)
    await worker.asker.close()
