"""Several shards under random interleavings, crashes, lost appends and refused binds.

The coordinator's protocol (units handed over and handed back, reservations prepared,
granted or denied, committed or aborted, evictions) is driven by
:mod:`tests.shards.chaos`; whatever the schedule,
at the end: no gang partially bound (checked at every quiet point too), no pod bound
twice, no reservation left open, no pod lost, no node over-committed, no quota above
its max, and a log that replays exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from engine.model.pools import Sharding
from events.types import (
    SECOND,
    GroupSpec,
    PodGroupSubmitted,
    PodSpec,
    PodSubmitted,
    PodUnschedulable,
)
from shards.inputs.scenario import Scenario, TimedEvent
from shards.replay import replay_routed
from tests.builders import make_node
from tests.shards.chaos import (
    describe,
    leaked_reservations,
    run_chaos,
    unknown_to_the_coordinator,
)

GPU_POD = {"cpu": 1000, "nvidia.com/gpu": 1}


@st.composite
def spanning_scenario(draw: Any) -> tuple[Scenario, dict[str, int], dict[str, str]]:
    """Small GPU nodes, gangs that often need several shards, ordinary pods between;
    some jobs applied again under their group's name (another PodGroup uid, new pods),
    sometimes while the first run still runs. Returns the scenario, minMember by gang
    (a second run as ``ml/gN#2``) and the pods of second runs → that name."""
    items: list[tuple[int, Any]] = []
    for i in range(draw(st.integers(2, 6))):
        node = make_node(f"n{i}").cpu("16").gpu(draw(st.sampled_from([1, 2, 4])))
        items.append((draw(st.integers(0, 3)), node.added()))
    minimum: dict[str, int] = {}
    runs_of: dict[str, str] = {}
    for g in range(draw(st.integers(1, 3))):
        size = draw(st.integers(2, 12))
        need = draw(st.integers(1, size))
        timeout = draw(st.one_of(st.none(), st.integers(20, 120)))
        key = f"ml/g{g}"
        minimum[key] = need
        spec = GroupSpec(
            namespace="ml",
            name=f"g{g}",
            min_member=need,
            timeout=None if timeout is None else timeout * SECOND,
            priority=draw(st.sampled_from([0, 100])),
        )
        at = draw(st.integers(0, 10))
        runtime = draw(st.integers(5, 60)) * SECOND
        runs = [(1, at)]
        if draw(st.booleans()):
            # after the first run's last pod came (a pod created after the PodGroup was
            # created again is the new run's: pods join a group by its name)
            runs.append((2, at + 3 + draw(st.integers(0, 80))))
        for run, start in runs:
            label = key if run == 1 else f"{key}#{run}"
            minimum[label] = need
            uid = f"g{g}-{run}" if len(runs) > 1 else ""
            items.append((start, PodGroupSubmitted(group=msgspec.structs.replace(spec, uid=uid))))
            for m in range(size):
                name = f"g{g}-{m}" if run == 1 else f"g{g}-r{run}-{m}"
                pod = PodSpec(
                    namespace="ml",
                    name=name,
                    uid=f"{name}-{run}" if uid else "",
                    requests={"cpu": 1000, "nvidia.com/gpu": 1},
                    group=key,
                    runtime=runtime,
                )
                if run > 1:
                    runs_of[pod.key] = label
                items.append((start + draw(st.integers(0, 2)), PodSubmitted(pod=pod)))
    for p in range(draw(st.integers(0, 8))):
        pod = PodSpec(
            namespace="web",
            name=f"p{p}",
            requests={"cpu": draw(st.sampled_from([1000, 4000])), "nvidia.com/gpu": 1},
            runtime=draw(st.integers(5, 60)) * SECOND,
            priority=draw(st.sampled_from([0, 10])),
        )
        items.append((draw(st.integers(0, 30)), PodSubmitted(pod=pod)))
    events = [TimedEvent(t * SECOND, i, e) for i, (t, e) in enumerate(items)]
    events.sort(key=lambda e: (e.time, e.order, not isinstance(e.event, PodGroupSubmitted)))
    return Scenario(events=events), minimum, runs_of


CHAOS = given(
    spanning_scenario(),
    st.integers(2, 4),
    st.integers(0, 2**32 - 1),
    st.sampled_from([(0.0, 0.0, 0.0), (0.05, 0.05, 0.05), (0.15, 0.1, 0.1)]),
    st.sampled_from([0, 4, 25]),
)
"""The cases of the chaos search: a scenario, the shards, the driver's seed, the faults
(lost appends, restarts, refused binds) and how often snapshots are written."""
Case = tuple[Scenario, dict[str, int], dict[str, str]]


@settings(deadline=None)
@CHAOS
async def test_coordinator_protocol_under_faults(
    case: Case, shards: int, seed: int, faults: tuple[float, ...], snapshot_every: int
) -> None:
    """The protocol's invariants under faults, with shards writing snapshots in some
    runs: a restarted shard then restores the newest one, and replay checks each
    against the state it re-derives."""
    await _keeps_the_invariants(case, shards, seed, faults, snapshot_every)


@pytest.mark.slow
@settings(deadline=None, max_examples=400)
@CHAOS
async def test_coordinator_protocol_under_faults_deeply(
    case: Case, shards: int, seed: int, faults: tuple[float, ...], snapshot_every: int
) -> None:
    """The same search, deeper (400 cases: some 10 minutes on two cores; the suite's
    test above draws the profile's 25 or 60). Not in the suite: run it before a release
    with ``pytest -m slow tests/shards/test_shards_properties.py``. Keep what it finds
    in ``tests/fixtures/chaos/`` (replayed by the suite below)."""
    await _keeps_the_invariants(case, shards, seed, faults, snapshot_every)


async def _keeps_the_invariants(
    case: Case, shards: int, seed: int, faults: tuple[float, ...], snapshot_every: int
) -> None:
    scenario, minimum, runs = case
    loss, restart, refuse = faults
    sharding = Sharding(shards=shards, reservation_timeout=10 * SECOND)
    result = await run_chaos(
        scenario,
        sharding,
        seed=seed,
        loss=loss,
        restart=restart,
        refuse=refuse,
        min_members=minimum,
        snapshot_every=snapshot_every,
        runs=runs,
    )
    context = describe(result)
    assert result.partial_gangs == [], context
    assert result.cluster.double_binds == 0, context
    assert leaked_reservations(result) == [], context
    assert unknown_to_the_coordinator(result) == [], context
    result.cluster.check_invariants()
    for engine in result.engines:
        engine.state.check_invariants()
        assert list(engine.quotas.check()) == []
    submitted = [e.event.pod.key for e in scenario.events if isinstance(e.event, PodSubmitted)]
    for key in submitted:
        view = result.report.pods[key]
        assert view.phase in {"Bound", "Pending", "Succeeded", "Failed"}, (key, context)
        assert view.phase != "Pending" or view.reason, (key, context)
        if view.phase == "Pending":
            view = result.control.engine
            held = key in view.pods or any(
                key in {p.key for p in waiting} for _, waiting in view.next_runs.values()
            )
            assert held, f"{key} is pending but nobody holds it; {context}"
    parts = [await result.log.read(p, 0) for p in range(shards + 1)]
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, (str(verified.mismatch), context)
    assert verified.unforwarded == 0, context
    held_back = any(
        isinstance(env.event, PodUnschedulable) and "run of pod group" in env.event.reason
        for records in parts
        for env in records
    )
    event("a run waited for the one before it" if held_back else "no run waited")


async def test_snapshots_do_not_depend_on_when_the_driver_asked_for_a_wake_up() -> None:
    """A case the search above found: a gang rolled back after a refused bind backs its
    members off again while earlier back-off records are still queued; the driver's
    wake-up questions drop those between passes, the replay's do not. The snapshot shard
    0 wrote after that must still equal the state replay derives."""
    events: list[Any] = [make_node("n0").cpu("16").gpu(1).added()]
    events += [make_node(f"n{i}").cpu("16").gpu(4).added() for i in (1, 2)]
    web = [
        PodSpec(namespace="web", name=f"p{i}", requests=GPU_POD, runtime=5 * SECOND) for i in (0, 1)
    ]
    events += [PodSubmitted(pod=pod) for pod in web]
    timed = [TimedEvent(0, i, e) for i, e in enumerate(events)]
    gang = GroupSpec(namespace="ml", name="g0", min_member=8)
    timed.append(TimedEvent(SECOND, len(timed), PodGroupSubmitted(group=gang)))
    for m in range(10):
        pod = PodSpec(
            namespace="ml", name=f"g0-{m}", requests=GPU_POD, group="ml/g0", runtime=5 * SECOND
        )
        timed.append(TimedEvent(SECOND, len(timed), PodSubmitted(pod=pod)))
    sharding = Sharding(shards=2, reservation_timeout=10 * SECOND)
    result = await run_chaos(
        Scenario(events=timed),
        sharding,
        seed=3,
        loss=0.05,
        restart=0.05,
        refuse=0.05,
        min_members={"ml/g0": 8},
        snapshot_every=25,
    )
    parts = [await result.log.read(p, 0) for p in range(3)]
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, str(verified.mismatch)
    assert verified.snapshots >= 2


async def test_a_pass_that_reports_nothing_does_not_change_what_later_passes_report() -> None:
    """A case the search above found: the coordinator folds a placement of gang g1 and
    its failed bind, runs a pass that reports nothing (g1's status is as last reported,
    so nothing reaches the log and replay cannot know the pass ran), then a summary that
    changes g0 and g1. The report must name them in the same order with or without the
    silent pass (groups are reported in the order of their keys)."""

    def gpu(namespace: str, name: str, group: str, runtime: int) -> PodSubmitted:
        spec = PodSpec(
            namespace=namespace, name=name, requests=GPU_POD, group=group, runtime=runtime
        )
        return PodSubmitted(pod=spec)

    web = {"cpu": 4000, "nvidia.com/gpu": 1}
    g0 = GroupSpec(namespace="ml", name="g0", min_member=4)
    g1 = GroupSpec(namespace="ml", name="g1", min_member=1)
    # (second, order, event): the order the search drew them in, which the run follows
    items: list[tuple[int, int, Any]] = [
        (0, 0, make_node("n0").cpu("16").gpu(1).added()),
        (0, 2, make_node("n2").cpu("16").gpu(2).added()),
        (0, 5, PodGroupSubmitted(group=g0)),
        *((0, o, gpu("ml", f"g0-{m}", "ml/g0", 5 * SECOND)) for m, o in _G0_AT_0),
        (
            0,
            27,
            PodSubmitted(pod=PodSpec(namespace="web", name="p0", requests=web, runtime=8 * SECOND)),
        ),
        (
            0,
            28,
            PodSubmitted(
                pod=PodSpec(
                    namespace="web", name="p1", requests=web, priority=10, runtime=7 * SECOND
                )
            ),
        ),
        (1, 3, make_node("n3").cpu("16").gpu(1).added()),
        (1, 4, make_node("n4").cpu("16").gpu(4).added()),
        *((1, 6 + m, gpu("ml", f"g0-{m}", "ml/g0", 5 * SECOND)) for m in (4, 6, 7, 8)),
        (2, 1, make_node("n1").cpu("16").gpu(4).added()),
        (2, 9, gpu("ml", "g0-3", "ml/g0", 5 * SECOND)),
        (6, 17, PodGroupSubmitted(group=g1)),
        (6, 25, gpu("ml", "g1-7", "ml/g1", 47 * SECOND)),
        *(
            (7, o, gpu("ml", f"g1-{m}", "ml/g1", 47 * SECOND))
            for m, o in ((2, 20), (3, 21), (6, 24))
        ),
        *((8, o, gpu("ml", f"g1-{m}", "ml/g1", 47 * SECOND)) for m, o in _G1_AT_8),
    ]
    timed = [TimedEvent(t * SECOND, order, e) for t, order, e in items]
    result = await run_chaos(
        Scenario(events=timed),
        Sharding(shards=2, reservation_timeout=10 * SECOND),
        seed=6,
        loss=0.05,
        restart=0.05,
        refuse=0.05,
        min_members={"ml/g0": 4, "ml/g1": 1},
        snapshot_every=0,
    )
    parts = [await result.log.read(p, 0) for p in range(3)]
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, str(verified.mismatch)
    assert result.partial_gangs == [] and leaked_reservations(result) == []


_G0_AT_0 = ((0, 6), (1, 7), (2, 8), (5, 11), (9, 15), (10, 16))
_G1_AT_8 = ((0, 18), (1, 19), (4, 22), (5, 23), (8, 26))


FOUND = Path(__file__).parent.parent / "fixtures" / "chaos"


@pytest.mark.parametrize("name", sorted(p.name for p in FOUND.glob("*.json")))
async def test_cases_the_search_found_keep_the_invariants(name: str) -> None:
    """Cases the search above found (a deeper search than the suite's), kept as they
    were drawn. ``gang-member-alone``: a gang placed across shards is aborted (a part
    denied) while a member beyond minMember waits in the queue as a pod of its own; the
    gang is Pending again, so that member must wait with it, not run alone.
    ``rejected-after-a-failed-bind``: a member's bind fails and its gang times out in
    the same pass; the report, merging the partitions by time, must still end the pod
    Failed (the shard's record of the failed bind comes after the rejection). In both,
    a member handed to a shard alone once its gang ran, then rolled back with the gang,
    must be let go by its shard too (it was held there, unknown to the coordinator,
    which planned that node again and again). ``placed-again-before-let-go``: such a
    member, rolled back with its gang, must not be placed on another shard before its
    shard has let it go (the cluster would run it twice).
    ``held-after-the-coordinator-forgot``: such a member is still on its way to its
    shard (its part not answered) when another member's bind fails; the gang is rolled
    back and, past its time-out, fails in the same pass, which rejects the members not
    placed. The member's part must be aborted with the rollback: before, the shard
    granted and bound it later, and held it (and its room) for good, unknown to the
    coordinator, which had forgotten the pod. ``run-joined-by-an-earlier-pod``: a
    gang's first run is preempted whole, a pod of that run comes late, and the group is
    submitted again; that pod joins the new run (pods join a group by its name: it
    came when the first run was over) and starts with one of its pods: the check
    counts it under the run it joined. ``late-member-of-a-running-run``: a pod of the
    first run that waits for room while the first run runs starts as that run's, not
    the second's, although the second's PodGroup came meanwhile."""
    raw = msgspec.json.decode((FOUND / name).read_bytes())
    events = msgspec.convert(raw["events"], list[TimedEvent])
    loss, restart, refuse = raw["faults"]
    result = await run_chaos(
        Scenario(events=events),
        Sharding(shards=raw["shards"], reservation_timeout=10 * SECOND),
        seed=raw["seed"],
        loss=loss,
        restart=restart,
        refuse=refuse,
        min_members=raw["min_members"],
        snapshot_every=raw["snapshot_every"],
        runs=raw["runs"],
    )
    context = describe(result)
    assert result.partial_gangs == [], context
    assert result.cluster.double_binds == 0, context
    assert leaked_reservations(result) == [], context
    assert unknown_to_the_coordinator(result) == [], context
    view = result.control.engine
    for key, pod in result.report.pods.items():
        if pod.phase == "Pending":
            held = key in view.pods or any(
                key in {p.key for p in waiting} for _, waiting in view.next_runs.values()
            )
            assert held, f"{key} is reported pending but nobody holds it; {context}"
    parts = [await result.log.read(p, 0) for p in range(raw["shards"] + 1)]
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, (str(verified.mismatch), context)
