"""Scenario text, runners and a record-by-record coordinator for the tests of several
shards (:mod:`tests.shards.test_coordinator`, :mod:`tests.shards.test_shard_protocol`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from engine.engine import Engine
from engine.model.pools import POOL_LABEL, Sharding
from events.filelog import FileLog
from events.memory import MemoryLog
from events.types import (
    SECOND,
    BindFailed,
    Envelope,
    Event,
    NodeAdded,
    PodBound,
    PodRouted,
    PodSubmitted,
    PodUnbound,
    ShardSummary,
)
from shards.cli import main
from shards.coordinator.coordinator import Coordinator, Output
from shards.inputs.scenario import Scenario, TimedEvent
from shards.replay import replay_routed
from shards.report import WAITING
from shards.simulate import simulate
from tests.builders import make_node, make_pod, relayed
from tests.shards.scenario_text import node

SHARDS = (2, 4)

E = TypeVar("E")


# ------------------------------------------------------------------------ scenario text


def pool_node(name: str, pool: str, *, cpu: int = 16, gpu: int = 0) -> str:
    return node(name, cpu=cpu, gpu=gpu, labels={POOL_LABEL: pool})


def podgroup(name: str, min_member: int, *, timeout: int | None = None, at: float = 0) -> str:
    limit = f", scheduleTimeoutSeconds: {timeout}" if timeout is not None else ""
    return f"""
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata: {{name: {name}, namespace: default, annotations: {{shoal.io/arrive-at: "{at:g}"}}}}
spec: {{minMember: {min_member}{limit}}}
---"""


def sharding(*lines: str) -> str:
    body = "\n".join(lines)
    return f"""
apiVersion: shoal.io/v1alpha1
kind: ShardingConfiguration
{body}
---"""


def pool_move(pool: str, shard: int, at: float) -> str:
    return f"""
apiVersion: shoal.io/v1alpha1
kind: PoolReassignment
metadata: {{name: move-{pool}, annotations: {{shoal.io/arrive-at: "{at:g}"}}}}
spec: {{pool: {pool}, shard: {shard}}}
---"""


# ------------------------------------------------------------------------------ running


Parts = list[list[Envelope]]


def read_log(path: Path) -> Parts:
    async def read() -> Parts:
        log = FileLog(str(path), readonly=True)
        try:
            return [await log.read(p, 0) for p in range(log.partitions)]
        finally:
            await log.close()

    return asyncio.run(read())


def shoal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, shards: int
) -> tuple[dict[str, Any], Parts]:
    """``shoal simulate --shards N --json --log``, then ``shoal replay --verify`` of its
    log (which must match, with nothing left unforwarded): the report and the log."""
    scenario = tmp_path / f"scenario-{shards}.yaml"
    scenario.write_text(text)
    log = tmp_path / f"run-{shards}.log"
    code = main(["simulate", str(scenario), "--shards", str(shards), "--json", "--log", str(log)])
    out = capsys.readouterr().out
    assert code == 0, out
    data: dict[str, Any] = json.loads(out)
    assert main(["replay", str(log), "--verify", "--json"]) == 0, capsys.readouterr().err
    verified = json.loads(capsys.readouterr().out)["verify"]
    assert verified["ok"] and verified["unforwarded"] == 0, verified
    assert_answered(data)
    return data, read_log(log)


def assert_answered(data: dict[str, Any]) -> None:
    """Every pod a run leaves pending that was tried or held has an answer with a next
    step (a pod never looked at still says "waiting to be scheduled")."""
    for key, view in data["pods"].items():
        if view["phase"] == "Pending" and view.get("reason") != WAITING:
            answer = view.get("answer")
            assert answer and answer["next_step"], (key, view)


def simulated(events: list[TimedEvent], sharding_: Sharding) -> tuple[dict[str, Any], Parts]:
    """A scenario of events, simulated with ``sharding_`` and verified by replay: the
    report and the log."""

    async def go() -> tuple[dict[str, Any], Parts]:
        log = MemoryLog(sharding_.shards + 1)
        result = await simulate(Scenario(events=events), log, sharding=sharding_)
        result.cluster.check_invariants()
        return result.report.to_json(), [await log.read(p, 0) for p in range(log.partitions)]

    data, parts = asyncio.run(go())
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, verified.mismatch
    assert verified.unforwarded == 0
    assert_answered(data)
    return data, parts


def at(seconds: float, events: Iterable[Event], order: int = 0) -> list[TimedEvent]:
    return [TimedEvent(round(seconds * SECOND), order + i, e) for i, e in enumerate(events)]


def records(parts: Parts, kind: type[E]) -> list[E]:
    """The events of ``kind`` in every shard partition, in partition then offset order."""
    return [env.event for part in parts[:-1] for env in part if isinstance(env.event, kind)]


def found(parts: Parts, kind: type[E], partition: int) -> list[tuple[Envelope, E]]:
    """(envelope, event) of each record of ``kind`` in ``partition`` (relayed copies in
    the control partition included)."""
    return [(env, env.event) for env in parts[partition] if isinstance(env.event, kind)]


def bound(data: dict[str, Any], keys: Iterable[str]) -> list[str]:
    return [k for k in keys if data["pods"][k]["phase"] == "Bound"]


def live_bindings(parts: Parts) -> dict[str, str]:
    """Each pod's binding that was neither refused nor taken back (there must be one at
    most per pod): pod → decision id."""
    undone = {e.decision_id for e in records(parts, BindFailed) + records(parts, PodUnbound)}
    live: dict[str, str] = {}
    for bind in records(parts, PodBound):
        if bind.decision_id not in undone:
            assert bind.pod not in live, (bind, live)
            live[bind.pod] = bind.decision_id
    return live


class Control:
    """Control records fed to a coordinator one after another, as the control worker
    folds them: inputs from ingest, and shard reports relayed (``stream="relay"``,
    caused by the same offset in the shard's partition); a pass after each batch."""

    def __init__(self, sharding_: Sharding) -> None:
        self.coordinator = Coordinator(sharding_)
        self.offset = 0
        self.time = 0

    def input(self, *events: Event, time: float | None = None) -> list[Output]:
        if time is not None:
            self.time = round(time * SECOND)
        for event in events:
            self.offset += 1
            env = Envelope(event=event, offset=self.offset, time=self.time, producer="ingest")
            self.coordinator.apply(env)
        return self.coordinator.schedule()

    def report(self, shard: int, *events: Event, time: float | None = None) -> list[Output]:
        if time is not None:
            self.time = round(time * SECOND)
        for event in events:
            self.offset += 1
            self.coordinator.apply(relayed(event, shard, self.offset, time=self.time))
        return self.coordinator.schedule()

    def placed(self, shard: int, placed: dict[str, str], nodes: int) -> list[Output]:
        """``shard`` says where it put pods it was handed."""
        summary = ShardSummary(shard=shard, seen=self.offset, placed=placed, nodes=nodes)
        return self.report(shard, summary)


def sent(out: Sequence[Output], kind: type[E]) -> list[tuple[int, E]]:
    return [(partition, event) for partition, event in out if isinstance(event, kind)]


def handed(out: Sequence[Output]) -> list[tuple[int, PodRouted]]:
    """The pods handed to a shard to place on a node of its choice."""
    return [(p, e) for p, e in sent(out, PodRouted) if not e.node]


def directed(out: Sequence[Output]) -> list[tuple[int, PodRouted]]:
    """The pods decided on the coordinator and handed to the node it chose."""
    return [(p, e) for p, e in sent(out, PodRouted) if e.node]


def only(out: Sequence[Output], kind: type[E]) -> tuple[int, E]:
    """The one record of ``kind`` a pass made (there must be exactly one)."""
    (one,) = sent(out, kind)
    return one


def pinned(shards: int, **pools: int) -> Sharding:
    return Sharding(shards=shards, pools=tuple(pools.items()))


def in_pool(name: str, pool: str, cpu: str) -> PodSubmitted:
    """Pod ``name`` asking for ``cpu``, held to ``pool`` by a node selector."""
    return make_pod(name).cpu(cpu).selector(**{POOL_LABEL: pool}).submitted()


def handed_to_shard(shards: int) -> tuple[Control, int]:
    """A coordinator that has handed ``default/p`` to the last shard (pool pa's)."""
    last = shards - 1
    control = Control(pinned(shards, pa=last, pb=0))
    control.input(
        make_node("a").cpu("6").label(POOL_LABEL, "pa").added(),
        make_node("b").cpu("6").label(POOL_LABEL, "pb").added(),
    )
    out = control.input(in_pool("p", "pa", "5"))
    assert [(p, e.pod.key) for p, e in sent(out, PodRouted)] == [(last, "default/p")]
    return control, last


class Shard:
    """A shard's engine fed as its worker feeds it: the coordinator's records are the
    router's; the answer is the pass's decisions, its summary left out."""

    def __init__(self, *nodes: NodeAdded) -> None:
        self.engine = Engine(shard=0)
        self.offset = 0
        for added in nodes:
            self(added)

    def __call__(self, *events: Event, time: float = 0, producer: str = "router") -> list[Event]:
        for event in events:
            self.offset += 1
            self.engine.apply(
                Envelope(
                    event=event,
                    time=round(time * SECOND),
                    producer=producer,
                    offset=self.offset,
                    causation=self.offset,
                )
            )
        return [e for e in self.engine.schedule() if not isinstance(e, ShardSummary)]
