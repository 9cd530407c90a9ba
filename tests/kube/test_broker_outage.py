"""The Kafka broker goes away in the middle of a run and comes back on the same store.

``shoal serve`` (two shards, the coordinator, ingest and the binder in one process)
runs against the in-repo API server over the session's Apache Kafka, which is stopped
and started again on the same port and log, so it comes back with every record. While
the broker is down the service keeps running, backs off, and reports not ready; once it is back, the
pods that arrived meanwhile are bound, nothing is lost or decided twice, and the log
replays.
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid

import pytest

from events.kafka import KafkaLog, KafkaSettings, create_topic
from events.types import PodBound
from shards.replay import replay_routed
from shards.serve import ServeOptions, Service, serve
from tests.broker import KafkaBroker
from tests.kube.apiserver import FakeApiServer
from tests.kube.test_ingest import eventually, node, pod
from tests.kube.test_serve import get


def _bound(apiserver: FakeApiServer, names: list[str]) -> bool:
    return all(apiserver.get("Pod", n, "default")["spec"].get("nodeName") for n in names)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_broker_outage_is_ridden_out_without_loss_or_duplicates(
    apiserver: FakeApiServer, kafka: KafkaBroker, kafka_bootstrap: str
) -> None:
    broker = kafka
    try:
        topic = f"outage-{uuid.uuid4().hex[:8]}"
        query = f"topic={topic}&partitions=3&request_timeout_ms=2000&fetch_max_wait_ms=10"
        bus = f"kafka://{broker.bootstrap}?{query}"
        await create_topic(KafkaSettings.from_url(bus))
        for i in range(4):
            apiserver.put("Node", node(f"n{i}"))
        apiserver.put("Pod", pod("before-0"))
        apiserver.put("Pod", pod("before-1"))
        services: list[Service] = []
        options = ServeOptions(
            role="all",
            bus=bus,
            shards=2,
            host=apiserver.url,
            token="t",
            listen="127.0.0.1:0",
            identity="test-0",
            watch_seconds=1,
            lease_seconds=3,
            poll_interval=0.02,
            stale_after=1.5,
        )
        task = asyncio.create_task(serve(options, ready=services.append))
        try:
            await eventually(lambda: bool(services), timeout=30)
            service = services[0]
            await eventually(lambda: _bound(apiserver, ["before-0", "before-1"]), timeout=30)
            assert (await get(f"{service.url}/readyz"))[0] == 200

            assert broker.stop(grace=60), "the broker did not shut down cleanly"
            apiserver.put("Pod", pod("during-0"))
            apiserver.put("Pod", pod("during-1"))

            async def not_ready() -> bool:
                return (await get(f"{service.url}/readyz"))[0] == 503

            deadline = time.monotonic() + 60
            while not await not_ready():
                assert time.monotonic() < deadline, "never reported not ready"
                await asyncio.sleep(0.2)
            assert not _bound(apiserver, ["during-0"]) or not _bound(apiserver, ["during-1"])

            await asyncio.to_thread(broker.start)
            names = ["before-0", "before-1", "during-0", "during-1"]
            # generous: on a busy machine a restarted broker and the readers' back-off
            # can take a minute or more
            await eventually(lambda: _bound(apiserver, names), timeout=240)
            deadline = time.monotonic() + 120
            while (await get(f"{service.url}/readyz"))[0] != 200:
                assert time.monotonic() < deadline, "never ready again"
                await asyncio.sleep(0.2)
            _, text = await get(f"{service.url}/metrics")
            assert "shoal_bus_errors_total" in text
        finally:
            if services:
                services[0].stop.set()
            assert await asyncio.wait_for(task, 60) == 0

        reader = KafkaLog(KafkaSettings.from_url(bus))
        await reader.start()
        try:
            parts = [await reader.read(p, 0) for p in range(3)]
        finally:
            await reader.close()
    finally:
        if broker.proc is None:
            await asyncio.to_thread(broker.start)  # the session's broker: the next tests need it
        # aiokafka can leave a connection it opened to the broker as it died unclosed
        # (seen only on a loaded machine, never alone); collected here, it is this test's
        # to ignore (the mark below), not a later test's error
        gc.collect()
    bound = [
        e.event.pod
        for records in parts[:-1]
        for e in records
        if isinstance(e.event, PodBound) and e.producer.startswith("shard-")
    ]
    assert sorted(bound) == sorted(f"default/{n}" for n in names), bound
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, verified.mismatch
