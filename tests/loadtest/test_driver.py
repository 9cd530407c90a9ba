from __future__ import annotations

import random
from pathlib import Path

import pytest

from events.filelog import FileLog
from events.memory import MemoryLog
from loadtest.driver import LoadShape, run_loadtest
from loadtest.synthetic import NODE_CPUS, POD_MILLICPU, basic_nodes, basic_pods
from shards.replay import replay


def test_synthetic_shapes_are_seeded_and_in_range() -> None:
    nodes = basic_nodes(100, random.Random(1))
    assert nodes == basic_nodes(100, random.Random(1))
    assert {n.allocatable["cpu"] // 1000 for n in nodes} <= set(NODE_CPUS)
    pods = basic_pods(100, random.Random(1))
    assert {p.requests["cpu"] for p in pods} <= set(POD_MILLICPU)
    assert len({p.key for p in pods}) == 100


async def test_small_run_reports_and_replays() -> None:
    log = MemoryLog()
    seen: list[int] = []
    result = await run_loadtest(
        LoadShape(nodes=40, pods=500, batch=100), log, progress=lambda d, t, e: seen.append(d)
    )
    assert seen == [100, 200, 300, 400, 500]
    assert result["bound"] == 500 and result["attempts"] == 500
    assert result["latency_ms"]["p50"] <= result["latency_ms"]["p99"] <= result["latency_ms"]["max"]
    assert result["events"] == 1 + 40 + 500 + 500
    verified = replay(await log.read(0, 0), verify=True)
    assert verified.mismatch is None and verified.verified == 500


async def test_window_sets_how_many_batches_wait_for_one_pass() -> None:
    """``window`` N: the shard polls once every N batches (and after the last), so
    progress comes in steps of N batches; 0: one pass after everything is appended.
    Every pod is decided whatever the window, and the log replays."""
    for window, steps in ((2, [200, 400, 500]), (0, [500]), (5, [500]), (7, [500])):
        log = MemoryLog()
        seen: list[int] = []
        shape = LoadShape(nodes=40, pods=500, batch=100, window=window)
        result = await run_loadtest(shape, log, progress=lambda d, t, e, s=seen: s.append(d))
        assert seen == steps, (window, seen)
        assert result["bound"] == 500 and result["shape"]["window"] == window
        assert replay(await log.read(0, 0), verify=True).mismatch is None


async def test_file_bus(tmp_path: Path) -> None:
    log = FileLog(tmp_path / "load.events")
    result = await run_loadtest(LoadShape(nodes=10, pods=50, batch=25), log, bus="file")
    await log.close()
    assert result["shape"]["bus"] == "file" and result["bound"] == 50


async def test_gang_workload_keeps_gangs_whole_and_replays() -> None:
    log = MemoryLog()
    result = await run_loadtest(LoadShape(nodes=30, pods=100, batch=16, gang_size=5), log)
    assert result["bound"] == 100 and result["gangs_scheduled"] == 20
    records = await log.read(0, 0)
    verified = replay(records, verify=True)
    assert verified.mismatch is None


def test_gang_batches_never_split_a_gang() -> None:
    from events.types import PodGroupSubmitted, PodSubmitted
    from loadtest.driver import _batches

    batches = _batches(LoadShape(pods=100, batch=16, gang_size=5), random.Random(0))
    for batch in batches:
        groups = sum(1 for e in batch if isinstance(e, PodGroupSubmitted))
        assert sum(1 for e in batch if isinstance(e, PodSubmitted)) == 5 * groups


async def test_stress_shapes_run_and_stay_bounded() -> None:
    from loadtest.stress import run

    churned = await run("churn", nodes=3, pods=300)
    assert churned["succeeded"] == 300
    # bounded requeueing: retries stay a small multiple of the pods, not pods x completions
    assert churned["attempts"] < 300 * 4
    preempted = await run("preempt", nodes=5, pods=400)
    assert preempted["preempted"] > 0 and preempted["failed"] == preempted["preempted"]


async def test_recovery_from_a_snapshot_is_measured_and_reaches_the_same_state() -> None:
    from loadtest.recovery import run_recovery

    steps: list[str] = []
    result = await run_recovery(60, 400, snapshot_every=300, starts=1, progress=steps.append)
    assert result["same_state"] is True
    assert result["snapshots"] >= 2 and result["snapshot_bytes"] > 0
    assert 0 <= result["restored_from"] < result["records"]
    assert 0 < result["records_replayed_after_snapshot"] < result["records"]
    assert set(result["recover_seconds"]) == {"from_snapshot", "from_start"}
    # a real shard process started on the log decided the new pod; its phases in order
    process = result["process_start"]
    ended = process["phase_ended_seconds"]
    assert process["starts"] == 1
    assert 0 < ended["started"] <= ended["recovered"] <= process["first_decision_seconds"]
    assert len(steps) == 5


async def test_sharded_harness_dates_each_decision_by_the_count_that_first_held_it() -> None:
    """The harness counts decisions while the shards work and reads them afterwards:
    each must get the time of the poll whose count first included it, on the log server
    (which counts) and on a log that cannot count (read as it goes)."""
    from events.remote import LogServer, RemoteLog
    from events.types import Envelope, PodBound, PodRouted, PodUnschedulable
    from loadtest.sharded import _Decisions

    def bound(pod: str) -> Envelope:
        return Envelope(
            event=PodBound(pod=pod, node="n", decision_id=pod, attempt=1), producer="shard-0"
        )

    routed = Envelope(event=PodRouted(pod=basic_pods(1, random.Random(0))[0]))
    waiting = Envelope(event=PodUnschedulable(pod="ns/c", attempt=1, reason="full"))

    async def check(log: RemoteLog | MemoryLog) -> None:
        await log.append([routed, bound("ns/a")])
        tracker = _Decisions(log, 0, 0)
        assert await tracker.poll(1.0) == 1
        assert await tracker.poll(2.0) == 0
        await log.append([routed, bound("ns/b"), waiting])
        assert await tracker.poll(3.0) == 2
        await log.append([bound("ns/late")])  # appended after the last count
        got = [(at, env.event) for at, env in await tracker.new()]
        assert got == [
            (1.0, bound("ns/a").event),
            (3.0, bound("ns/b").event),
            (3.0, waiting.event),
        ]
        assert tracker.read_to == 5 and await tracker.new() == []
        assert await tracker.poll(4.0) == 1
        assert [(at, env.event.pod) for at, env in await tracker.new()] == [(4.0, "ns/late")]

    await check(MemoryLog())
    async with LogServer(1) as server:
        remote = await RemoteLog.connect(server.url)
        await check(remote)
        await remote.close()


def test_progress_is_a_line_per_tenth_into_a_pipe_and_throttled_on_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from loadtest.render import LoadtestProgress

    piped = LoadtestProgress(interactive=False)
    for done in [0, 0, 5, 10, 10, 11, 55, 99, 100, 100]:
        piped(done, 100, done / 10)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[1] for line in lines] == ["0/100", "10/100", "55/100", "99/100", "100/100"]

    terminal = LoadtestProgress(interactive=True)
    for done, elapsed in [(1, 0.0), (2, 0.1), (3, 0.3), (4, 0.35), (100, 0.36), (100, 0.5)]:
        terminal(done, 100, elapsed)
    err = capsys.readouterr().err
    shown = [part.split()[1] for part in err.strip("\n").split("\r") if part]
    assert shown == ["1/100", "3/100", "100/100"]  # 2 and 4 within 0.2 s; 100 once
    assert err.endswith("\n")


@pytest.mark.parametrize(
    ("workload", "bound"),
    [
        # 30 nodes: the 1,000 init pods with anti-affinity hold 30 of them (one each),
        # so none of the measured ones fits
        ("SchedulingPodAntiAffinity", 0),
        ("TopologySpreading", 60),
        ("PreferredTopologySpreading", 60),
        ("SchedulingBasic", 60),
    ],
)
async def test_scheduler_perf_workloads_run_and_replay(workload: str, bound: int) -> None:
    log = MemoryLog()
    shape = LoadShape(nodes=30, pods=60, batch=20, workload=workload)
    result = await run_loadtest(shape, log)
    assert result["bound"] == bound
    assert result["shape"]["workload"] == workload
    records = await log.read(0, 0)
    verified = replay(records, verify=True)
    assert verified.mismatch is None
    nodes: dict[str, list[str]] = {}
    for env in records:
        if type(env.event).__name__ == "PodBound":
            nodes.setdefault(env.event.node, []).append(env.event.pod)  # type: ignore[union-attr]
    if workload == "SchedulingPodAntiAffinity":
        assert all(len(pods) == 1 for pods in nodes.values())  # one green pod per node
