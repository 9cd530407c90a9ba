"""The rescheduler's budget in percent of placed pods (``budget: {percentOfPlaced: P}``):
moves in all stay within P% of the pods placed so far, each move counted; at 1, 2 and 4
shards, replayed with ``--verify``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import parse_config
from engine.engine import Engine
from events.errors import InputError
from events.types import Envelope, PodBound, PodDeleted, PodMigrated
from tests.builders import make_node, make_pod
from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import gpu_node, gpu_pod, pod_group, rescheduler_config

SHARDS = (1, 2, 4)


def seed_case(budget: str) -> str:
    """node1 runs podA (4 cards) and podB (3), node2 runs podD (5, not movable); podC
    (4) fits only once podB moves to node2: one move, for three pods placed."""
    text = rescheduler_config(budget) + gpu_node("node1", 8) + gpu_node("node2", 8)
    text += gpu_pod("podA", cards=4, on="node1") + gpu_pod("podB", cards=3, on="node1")
    text += gpu_pod("podD", cards=5, on="node2", migratable=False)
    return text + gpu_pod("podC", cards=4, at=10, priority=0)


@pytest.mark.parametrize("shards", SHARDS)
def test_a_move_waits_for_its_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    # 3 pods placed: 34% of them allows one move (3 * 34 // 100 = 1), 33% none
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    data, _ = shoal(tmp_path / "a", capsys, seed_case("{budget: {percentOfPlaced: 34}}"), shards)
    moves = [(m["pod"], m["from"], m["to"]) for m in data["migrations"]]
    assert moves == [("default/podB", "node1", "node2")]
    assert data["pods"]["default/podC"]["node"] == "node1"
    data, _ = shoal(tmp_path / "b", capsys, seed_case("{budget: {percentOfPlaced: 33}}"), shards)
    assert data["migrations"] == []
    pending = data["pods"]["default/podC"]
    assert pending["phase"] == "Pending" and pending["node"] is None


def pools_case(percent: int, elsewhere: int) -> str:
    """Pool p0 runs ``elsewhere`` one-card pods; in pool p1, node1 and node2 run one
    share each, and a whole-card pod fits only once node1's share moves to node2."""
    text = rescheduler_config(f"{{budget: {{percentOfPlaced: {percent}}}}}")
    text += gpu_node("node0", elsewhere, pool="p0")
    text += gpu_node("node1", 1, pool="p1") + gpu_node("node2", 1, pool="p1")
    text += "".join(gpu_pod(f"busy{i}", cards=1, on="node0") for i in range(elsewhere))
    text += gpu_pod("share1", milli=300, on="node1") + gpu_pod("share2", milli=200, on="node2")
    return text + gpu_pod("whole", cards=1, at=10)


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(("percent", "elsewhere"), [(20, 3), (20, 8), (10, 8), (50, 1)])
def test_the_budget_counts_pods_placed_on_every_shard(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shards: int,
    percent: int,
    elsewhere: int,
) -> None:
    # the pods placed in pool p0 (another shard's, at 2 and 4 shards) count toward the
    # budget of a move in pool p1, as one scheduler counts them
    data, _ = shoal(tmp_path, capsys, pools_case(percent, elsewhere), shards)
    allowed = (elsewhere + 2) * percent // 100 >= 1
    moves = [(m["pod"], m["from"], m["to"]) for m in data["migrations"]]
    assert moves == ([("default/share1", "node1", "node2")] if allowed else [])
    assert data["pods"]["default/whole"]["node"] == ("node1" if allowed else None)


CONFIG = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
  plugins:
    postFilter: {disabled: [{name: "*"}], enabled: [{name: Rescheduler}]}
  pluginConfig:
  - name: Rescheduler
    args: {maxMoves: 3, budget: {percentOfPlaced: %d}}
"""


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    percent=st.sampled_from([0, 5, 20, 50, 100]),
    sizes=st.lists(st.sampled_from([1000, 2000, 3000]), min_size=4, max_size=30),
)
def test_moves_stay_within_the_budget_and_each_is_counted(percent: int, sizes: list[int]) -> None:
    # the protocol of the GPU trace on cpu: pods arrive one at a time, one that finds no
    # place even with moves is deleted; after each, moves made <= percent of pods placed
    engine = Engine(parse_config(yaml.safe_load(CONFIG % percent)))
    for i in range(3):
        engine.apply(Envelope(event=make_node(f"n{i}").cpu(4).added(), producer="ingest"))
    engine.schedule()
    placed = moved = 0
    for i, size in enumerate(sizes):
        submitted = make_pod(f"p{i}").cpu(f"{size}m").submitted()
        engine.apply(Envelope(event=submitted, producer="ingest"))
        decisions = engine.schedule()
        placed += sum(isinstance(e, PodBound) for e in decisions)
        moved += sum(isinstance(e, PodMigrated) for e in decisions)
        assert (engine.placed_total, engine.moved_total) == (placed, moved)
        assert moved * 100 <= placed * percent
        if not any(isinstance(e, PodBound) for e in decisions):
            key = submitted.pod.key
            engine.apply(Envelope(event=PodDeleted(pod=key), producer="ingest"))


def test_the_budget_is_checked() -> None:
    with pytest.raises(InputError, match="percentOfPlaced"):
        Engine(parse_config(yaml.safe_load(CONFIG.replace("%d", "101"))))


def gang_case(percent: int) -> str:
    """node1 runs gang sg (two 2-card members, started at 5 s) and p-0, p-1 (2 cards
    each); node2 and node3 have 3 cards free. podC (4 cards) needs two pods off node1:
    the gang whole is the cheapest plan, two moves (six pods placed before it)."""
    text = rescheduler_config(f"{{budget: {{percentOfPlaced: {percent}}}}}")
    text += "".join(gpu_node(name, 8) for name in ("node1", "node2", "node3"))
    text += pod_group("sg", 2, at=5)
    text += "".join(gpu_pod(f"s-{i}", cards=2, on="node1", group="sg", at=5) for i in range(2))
    text += "".join(gpu_pod(f"p-{i}", cards=2, on="node1") for i in range(2))
    text += gpu_pod("podD", cards=5, on="node2", migratable=False)
    text += gpu_pod("podE", cards=5, on="node3", migratable=False)
    return text + gpu_pod("podC", cards=4, at=10)


def test_a_gang_moves_whole_within_the_budget_or_not_at_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 6 placed: 34% allows two moves (the gang's two members, each counted), 33% one,
    # which no plan can do with (the gang is never split, one pod frees too little)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    data, _ = shoal(tmp_path / "a", capsys, gang_case(34), 1)
    assert sorted(m["pod"] for m in data["migrations"]) == ["default/s-0", "default/s-1"]
    assert data["pods"]["default/podC"]["node"] == "node1"
    data, _ = shoal(tmp_path / "b", capsys, gang_case(33), 1)
    assert data["migrations"] == []
    assert data["pods"]["default/podC"]["node"] is None
    assert {data["pods"][f"default/s-{i}"]["node"] for i in range(2)} == {"node1"}
