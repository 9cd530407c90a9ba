"""What the engine forgets, and when: finished pods and groups are kept for the
retention window (log time) and while a live unit depends on them, then forgotten;
groups' time-outs come from a heap of deadlines, not a scan of every group."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import SchedulerConfig, parse_config
from engine.engine import Engine
from engine.model.groups import FAILED, PENDING, SCHEDULED, SUCCEEDED, GroupInfo, advance
from engine.model.retention import Deadlines, Retired
from engine.snapshot import encode_state, restore
from events.types import (
    SECOND,
    ClockTicked,
    Event,
    GroupSpec,
    PodBound,
    PodGroupStatusChanged,
    PodGroupSubmitted,
    PodRejected,
    PodSucceeded,
    PodUnschedulable,
)
from tests.builders import env, make_node, make_pod

WINDOW = 60


def config(window: int = WINDOW) -> SchedulerConfig:
    return parse_config(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "finishedRetentionSeconds": window,
        }
    )


def feed(engine: Engine, *events: Event, at: float = 0) -> list[Event]:
    for event in events:
        engine.apply(env(event, at))
    return engine.schedule()


def bound(decisions: list[Event]) -> dict[str, str]:
    return {d.pod: d.node for d in decisions if isinstance(d, PodBound)}


def gang(name: str, size: int, *, timeout: int | None = None, uid: str = "") -> list[Event]:
    spec = GroupSpec(
        namespace="default",
        name=name,
        min_member=size,
        timeout=None if timeout is None else timeout * SECOND,
        uid=uid or name,
    )
    return [
        PodGroupSubmitted(group=spec),
        *(
            make_pod(f"{name}-{i}")
            .cpu("100m")
            .uid(f"{uid or name}-{i}")
            .group(spec.key)
            .submitted()
            for i in range(size)
        ),
    ]


def churn(engine: Engine, rounds: int, *, every: float = 10, size: int = 0) -> float:
    """``rounds`` times: a pod (or a gang of ``size``) arrives, runs ``every`` seconds and
    succeeds; return the time of the last round."""
    t = 0.0
    for n in range(rounds):
        t = n * every
        if size:
            out = feed(engine, *gang(f"g{n}", size, timeout=30), at=t)
        else:
            out = feed(engine, make_pod(f"p{n}").cpu("100m").uid(f"u{n}").submitted(), at=t)
        placed = bound(out)
        assert len(placed) == max(size, 1), out
        feed(engine, *(PodSucceeded(pod=key) for key in placed), at=t + every / 2)
    return t


def test_finished_pods_and_gangs_are_kept_for_the_window_only() -> None:
    """After many pods and gangs finished, the engine holds what finished within the
    window, not everything that ever ran (today's fails: it kept them all)."""
    engine = Engine(config())
    feed(engine, make_node("a").cpu("64").added())
    t = churn(engine, 200)  # 2,000 s of pods, one every 10 s
    assert not engine.pods
    # one window and the sweep's slack: about 60/10 pods, never 200
    assert 5 <= len(engine.outcomes) <= 12, len(engine.outcomes)
    assert set(engine.finished_uids) <= set(engine.outcomes)
    assert len(engine.retired) == len(engine.outcomes)
    gangs = Engine(config())
    feed(gangs, make_node("a").cpu("64").added())
    churn(gangs, 200, size=3)
    assert not gangs.pods
    assert len(gangs.groups) <= 12, len(gangs.groups)
    assert len(gangs.outcomes) <= 36
    # deadlines of the gangs over are dropped as their time passes: a pass looks at
    # the heap's due entries only, and it holds no more than a time-out's worth
    assert len(gangs.deadlines) <= 4, gangs.deadlines
    feed(gangs, ClockTicked(), at=t + 1000)
    assert len(gangs.groups) == 0 and len(gangs.outcomes) == 0 and len(gangs.deadlines) == 0


def test_the_snapshot_stays_the_same_size_as_pods_finish() -> None:
    sizes = []
    engine = Engine(config())
    feed(engine, make_node("a").cpu("64").added())
    for start in range(4):
        for n in range(start * 100, start * 100 + 100):
            out = feed(engine, make_pod(f"p{n}").cpu("100m").uid(f"u{n}").submitted(), at=n * 10)
            feed(engine, *(PodSucceeded(pod=k) for k in bound(out)), at=n * 10 + 5)
        sizes.append(len(encode_state(engine)))
    assert max(sizes) - min(sizes) < min(sizes) // 10, sizes


def test_a_dependency_within_the_window_is_met_and_past_it_is_not_found() -> None:
    engine = Engine(config())
    feed(engine, make_node("a").cpu("4").added(), make_pod("a").cpu("1").submitted())
    feed(engine, PodSucceeded(pod="default/a"), at=10)
    out = feed(engine, _depending("soon", "default/a"), at=10 + WINDOW - 1)
    assert bound(out) == {"default/soon": "a"}
    feed(engine, PodSucceeded(pod="default/soon"), at=10 + WINDOW)
    # a pass long after the window (and the sweep's slack): the name is forgotten (no
    # live unit names it any more), and a dependency on it waits as on a pod not seen
    feed(engine, ClockTicked(), at=10 + 3 * WINDOW)
    out = feed(engine, _depending("late", "default/a"), at=10 + 3 * WINDOW)
    assert bound(out) == {}
    (waiting,) = [d for d in out if isinstance(d, PodUnschedulable)]
    assert waiting.reason == "waiting for default/a to succeed (not found)"
    assert "default/a" not in engine.outcomes


def test_a_dependency_a_live_unit_names_is_kept_past_the_window() -> None:
    """A gang that depends on a pod is settled again whenever a member arrives: the
    pod's outcome is kept while the gang lives, however long it takes."""
    engine = Engine(config())
    feed(engine, make_node("a").cpu("8").added(), make_pod("a").cpu("1").submitted())
    feed(engine, PodSucceeded(pod="default/a"), at=1)
    spec = GroupSpec(namespace="default", name="job", min_member=3, depends_on=("default/a",))
    feed(engine, PodGroupSubmitted(group=spec), at=2)
    for i in range(2):  # members trickle in, far apart
        feed(engine, make_pod(f"w{i}").cpu("1").group("default/job").submitted(), at=5 * WINDOW * i)
    out = feed(engine, make_pod("w2").cpu("1").group("default/job").submitted(), at=12 * WINDOW)
    assert len(bound(out)) == 3
    assert engine.outcomes["default/a"] == SUCCEEDED


def test_the_same_pod_told_again_within_the_window_is_recognised() -> None:
    engine = Engine(config())
    feed(engine, make_node("a").cpu("4").added())
    pod = make_pod("web-0").cpu("1").uid("u1")
    assert bound(feed(engine, pod.submitted())) == {"default/web-0": "a"}
    feed(engine, PodSucceeded(pod="default/web-0"), at=1)
    assert feed(engine, pod.submitted(), at=WINDOW) == []  # a relist: the same pod
    other = make_pod("web-0").cpu("1").uid("u2")
    assert bound(feed(engine, other.submitted(), at=WINDOW + 1)) == {"default/web-0": "a"}
    feed(engine, PodSucceeded(pod="default/web-0"), at=WINDOW + 2)
    # past the window (a pass swept it) the name is forgotten: the same pod told again
    # is a new one
    feed(engine, ClockTicked(), at=4 * WINDOW)
    out = feed(engine, other.submitted(), at=4 * WINDOW)
    assert bound(out) == {"default/web-0": "a"}


def test_a_late_member_of_a_gang_over_is_refused_within_the_window() -> None:
    engine = Engine(config())
    feed(engine, make_node("a").cpu("4").added())
    spec = GroupSpec(namespace="default", name="job", min_member=1, source="labels")
    out = feed(
        engine, PodGroupSubmitted(group=spec), make_pod("w0").cpu("1").group(spec.key).submitted()
    )
    assert bound(out) == {"default/w0": "a"}
    feed(engine, PodSucceeded(pod="default/w0"), at=1)
    assert engine.groups["default/job"].phase == SUCCEEDED
    out = feed(engine, make_pod("w1").cpu("1").group(spec.key).submitted(), at=WINDOW)
    (rejected,) = [d for d in out if isinstance(d, PodRejected)]
    assert rejected.reason == "pod group default/job has already succeeded"
    feed(engine, ClockTicked(), at=4 * WINDOW)
    assert "default/job" not in engine.groups


def test_a_gang_rolled_back_past_its_deadline_times_out_at_the_next_pass() -> None:
    """The heap's entry of a Scheduled gang is dropped when its deadline passes; going
    back to Pending arms it again (as the scan of every group found it)."""
    engine = Engine(config())
    feed(engine, make_node("a").cpu("4").added())
    out = feed(engine, *gang("job", 2, timeout=10))
    assert len(bound(out)) == 2
    assert engine.next_wakeup() is None  # Scheduled: no time-out to wait for
    feed(engine, ClockTicked(), at=20)
    assert len(engine.deadlines) == 0
    group = engine.groups["default/job"]
    engine.pending_again(group, "rolled back")
    assert engine.timed_out() == [group]
    fresh = Engine(config())
    feed(fresh, *gang("slow", 3, timeout=10)[:2])
    assert fresh.next_wakeup() == 10 * SECOND
    out = feed(fresh, ClockTicked(), at=10)
    assert fresh.groups["default/slow"].phase == FAILED
    assert [d.phase for d in out if isinstance(d, PodGroupStatusChanged)] == [FAILED]


def test_forgetting_survives_a_snapshot() -> None:
    engine = Engine(config())
    feed(engine, make_node("a").cpu("64").added())
    churn(engine, 30, size=2)
    copy = restore(encode_state(engine), config())
    assert encode_state(copy) == encode_state(engine)
    assert copy.retired.at == engine.retired.at and copy.deadlines.heap == engine.deadlines.heap


def _depending(name: str, *deps: str) -> Event:
    from msgspec.structs import replace

    from events.types import PodSubmitted

    return PodSubmitted(pod=replace(make_pod(name).cpu("1").spec(), depends_on=deps))


# ---------------------------------------------------------------------- the heap's rule


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(("create", "schedule", "pend", "finish", "dispatch", "tick")),
            st.integers(0, 5),
            st.integers(0, 40),
        ),
        max_size=60,
    )
)
def test_the_heap_finds_what_a_scan_of_every_group_finds(ops: list[tuple[str, int, int]]) -> None:
    """Whatever groups do (created with a time-out, scheduled, rolled back, finished,
    handed elsewhere), the groups the heap says timed out, and the next deadline it
    gives, are those a scan of every group gives."""
    engine = Engine()
    for op, index, amount in ops:
        key = f"default/g{index}"
        group = engine.groups.get(key)
        if op == "create":
            spec = GroupSpec(
                namespace="default",
                name=f"g{index}",
                min_member=1,
                timeout=amount * SECOND,
                uid=f"u{index}-{amount}",
            )
            if group is not None and group.phase == PENDING:
                continue
            engine.groups.pop(key, None)
            engine.group_submitted(PodGroupSubmitted(group=spec))
        elif group is None:
            continue
        elif op == "schedule" and group.phase == PENDING:
            advance(group, SCHEDULED)
        elif op == "pend" and group.phase == SCHEDULED:
            engine.pending_again(group, "rolled back")
        elif op == "finish" and group.phase == SCHEDULED:
            advance(group, SUCCEEDED)
        elif op == "dispatch":
            unit = "@" + key
            if unit in engine.dispatched:
                del engine.dispatched[unit]
            else:
                engine.dispatched[unit] = "0"
        elif op == "tick":
            engine.now += amount * SECOND // 4
            expected_next = _scan_next(engine)
            assert engine.next_deadline() == expected_next
            expected = _scan_due(engine)
            due = engine.timed_out()
            assert [g.key for g in due] == [g.key for g in expected]
            for timed_out in due:
                advance(timed_out, FAILED, "timed out")


def _scan_due(engine: Engine) -> list[GroupInfo]:
    return [
        g
        for g in engine.groups.values()
        if g.phase == PENDING
        and g.deadline is not None
        and g.deadline <= engine.now
        and "@" + g.key not in engine.dispatched
    ]


def _scan_next(engine: Engine) -> int | None:
    times = [
        g.deadline
        for g in engine.groups.values()
        if g.phase == PENDING and g.deadline is not None and g.deadline > engine.now
    ]
    return min(times) if times else None


def test_retired_names_come_due_in_batches_oldest_first() -> None:
    retired = Retired(100)
    for t in range(50):
        retired.add(f"p{t}", t * SECOND)
    retired.add("p3", 60 * SECOND)  # over again later: its first entry is stale
    assert retired.due(100 * SECOND) == []  # the oldest is not a slack past due yet
    due = retired.due(140 * SECOND)
    assert due == [f"p{t}" for t in range(41) if t != 3]
    assert retired.due(1000 * SECOND) == [*(f"p{t}" for t in range(41, 50)), "p3"]
    deadlines = Deadlines()
    deadlines.arm(5, 0, "a")
    deadlines.arm(3, 1, "b")
    assert deadlines.next_after(0, lambda key, _: key == "a") == 5
    assert deadlines.due(4, lambda key, _: True) == [(3, 1, "b")]


async def test_a_sweep_between_recorded_passes_replays_exactly() -> None:
    """A pass that decides nothing leaves no record; forgetting happens in the fold, so
    a sweep at such a time (here: a clock tick past the window) is replayed alike, and
    the snapshot after the next recorded pass matches the state replay derives."""
    from events.memory import MemoryLog
    from events.types import Envelope, SchedulerConfigured
    from shards.replay import replay
    from shards.worker import ShardWorker

    log = MemoryLog()
    recorded = config()
    assert recorded.source is not None
    worker = ShardWorker(Engine(recorded), log, snapshot_every=1)

    async def at(seconds: float, *events: Event) -> None:
        await log.append([env(e, seconds) for e in events])
        await worker.poll()

    import json

    setup = SchedulerConfigured(config=json.dumps(recorded.source, sort_keys=True))
    await log.append([Envelope(event=setup, producer="ingest")])
    await at(0, make_node("n").cpu("4").added(), make_pod("a").cpu("1").submitted())
    await at(0.5, make_pod("c").cpu("1").submitted())
    await at(1, PodSucceeded(pod="default/a"))
    await at(30, PodSucceeded(pod="default/c"))
    await at(WINDOW + 9.5, ClockTicked())  # sweeps a (c is not due yet); decides nothing
    await at(95, make_pod("b").cpu("1").submitted())  # decides: recorded, snapshot after
    records = await log.read(0, 0)
    verified = replay(records, verify=True)
    assert verified.mismatch is None, verified.mismatch
    assert verified.snapshots > 0
    assert "default/a" not in worker.engine.outcomes and "default/c" in worker.engine.outcomes


def test_the_heap_is_written_in_one_layout_whatever_the_pops() -> None:
    """Passes that decide nothing are not replayed, and they may pop stale entries: the
    snapshot writes the heap sorted, so equal entries give equal bytes."""
    one, other = Deadlines(), Deadlines()
    for deadline in (5, 1, 4, 2, 3):
        one.arm(deadline, deadline, f"g{deadline}")
    for deadline in (1, 2, 3, 4, 5, 0):
        other.arm(deadline, deadline, f"g{deadline}")
    other.due(0, lambda key, _: True)
    assert one.heap != other.heap
    one.compact()
    other.compact()
    assert one.heap == other.heap
