"""Logs recorded by the version before the scheduler was rebuilt around one set of rules
(``tests/fixtures/logs-before-rebuild/``): they still decode, replay and report; a
one-shard log still verifies (its snapshots, of an earlier format, are skipped, and a
restarted shard folds the partition instead of restoring them); a log of several
shards, recorded under the router's protocol, says plainly that its decisions cannot
be re-derived, and no service continues it."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from engine.model.pools import PROTOCOL
from events.errors import UnverifiableLogError
from events.filelog import FileLog
from events.types import PodBound, ShardingConfigured, SnapshotTaken
from shards.cli import main
from shards.replay import replay, replay_routed, sharding_of
from shards.worker import ShardWorker

OLD = Path(__file__).resolve().parents[1] / "fixtures" / "logs-before-rebuild"
ONE_SHARD = ("quickstart-1.log", "batch-1.log", "batch-1-snap.log")
TWO_SHARDS = ("batch-2.log", "batch-2-snap.log")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _parts(name: str) -> list[list]:  # type: ignore[type-arg]
    async def read() -> list[list]:  # type: ignore[type-arg]
        log = FileLog(OLD / name, readonly=True)
        try:
            return [await log.read(p, 0) for p in range(log.partitions)]
        finally:
            await log.close()

    return asyncio.run(read())


@pytest.mark.parametrize("name", ONE_SHARD)
def test_an_old_one_shard_log_replays_and_verifies(name: str) -> None:
    (records,) = _parts(name)
    result = replay(records, verify=True)
    assert result.mismatch is None, result.mismatch
    assert result.verified > 0 and result.passes > 0
    had_snapshots = any(isinstance(e.event, SnapshotTaken) for e in records)
    assert (result.older_snapshots > 0) == had_snapshots
    assert result.snapshots == 0  # none of today's format to compare
    bound = {e.event.pod for e in records if isinstance(e.event, PodBound)}
    assert bound and bound <= set(result.report.pods)


def test_the_batch_logs_report_the_same_phases(capsys: pytest.CaptureFixture[str]) -> None:
    reports = []
    for name in ("batch-1.log", "batch-1-snap.log", "batch-2.log", "batch-2-snap.log"):
        code, out, err = _run(capsys, "replay", str(OLD / name), "--json")
        assert code == 0, err
        data = json.loads(out)
        reports.append({k: v["phase"] for k, v in data["pods"].items()})
    assert all(r == reports[0] for r in reports[1:])
    assert set(reports[0].values()) >= {"Succeeded", "Failed", "Bound"}


@pytest.mark.parametrize("name", TWO_SHARDS)
def test_an_old_sharded_log_reports_but_says_it_cannot_be_verified(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parts = _parts(name)
    assert sharding_of(parts[-1]).protocol == 1 != PROTOCOL
    result = replay_routed(parts, verify=True)
    assert isinstance(result.mismatch, UnverifiableLogError)
    assert result.report.pods  # the report is whole all the same
    code, out, err = _run(capsys, "replay", str(OLD / name), "--verify")
    assert code == 1
    assert err.startswith("shoal: cannot verify: ") and err.count("\n") == 1, err
    assert "protocol 1" in err and f"protocol {PROTOCOL}" in err
    assert "succeeded" in out  # the report came first
    code, out, _ = _run(capsys, "replay", str(OLD / name), "--verify", "--json")
    assert code == 1
    verdict = json.loads(out)["verify"]
    assert verdict["ok"] is False and "cannot be checked" in verdict["mismatch"]


def test_a_shard_restarted_on_an_old_log_folds_it_instead_of_restoring(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.log"
    shutil.copy(OLD / "batch-1-snap.log", path)

    async def recover() -> tuple[set[str], set[str]]:
        log = FileLog(path)
        try:
            worker = await ShardWorker.recover(log)
            records = await log.read(0, 0)
        finally:
            await log.close()
        placed = set(worker.engine.state.pods)
        replayed = replay(records)
        return placed, set(replayed.engine.state.pods)

    placed, replayed = asyncio.run(recover())
    assert placed == replayed and placed


def test_recorded_sharding_names_its_protocol() -> None:
    from engine.model.pools import Sharding

    text = Sharding(shards=2).to_json()
    assert json.loads(text)["protocol"] == PROTOCOL
    assert Sharding.from_json(text).protocol == PROTOCOL
    old = ShardingConfigured(config=json.dumps({"shards": 2}))
    assert Sharding.from_json(old.config).protocol == 1
