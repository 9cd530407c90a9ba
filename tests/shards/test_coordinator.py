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

Why one module of over 500 lines: the coordinator's dispatch is one rule (hand over
what certainly fits, decide the rest on the view) and these are its cases; the
shard's side and the coordinator's lifetime have their own modules.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from engine.model.pools import POOL_LABEL, Sharding
from engine.model.quota import GPU_SCALE
from events.types import (
    SECOND,
    ClockTicked,
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
    PodUnschedulable,
    PreemptionRequested,
    QuotaDefined,
    QuotaSpec,
    ReservationAborted,
    ReservationCommitted,
    ReservationDenied,
    ReservationGranted,
    ReservationReleased,
    ReservationRequested,
)
from shards.coordinator.coordinator import RELAY, Output
from shards.coordinator.flights import ABORTING
from tests.builders import make_node, make_pod
from tests.shards.coordinator_kit import (
    SHARDS,
    Control,
    Shard,
    bound,
    directed,
    found,
    handed,
    handed_to_shard,
    in_pool,
    only,
    pinned,
    podgroup,
    pool_node,
    records,
    sent,
    sharding,
    shoal,
)
from tests.shards.scenario_text import node, pod

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
    over again, it decides it on its view and hands it to the node it chose."""
    control, last = handed_to_shard(shards)
    control.input(make_node("a2").cpu("6").label(POOL_LABEL, "pa").added())
    refusal = PodHandedBack(pod="default/p", reason="no node fits", shard=last, resolvable=True)
    out = control.report(last, refusal)
    assert not handed(out) and not sent(out, ReservationRequested)
    ((partition, request),) = directed(out)
    assert partition == last and request.pod.key == "default/p"
    chosen = request.node
    assert chosen in {"a", "a2"}
    coordinator = control.coordinator
    assert coordinator.counters["handbacks"] == 1 and coordinator.counters["decided"] == 1
    view = coordinator.engine.state
    assert view.names[view.pods["default/p"].slot] == chosen  # held there at once
    assert control.placed(last, {"default/p": chosen}, nodes=2) == []
    assert coordinator.directed == {}
    # the view holds p there: of two more such pods, one is handed (for the other node)
    out = control.input(in_pool("q0", "pa", "5"), in_pool("q1", "pa", "5"))
    assert [(p, e.pod.key) for p, e in handed(out)] == [(last, "default/q0")]


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
    """The shard that owns the only nodes keeps handing back what the coordinator decides
    there (its view of them differs): the pod is decided again only after a back-off
    that doubles (1 s, 2 s, 4 s, 8 s) up to the profile's 10 s, never handed over, and
    never asked for in between: no retry storm."""
    control, last = handed_to_shard(shards)
    refusal = PodHandedBack(pod="default/p", reason="no node fits", shard=last, resolvable=True)
    out = control.report(last, refusal)
    asked: list[float] = []
    now = 0.0
    while now <= 40:
        assert not handed(out) and not sent(out, ReservationRequested)
        requests = directed(out)
        if requests:
            ((partition, request),) = requests
            assert partition == last and request.node == "a"
            asked.append(now)
            assert len(asked) <= 7, f"asked again and again: {asked}"
            denial = PodHandedBack(
                pod="default/p",
                reason="full",
                shard=last,
                resolvable=True,
                decision_id=request.decision_id,
            )
            out = control.report(last, denial, time=now)
            continue
        now += 0.5
        out = control.input(ClockTicked(), time=now)
    assert asked == [0, 1, 3, 7, 15, 25, 35]
    coordinator = control.coordinator
    assert coordinator.counters["handed"] == 1 and coordinator.counters["directed"] == len(asked)
    assert coordinator.directed == {} and coordinator.next_wakeup() == 45 * SECOND


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
    assert quota.used.get(gpu, 0) == 2 * GPU_SCALE, quota.used  # (kept in milli-cards)
    out = control.input(*[make_pod(f"x{i}", "ml").gpu(1).submitted() for i in range(3)])
    assert [e.pod.key for _, e in sent(out, PodRouted)] == ["ml/x0"]


# --------------------------------------------------------------------------- preemption


@pytest.mark.parametrize("shards", SHARDS)
def test_a_preemption_evicts_first_and_nothing_is_handed_over_meanwhile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Low-priority pods take 6 of each node's 8 cpu; ``urgent`` (8 cpu) arrives with as
    many 1-cpu pods as the other nodes have room for. The coordinator asks the victim's
    shard to evict it and, in the same pass, hands ``urgent`` to that node, after the
    request in the shard's partition (the shard evicts, then places: one scheduler
    evicts and places in one step); it hands nothing else over in that pass. Then
    the small pods are placed beside the low ones."""
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
    asked = [(p, env, e) for p in range(shards) for env, e in found(parts, PreemptionRequested, p)]
    ((shard, request_env, request),) = asked
    assert request.victims == {victim: "default/urgent"}
    gone = [env for env, e in found(parts, PodPreempted, shards) if e.pod == victim]
    assert len(gone) == 1 and gone[0].stream == RELAY
    placements = [
        (env.causation, env.offset, p, keys)
        for p in range(shards)
        for env, e in found(parts, PodRouted, p) + found(parts, ReservationRequested, p)
        for keys in [[e.pod.key] if isinstance(e, PodRouted) else [s.key for s in e.pods]]
        if env.time == 20 * SECOND
    ]
    assert sorted(k for *_, keys in placements for k in keys) == sorted([*smalls, "default/urgent"])
    ((cause, offset, where),) = [
        (c, o, p) for c, o, p, keys in placements if keys == ["default/urgent"]
    ]
    assert (cause, where) == (request_env.causation, shard)
    assert offset > request_env.offset  # after the request, in the shard's partition
    assert all(c > cause for c, _, _, keys in placements if keys != ["default/urgent"])


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
