"""Several shards, deterministic cases: pools, tenants, hand-backs, gangs across shards,
reservations (grant, deny, expiry, commit, break) and gang rollback after a failed bind.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import msgspec
import pytest

from engine.engine import Engine
from engine.model.pools import POOL_LABEL, Sharding
from engine.model.reservations import COMMITTED, HELD
from events.errors import InputError, LogCorruptedError
from events.memory import MemoryLog
from events.types import (
    SECOND,
    BindFailed,
    ClockTicked,
    Envelope,
    Event,
    GroupSpec,
    NodeRemoved,
    NodeUpdated,
    PodAdopted,
    PodBound,
    PodDeleted,
    PodGroupSubmitted,
    PodHandedBack,
    PodRecalled,
    PodRouted,
    PodSubmitted,
    PodUnbound,
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
from shards.control import ControlWorker
from shards.inputs.scenario import Scenario, TimedEvent, load_scenario
from shards.replay import replay_routed
from shards.router import RELAY, Control
from shards.simulate import simulate
from tests.builders import env, make_node, make_pod, relayed
from tests.shards.test_batch import group, node, pod


def run(tmp_path: Path, text: str, shards: int) -> dict[str, Any]:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    scenario = load_scenario([str(path)])
    spec = scenario.sharding
    sharding = spec.sharding(shards) if spec is not None else Sharding(shards=shards)

    async def go() -> dict[str, Any]:
        log = MemoryLog(shards + 1)
        result = await simulate(scenario, log, sharding=sharding)
        parts = [await log.read(p, 0) for p in range(shards + 1)]
        verified = replay_routed(parts, verify=True)
        assert verified.mismatch is None, verified.mismatch
        assert verified.unforwarded == 0
        result.cluster.check_invariants()
        for engine in result.engines:
            engine.state.check_invariants()
            assert not [r for r in engine.reservations.values() if r.state == HELD]
        data = result.report.to_json()
        data["parts"] = parts
        data["control"] = result.control
        return data

    return asyncio.run(go())


def pools(*lines: str) -> str:
    body = "\n".join(lines)
    return f"""
apiVersion: shoal.io/v1alpha1
kind: ShardingConfiguration
{body}
---"""


def labelled(name: str, pool: str, gpu: int = 4) -> str:
    return node(name, cpu=16, gpu=gpu, extra=f", labels: {{{POOL_LABEL}: {pool}}}")


# --------------------------------------------------------------------------- pools


def test_pools_pinned_by_configuration_and_rules(tmp_path: Path) -> None:
    text = (
        pools(
            "pools:",
            "- {name: big, shard: 2, nodeSelector: {size: big}}",
            "- {name: small, shard: 0}",
        )
        + node("b0", extra=", labels: {size: big}")
        + labelled("s0", "small")
        + pod("x", cpu="1")
    )
    data = run(tmp_path, text, 3)
    forwarded = {
        env.event.node.name: (p, env.event.node.labels.get(POOL_LABEL))
        for p, records in enumerate(data["parts"][:3])
        for env in records
        if type(env.event).__name__ == "NodeAdded"
    }
    assert forwarded == {"b0": (2, "big"), "s0": (0, "small")}


def test_tenant_pools_are_exclusive(tmp_path: Path) -> None:
    text = (
        pools("tenants:", "- {namespace: research, pools: [a100]}")
        + labelled("a100-0", "a100", gpu=8)
        + labelled("v100-0", "v100", gpu=2)
        + pod("train", gpu=4, ns="research")
        + "".join(pod(f"infer-{i}", gpu=1, ns="serving") for i in range(3))
    )
    data = run(tmp_path, text, 2)
    pods = data["pods"]
    assert pods["research/train"]["node"] == "a100-0"
    placed = [pods[f"serving/infer-{i}"]["node"] for i in range(3)]
    assert sorted(p for p in placed if p) == ["v100-0", "v100-0"]
    assert "a100-0" not in placed  # the third waits rather than use research's pool
    assert pods["serving/infer-2"]["phase"] == "Pending"


def test_hand_backs_are_bounded_and_the_reason_names_every_shard(tmp_path: Path) -> None:
    text = "".join(node(f"n{i}", cpu=2) for i in range(6)) + pod("huge", cpu="8")
    data = run(tmp_path, text, 3)
    view = data["pods"]["default/huge"]
    assert view["phase"] == "Pending"
    for shard in range(3):
        assert shard == view["shard"] or f"shard {shard}:" in view["reason"], view
    handbacks = [
        env
        for records in data["parts"][:3]
        for env in records
        if isinstance(env.event, PodHandedBack)
    ]
    assert len(handbacks) == 2  # every other shard answered; the last one keeps it


def test_dependency_on_a_pod_of_another_shard(tmp_path: Path) -> None:
    text = (
        labelled("a", "pa")
        + labelled("b", "pb")
        + pod(
            "first",
            spec=f"  nodeSelector: {{{POOL_LABEL}: pa}}",
            annotations='"shoal.io/runtime": "10"',
        )
        + pod(
            "then",
            spec=f"  nodeSelector: {{{POOL_LABEL}: pb}}",
            annotations='"shoal.io/depends-on": "first"',
        )
    )
    data = run(tmp_path, text, 2)
    assert data["pods"]["default/first"]["phase"] == "Succeeded"
    assert data["pods"]["default/then"]["node"] == "b"


# --------------------------------------------------------------------------- gangs


def test_gang_too_big_for_any_shard_is_placed_across_shards(tmp_path: Path) -> None:
    text = (
        "".join(labelled(f"g{i}", f"p{i % 2}") for i in range(4))  # 8 GPUs per shard
        + group("wide", 12)
        + "".join(
            pod(f"w{i}", cpu="1", gpu=1, labels="scheduling.x-k8s.io/pod-group: wide")
            for i in range(12)
        )
    )
    data = run(tmp_path, text, 2)
    members = [data["pods"][f"default/w{i}"] for i in range(12)]
    assert all(m["phase"] == "Bound" for m in members)
    assert {m["shard"] for m in members} == {0, 1}
    assert data["groups"]["default/wide"]["phase"] == "Scheduled"
    control: Control = data["control"]
    assert control.counters["committed"] == 1


def test_gang_that_fits_nowhere_waits_at_the_coordinator_with_a_reason(tmp_path: Path) -> None:
    text = (
        "".join(labelled(f"g{i}", f"p{i % 2}") for i in range(2))  # 8 GPUs in all
        + group("wide", 10, spec=", scheduleTimeoutSeconds: 30")
        + "".join(
            pod(f"w{i}", gpu=1, labels="scheduling.x-k8s.io/pod-group: wide") for i in range(10)
        )
    )
    data = run(tmp_path, text, 2)
    assert data["groups"]["default/wide"]["phase"] == "Failed"
    assert "timed out" in data["pods"]["default/w0"]["reason"]


# --------------------------------------------------------------------------- reservations


def _engine(*events: Event, time: int = 0) -> tuple[Engine, list[Event]]:
    engine = Engine(shard=0)
    engine.apply(Envelope(event=make_node("n").cpu("8").gpu(4).added()))
    for event in events:
        engine.apply(Envelope(event=event, time=time, producer="router", causation=1))
    return engine, engine.schedule()


def _request(rid: str, count: int, *, expires: int = 10 * SECOND) -> ReservationRequested:
    spec = GroupSpec(namespace="ml", name="g", min_member=count)
    pods = tuple(
        make_pod(f"m{i}", "ml").cpu("1").gpu(1).member("ml/g").spec() for i in range(count)
    )
    return ReservationRequested(rid=rid, group=spec, pods=pods, expires_at=expires)


def _of(kind: type, events: list[Event]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def test_reservation_granted_held_then_committed() -> None:
    engine, out = _engine(_request("ml/g#1", 3))
    (grant,) = _of(ReservationGranted, out)
    assert len(grant.placements) == 3 and not _of(PodBound, out)
    assert engine.reservations["ml/g#1"].state == HELD
    engine.apply(Envelope(event=ReservationCommitted(rid="ml/g#1"), producer="router"))
    bound = _of(PodBound, engine.schedule())
    assert len(bound) == 3
    assert engine.reservations["ml/g#1"].state == COMMITTED


def test_reservation_that_does_not_fit_is_denied_and_holds_nothing() -> None:
    engine, out = _engine(_request("ml/g#1", 5))
    assert _of(ReservationDenied, out) and not _of(ReservationGranted, out)
    assert not engine.state.pods and "ml/g#1" not in engine.reservations


def test_reservation_expires_by_itself() -> None:
    engine, out = _engine(_request("ml/g#1", 2, expires=5 * SECOND))
    assert _of(ReservationGranted, out)
    assert engine.next_wakeup() == 5 * SECOND
    engine.apply(Envelope(event=ClockTicked(), time=5 * SECOND))
    (released,) = _of(ReservationReleased, engine.schedule())
    assert released.reason.startswith("expired")
    assert not engine.state.pods
    engine.apply(Envelope(event=ReservationCommitted(rid="ml/g#1"), producer="router"))
    assert not _of(PodBound, engine.schedule())  # too late: nothing to commit


def test_abort_after_commit_unbinds_and_a_failed_bind_breaks_the_part() -> None:
    engine, _ = _engine(_request("ml/g#1", 2))
    engine.apply(Envelope(event=ReservationCommitted(rid="ml/g#1"), producer="router"))
    bound = _of(PodBound, engine.schedule())
    failed = bound[0]
    engine.apply(
        Envelope(
            event=BindFailed(
                pod=failed.pod, node=failed.node, decision_id=failed.decision_id, reason="409"
            )
        )
    )
    out = engine.schedule()
    (unbound,) = _of(PodUnbound, out)
    assert unbound.pod == bound[1].pod
    (released,) = _of(ReservationReleased, out)
    assert released.reason.startswith("broken")
    assert not engine.state.pods


def test_local_gang_rolled_back_whole_after_a_failed_bind() -> None:
    engine = Engine()
    engine.apply(Envelope(event=make_node("n").cpu("8").added()))
    spec = GroupSpec(namespace="ml", name="g", min_member=3)
    engine.apply(Envelope(event=PodGroupSubmitted(group=spec)))
    for i in range(3):
        member = make_pod(f"m{i}", "ml").cpu("1").member("ml/g").spec()
        engine.apply(Envelope(event=PodSubmitted(pod=member)))
    bound = _of(PodBound, engine.schedule())
    assert len(bound) == 3
    first = bound[0]
    engine.apply(
        Envelope(
            event=BindFailed(
                pod=first.pod, node=first.node, decision_id=first.decision_id, reason="409"
            )
        )
    )
    out = engine.schedule()
    assert {e.pod for e in _of(PodUnbound, out)} == {bound[1].pod, bound[2].pod}
    again = _of(PodBound, out)
    assert len(again) == 3  # placed again, whole, in the same pass
    assert all(e.decision_id not in {b.decision_id for b in bound} for e in again)


# --------------------------------------------------------------------------- router


def test_quota_slices_add_up_to_the_quota() -> None:
    control = Control(Sharding(shards=3))
    for i, gpus in enumerate([8, 4, 4]):
        node_event = make_node(f"n{i}").gpu(gpus).label(POOL_LABEL, f"p{i}").added()
        control.apply(Envelope(event=node_event, offset=i))
    quota = QuotaSpec(
        namespace="ml", name="q", min={"nvidia.com/gpu": 7}, max={"nvidia.com/gpu": 9}
    )
    out = control.apply(Envelope(event=QuotaDefined(quota=quota), offset=3))
    slices = {shard: e.quota for shard, e in out if isinstance(e, QuotaDefined)}
    assert sum(q.min["nvidia.com/gpu"] for q in slices.values()) == 7
    assert sum(q.max["nvidia.com/gpu"] for q in slices.values()) == 9
    assert slices[0].max["nvidia.com/gpu"] >= slices[1].max["nvidia.com/gpu"]


def test_guarantees_are_packed_whole_where_they_fit() -> None:
    """Two shards of 4 GPUs; two quotas guaranteeing 4 each: each guarantee lands whole
    on one shard (split 2 and 2, neither quota's gang of 4 could reclaim its own), the
    borrowable rest is spread by capacity, and every slice's max covers its min."""
    control = Control(Sharding(shards=2))
    for i in range(2):
        node_event = make_node(f"n{i}").gpu(4).label(POOL_LABEL, f"p{i}").added()
        control.apply(Envelope(event=node_event, offset=i))
    slices: dict[str, dict[int, QuotaSpec]] = {}
    for offset, (ns, top) in enumerate([("vision", 6), ("research", 8)], start=2):
        quota = QuotaSpec(
            namespace=ns, name=ns, min={"nvidia.com/gpu": 4}, max={"nvidia.com/gpu": top}
        )
        for shard, event in control.apply(Envelope(event=QuotaDefined(quota=quota), offset=offset)):
            if isinstance(event, QuotaDefined):
                slices.setdefault(event.quota.namespace, {})[shard] = event.quota
    gpu = "nvidia.com/gpu"
    research = [control.quota_slices["research"][s] for s in range(2)]
    vision = [control.quota_slices["vision"][s] for s in range(2)]
    assert [q.min[gpu] for q in research] == [4, 0]  # first by name on equal shares
    assert [q.min[gpu] for q in vision] == [0, 4]
    assert [q.max[gpu] for q in research] == [6, 2] and [q.max[gpu] for q in vision] == [1, 5]
    assert all(q.max[gpu] >= q.min[gpu] for q in (*research, *vision))
    # vision's slices moved when research's quota arrived: both shards were told
    assert set(slices["vision"]) == {0, 1} and set(slices["research"]) == {0, 1}


def test_guarantees_larger_than_a_shard_fill_the_roomiest_first() -> None:
    control = Control(Sharding(shards=3))
    for i, gpus in enumerate([2, 8, 4]):
        node_event = make_node(f"n{i}").gpu(gpus).label(POOL_LABEL, f"p{i}").added()
        control.apply(Envelope(event=node_event, offset=i))
    quota = QuotaSpec(namespace="ml", name="q", min={"nvidia.com/gpu": 11}, max={})
    control.apply(Envelope(event=QuotaDefined(quota=quota), offset=3))
    assert [q.min["nvidia.com/gpu"] for q in control.quota_slices["ml"]] == [0, 8, 3]
    over = QuotaSpec(namespace="ml", name="q", min={"nvidia.com/gpu": 20}, max={})
    control.apply(Envelope(event=QuotaDefined(quota=over), offset=4))
    mins = [q.min["nvidia.com/gpu"] for q in control.quota_slices["ml"]]
    assert sum(mins) == 20 and mins[1] >= 8 and mins[2] >= 4 and mins[0] >= 2


def test_routes_to_the_roomiest_shard_and_ignores_forged_relays() -> None:
    control = Control(Sharding(shards=2))
    control.apply(Envelope(event=make_node("a").cpu("4").label(POOL_LABEL, "pa").added()))
    control.apply(Envelope(event=make_node("b").cpu("64").label(POOL_LABEL, "pb").added()))
    chosen = []
    for i in range(3):
        event = PodSubmitted(pod=make_pod(f"p{i}").cpu("2").spec())
        chosen += [s for s, e in control.apply(Envelope(event=event, offset=2 + i))]
    # a tie at first, then the shard with the larger share free
    assert chosen == [0, 1, 1]
    forged = ShardSummary(shard=0, seen=99, nodes=1, allocatable={}, used={}, largest={})
    for producer in ("relay-x", "relay-7", "relay-", "someone"):
        assert (
            control.apply(Envelope(event=forged, stream=RELAY, producer=producer, causation=5))
            == []
        )
    assert control.shards[0].seen == -1


def test_replay_tolerates_an_unforwarded_tail_but_not_a_gap(tmp_path: Path) -> None:
    """A coordinator stopped before forwarding leaves a tail of router outputs missing:
    replay counts it. A record missing in the middle is a mismatch."""
    text = "".join(node(f"n{i}", cpu=4) for i in range(4)) + "".join(
        pod(f"p{i}", cpu="1") for i in range(6)
    )
    parts = run(tmp_path, text, 2)["parts"]
    routed = [i for i, env in enumerate(parts[0]) if env.producer == "router"]
    assert len(routed) >= 3
    tail = [list(p) for p in parts]
    del tail[0][routed[-1] :]  # the shard never saw it, so decided nothing on it
    result = replay_routed(tail, verify=True)
    assert result.mismatch is None and result.unforwarded == 1
    gap = [list(p) for p in parts]
    del gap[0][routed[1]]
    assert replay_routed(gap, verify=True).mismatch is not None


def test_a_node_selector_routes_to_a_shard_with_a_matching_node() -> None:
    """The roomiest shard has no node the selector matches: the pod goes straight to the
    one that has, instead of being handed back; when no shard has one, every shard may
    say why. Label changes are seen."""
    control = Control(Sharding(shards=2))
    a100 = make_node("a").cpu("4").label(POOL_LABEL, "pa").label("gpu-model", "a100")
    control.apply(Envelope(event=a100.added()))
    control.apply(Envelope(event=make_node("b").cpu("64").label(POOL_LABEL, "pb").added()))

    def route(name: str, selector: dict[str, str], offset: int) -> list[int]:
        spec = msgspec.structs.replace(make_pod(name).cpu("1").spec(), node_selector=selector)
        out = control.apply(Envelope(event=PodSubmitted(pod=spec), offset=offset))
        return [shard for shard, e in out if type(e).__name__ == "PodRouted"]

    assert route("first", {}, 2) == [0]  # a tie at first
    assert route("plain", {}, 3) == [1]  # then the roomier shard
    assert route("wants-a100", {"gpu-model": "a100"}, 4) == [0]
    assert route("wants-h100", {"gpu-model": "h100"}, 5) == [1]  # nowhere: roomiest
    assert control._matching({"gpu-model": "h100"}) == []
    # node a is relabelled: the selector now matches it
    relabelled = make_node("a").cpu("4").label(POOL_LABEL, "pa").label("gpu-model", "h100")
    control.apply(Envelope(event=NodeUpdated(node=relabelled.added().node), offset=6))
    assert control._matching({"gpu-model": "h100"}) == [0]
    assert route("wants-h100-again", {"gpu-model": "h100"}, 7) == [0]
    control.apply(Envelope(event=NodeRemoved(name="a"), offset=8))
    assert control._matching({"gpu-model": "h100"}) == []


def test_a_pod_seen_bound_moves_to_the_shard_owning_its_node() -> None:
    """Ingest reports pods it finds bound (by us or another scheduler) as ``PodBound``:
    the node's owner accounts for the pod, and a shard it was routed to forgets it."""
    control = Control(Sharding(shards=2))
    control.apply(Envelope(event=make_node("a").cpu("64").label(POOL_LABEL, "pa").added()))
    control.apply(Envelope(event=make_node("b").cpu("4").label(POOL_LABEL, "pb").added()))
    spec = make_pod("p").cpu("2").spec()
    out = control.apply(Envelope(event=PodSubmitted(pod=spec), offset=2))
    assert [(s, type(e).__name__) for s, e in out] == [(0, "PodRouted")]
    seen = PodBound(pod=spec.key, node="b", decision_id="observed:u1", attempt=0)
    out = control.apply(Envelope(event=seen, offset=3))
    assert [(s, type(e).__name__) for s, e in out] == [(0, "PodDeleted"), (1, "PodAdopted")]
    adopted = out[1][1]
    assert isinstance(adopted, PodAdopted)
    assert adopted.placement.node == "b"
    assert control.pod_shard[spec.key] == 1
    # seen again on the same node: the owner is told, nobody else
    out = control.apply(Envelope(event=seen, offset=4))
    assert [(s, type(e).__name__) for s, e in out] == [(1, "PodBound")]
    # the owner's engine accounts for it as bound, without scheduling it
    engine = Engine(shard=1)
    engine.apply(Envelope(event=make_node("b").cpu("4").label(POOL_LABEL, "pb").added()))
    engine.apply(Envelope(event=adopted, offset=1))
    assert not [e for e in engine.schedule() if isinstance(e, PodBound)]
    assert engine.state.pods[spec.key].slot == engine.state.index["b"]
    # a binding on a node nobody owns yet, or of a pod never submitted: nothing moves
    assert (
        control.apply(Envelope(event=PodBound(pod="x/y", node="b", decision_id="d", attempt=0)))
        == []
    )


def test_routed_replay_needs_the_sharding_record() -> None:
    parts = [[], [], [Envelope(event=ClockTicked(), partition=2, offset=0)]]
    with pytest.raises(LogCorruptedError, match="sharding configuration"):
        replay_routed(parts, verify=True)
    bad = [[], [], [Envelope(event=ShardingConfigured(config="{nope"), partition=2, offset=0)]]
    with pytest.raises(LogCorruptedError, match="invalid"):
        replay_routed(bad, verify=True)


class _Feed:
    """Control records one after another, at the time given (relayed when from a shard)."""

    def __init__(self, control: Control) -> None:
        self.control = control
        self.offset = 0

    def __call__(self, event: Event, relay: int | None = None, time: int = 0) -> list[Any]:
        self.offset += 1
        if relay is None:
            return self.control.apply(Envelope(event=event, offset=self.offset, time=time))
        return self.control.apply(relayed(event, relay, self.offset, time=time))

    def room(self, shard: int, free_cpu: int) -> ShardSummary:
        return ShardSummary(
            shard=shard,
            seen=self.offset,
            nodes=1,
            allocatable={"cpu": 8000, "memory": 8 << 30, "pods": 110},
            used={"cpu": 8000 - free_cpu},
            largest={"cpu": free_cpu, "memory": 8 << 30, "pods": 110},
        )


def _kept_big_pod(feed: _Feed) -> tuple[int, int]:
    """Two shards of one 8-cpu node; a 6-cpu pod refused by the first shard it went to
    and kept by the other: (the first, the keeper)."""
    for i in range(2):
        feed(make_node(f"n{i}").cpu("8").memory("8Gi").label(POOL_LABEL, f"p{i}").added())
    out = feed(PodSubmitted(pod=make_pod("big").cpu("6").spec()))
    first = next(s for s, e in out if isinstance(e, PodRouted))
    other = 1 - first
    out = feed(PodHandedBack(pod="default/big", reason="full", shard=first, resolvable=True), first)
    assert [(s, e.final) for s, e in out if isinstance(e, PodRouted)] == [(other, True)]
    assert feed.control.kept == {"default/big": other}
    return first, other


def test_a_pod_every_shard_refused_is_recalled_when_another_has_room() -> None:
    """Refused by both shards, the pod stays with the last; a summary from the other
    shard showing room for it recalls it (once), the keeper hands it back, and it goes
    there. A summary without room, or from the keeper itself, recalls nothing."""
    control = Control(Sharding(shards=2))
    feed = _Feed(control)
    first, other = _kept_big_pod(feed)
    assert not feed(feed.room(first, 2000), relay=first), "no room for 6 cpu: nothing recalled"
    assert not feed(feed.room(other, 8000), relay=other), "its keeper's own room: nothing"
    out = feed(feed.room(first, 8000), relay=first)
    assert out == [(other, PodRecalled(pod="default/big"))]
    assert control.kept == {} and control.counters["recalls"] == 1
    assert not feed(feed.room(first, 8000), relay=first), "recalled once per keeping"
    out = feed(PodHandedBack(pod="default/big", reason="still full", shard=other), other)
    assert [s for s, e in out if isinstance(e, PodRouted)] == [first]


def test_recalls_of_one_pod_back_off() -> None:
    """The roomy shard's room is an estimate: it may refuse the pod again, and its next
    summary shows the same room. The pod is then recalled again only after a back-off
    that doubles each time (1 s, 2 s, 4 s... up to ``max_retry_backoff``), not on every
    summary: it cannot go back and forth between the shards for ever."""
    sharding = Sharding(shards=2, retry_backoff=SECOND, max_retry_backoff=4 * SECOND)
    control = Control(sharding)
    feed = _Feed(control)
    _kept_big_pod(feed)
    recalled_at = []
    now = 0
    while now <= 20 * SECOND:
        keeper = control.kept.get("default/big")
        if keeper is not None:
            roomy = 1 - keeper
            out = feed(feed.room(roomy, 8000), relay=roomy, time=now)
            if out:
                assert out == [(keeper, PodRecalled(pod="default/big"))]
                recalled_at.append(now)
                # the keeper hands it back; the roomy shard refuses it too, and so the
                # pod is kept again (by the roomy shard: it is the last one untried)
                out = feed(PodHandedBack(pod="default/big", reason="full", shard=keeper), keeper)
                (shard,) = [s for s, e in out if isinstance(e, PodRouted)]
                refusal = PodHandedBack(pod="default/big", reason="no node fits", shard=shard)
                feed(refusal, shard, time=now)
        now += SECOND // 2
    gaps = [b - a for a, b in itertools.pairwise(recalled_at)]
    assert recalled_at[0] == 0, "the first recall comes with the first roomy summary"
    assert gaps == [1 * SECOND, 2 * SECOND] + [4 * SECOND] * 4, recalled_at
    assert control.counters["recalls"] == len(recalled_at) == 7


def test_a_recalled_pod_is_handed_back_only_if_it_still_does_not_fit() -> None:
    engine = Engine(shard=0)
    engine.apply(env(make_node("n").cpu("4").added(), 0))
    spec = make_pod("big").cpu("6").spec()
    engine.apply(env(PodRouted(pod=spec, final=True, answers=("shard 1: full",)), 1))
    out = engine.schedule()
    assert [type(e).__name__ for e in out if not isinstance(e, ShardSummary)] == [
        "PodUnschedulable"
    ]
    engine.apply(env(PodRecalled(pod="default/big"), 2))
    out = engine.schedule()
    assert [e for e in out if isinstance(e, PodHandedBack)] == [
        PodHandedBack(pod="default/big", reason=out[0].reason, shard=0, resolvable=True)
    ]
    assert "default/big" not in engine.pods
    # one that fits now is placed, not handed back; one placed already ignores it
    engine.apply(env(PodRouted(pod=make_pod("small").cpu("1").spec(), final=True), 3))
    engine.apply(env(PodRecalled(pod="default/small"), 4))
    out = engine.schedule()
    assert [type(e).__name__ for e in out if not isinstance(e, ShardSummary)] == ["PodBound"]
    engine.apply(env(PodRecalled(pod="default/small"), 5))
    assert [e for e in engine.schedule() if isinstance(e, PodHandedBack)] == []


def test_abort_reaches_every_open_part() -> None:
    sharding = Sharding(shards=2, reservation_timeout=5 * SECOND)
    control = Control(sharding)
    feed = _Feed(control)

    for i in range(4):
        feed(make_node(f"g{i}").gpu(2).label(POOL_LABEL, f"p{i % 2}").added())
    feed(PodGroupSubmitted(group=GroupSpec(namespace="ml", name="g", min_member=6)))
    for i in range(6):
        feed(PodSubmitted(pod=make_pod(f"m{i}", "ml").gpu(1).member("ml/g").spec()))
    for shard in (0, 1):  # both shards refuse it whole
        feed(PodHandedBack(group="ml/g", reason="too big", shard=shard), relay=shard)
    out = []
    for shard in (0, 1):
        out += feed(
            ShardSummary(
                shard=shard, seen=feed.offset, nodes=2, allocatable={}, used={}, largest={}
            ),
            relay=shard,
        )
    # the first plan ran before shard 1 had summarised: it waits out its back-off
    out += feed(ClockTicked(), time=SECOND)
    requests = [(s, e) for s, e in out if isinstance(e, ReservationRequested)]
    assert {s for s, _ in requests} == {0, 1}
    rid = requests[0][1].rid
    feed(ReservationGranted(rid=rid, group="ml/g", placements={}, shard=0), relay=0, time=SECOND)
    out = feed(ReservationDenied(rid=rid, group="ml/g", reason="no", shard=1), relay=1, time=SECOND)
    assert [(s, type(e)) for s, e in out if isinstance(e, ReservationAborted)] == [
        (0, ReservationAborted)
    ]
    assert control.gangs["ml/g"].stage == "aborting"
    feed(
        ReservationReleased(rid=rid, group="ml/g", reason="aborted", shard=0), relay=0, time=SECOND
    )
    assert control.gangs["ml/g"].stage == ""


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("body", "where"),
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
def test_malformed_sharding_configuration(tmp_path: Path, body: str, where: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(pools(body) + node("n"))
    with pytest.raises(InputError) as caught:
        load_scenario([str(path)])
    assert where in str(caught.value) and "document 1" in str(caught.value)


def test_pool_pinned_to_a_shard_that_does_not_exist(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(pools("pools: [{name: a, shard: 3}]") + node("n"))
    spec = load_scenario([str(path)]).sharding
    assert spec is not None
    assert spec.sharding(4).pools == (("a", 3),)
    with pytest.raises(InputError, match="shard 3, but there are 2"):
        spec.sharding(2)


def test_pool_moves_to_another_shard_with_what_runs_there(tmp_path: Path) -> None:
    move = """
apiVersion: shoal.io/v1alpha1
kind: PoolReassignment
metadata: {name: move, annotations: {shoal.io/arrive-at: "10"}}
spec: {pool: pa, shard: 1}
---"""
    text = (
        pools("pools: [{name: pa, shard: 0}, {name: pb, shard: 1}]")
        + labelled("a", "pa")
        + labelled("b", "pb")
        + pod("running", gpu=2, spec=f"  nodeSelector: {{{POOL_LABEL}: pa}}")
        + move
        + pod(
            "later",
            gpu=3,
            spec=f"  nodeSelector: {{{POOL_LABEL}: pa}}",
            annotations='"shoal.io/arrive-at": "20"',
        )
    )
    data = run(tmp_path, text, 2)
    pods = data["pods"]
    assert pods["default/running"] == {**pods["default/running"], "node": "a", "phase": "Bound"}
    # the new owner knows node a holds 2 of its 4 GPUs: 3 more do not fit there
    assert pods["default/later"]["phase"] == "Pending"
    assert pods["default/later"]["shard"] == 1
    over = [env.event for env in data["parts"][0] if type(env.event).__name__ == "PoolHandedOver"]
    assert [p.pod.key for p in over[0].placements] == ["default/running"]


async def test_the_coordinator_forwards_a_burst_in_slices() -> None:
    """A burst of control records is folded ``fold_slice`` at a time, each slice's
    outputs appended before the next is folded (shards start on the first while the
    router folds the rest); one poll folds them all, and what reaches the shards is
    what one big slice would have sent."""

    async def forwarded(fold_slice: int) -> tuple[list[Any], list[int]]:
        log = MemoryLog(3)
        events: list[Event] = [
            make_node(f"n{i}").cpu("8").label(POOL_LABEL, f"p{i}").added() for i in range(2)
        ]
        events += [PodSubmitted(pod=make_pod(f"pod{i}").cpu("1").spec()) for i in range(7)]
        await log.append([Envelope(event=e, time=i) for i, e in enumerate(events)], 2)
        sizes: list[int] = []
        append = log.append

        async def counted(envelopes: Any, partition: int = 0) -> list[int]:
            sizes.append(len(envelopes))
            return await append(envelopes, partition)

        log.append = counted  # type: ignore[method-assign]
        worker = ControlWorker(Control(Sharding(shards=2)), log)
        worker.fold_slice = fold_slice
        await worker.poll()
        assert worker.position == len(events), "one poll folds the whole burst"
        sent = [
            (shard, env.causation, env.event)
            for shard in range(2)
            for env in await log.read(shard, 0)
        ]
        return sent, sizes

    sliced, appends = await forwarded(3)
    whole, whole_appends = await forwarded(1000)
    assert sliced == whole
    assert len(appends) > len(whole_appends) and max(appends) <= 3


def test_a_name_used_again_by_another_pod_is_routed_again() -> None:
    """The router, like a shard, takes a pod named like one that finished when its uid
    is another (Kubernetes reuses names); the same pod told again is not routed twice.
    The run router folds such records as the fold does."""
    from shards.fastroute import RunRouter

    records = [
        Envelope(event=make_node("a").cpu("4").label(POOL_LABEL, "pa").added(), offset=0),
        Envelope(event=make_node("b").cpu("4").label(POOL_LABEL, "pb").added(), offset=1),
        Envelope(event=make_pod("web-0").cpu("1").uid("u1").submitted(), offset=2),
        Envelope(event=PodDeleted(pod="default/web-0"), offset=3),
        Envelope(event=make_pod("web-0").cpu("1").uid("u1").submitted(), offset=4),
        Envelope(event=make_pod("web-0").cpu("1").uid("u2").submitted(), offset=5),
        Envelope(event=make_pod("web-0").cpu("1").uid("u2").submitted(), offset=6),
    ]
    control = Control(Sharding(shards=2))
    outputs = [control.apply(env) for env in records]
    routed = [[e.pod.uid for _, e in out if isinstance(e, PodRouted)] for out in outputs]
    assert routed == [[], [], ["u1"], [], [], ["u2"], []]
    assert "default/web-0" not in control.outcomes and control.pods["default/web-0"].uid == "u2"
    folded = Control(Sharding(shards=2))
    runs = RunRouter(min_run=1).fold(folded, records)
    assert [out for _, _, out in runs] == outputs


def _job(uid: str, name: str, size: int, gpu: int, runtime: int, at: int) -> list[TimedEvent]:
    """A gang of ``size`` pods of ``gpu`` cards each under PodGroup ``name`` (object
    ``uid``), arriving at ``at`` seconds and running ``runtime``."""
    group = GroupSpec(namespace="ml", name=name, min_member=size, uid=uid)
    events: list[Event] = [PodGroupSubmitted(group=group)]
    for m in range(size):
        pod = make_pod(f"{name}-{m}", "ml").cpu("1").gpu(gpu).group(group.key).uid(f"{uid}-{m}")
        events.append(PodSubmitted(pod=msgspec.structs.replace(pod.spec(), runtime=runtime)))
    return [TimedEvent(at * SECOND, at * 100 + i, e) for i, e in enumerate(events)]


def test_gangs_run_again_under_their_names_over_several_shards() -> None:
    """A job that finished and is applied again (its PodGroup and pods under the same
    names, other uids) runs again with several shards: a gang one shard holds, and one
    too big for any shard, placed across shards again with fresh reservation ids."""
    nodes = [
        make_node(f"n{i}").cpu("32").gpu(4).label(POOL_LABEL, f"p{i % 2}").added() for i in range(4)
    ]
    events = [TimedEvent(0, i, e) for i, e in enumerate(nodes)]
    for uid, at in (("a", 0), ("b", 20)):  # each run lasts 10 s: the second finds it over
        events += _job(f"small-{uid}", "small", 2, 1, 10 * SECOND, at)
        events += _job(f"wide-{uid}", "wide", 12, 1, 10 * SECOND, at + 1)  # > 8 cards a shard

    async def go() -> list[list[Envelope]]:
        log = MemoryLog(3)
        await simulate(Scenario(events=events), log, sharding=Sharding(shards=2))
        return [await log.read(p, 0) for p in range(3)]

    parts = asyncio.run(go())
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, verified.mismatch
    decided = [e.event for part in parts[:2] for e in part if isinstance(e.event, PodBound)]
    runs: dict[str, int] = {}
    for event in decided:
        runs[event.pod] = runs.get(event.pod, 0) + 1
    assert runs == {
        f"ml/{name}-{m}": 2 for name, size in (("small", 2), ("wide", 12)) for m in range(size)
    }
    committed = {
        e.event.rid for part in parts[:2] for e in part if isinstance(e.event, ReservationCommitted)
    }
    assert len(committed) == 2  # one reservation committed per run, each its own id
