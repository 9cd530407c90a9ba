"""The coordinator of several shards and the shards' side of its protocol.

Scenarios run through ``shoal simulate`` (or :func:`shards.simulate.simulate`) and are
replayed with ``--verify``; rules about the protocol itself are checked on a
:class:`Coordinator` fed record by record, or on a shard's :class:`Engine`.

The rules: pools are pinned to shards by configuration and by rules, tenants' pools are
theirs; dependencies, gangs and names used again work across shards; a unit is handed to
a shard only while that shard certainly has a node for it, anything else is decided on
the coordinator's view and carried out by the shards that own the nodes (reservation
parts, prepared and committed whole, or aborted everywhere; evictions first, then the
preemptor); what a shard hands back is decided by the coordinator; what fails backs off.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

import shards.simulate as simulate_module
from engine.engine import Engine
from engine.model.pools import POOL_LABEL, Sharding
from engine.model.reservations import COMMITTED, HELD, ReservationState
from events.errors import LogCorruptedError
from events.filelog import FileLog
from events.memory import MemoryLog
from events.types import (
    SECOND,
    BindFailed,
    ClockTicked,
    Envelope,
    Event,
    GroupSpec,
    NodeAdded,
    NodeRemoved,
    NodeUpdated,
    Placement,
    PodAdopted,
    PodBound,
    PodDeleted,
    PodGroupSubmitted,
    PodHandedBack,
    PodPreempted,
    PodRouted,
    PodSubmitted,
    PodSucceeded,
    PodUnbound,
    PodUnschedulable,
    PoolHandedOver,
    PoolReleased,
    PreemptionRequested,
    QuotaDefined,
    QuotaSpec,
    ReservationAborted,
    ReservationCommitted,
    ReservationDenied,
    ReservationGranted,
    ReservationReleased,
    ReservationRequested,
    ShardingConfigured,
    ShardSummary,
)
from shards.cli import main
from shards.cluster import SimulatedCluster
from shards.control import ControlWorker
from shards.coordinator.coordinator import RELAY, Coordinator, Output
from shards.coordinator.flights import ABORTING
from shards.inputs.scenario import Scenario, TimedEvent
from shards.replay import replay_routed
from shards.simulate import simulate
from tests.builders import make_node, make_pod, relayed

SHARDS = (2, 4)

E = TypeVar("E")


# ------------------------------------------------------------------------ scenario text


def node(name: str, *, cpu: int = 16, gpu: int = 0, labels: dict[str, str] | None = None) -> str:
    gpus = f', nvidia.com/gpu: "{gpu}"' if gpu else ""
    label_text = ", ".join(f"{k}: {v}" for k, v in (labels or {}).items())
    return f"""
apiVersion: v1
kind: Node
metadata: {{name: {name}, labels: {{{label_text}}}}}
status: {{allocatable: {{cpu: "{cpu}", memory: 64Gi{gpus}}}}}
---"""


def pool_node(name: str, pool: str, *, cpu: int = 16, gpu: int = 0) -> str:
    return node(name, cpu=cpu, gpu=gpu, labels={POOL_LABEL: pool})


def pod(
    name: str,
    *,
    ns: str = "default",
    cpu: str = "1",
    gpu: int = 0,
    at: float = 0,
    runtime: float | None = None,
    priority: int | None = None,
    group: str = "",
    pool: str = "",
    depends_on: str = "",
) -> str:
    gpus = f', nvidia.com/gpu: "{gpu}"' if gpu else ""
    annotations = [f'shoal.io/arrive-at: "{at:g}"']
    if runtime is not None:
        annotations.append(f'shoal.io/runtime: "{runtime:g}"')
    if depends_on:
        annotations.append(f'shoal.io/depends-on: "{depends_on}"')
    labels = f"scheduling.x-k8s.io/pod-group: {group}" if group else ""
    spec = []
    if priority is not None:
        spec.append(f"  priority: {priority}")
    if pool:
        spec.append(f"  nodeSelector: {{{POOL_LABEL}: {pool}}}")
    extra = "\n".join(spec)
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
  labels: {{{labels}}}
  annotations: {{{", ".join(annotations)}}}
spec:
{extra}
  containers:
  - name: c
    resources: {{requests: {{cpu: "{cpu}", memory: 1Gi{gpus}}}}}
---"""


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
    return data, read_log(log)


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


def only(out: Sequence[Output], kind: type[E]) -> tuple[int, E]:
    """The one record of ``kind`` a pass made (there must be exactly one)."""
    (one,) = sent(out, kind)
    return one


def pinned(shards: int, **pools: int) -> Sharding:
    return Sharding(shards=shards, pools=tuple(pools.items()))


def in_pool(name: str, pool: str, cpu: str) -> PodSubmitted:
    """Pod ``name`` asking for ``cpu``, held to ``pool`` by a node selector."""
    return make_pod(name).cpu(cpu).selector(**{POOL_LABEL: pool}).submitted()


# -------------------------------------------------------------------- pools and tenants


@pytest.mark.parametrize("shards", [3, 4])
def test_pools_are_pinned_by_configuration_and_by_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Pool ``big`` (pinned to shard 2) takes the nodes its rule matches, which are told
    to their shard with the pool as a label; pool ``small`` is pinned to shard 0. A pod
    held to a pool is placed by the pool's shard."""
    text = sharding(
        "pools:",
        "- {name: big, shard: 2, nodeSelector: {size: big}}",
        "- {name: small, shard: 0}",
    )
    text += node("b0", cpu=12, labels={"size": "big"}) + node("b1", cpu=12, labels={"size": "big"})
    text += pool_node("s0", "small", cpu=3)
    text += pod("wide", cpu="10", pool="big") + pod("narrow", cpu="2", pool="small")
    data, parts = shoal(tmp_path, capsys, text, shards)
    told = {
        added.node.name: (p, added.node.labels.get(POOL_LABEL))
        for p in range(shards)
        for _, added in found(parts, NodeAdded, p)
    }
    assert told == {"b0": (2, "big"), "b1": (2, "big"), "s0": (0, "small")}
    assert data["pods"]["default/wide"]["shard"] == 2
    assert data["pods"]["default/wide"]["node"] in {"b0", "b1"}
    assert data["pods"]["default/narrow"] == {**data["pods"]["default/narrow"], "node": "s0"}
    assert data["pods"]["default/narrow"]["shard"] == 0


@pytest.mark.parametrize("shards", SHARDS)
def test_a_tenants_pools_are_exclusive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """``research`` owns pool a100 (one node, 6 cards); pool v100 has 3 cards. research's
    second job does not fit a100 and waits rather than use v100; serving's fourth pod
    waits rather than use a100, idle as it is."""
    text = sharding("tenants:", "- {namespace: research, pools: [a100]}")
    text += pool_node("a100-0", "a100", gpu=6) + pool_node("v100-0", "v100", gpu=3)
    text += pod("train", ns="research", gpu=5) + pod("tune", ns="research", gpu=2, at=1)
    text += "".join(pod(f"infer-{i}", ns="serving", gpu=1, at=2) for i in range(4))
    data, _ = shoal(tmp_path, capsys, text, shards)
    pods = data["pods"]
    assert pods["research/train"]["node"] == "a100-0"
    assert pods["research/tune"]["phase"] == "Pending"
    assert "Insufficient nvidia.com/gpu" in pods["research/tune"]["reason"]
    placed = [pods[f"serving/infer-{i}"]["node"] for i in range(4)]
    assert placed[:3] == ["v100-0"] * 3
    assert placed[3] is None
    assert "affinity" in pods["serving/infer-3"]["reason"]


@pytest.mark.parametrize("shards", SHARDS)
def test_a_dependency_on_a_pod_of_another_shard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """``then`` (pool pb, the last shard) waits for ``first`` (pool pa, shard 0) to
    succeed; it is handed to its shard when first succeeds, 7 s in, and not before."""
    last = shards - 1
    text = sharding(f"pools: [{{name: pa, shard: 0}}, {{name: pb, shard: {last}}}]")
    text += pool_node("a", "pa", cpu=4) + pool_node("b", "pb", cpu=4)
    text += pod("first", cpu="3", pool="pa", runtime=7)
    text += pod("then", cpu="3", pool="pb", depends_on="first")
    data, parts = shoal(tmp_path, capsys, text, shards)
    assert data["pods"]["default/first"]["phase"] == "Succeeded"
    assert data["pods"]["default/then"] == {**data["pods"]["default/then"], "node": "b"}
    ((handed, routed),) = found(parts, PodRouted, last)
    assert routed.pod.name == "then" and handed.time == 7 * SECOND
    ((placed, _),) = found(parts, PodBound, last)
    assert placed.time == 7 * SECOND


# ------------------------------------------------------------------- handing units over


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


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(("nodes", "extra"), [(3, 2), (5, 1)])
def test_a_unit_is_handed_over_only_while_its_shard_certainly_has_a_node_for_it(
    shards: int, nodes: int, extra: int
) -> None:
    """Pods of 5 cpu held to pool pa (``nodes`` 6-cpu nodes, the last shard's): each
    handed pod may take any of those nodes, so only as many pods are handed as there
    are nodes; the rest wait, undecided, until every handed pod is answered, and are
    then decided on the coordinator's view (where, now, none fits)."""
    last = shards - 1
    control = Control(pinned(shards, pa=last, pb=0))
    control.input(
        *[make_node(f"a{i}").cpu("6").label(POOL_LABEL, "pa").added() for i in range(nodes)],
        make_node("b0").cpu("6").label(POOL_LABEL, "pb").added(),
    )
    out = control.input(*[in_pool(f"p{i}", "pa", "5") for i in range(nodes + extra)])
    assert [(p, e.pod.name) for p, e in sent(out, PodRouted)] == [
        (last, f"p{i}") for i in range(nodes)
    ]
    assert out == sent(out, PodRouted), "the others are neither handed nor decided"
    assert control.placed(last, {"default/p0": "a0"}, nodes) == [], "one still unanswered"
    placed = {f"default/p{i}": f"a{i}" for i in range(1, nodes)}
    out = control.placed(last, placed, nodes)
    assert not sent(out, PodRouted) and not sent(out, ReservationRequested)
    waiting = sent(out, PodUnschedulable)
    assert [(p, e.pod) for p, e in waiting] == [
        (shards, f"default/p{i}") for i in range(nodes, nodes + extra)
    ]
    for _, why in waiting:
        assert why.shard == -1 and why.reason.startswith(f"0/{nodes + 1} nodes are available")
        assert f"{nodes} Insufficient cpu" in why.reason


@pytest.mark.parametrize("shards", SHARDS)
def test_a_pod_a_shard_hands_back_is_decided_by_the_coordinator_next(shards: int) -> None:
    """The shard could not place what it was handed: the coordinator does not hand it
    over again, it decides it on its view and asks the node's owner for that node."""
    control, last = handed_to_shard(shards)
    control.input(make_node("a2").cpu("6").label(POOL_LABEL, "pa").added())
    refusal = PodHandedBack(pod="default/p", reason="no node fits", shard=last, resolvable=True)
    out = control.report(last, refusal)
    assert not sent(out, PodRouted)
    partition, request = only(out, ReservationRequested)
    assert partition == last and request.at_once
    assert [spec.key for spec in request.pods] == ["default/p"]
    chosen = request.placements["default/p"]
    assert chosen in {"a", "a2"}
    coordinator = control.coordinator
    assert coordinator.counters["handbacks"] == 1 and coordinator.counters["decided"] == 1
    grant = ReservationGranted(
        rid=request.rid, group=request.group.key, placements=request.placements, shard=last
    )
    assert control.report(last, grant) == []
    view = coordinator.engine.state
    assert view.names[view.pods["default/p"].slot] == chosen
    # the view holds p there: of two more such pods, one is handed (for the other node)
    out = control.input(in_pool("q0", "pa", "5"), in_pool("q1", "pa", "5"))
    assert [(p, e.pod.key) for p, e in sent(out, PodRouted)] == [(last, "default/q0")]


@pytest.mark.parametrize("shards", SHARDS)
def test_a_node_selector_sends_a_pod_only_to_a_shard_with_a_matching_node(shards: int) -> None:
    """One a100 node, on shard 1; v100 nodes on every shard. A pod that wants an a100
    goes to shard 1; one that wants an h100 is handed to nobody and waits, decided on
    the view; relabelling a node (on the last shard) makes it that shard's."""
    control = Control(pinned(shards, **{f"p{i}": i for i in range(shards)}))
    nodes = [
        make_node(f"v{i}").cpu("8").label(POOL_LABEL, f"p{i}").label("gpu", "v100").added()
        for i in range(shards)
    ]
    a100 = make_node("x").cpu("4").label(POOL_LABEL, "p1").label("gpu", "a100").added()
    control.input(*nodes, a100)

    def wants(name: str, model: str, time: float) -> list[Output]:
        spec = msgspec.structs.replace(make_pod(name).cpu("1").spec(), node_selector={"gpu": model})
        return control.input(PodSubmitted(pod=spec), time=time)

    out = wants("a100-job", "a100", 0)
    assert [(p, e.pod.name) for p, e in sent(out, PodRouted)] == [(1, "a100-job")]
    control.placed(1, {"default/a100-job": "x"}, 2)
    out = wants("h100-job", "h100", 1)
    assert not sent(out, PodRouted)
    (_, why) = only(out, PodUnschedulable)
    assert why.reason == (
        f"0/{shards + 1} nodes are available: "
        f"{shards + 1} node(s) didn't match Pod's node affinity/selector."
    )
    relabelled = make_node(f"v{shards - 1}").cpu("8").label(POOL_LABEL, f"p{shards - 1}")
    out = control.input(NodeUpdated(node=relabelled.label("gpu", "h100").spec()), time=5)
    assert [(p, e.pod.name) for p, e in sent(out, PodRouted)] == [(shards - 1, "h100-job")]
    control.placed(shards - 1, {"default/h100-job": f"v{shards - 1}"}, 1)
    control.input(NodeRemoved(name=f"v{shards - 1}"), time=6)
    out = wants("h100-again", "h100", 6)
    assert not sent(out, PodRouted) and only(out, PodUnschedulable)[1].pod == "default/h100-again"


@pytest.mark.parametrize("shards", SHARDS)
def test_a_pod_seen_bound_is_adopted_by_the_shard_that_owns_its_node(shards: int) -> None:
    """Ingest reports a pod it finds bound (by us or another scheduler) as ``PodBound``:
    the shard it was handed to forgets it, the node's owner adopts it as it is (without
    deciding anything), and the view places it there."""
    control, last = handed_to_shard(shards)
    spec = make_pod("p").cpu("5").selector(**{POOL_LABEL: "pa"}).spec()
    seen = PodBound(pod="default/p", node="b", decision_id="observed:u7", attempt=0)
    out = control.input(seen)
    placement = PodAdopted(placement=Placement(pod=spec, node="b", decision_id="observed:u7"))
    assert out == [(last, PodDeleted(pod="default/p")), (0, placement)]
    coordinator = control.coordinator
    assert "default/p" not in coordinator.flights
    assert coordinator.engine.bindings == {"default/p": "observed:u7"}
    assert control.input(seen) == [], "seen again: nothing moves"
    unknown = PodBound(pod="x/y", node="b", decision_id="observed:u8", attempt=0)
    nowhere = PodBound(pod="default/p", node="gone", decision_id="observed:u9", attempt=0)
    assert control.input(unknown, nowhere) == []
    owner = Shard(make_node("b").cpu("6").label(POOL_LABEL, "pb").added())
    assert owner(placement) == []
    assert owner.engine.bindings == {"default/p": "observed:u7"}
    state = owner.engine.state
    assert state.names[state.pods["default/p"].slot] == "b"


# ------------------------------------------------------------------ gangs across shards


@pytest.mark.parametrize("shards", SHARDS)
def test_a_gang_too_big_for_any_shard_is_prepared_on_each_and_committed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Two 3-card nodes a shard; a gang of one-card members, one more than all shards
    but one hold: decided on the coordinator's view, a part is prepared on every
    shard (on the nodes chosen), each granted, then all committed under one id."""
    members = 6 * (shards - 1) + 1
    text = "".join(pool_node(f"g{i}", f"p{i % shards}", gpu=3) for i in range(2 * shards))
    text += podgroup("wide", members)
    text += "".join(pod(f"w{i}", gpu=1, group="wide") for i in range(members))
    data, parts = shoal(tmp_path, capsys, text, shards)
    keys = [f"default/w{i}" for i in range(members)]
    assert bound(data, keys) == keys
    assert data["groups"]["default/wide"]["phase"] == "Scheduled"
    assert len({data["pods"][k]["shard"] for k in keys}) == shards
    requests = records(parts, ReservationRequested)
    (rid,) = {r.rid for r in requests}
    assert len(requests) == shards and not any(r.at_once for r in requests)
    assert sorted(k for r in requests for k in r.placements) == sorted(keys)
    grants = found(parts, ReservationGranted, shards)  # as relayed to the coordinator
    assert sorted(grant.shard for _, grant in grants) == list(range(shards))
    for p in range(shards):
        ((env, commit),) = found(parts, ReservationCommitted, p)
        assert commit == ReservationCommitted(rid=rid)
        assert env.causation >= max(relay.offset for relay, _ in grants)  # after every grant
    assert not records(parts, ReservationAborted) and not records(parts, PodRouted)
    decisions = {b.pod: b.decision_id for b in records(parts, PodBound)}
    assert decisions == {k: f"{k}@{rid}" for k in keys}


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("timeout", [None, 40])
def test_a_gang_that_fits_nowhere_waits_at_the_coordinator_with_a_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, timeout: int | None
) -> None:
    """Three more members than the cluster has cards: no shard is asked anything; the
    gang waits in the coordinator's queue saying why, counting every node, and fails
    when its time-out (if any) is over."""
    nodes = shards + 1
    members = 4 * nodes + 3
    text = "".join(pool_node(f"g{i}", f"p{i}", gpu=4) for i in range(nodes))
    text += podgroup("wide", members, timeout=timeout)
    text += "".join(pod(f"w{i}", gpu=1, group="wide") for i in range(members))
    data, parts = shoal(tmp_path, capsys, text, shards)
    assert not records(parts, ReservationRequested) and not records(parts, PodRouted)
    group = data["groups"]["default/wide"]
    said = f"{4 * nodes} of the {members} members still needed fit; 0/{nodes} nodes are available"
    assert said in group["reason"]
    if timeout is None:
        assert group["phase"] == "Pending"
        assert data["pods"]["default/w0"]["reason"] == group["reason"]
    else:
        assert group["phase"] == "Failed"
        assert (
            f"timed out: fewer than {members} members placed within {timeout}s"
            in (data["pods"]["default/w0"]["reason"])
        )
        assert data["summary"]["simulated_seconds"] == timeout


def gang_over_every_shard(shards: int, timeout: float = 30) -> tuple[Control, str]:
    """A gang of two cards per shard but one, on one 2-card node per shard: decided on
    the view, a part is prepared on every shard; the claim's id."""
    control = Control(
        Sharding(
            shards=shards,
            pools=tuple((f"p{i}", i) for i in range(shards)),
            reservation_timeout=round(timeout * SECOND),
        )
    )
    control.input(
        *[
            make_node(f"g{i}").cpu("8").gpu(2).label(POOL_LABEL, f"p{i}").added()
            for i in range(shards)
        ]
    )
    members = 2 * shards - 1
    spec = GroupSpec(namespace="ml", name="g", min_member=members)
    pods = [make_pod(f"m{i}", "ml").gpu(1).member("ml/g").submitted() for i in range(members)]
    out = control.input(PodGroupSubmitted(group=spec), *pods)
    requests = sent(out, ReservationRequested)
    assert sorted(p for p, _ in requests) == list(range(shards))
    (rid,) = {r.rid for _, r in requests}
    assert not any(r.at_once for _, r in requests)
    return control, rid


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("cause", ["denied", "timed-out"])
def test_an_abort_reaches_every_open_part(shards: int, cause: str) -> None:
    """One part denied (or the time-out over before every part answered, though some
    granted): every other part is aborted, each once; the claim is forgotten when all
    are closed, and the gang is decided again only after its back-off."""
    control, rid = gang_over_every_shard(shards, timeout=7)
    coordinator = control.coordinator
    out = control.report(0, ReservationGranted(rid=rid, group=rid, placements={}, shard=0), time=1)
    assert out == []
    if cause == "denied":
        denial = ReservationDenied(rid=rid, group=rid, reason="no room", shard=shards - 1)
        out = control.report(shards - 1, denial, time=1)
        told = list(range(shards - 1))
        reason = f"shard {shards - 1}: no room"
    else:
        assert control.input(ClockTicked(), time=6.9) == []
        out = control.input(ClockTicked(), time=7)
        told = list(range(shards))
        reason = "not every part answered within the reservation time-out"
    aborts = sent(out, ReservationAborted)
    assert aborts == [(p, ReservationAborted(rid=rid, reason=reason)) for p in told]
    assert coordinator.claims[rid].stage == ABORTING
    assert not sent(out, ReservationRequested)
    for p in told:
        released = ReservationReleased(rid=rid, group=rid, reason=f"aborted: {reason}", shard=p)
        assert not sent(control.report(p, released), ReservationRequested)
    assert rid not in coordinator.claims
    retry = coordinator.next_wakeup()
    assert retry is not None and retry > control.time
    assert control.input(ClockTicked(), time=(retry - 1) / SECOND) == []
    out = control.input(ClockTicked(), time=retry / SECOND)
    again = sent(out, ReservationRequested)
    assert sorted(p for p, _ in again) == list(range(shards))
    assert {r.rid for _, r in again} != {rid}


@pytest.mark.parametrize("shards", SHARDS)
def test_a_denied_claim_backs_its_unit_off(shards: int) -> None:
    """The shard that owns the only nodes keeps denying what the coordinator decides
    there (its view of them differs): the pod is decided again only after a back-off
    that doubles (1 s, 2 s, 4 s, 8 s) up to the profile's 10 s, never handed over, and
    never asked for in between: no retry storm."""
    control, last = handed_to_shard(shards)
    refusal = PodHandedBack(pod="default/p", reason="no node fits", shard=last, resolvable=True)
    out = control.report(last, refusal)
    asked: list[float] = []
    now = 0.0
    while now <= 40:
        assert not sent(out, PodRouted)
        requests = sent(out, ReservationRequested)
        if requests:
            ((partition, request),) = requests
            assert partition == last
            asked.append(now)
            assert len(asked) <= 7, f"asked again and again: {asked}"
            denial = ReservationDenied(
                rid=request.rid, group=request.group.key, reason="full", shard=last
            )
            out = control.report(last, denial, time=now)
            continue
        now += 0.5
        out = control.input(ClockTicked(), time=now)
    assert asked == [0, 1, 3, 7, 15, 25, 35]
    coordinator = control.coordinator
    assert coordinator.counters["handed"] == 1 and coordinator.counters["aborted"] == len(asked)
    assert coordinator.claims == {} and coordinator.next_wakeup() == 45 * SECOND


@pytest.mark.parametrize("shards", SHARDS)
def test_a_handed_gang_whose_part_is_denied_leaves_its_quota_as_it_was(shards: int) -> None:
    """ElasticQuota ``ml`` guarantees and allows 3 cards. A 2-member gang is handed
    whole to the owner of pool pa (two nodes), which denies it; after its back-off it is
    handed again and granted. Three one-card pods of ``ml`` follow: only one may run."""
    last = shards - 1
    control = Control(pinned(shards, pa=last, pb=0))
    control.input(
        *[make_node(f"a{i}").cpu("16").gpu(4).label(POOL_LABEL, "pa").added() for i in range(2)],
        make_node("b").cpu("16").gpu(4).label(POOL_LABEL, "pb").added(),
    )
    gpu = "nvidia.com/gpu"
    limit = {gpu: 3}
    control.input(QuotaDefined(quota=QuotaSpec(namespace="ml", name="q", min=limit, max=limit)))
    members = [
        make_pod(f"m{i}", "ml").gpu(1).member("ml/g").selector(**{POOL_LABEL: "pa"}).submitted()
        for i in range(2)
    ]
    gang = GroupSpec(namespace="ml", name="g", min_member=2)
    out = control.input(PodGroupSubmitted(group=gang), *members)
    partition, request = only(out, ReservationRequested)
    assert partition == last and request.at_once and not request.placements  # handed whole
    quota = control.coordinator.engine.quotas.get("ml")
    assert quota is not None
    denial = ReservationDenied(rid=request.rid, group=request.group.key, reason="busy", shard=last)
    control.report(last, denial, time=1)
    assert quota.used.get(gpu, 0) == 0, quota.used
    retry = control.coordinator.next_wakeup()
    assert retry is not None
    _, request = only(control.input(ClockTicked(), time=retry / SECOND), ReservationRequested)
    grant = ReservationGranted(
        rid=request.rid,
        group=request.group.key,
        placements={"ml/m0": "a0", "ml/m1": "a1"},
        shard=last,
    )
    control.report(last, grant)
    assert quota.used.get(gpu, 0) == 2, quota.used
    out = control.input(*[make_pod(f"x{i}", "ml").gpu(1).submitted() for i in range(3)])
    assert [e.pod.key for _, e in sent(out, PodRouted)] == ["ml/x0"]


# ------------------------------------------------------- a shard's side of reservations


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


def part(
    rid: str,
    count: int,
    *,
    expires: float = 10,
    placements: dict[str, str] | None = None,
    at_once: bool = False,
) -> ReservationRequested:
    """Part ``rid`` of a gang in ``ml``: ``count`` one-card pods (``ml/m0``...)."""
    group = GroupSpec(namespace="ml", name=rid.split("/", 1)[1], min_member=count, uid=rid)
    pods = tuple(
        make_pod(f"m{i}", "ml").cpu("1").gpu(1).member(group.key).spec() for i in range(count)
    )
    return ReservationRequested(
        rid=rid,
        group=group,
        pods=pods,
        expires_at=round(expires * SECOND),
        placements=placements or {},
        at_once=at_once,
    )


def state_of(engine: Engine, rid: str) -> ReservationState:
    return engine.reservations[rid].state


def two_nodes() -> Shard:
    return Shard(make_node("n0").cpu("8").gpu(2).added(), make_node("n1").cpu("8").gpu(3).added())


def test_a_part_is_granted_and_held_on_the_chosen_nodes_until_committed() -> None:
    shard = two_nodes()
    chosen = {"ml/m0": "n1", "ml/m1": "n0", "ml/m2": "n1"}
    (grant,) = shard(part("ml/g#5", 3, placements=chosen))
    assert grant == ReservationGranted(
        rid="ml/g#5", group="ml/g#5", placements=chosen, shard=0
    )  # nothing bound yet
    engine = shard.engine
    assert state_of(engine, "ml/g#5") == HELD
    held = {key: engine.state.names[p.slot] for key, p in engine.state.pods.items()}
    assert held == chosen
    out = shard(ReservationCommitted(rid="ml/g#5"))
    assert out == [
        PodBound(pod=key, node=node_name, decision_id=f"{key}@ml/g#5", attempt=1)
        for key, node_name in chosen.items()
    ]
    assert state_of(engine, "ml/g#5") == COMMITTED
    assert shard(ReservationCommitted(rid="ml/g#5")) == []  # told twice: bound once


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (part("ml/g#2", 6), "5 of the 6 members still needed fit"),
        (
            part("ml/g#2", 3, placements={"ml/m0": "n0", "ml/m1": "n0", "ml/m2": "n0"}),
            "ml/m2 no longer fits node n0",
        ),
        (
            part("ml/g#2", 2, placements={"ml/m0": "n1", "ml/m1": "elsewhere"}),
            "node elsewhere is not on this shard",
        ),
    ],
    ids=["too-big", "chosen-node-full", "node-not-here"],
)
def test_a_part_that_does_not_fit_is_denied_and_holds_nothing(
    request_: ReservationRequested, reason: str
) -> None:
    shard = two_nodes()
    (denial,) = shard(request_)
    assert isinstance(denial, ReservationDenied) and denial.rid == "ml/g#2"
    assert reason in denial.reason
    engine = shard.engine
    assert not engine.pods and not engine.state.pods and not engine.groups
    assert not engine.reservations and len(engine.queue) == 0


def test_a_held_part_expires_by_itself() -> None:
    shard = two_nodes()
    (grant,) = shard(part("ml/g#3", 4, expires=6))
    assert isinstance(grant, ReservationGranted)
    assert shard.engine.next_wakeup() == 6 * SECOND
    assert shard(ClockTicked(), time=5.9) == []
    (released,) = shard(ClockTicked(), time=6)
    assert released == ReservationReleased(
        rid="ml/g#3",
        group="ml/g#3",
        reason="expired: no commit before the reservation's time-out",
    )
    assert not shard.engine.state.pods and not shard.engine.pods
    assert shard(ReservationCommitted(rid="ml/g#3"), time=7) == []  # too late: nothing bound


def test_an_abort_after_the_commit_unbinds_the_part() -> None:
    shard = two_nodes()
    out = shard(part("ml/g#4", 2, placements={"ml/m0": "n0", "ml/m1": "n1"}, at_once=True))
    assert [type(e) for e in out] == [ReservationGranted, PodBound, PodBound]  # at once
    out = shard(ReservationAborted(rid="ml/g#4", reason="shard 3: no room"))
    assert out == [
        PodUnbound(
            pod=key,
            node=node_name,
            decision_id=f"{key}@ml/g#4",
            reason="reservation ml/g#4 aborted: shard 3: no room",
        )
        for key, node_name in (("ml/m0", "n0"), ("ml/m1", "n1"))
    ] + [ReservationReleased(rid="ml/g#4", group="ml/g#4", reason="aborted: shard 3: no room")]
    assert not shard.engine.state.pods and not shard.engine.reservations


def test_an_abort_that_comes_before_the_part_is_taken_on_refuses_it() -> None:
    """The request and its abort are folded before the shard's next pass: the part is
    refused (the coordinator waits for every part's answer), and nothing is held."""
    shard = two_nodes()
    shard.engine.apply(Envelope(event=part("ml/g#6", 2), producer="router", causation=1))
    out = shard(ReservationAborted(rid="ml/g#6", reason="not every part answered"))
    assert out == [
        ReservationDenied(rid="ml/g#6", group="ml/g#6", reason="aborted: not every part answered")
    ]
    assert not shard.engine.pods and not shard.engine.state.pods


# ------------------------------------------------------------------------- failed binds


def test_a_failed_bind_of_a_member_is_handed_back_and_the_part_keeps_the_rest() -> None:
    """The coordinator folds the failed bind as one scheduler does (it knows the gang's
    minMember, the shard does not): the shard unbinds nothing else."""
    shard = two_nodes()
    chosen = {"ml/m0": "n1", "ml/m1": "n1", "ml/m2": "n0"}
    out = shard(part("ml/g#7", 3, placements=chosen, at_once=True))
    failed = next(e for e in out if isinstance(e, PodBound) and e.pod == "ml/m1")
    refusal = BindFailed(pod="ml/m1", node="n1", decision_id=failed.decision_id, reason="409")
    out = shard(refusal, producer="binder")
    assert out == [
        PodHandedBack(
            pod="ml/m1",
            reason="ml/m1 failed to bind to n1: 409",
            shard=0,
            decision_id=failed.decision_id,  # the coordinator knows which part it left
        )
    ]
    engine = shard.engine
    assert sorted(engine.state.pods) == ["ml/m0", "ml/m2"]
    assert engine.reservations["ml/g#7"].state == COMMITTED
    assert engine.reservations["ml/g#7"].pods == ("ml/m0", "ml/m2")
    assert "ml/m1" not in engine.pods


def test_a_local_gang_is_rolled_back_whole_after_a_failed_bind() -> None:
    """One shard, a gang of exactly minMember: a failed bind leaves it short, so the
    others are unbound and the gang is placed again whole, under new decisions."""
    shard = Shard(make_node("n").cpu("6").added())
    spec = GroupSpec(namespace="ml", name="g", min_member=4)
    members = [make_pod(f"m{i}", "ml").cpu("1").member("ml/g").submitted() for i in range(4)]
    out = shard(PodGroupSubmitted(group=spec), *members, producer="ingest")
    first = [e for e in out if isinstance(e, PodBound)]
    assert len(first) == 4
    refusal = BindFailed(
        pod=first[2].pod, node="n", decision_id=first[2].decision_id, reason="conflict"
    )
    out = shard(refusal, producer="binder")
    unbound_ = {e.pod for e in out if isinstance(e, PodUnbound)}
    assert unbound_ == {b.pod for b in first} - {first[2].pod}
    again = [e for e in out if isinstance(e, PodBound)]
    assert sorted(e.pod for e in again) == sorted(b.pod for b in first)
    assert not {e.decision_id for e in again} & {b.decision_id for b in first}


class RefusingCluster(SimulatedCluster):
    """Refuses the first bind of each pod named, as an API server does when someone
    else has taken the room meanwhile."""

    def __init__(self, refuse: Iterable[str]) -> None:
        super().__init__()
        self.refuse = set(refuse)

    def bind(self, decision: PodBound, now: int) -> list[Event]:
        if decision.pod in self.refuse:
            self.refuse.discard(decision.pod)
            return [self._fail(decision, "conflict (test)")]
        return super().bind(decision, now)


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("below", [True, False], ids=["below-min-member", "min-member-kept"])
def test_a_failed_bind_rolls_a_gang_back_whole_only_below_min_member(
    monkeypatch: pytest.MonkeyPatch, shards: int, below: bool
) -> None:
    """A gang over every shard (3 cards a shard, one card a member, one card left over);
    the first bind of ``ml/w0`` is refused. Its shard hands it back and keeps the rest of
    its part; the coordinator folds the failed bind as one scheduler would: below
    minMember, every part is aborted and the gang placed again whole; else ``w0`` alone
    is placed again and the others keep their bindings."""
    monkeypatch.setattr(simulate_module, "SimulatedCluster", lambda: RefusingCluster({"ml/w0"}))
    members = 3 * shards - 1
    min_member = members if below else members - 1
    nodes = [
        make_node(f"n{i}").cpu("16").gpu(3).label(POOL_LABEL, f"p{i}").added()
        for i in range(shards)
    ]
    gang = GroupSpec(namespace="ml", name="g", min_member=min_member)
    pods = [
        make_pod(f"w{i}", "ml").cpu("1").gpu(1).member("ml/g").submitted() for i in range(members)
    ]
    data, parts = simulated(
        at(0, [*nodes, PodGroupSubmitted(group=gang), *pods]), Sharding(shards=shards)
    )
    keys = [f"ml/w{i}" for i in range(members)]
    assert bound(data, keys) == keys
    (handback,) = records(parts, PodHandedBack)
    assert handback.pod == "ml/w0" and "conflict (test)" in handback.reason
    first = records(parts, ReservationRequested)[0].rid
    aborted = records(parts, ReservationAborted)
    final = live_bindings(parts)
    if below:
        assert {a.rid for a in aborted} == {first}
        assert len(aborted) == shards  # every part, each once
        rids = {r.rid for r in records(parts, ReservationRequested)}
        (second,) = rids - {first}
        assert final == {k: f"{k}@{second}" for k in keys}
    else:
        assert aborted == [] and records(parts, PodUnbound) == []
        assert {r.rid for r in records(parts, ReservationRequested)} == {first}
        assert final == {k: f"{k}@{first}" for k in keys[1:]} | {"ml/w0": final["ml/w0"]}
        assert final["ml/w0"] != f"ml/w0@{first}"
        assert data["groups"]["ml/g"]["phase"] == "Scheduled"


def test_a_part_whose_only_pod_failed_to_bind_is_forgotten_once_the_pod_ran() -> None:
    """The coordinator places ``p`` itself (its shard handed it back once) under a
    one-pod claim; the bind fails, ``p`` is placed again (handed over, this time) and
    runs to the end: nothing of the first claim may be left on either side."""
    control, last = handed_to_shard(2)
    out = control.report(last, PodHandedBack(pod="default/p", reason="no node", shard=last))
    _, request = only(out, ReservationRequested)
    shard = Shard(make_node("a").cpu("6").label(POOL_LABEL, "pa").added())
    answer = shard(request)
    assert [type(e) for e in answer] == [ReservationGranted, PodBound]
    grant, first = answer
    assert isinstance(grant, ReservationGranted) and isinstance(first, PodBound)
    control.report(last, grant)
    failed = BindFailed(pod="default/p", node="a", decision_id=first.decision_id, reason="409")
    (handback,) = shard(failed, producer="binder")
    out = control.report(last, handback, time=0)
    out += control.input(ClockTicked(), time=1)
    _, routed = only(out, PodRouted)
    (again,) = shard(routed, time=1)
    assert isinstance(again, PodBound) and again.decision_id == routed.decision_id
    control.placed(last, {"default/p": "a"}, 1)
    done = PodSucceeded(pod="default/p", node="a")
    out = control.input(done, time=9)
    assert out == [(last, done)]
    shard(done, time=9)
    assert shard.engine.reservations == {} and shard.engine.groups == {}
    assert control.coordinator.claims == {}


# --------------------------------------------------------------------------- preemption


@pytest.mark.parametrize("shards", SHARDS)
def test_a_preemption_evicts_first_and_nothing_is_handed_over_meanwhile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Low-priority pods take 6 of each node's 8 cpu; ``urgent`` (8 cpu) arrives with as
    many 1-cpu pods as the other nodes have room for. The coordinator asks the victim's
    shard to evict it, and hands nothing to any shard until the eviction is reported;
    then ``urgent`` is placed first, and the small pods beside the low ones."""
    smalls = [f"default/small-{i}" for i in range(2 * (shards - 1))]
    text = "".join(pool_node(f"n{i}", f"p{i}", cpu=8) for i in range(shards))
    text += "".join(pod(f"low-{i}", cpu="6", priority=1, at=i) for i in range(shards))
    text += pod("urgent", cpu="8", priority=100, at=20)
    text += "".join(pod(key.split("/")[1], cpu="1", at=20) for key in smalls)
    data, parts = shoal(tmp_path, capsys, text, shards)
    assert data["pods"]["default/urgent"]["phase"] == "Bound"
    (victim,) = [p["pod"] for p in data["preemptions"]]
    assert victim.startswith("default/low-")
    assert bound(data, smalls) == smalls
    asked = [(env, e) for p in range(shards) for env, e in found(parts, PreemptionRequested, p)]
    ((request_env, request),) = asked
    assert request.victims == {victim: "default/urgent"}
    gone = [env for env, e in found(parts, PodPreempted, shards) if e.pod == victim]
    assert len(gone) == 1 and gone[0].stream == RELAY
    placements = [
        (env.causation, keys)
        for p in range(shards)
        for env, e in found(parts, PodRouted, p) + found(parts, ReservationRequested, p)
        for keys in [[e.pod.key] if isinstance(e, PodRouted) else [s.key for s in e.pods]]
        if env.time == 20 * SECOND
    ]
    assert sorted(k for _, keys in placements for k in keys) == sorted([*smalls, "default/urgent"])
    assert request_env.causation < gone[0].offset
    assert all(cause >= gone[0].offset for cause, _ in placements), (request_env, placements)
    urgent = next(cause for cause, keys in placements if keys == ["default/urgent"])
    assert all(urgent <= cause for cause, _ in placements)


def test_the_preemptor_waits_for_every_victim_and_the_queue_waits_with_it() -> None:
    """Victims on two shards: the preemptor is placed only when both are reported gone;
    until then, passes hand nothing over, not even a pod with room of its own."""
    control = Control(pinned(3, pa=0, pb=1, pc=2))
    control.input(
        make_node("a").cpu("5").label(POOL_LABEL, "pa").added(),
        make_node("b").cpu("5").label(POOL_LABEL, "pb").added(),
        make_node("c").cpu("3").label(POOL_LABEL, "pc").added(),
    )
    spec = GroupSpec(namespace="default", name="pair", min_member=2, priority=50)
    pair = [
        make_pod(f"pair-{i}").cpu("5").priority(50).member("default/pair").submitted()
        for i in range(2)
    ]
    lows = [in_pool(f"low-{s}", f"p{s}", "4") for s in "ab"]
    control.input(*lows)
    control.placed(0, {"default/low-a": "a"}, 1)
    control.placed(1, {"default/low-b": "b"}, 1)
    out = control.input(
        PodGroupSubmitted(group=spec), *pair, make_pod("spare").cpu("2").submitted(), time=1
    )
    evictions = sorted((p, e.victims) for p, e in sent(out, PreemptionRequested))
    assert [(p, list(victims)) for p, victims in evictions] == [
        (0, ["default/low-a"]),
        (1, ["default/low-b"]),
    ]
    assert {by for _, victims in evictions for by in victims.values()} <= {
        "default/pair-0",
        "default/pair-1",
    }
    assert not sent(out, PodRouted) and not sent(out, ReservationRequested)
    assert control.input(ClockTicked(), time=2) == []
    gone_a = PodPreempted(pod="default/low-a", node="a", by="default/pair", shard=0)
    assert control.report(0, gone_a, time=2) == []
    gone_b = PodPreempted(pod="default/low-b", node="b", by="default/pair", shard=1)
    out = control.report(1, gone_b, time=2)
    handed = [(p, e.pod.key) for p, e in sent(out, PodRouted)]
    requested = {p: sorted(s.key for s in e.pods) for p, e in sent(out, ReservationRequested)}
    assert sorted(requested) == [0, 1]
    assert sorted(k for keys in requested.values() for k in keys) == [
        "default/pair-0",
        "default/pair-1",
    ]
    assert all(len(keys) == 1 for keys in requested.values())
    assert handed == [(2, "default/spare")]


# -------------------------------------------------------------------- relays and replay


@pytest.mark.parametrize("shards", SHARDS)
def test_relays_this_coordinator_did_not_make_or_has_seen_are_ignored(shards: int) -> None:
    """Only copies the control worker made (``relay-<shard>`` of an existing shard, each
    shard's causations rising) are shard reports; anything else changes nothing."""
    control, last = handed_to_shard(shards)
    coordinator = control.coordinator
    placed = ShardSummary(shard=last, seen=2, placed={"default/p": "a"}, nodes=1)
    for producer in ("relay-x", f"relay-{shards}", "relay-", "relay--1", "ingest", "shard-0"):
        env = Envelope(event=placed, stream=RELAY, producer=producer, causation=40, offset=40)
        coordinator.apply(env)
        assert coordinator.schedule() == []
    assert "default/p" in coordinator.flights, "a forged summary answered nothing"
    assert "default/p" not in coordinator.engine.state.pods
    assert control.report(last, placed) == []
    assert "default/p" not in coordinator.flights
    assert coordinator.engine.state.names[coordinator.engine.state.pods["default/p"].slot] == "a"
    # the same copy again, or an older one from that shard: already seen
    handback = PodHandedBack(pod="default/p", reason="full", shard=last)
    for causation in (control.offset, control.offset - 1):
        env = relayed(handback, last, causation)
        coordinator.apply(env)
        assert coordinator.schedule() == []
    assert coordinator.counters["handbacks"] == 0
    assert coordinator.engine.bindings["default/p"] == "default/p#1"


@pytest.mark.parametrize("producer", ["relay-\u00b2", "relay-\u0661"])
def test_a_relay_named_with_other_digits_is_ignored(producer: str) -> None:
    control, _ = handed_to_shard(2)
    coordinator = control.coordinator
    placed = ShardSummary(shard=1, seen=2, placed={"default/p": "a"}, nodes=1)
    coordinator.apply(Envelope(event=placed, stream=RELAY, producer=producer, causation=9))
    assert coordinator.schedule() == []
    assert "default/p" in coordinator.flights


@pytest.mark.parametrize("shards", SHARDS)
def test_replay_tolerates_an_unforwarded_tail_but_not_a_gap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """The coordinator appends a pass's records partition by partition, the control
    partition last. One stopped in the middle of its last pass leaves a tail of some
    partitions missing (the shards never saw it, so derived nothing from it): replay
    counts what is missing. A record missing before later ones is a mismatch."""
    text = sharding(
        "pools: [" + ", ".join(f"{{name: p{i}, shard: {i}}}" for i in range(shards)) + "]"
    )
    text += "".join(pool_node(f"n{i}", f"p{i}", cpu=4) for i in range(shards))
    text += "".join(pod(f"early-{i}", cpu="1", pool=f"p{i}") for i in range(shards))
    text += "".join(pod(f"late-{i}", cpu="2", pool=f"p{i}", at=3) for i in range(shards))
    text += pod("huge", cpu="9", at=3, priority=10)  # decided first in that pass: no room
    _, parts = shoal(tmp_path, capsys, text, shards)
    ours = [
        (p, i, env)
        for p, part in enumerate(parts)
        for i, env in enumerate(part)
        if env.producer == "router"
    ]
    last = max(env.causation for _, _, env in ours)
    lost = [(p, i) for p, i, env in ours if env.causation == last and p >= 1]
    assert {p for p, _ in lost} == set(range(1, shards + 1))  # every shard but 0, and control
    tail = [list(part) for part in parts]
    for p in range(1, shards + 1):
        del tail[p][min(i for q, i in lost if q == p) :]
    result = replay_routed(tail, verify=True)
    assert result.mismatch is None, result.mismatch
    assert result.unforwarded == len(lost)
    gap = [list(part) for part in parts]
    early = next(i for i, env in enumerate(parts[shards - 1]) if isinstance(env.event, PodRouted))
    del gap[shards - 1][early]
    mismatch = replay_routed(gap, verify=True).mismatch
    assert mismatch is not None
    assert f"partition {shards - 1}: the coordinator derives PodRouted" in str(mismatch)
    assert "never appended though later records were" in str(mismatch)


def test_routed_replay_needs_the_sharding_record() -> None:
    parts: Parts = [[], [], [Envelope(event=ClockTicked(), partition=2, offset=0)]]
    with pytest.raises(LogCorruptedError, match="sharding configuration"):
        replay_routed(parts, verify=True)
    bad: Parts = [[], [], [Envelope(event=ShardingConfigured(config="{nope"), partition=2)]]
    with pytest.raises(LogCorruptedError, match="invalid"):
        replay_routed(bad, verify=True)


# --------------------------------------------------------------------------- pool moves


@pytest.mark.parametrize("shards", SHARDS)
def test_a_pool_moves_to_another_shard_with_what_runs_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Pool pa moves from shard 0 to the last shard at 10 s: shard 0 lets its node go
    with the pod running there (PoolReleased → PoolHandedOver), the new owner takes the
    node and adopts the pod, and places what comes later knowing the node holds it."""
    last = shards - 1
    text = sharding(f"pools: [{{name: pa, shard: 0}}, {{name: pb, shard: {last}}}]")
    text += pool_node("a", "pa", gpu=5) + pool_node("b", "pb", gpu=5)
    text += pod("running", gpu=3, pool="pa") + pool_move("pa", last, at=10)
    text += pod("later", gpu=3, pool="pa", at=20) + pod("fits", gpu=2, pool="pa", at=21)
    data, parts = shoal(tmp_path, capsys, text, shards)
    pods = data["pods"]
    assert pods["default/running"] == {**pods["default/running"], "node": "a", "phase": "Bound"}
    assert pods["default/later"]["phase"] == "Pending"
    assert "Insufficient nvidia.com/gpu" in pods["default/later"]["reason"]
    assert pods["default/fits"] == {**pods["default/fits"], "node": "a", "shard": last}
    ((released_env, released),) = found(parts, PoolReleased, 0)
    assert released == PoolReleased(pool="pa", nodes=("a",), to=last)
    assert released_env.time == 10 * SECOND
    ((_, over),) = found(parts, PoolHandedOver, 0)
    assert [p.pod.key for p in over.placements] == ["default/running"]
    adopted = [e.placement for _, e in found(parts, PodAdopted, last)]
    assert [(p.pod.key, p.node) for p in adopted] == [("default/running", "a")]
    assert [e.node.name for _, e in found(parts, NodeAdded, last)] == ["b", "a"]


@pytest.mark.parametrize("shards", SHARDS)
def test_a_pod_that_arrives_as_its_pool_moves_is_placed_by_the_new_owner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    last = shards - 1
    text = sharding(f"pools: [{{name: pa, shard: 0}}, {{name: pb, shard: {last}}}]")
    text += pool_node("a", "pa", gpu=5) + pool_node("b", "pb", gpu=5)
    text += pool_move("pa", last, at=10) + pod("mover", gpu=3, pool="pa", at=10)
    data, _ = shoal(tmp_path, capsys, text, shards)
    assert data["pods"]["default/mover"] == {
        **data["pods"]["default/mover"],
        "node": "a",
        "phase": "Bound",
        "shard": last,
    }


# ------------------------------------------------------------------- the control worker


@pytest.mark.parametrize("fold_slice", [3, 4])
async def test_the_control_worker_folds_a_burst_in_slices(fold_slice: int) -> None:
    """A burst of control records is folded ``fold_slice`` at a time, a pass after each
    slice with its outputs appended (caused by the slice's last record) before the next
    is folded: shards start on the first slice while the coordinator folds the rest.
    One poll folds the whole burst, and the shards are told what one big slice would
    have told them, in the same order."""

    async def run_burst(size: int) -> tuple[ControlWorker, list[tuple[int, int, Event]]]:
        log = MemoryLog(3)
        worker = ControlWorker(Coordinator(Sharding(shards=2)), log)
        worker.fold_slice = size
        assert await worker.poll() == 0  # recovered, on an empty log
        events: list[Event] = [
            make_node(f"n{i}").cpu("8").label(POOL_LABEL, f"p{i % 2}").added() for i in range(8)
        ]
        events += [make_pod(f"pod{i}").cpu("1").submitted() for i in range(7)]
        await log.append([Envelope(event=e, producer="ingest") for e in events], 2)
        await worker.poll()
        assert worker.position == len(events), "one poll folds the whole burst"
        told = [(p, env.causation, env.event) for p in range(2) for env in await log.read(p, 0)]
        return worker, told

    sliced, in_slices = await run_burst(fold_slice)
    whole, at_once = await run_burst(1000)
    assert [(p, e) for p, _, e in in_slices] == [(p, e) for p, _, e in at_once]
    assert sum(isinstance(e, PodRouted) for _, _, e in at_once) == 7
    ends = {min(end, 15) - 1 for end in range(fold_slice, 15 + fold_slice, fold_slice)}
    assert {cause for _, cause, _ in in_slices} == ends
    assert {cause for _, cause, _ in at_once} == {14}
    assert sliced.passes == len(ends) and whole.passes == 1


# --------------------------------------------------------------------- names used again


def test_a_name_used_again_by_another_pod_is_scheduled_again() -> None:
    """Kubernetes lets a name be used again once its pod is gone: ``web-0`` runs 5 s
    (uid u1), is told again after it succeeded (the same pod: nothing happens), then
    comes back with uid u2 (another pod: it runs again), told twice too."""
    web = make_pod("web-0").cpu("1").runtime(5)
    events = at(
        0, [make_node(f"n{i}").cpu("4").label(POOL_LABEL, f"p{i}").added() for i in range(3)]
    )
    events += at(0, [web.uid("u1").submitted()], order=10)
    events += at(8, [web.uid("u1").submitted()], order=20)
    events += at(12, [web.uid("u2").submitted(), web.uid("u2").submitted()], order=30)
    data, parts = simulated(events, Sharding(shards=3))
    assert data["pods"]["default/web-0"]["phase"] == "Succeeded"
    binds = sorted(
        (env.time, e.decision_id)
        for p in range(3)
        for env, e in found(parts, PodBound, p)
        if e.pod == "default/web-0"
    )
    assert [t for t, _ in binds] == [0, 12 * SECOND]
    assert binds[0][1] != binds[1][1]
    routed = [e.pod.uid for p in range(3) for _, e in found(parts, PodRouted, p)]
    assert sorted(routed) == ["u1", "u2"]


def job(uid: str, name: str, size: int, at_seconds: int) -> list[TimedEvent]:
    """A gang of ``size`` one-card pods under PodGroup ``name`` (object ``uid``), each
    running 10 s, arriving at ``at_seconds``."""
    group = GroupSpec(namespace="ml", name=name, min_member=size, uid=uid)
    events: list[Event] = [PodGroupSubmitted(group=group)]
    for m in range(size):
        member = make_pod(f"{name}-{m}", "ml").cpu("1").gpu(1).group(group.key).uid(f"{uid}-{m}")
        events.append(member.runtime(10).submitted())
    return at(at_seconds, events, order=at_seconds * 100)


@pytest.mark.parametrize("shards", SHARDS)
def test_gangs_run_again_under_their_names_over_several_shards(shards: int) -> None:
    """A job that finished is applied again (its PodGroup and pods under the same names,
    other uids): a gang one shard holds is handed to it again, and one too big for any
    shard is prepared across shards and committed again, under a fresh id."""
    nodes = [
        make_node(f"n{i}").cpu("32").gpu(4).label(POOL_LABEL, f"p{i % shards}").added()
        for i in range(2 * shards)
    ]
    wide = 8 + shards + 1  # more than the 8 cards a shard has
    events = at(0, nodes)
    for uid, start in (("a", 0), ("b", 20)):  # each run lasts 10 s: the second finds it over
        events += job(f"small-{uid}", "small", 2, start)  # a shard has 2 nodes for it
        events += job(f"wide-{uid}", "wide", wide, start + 1)
    data, parts = simulated(events, Sharding(shards=shards))
    runs: dict[str, int] = {}
    for bind in records(parts, PodBound):
        runs[bind.pod] = runs.get(bind.pod, 0) + 1
    expected = [f"ml/small-{m}" for m in range(2)] + [f"ml/wide-{m}" for m in range(wide)]
    assert runs == dict.fromkeys(expected, 2)
    assert all(data["pods"][k]["phase"] == "Succeeded" for k in expected)
    requests = records(parts, ReservationRequested)
    small = {r.rid for r in requests if r.group.name.startswith("small")}
    assert len(small) == 2 and all(
        r.at_once and not r.placements for r in requests if r.rid in small
    )
    committed = {c.rid for c in records(parts, ReservationCommitted)}
    assert len(committed) == 2 and all(rid.startswith("ml/wide#") for rid in committed)


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("pools: {a: 1}", "pools"),
        ("pools: [{shard: 0}]", "pools[0].name"),
        ("pools: [{name: a}, {name: a}]", "pools[1].name"),
        ("pools: [{name: a, shard: -1}]", "pools[0].shard"),
        ("pools: [{name: a, shard: true}]", "pools[0].shard"),
        ("pools: [{name: a, nodeSelector: {x: 1}}]", "pools[0].nodeSelector"),
        ("tenants: [{namespace: t}]", "tenants[0].pools"),
        ("tenants: [{namespace: t, pools: [a]}, {namespace: u, pools: [a]}]", "tenants[1].pools"),
        ("reservationTimeoutSeconds: 0", "reservationTimeoutSeconds"),
        ("reservationTimeoutSeconds: lots", "reservationTimeoutSeconds"),
    ],
)
def test_a_malformed_sharding_configuration_exits_2_naming_file_document_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, field: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(node("n0") + sharding(body))
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", str(path), "--shards", "3", "--json"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{path}: document 2 (ShardingConfiguration): {field}: " in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(("shards", "pinned_to"), [(2, 2), (4, 7)])
@pytest.mark.parametrize("command", ["simulate", "serve"])
def test_a_pool_pinned_to_a_shard_that_does_not_exist_exits_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    shards: int,
    pinned_to: int,
) -> None:
    """From a scenario (``simulate``) and from ``serve --sharding`` alike: one line
    naming the file, the document and the field, before anything starts."""
    config = sharding(f"pools: [{{name: a, shard: 0}}, {{name: far, shard: {pinned_to}}}]")
    path = tmp_path / "sharding.yaml"
    if command == "simulate":
        path.write_text(config + node("n0", labels={POOL_LABEL: "far"}))
        argv = ["simulate", str(path), "--shards", str(shards)]
    else:
        path.write_text(config)
        argv = ["serve", "--shards", str(shards), "--sharding", str(path)]
        argv += ["--listen", "127.0.0.1:0", "--host", "http://127.0.0.1:9"]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{path}: document 1 (ShardingConfiguration): pools[1].shard: " in err, err
    assert f"assigned to shard {pinned_to}, but there are {shards}" in err, err
