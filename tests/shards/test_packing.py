"""Packing profiles place every pod on one scheduler's node at any number of shards.

Under ``MostAllocated``, ``RequestedToCapacityRatio`` and the GPU policies the best node
is the fullest one that fits, and a shard's sums do not say where that is: a shard
whose sums look fullest may hold only empty nodes. Units of such profiles are decided
on the coordinator's exact view (:func:`shards.coordinator.choice.summarised`), so at 2
and 4 shards the same pods run on the same nodes as at one, and every log replays.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.model.pools import POOL_LABEL
from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import gpu_pod, node

SHARDS = (1, 2, 4)

MOST_ALLOCATED = """
- schedulerName: default-scheduler
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources: [{name: nvidia.com/gpu, weight: 1}]"""

GPU_PACKING = """
- schedulerName: default-scheduler
  plugins:
    score:
      disabled: [{name: "*"}]
      enabled: [{name: GpuPacking}]"""


def config(profile: str) -> str:
    return f"""
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
{profile}
---"""


def placements(data: dict[str, Any]) -> dict[str, tuple[str | None, str]]:
    return {key: (view["node"], view["phase"]) for key, view in data["pods"].items()}


def whole_node_scenario(profile: str) -> str:
    """Two 8-card nodes in each shard's pools (at 2 and at 4 shards; the pools without
    cards fill the round of pool owners). ``a`` runs 6 cards, ``f`` is full, ``b`` and
    ``e`` are empty. A 2-card pod fits the cluster's fullest node ``a`` (score 100); as
    sums, ``a`` and ``e`` (6 of 16 cards) look emptier than ``b`` and ``f`` (8 of 16).
    Two 8-card jobs follow: they need ``b`` and ``e`` both."""
    nodes = [("a", 8), ("b", 8), ("x", 0), ("y", 0), ("e", 8), ("f", 8), ("z", 0), ("w", 0)]
    text = config(profile)
    text += "".join(
        node(name, gpu=cards, labels={POOL_LABEL: f"p{i}"}) for i, (name, cards) in enumerate(nodes)
    )
    text += gpu_pod("hog-a", cards=6, on="a", migratable=False)
    text += gpu_pod("hog-f", cards=8, on="f", migratable=False)
    text += gpu_pod("small", cards=2, at=1, migratable=False)
    text += gpu_pod("big-0", cards=8, at=2) + gpu_pod("big-1", cards=8, at=2)
    return text


@pytest.mark.parametrize("profile", [MOST_ALLOCATED, GPU_PACKING], ids=["most", "gpu-packing"])
def test_an_eight_card_job_finds_the_node_one_scheduler_kept_free(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], profile: str
) -> None:
    text = whole_node_scenario(profile)
    runs = {n: placements(shoal(tmp_path, capsys, text, n)[0]) for n in SHARDS}
    assert runs[1]["default/small"] == ("a", "Bound")
    assert {runs[1][f"default/big-{i}"] for i in range(2)} == {("b", "Bound"), ("e", "Bound")}
    assert runs[2] == runs[1]
    assert runs[4] == runs[1]


# ------------------------------------------------------------------ generated scenarios


@st.composite
def packing_scenarios(draw: Any) -> str:
    """Nodes of distinct card counts (so no two nodes score alike for a pod, and which
    node is chosen decides who runs later), in pools that give every shard several
    nodes; pods of 1 to 8 cards arriving one after the other, some finishing."""
    profile = draw(st.sampled_from([MOST_ALLOCATED, GPU_PACKING]))
    sizes = draw(st.lists(st.integers(1, 16), min_size=3, max_size=8, unique=True))
    text = config(profile)
    text += "".join(
        node(f"n{i}", cpu=64, gpu=cards, labels={POOL_LABEL: f"p{i}"})
        for i, cards in enumerate(sizes)
    )
    count = draw(st.integers(1, 10))
    for i in range(count):
        cards = draw(st.integers(1, 8))
        runtime = draw(st.one_of(st.none(), st.integers(5, 30)))
        text += gpu_pod(f"p{i}", cards=cards, at=2 * i, runtime=runtime, migratable=False)
    return text


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=packing_scenarios())
def test_packing_places_every_pod_where_one_scheduler_does(
    capsys: pytest.CaptureFixture[str], text: str
) -> None:
    with tempfile.TemporaryDirectory() as where:
        runs = {n: placements(shoal(Path(where), capsys, text, n)[0]) for n in SHARDS}
    assert runs[2] == runs[1]
    assert runs[4] == runs[1]
