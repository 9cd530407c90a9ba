"""``percentageOfNodesToScore`` in whole runs: honoured per shard, replayed exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shards.cli import main
from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import node, pod

CONFIG = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
percentageOfNodesToScore: 10
---"""


def scenario(sampled: bool) -> str:
    """800 nodes of 4 cpus and one of 64 (the roomiest, where the exact default puts
    every pod); 12 pods of 1 cpu. Sampled, each shard scans 100 of its nodes per pod
    (10 per cent of 800 is 80, raised to the minimum of 100), so most pods never see the
    big one."""
    text = CONFIG if sampled else ""
    text += "".join(node(f"n{i:03}", cpu=4) for i in range(800)) + node("big", cpu=64)
    return text + "".join(pod(f"p{i}", cpu="1") for i in range(12))


def on_big(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, shards: int) -> int:
    tmp_path.mkdir()
    data, _ = shoal(tmp_path, capsys, text, shards)  # with replay --verify
    nodes = [p["node"] for p in data["pods"].values()]
    assert None not in nodes
    return nodes.count("big")


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_sampled_runs_replay_and_pass_the_best_node_by(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Exact (unset), one shard puts every pod on the big node (at two, the pods the
    router sends to the other shards cannot reach it); sampled, fewer pods see it."""
    exact = on_big(tmp_path / "exact", capsys, scenario(sampled=False), shards)
    sampled = on_big(tmp_path / "sampled", capsys, scenario(sampled=True), shards)
    if shards == 1:
        assert exact == 12
    assert sampled < exact


@pytest.mark.parametrize("shards", [1, 2])
def test_more_than_one_shard_warns_that_the_share_is_per_shard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """kube-scheduler takes the share of every node; N shards each take it of their
    own, so a run with more than one says so (and still replays exactly)."""
    text = CONFIG + "".join(node(f"n{i}", cpu=4) for i in range(4)) + pod("p", cpu="1")
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(text)
    code = main(["simulate", str(scenario), "--shards", str(shards), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    warned = [w for w in json.loads(captured.out)["warnings"] if "applies per shard" in w]
    assert len(warned) == (shards > 1)
    assert ("applies per shard" in captured.err) == (shards > 1)


@pytest.mark.parametrize("shards", [1, 2])
def test_serve_with_more_than_one_shard_warns_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, shards: int
) -> None:
    """``serve --shards N`` logs the same warning at start (the service itself is not
    started here: only what the command line makes of its configuration)."""
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.split("---", maxsplit=1)[0])
    started: list[object] = []

    async def serve(options: object) -> int:
        started.append(options)
        return 0

    monkeypatch.setattr("shards.serve.serve", serve)
    with caplog.at_level("WARNING", logger="shoal.serve"):
        code = main(["serve", "--shards", str(shards), "--config", str(config)])
    assert code == 0 and len(started) == 1
    warned = [r for r in caplog.records if "applies per shard" in r.getMessage()]
    assert len(warned) == (shards > 1)
