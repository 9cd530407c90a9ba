"""``shoal loadtest --churn``: pods arriving and finishing without end on one shard; the
engine's state stays the size of what is live and recent, and the log replays."""

from __future__ import annotations

import json
from typing import Any

import pytest

from events.memory import MemoryLog
from events.types import SnapshotTaken
from loadtest.churn import ChurnShape, TailLog, run_churn
from shards.cli import main
from shards.replay import replay


async def test_a_churn_log_with_gangs_replays_and_verifies_with_its_snapshots() -> None:
    """Long enough (in simulated time) that pods, gangs and their deadlines are
    forgotten many times over; replay re-derives every decision and every snapshot."""
    log = MemoryLog()
    seen: list[dict[str, Any]] = []
    shape = ChurnShape(nodes=30, pods=3000, live=150, every=1000, gang_size=3)
    result = await run_churn(shape, log, progress=seen.append, snapshot_every=2000)
    assert result["finished"] >= 3000 and [p["finished"] // 1000 for p in seen] == [1, 2, 3]
    assert result["simulated_seconds"] > 5 * 600  # windows of the default retention
    records = await log.read(0, 0)
    assert any(isinstance(e.event, SnapshotTaken) for e in records)
    verified = replay(records, verify=True)
    assert verified.mismatch is None, verified.mismatch
    assert verified.snapshots > 0
    # what is kept is what finished within a window (about live / 150 s * 600 s), not
    # everything: flat from the first checkpoint to the last
    kept = [p["finished_kept"] for p in seen]
    assert max(kept) < 1000, kept
    assert max(p["groups"] for p in seen) < 400


async def test_the_tail_log_keeps_only_what_is_unread() -> None:
    """On the memory bus a run of a million pods keeps only the unread tail of its log;
    offsets stay as they were."""
    log = TailLog()
    result = await run_churn(ChurnShape(nodes=20, pods=400, live=60, every=400), log)
    assert result["finished"] >= 400
    end = await log.end_offset(0)
    assert end > 2 * 400 and len(await log.read(0, 0)) < 200
    assert (await log.read(0, end - 1))[0].offset == end - 1


def test_the_command_reports_checkpoints(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "loadtest", "--churn", "--nodes", "20", "--pods", "600", "--live", "60",
            "--every", "300", "--json",
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    assert [p["finished"] // 300 for p in data["checkpoints"]] == [1, 2]
    assert data["shape"]["workload"] == "churn" and data["pods_per_second"] > 0
    assert {"p50", "p99"} <= set(data["latency_ms"])
    assert err.count("finished ") == 2  # a progress line per checkpoint
    with pytest.raises(SystemExit) as refused:
        main(["loadtest", "--churn", "--shards", "2"])
    assert refused.value.code == 2
    assert capsys.readouterr().err == "shoal: error: --churn: measures one shard\n"
