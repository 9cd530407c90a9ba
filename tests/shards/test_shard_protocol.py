"""A shard's side of the coordinator's protocol: reservation parts granted, held,
committed, expiring and aborted on a shard's engine fed record by record, and binds that
fail (a member handed back, a gang rolled back whole only below ``minMember``, and with
it the members still on their way to a shard alone)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

import shards.simulate as simulate_module
from engine.engine import Engine
from engine.model.pools import POOL_LABEL, Sharding
from engine.model.reservations import COMMITTED, HELD, ReservationState
from events.types import (
    SECOND,
    BindFailed,
    ClockTicked,
    Envelope,
    Event,
    GroupSpec,
    PodBound,
    PodGroupSubmitted,
    PodHandedBack,
    PodRejected,
    PodRouted,
    PodSubmitted,
    PodSucceeded,
    PodUnbound,
    PreemptionRequested,
    ReservationAborted,
    ReservationCommitted,
    ReservationDenied,
    ReservationGranted,
    ReservationReleased,
    ReservationRequested,
)
from shards.cluster import SimulatedCluster
from tests.builders import make_node, make_pod
from tests.shards.coordinator_kit import (
    SHARDS,
    Control,
    Shard,
    at,
    bound,
    handed_to_shard,
    live_bindings,
    only,
    pinned,
    records,
    sent,
    simulated,
)

# ------------------------------------------------------- a shard's side of reservations


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
    # nothing bound yet; each member's GPU card said (n1's two members on two cards)
    devices = {"ml/m0": (0,), "ml/m1": (0,), "ml/m2": (1,)}
    assert grant == ReservationGranted(
        rid="ml/g#5", group="ml/g#5", placements=chosen, shard=0, devices=devices
    )
    engine = shard.engine
    assert state_of(engine, "ml/g#5") == HELD
    held = {key: engine.state.names[p.slot] for key, p in engine.state.pods.items()}
    assert held == chosen
    out = shard(ReservationCommitted(rid="ml/g#5"))
    assert out == [
        PodBound(
            pod=key,
            node=node_name,
            decision_id=f"{key}@ml/g#5",
            attempt=1,
            devices=devices[key],
        )
        for key, node_name in chosen.items()
    ]
    assert state_of(engine, "ml/g#5") == COMMITTED
    assert shard(ReservationCommitted(rid="ml/g#5")) == []  # told twice: bound once


def _swap(*, leaving: bool) -> tuple[Shard, ReservationRequested]:
    """A shard whose node n0 (4 CPUs) runs x (4 CPUs); part ``ml/y/moves#7`` moves y (4
    CPUs) here onto n0 from another shard's node, as x moves to another shard in the same
    plan (``leaving``: the part says so)."""
    shard = Shard(make_node("n0").cpu("4").added())
    shard(PodSubmitted(pod=make_pod("x", "ml").cpu("4").spec()), producer="ingest")
    assert shard.engine.state.pods["ml/x"]
    group = GroupSpec(namespace="ml", name="y/moves#7", min_member=1, uid="ml/y/moves#7")
    y = make_pod("y", "ml").cpu("4").member(group.key).spec()
    request = ReservationRequested(
        rid="ml/y/moves#7",
        group=group,
        pods=(y,),
        expires_at=10 * SECOND,
        placements={"ml/y": "n0"},
        moves={"ml/y": "m9"},
        moved_for="ml/w",
        leaving={"ml/x": "n0"} if leaving else {},
    )
    return shard, request


def test_a_part_counts_the_pods_its_plan_takes_elsewhere_as_gone_and_commits_them_away() -> None:
    """Without ``leaving`` the part is refused (x still runs on n0); with it, x is taken
    off n0 while the part is held, y moves in when it is committed, and x is gone here."""
    shard, refused = _swap(leaving=False)
    (denial,) = shard(refused)
    assert isinstance(denial, ReservationDenied)
    shard, request = _swap(leaving=True)
    (grant,) = shard(request)
    assert isinstance(grant, ReservationGranted)
    engine = shard.engine
    assert "ml/x" not in engine.state.pods and engine.reservations[request.rid].lifted == {
        "ml/x": ()
    }
    out = shard(ReservationCommitted(rid=request.rid))
    assert [type(e).__name__ for e in out] == ["PodMigrated"]
    assert "ml/x" not in engine.pods and engine.state.pods["ml/y"].slot == 0
    engine.state.check_invariants()


def test_a_part_let_go_puts_back_the_pods_its_plan_was_to_take_elsewhere() -> None:
    """Aborted while held (another shard refused its part of the plan): y is let go and
    x runs on n0 again, as before."""
    shard, request = _swap(leaving=True)
    shard(request)
    out = shard(ReservationAborted(rid=request.rid, reason="another part was refused"))
    assert [type(e).__name__ for e in out] == ["ReservationReleased"]
    engine = shard.engine
    assert engine.state.pods["ml/x"].slot == 0 and "ml/y" not in engine.state.pods
    assert "ml/x" in engine.bindings
    engine.state.check_invariants()


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
    is placed again (under a part of its own) and the others keep their bindings."""
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
        # w0 alone is placed again, as a member of a running gang: under a one-pod part
        # of its own, which a later rollback of the gang would abort on its shard too
        (again,) = [r for r in records(parts, ReservationRequested) if r.rid != first]
        assert [p.key for p in again.pods] == ["ml/w0"] and again.at_once
        assert final == {k: f"{k}@{first}" for k in keys[1:]} | {"ml/w0": f"ml/w0@{again.rid}"}
        assert data["groups"]["ml/g"]["phase"] == "Scheduled"


def test_a_part_whose_only_pod_failed_to_bind_is_forgotten_once_the_pod_ran() -> None:
    """The coordinator places ``p`` itself (its shard handed it back once) and hands it
    to the node it chose; the bind fails, ``p`` is placed again (handed over, this
    time) and runs to the end: nothing of the first decision may be left on either
    side."""
    control, last = handed_to_shard(2)
    out = control.report(last, PodHandedBack(pod="default/p", reason="no node", shard=last))
    _, request = only(out, PodRouted)
    assert request.node == "a"
    shard = Shard(make_node("a").cpu("6").label(POOL_LABEL, "pa").added())
    (first,) = shard(request)
    assert isinstance(first, PodBound) and first.node == "a"
    assert first.decision_id == request.decision_id
    control.placed(last, {"default/p": "a"}, 1)
    assert control.coordinator.directed == {}
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


@pytest.mark.parametrize("timed_out", [False, True], ids=["in-time", "timed-out"])
def test_a_rollback_lets_go_of_a_member_still_on_its_way_to_its_shard(timed_out: bool) -> None:
    """Gang ``ml/g`` (minMember 2, 5 s to run) is handed whole to shard 0 and granted;
    ``m2``, a member beyond minMember that only pool pb's node fits, is handed to shard 1
    alone, under a part of its own. Before shard 1 answers, ``m0`` fails to bind: the
    gang is rolled back, and ``m2``'s part is aborted in the same pass, as ``m1``'s
    binding is taken back. Past the gang's time-out the gang fails in that pass too
    (its pending members rejected): shard 1, which grants and binds ``m2`` meanwhile,
    must still let it go, or it would hold a pod the coordinator has forgotten. In time,
    the gang waits until both shards have let go."""
    control = Control(pinned(2, pa=0, pb=1))
    a0 = make_node("a0").cpu("8").gpu(2).label(POOL_LABEL, "pa").added()
    b0 = make_node("b0").cpu("8").gpu(2).label(POOL_LABEL, "pb").added()
    control.input(a0, b0)

    def member(i: int, pool: str) -> PodSubmitted:
        spec = make_pod(f"m{i}", "ml").cpu("1").gpu(1).member("ml/g").selector(**{POOL_LABEL: pool})
        return spec.submitted()

    gang = GroupSpec(namespace="ml", name="g", min_member=2, timeout=5 * SECOND)
    out = control.input(PodGroupSubmitted(group=gang), member(0, "pa"), member(1, "pa"))
    partition, whole = only(out, ReservationRequested)
    assert partition == 0 and whole.at_once
    shard0, shard1 = Shard(a0), Shard(b0)
    grant, *binds = shard0(whole)
    assert isinstance(grant, ReservationGranted) and len(binds) == 2
    control.report(0, grant)
    partition, alone = only(control.input(member(2, "pb"), time=1), ReservationRequested)
    assert partition == 1 and [p.key for p in alone.pods] == ["ml/m2"]
    m0 = next(b for b in binds if isinstance(b, PodBound) and b.pod == "ml/m0")
    failed = BindFailed(pod="ml/m0", node="a0", decision_id=m0.decision_id, reason="409")
    (handback,) = shard0(failed, producer="binder", time=2)
    rollback = control.report(0, handback, time=6 if timed_out else 2)
    aborts = {(p, e.rid) for p, e in sent(rollback, ReservationAborted)}
    assert aborts == {(0, whole.rid), (1, alone.rid)}
    assert not sent(rollback, ReservationRequested)
    assert bool(sent(rollback, PodRejected)) == timed_out
    # shard 1 took the part on before the abort reached it: it lets go of what it bound
    granted, bound_m2 = shard1(alone, time=2)
    assert isinstance(granted, ReservationGranted) and isinstance(bound_m2, PodBound)
    assert not sent(control.report(1, granted), ReservationRequested)  # too late: ignored
    let_go = shard1(*[e for p, e in rollback if p == 1], time=6)
    assert [type(e) for e in let_go] == [PodUnbound, ReservationReleased]
    assert shard1.engine.state.pods == {}
    assert not sent(control.report(1, *let_go), ReservationRequested)  # shard 0 holds m1
    out = control.report(0, *shard0(*[e for p, e in rollback if p == 0], time=6))
    requests = sent(out, ReservationRequested)
    if timed_out:  # nothing left of the gang on either side
        assert control.coordinator.claims == {} and control.coordinator.held_by == {}
        assert requests == [] and shard0.engine.state.pods == {}
    else:  # both have let go: the gang is placed again, whole
        assert {p.key for _, r in requests for p in r.pods} == {"ml/m0", "ml/m1", "ml/m2"}


@pytest.mark.parametrize("first", [True, False])
def test_a_pod_handed_to_a_node_goes_there_or_back(first: bool) -> None:
    """The coordinator chose node ``b`` on its view of every shard: the shard places the
    pod there though ``a`` scores higher here (emptier), on the cards named where they
    are free; where ``b`` no longer has room, the pod goes back, and nowhere else."""
    shard = Shard(
        make_node("a").cpu("8").gpu(2).added(),
        make_node("b").cpu("8").gpu(2).added(),
    )
    if not first:
        hog = make_pod("hog").cpu("7").spec()
        (placed,) = shard(PodRouted(pod=hog, decision_id="default/hog#1", node="b"))
        assert isinstance(placed, PodBound) and placed.node == "b"
    pod = make_pod("p").cpu("2").gpu(1).spec()
    answer = shard(PodRouted(pod=pod, decision_id="default/p#7", node="b", devices=(1,)))
    if first:
        (bound,) = answer
        assert isinstance(bound, PodBound)
        assert (bound.node, bound.devices, bound.decision_id) == ("b", (1,), "default/p#7")
    else:
        (back,) = answer
        assert isinstance(back, PodHandedBack) and back.pod == "default/p"
        assert "default/p" not in shard.engine.state.pods


@pytest.mark.parametrize("together", [True, False])
def test_a_victim_handed_to_a_node_is_evicted_before_what_comes_after_it(together: bool) -> None:
    """The coordinator handed ``old`` to node ``a``, then (before the shard placed it)
    decided ``urgent`` there, evicting ``old``: one scheduler places ``old``, evicts it
    and places ``urgent``. The shard, reading the three records in one pass or the
    first in a pass of its own, does the same: ``urgent`` is not handed back for want
    of the room ``old`` was to leave."""
    shard = Shard(make_node("a").cpu("4").added())
    old = PodRouted(pod=make_pod("old").cpu("3").spec(), decision_id="default/old#1", node="a")
    urgent_spec = make_pod("urgent").cpu("3").priority(100).spec()
    urgent = PodRouted(pod=urgent_spec, decision_id="default/urgent#2", node="a")
    evict = PreemptionRequested(victims={"default/old": "default/urgent"})
    if together:
        answer = shard(old, evict, urgent)
    else:
        answer = shard(old) + shard(evict, urgent)
    kinds = [(type(e).__name__, getattr(e, "pod", "")) for e in answer]
    assert ("PodPreempted", "default/old") in kinds
    assert ("PodBound", "default/urgent") in kinds
    assert not any(isinstance(e, PodHandedBack) for e in answer)
    assert set(shard.engine.state.pods) == {"default/urgent"}
