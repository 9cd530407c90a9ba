"""A plan of moves that moves a pod placed in the same pass, at 1, 2 and 4 shards.

At several shards the coordinator places a pod under a claim and hears from its shard
later; a plan of moves that needs that pod moved waits for the answer (its shard could
otherwise bind the pod where it no longer runs). The queue behind the planned pod waits
with it, as one scheduler decides nothing behind a pod before it: else the pods after it
took the nodes the plan moves pods to, and it found no plan the next pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import gpu_node, gpu_pod, rescheduler_config

SHARDS = (1, 2, 4)


def scenario(args: str) -> str:
    """node0 (4 cards) runs four shares by 7 s, two of them movable, one arriving at 7 s
    with w5 (two whole cards) and s6, s7 behind it; node1 and node2 (one card each) are
    free: w5 fits once s3 and s4 move there, which s6 and s7 would take first."""
    text = rescheduler_config(args, score="ShoalGpu")
    text += gpu_node("node0", 4) + gpu_node("node1", 1, cpu=8) + gpu_node("node2", 1)
    text += gpu_pod("s0", milli=200, at=2, migratable=False, runtime=5)
    text += gpu_pod("s1", milli=600, at=4, migratable=False, runtime=30)
    text += gpu_pod("s2", milli=600, at=5, runtime=5)
    text += gpu_pod("s3", milli=700, at=6)
    text += gpu_pod("s4", milli=700, at=7, runtime=5)
    text += gpu_pod("w5", cards=2, at=7)
    text += gpu_pod("s6", milli=700, at=7, runtime=5)
    return text + gpu_pod("s7", milli=400, at=7, migratable=False, runtime=30)


@pytest.mark.parametrize("shards", SHARDS)
def test_the_queue_waits_behind_a_plan_that_waits_for_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    data, _ = shoal(tmp_path, capsys, scenario("{budget: {percentOfPlaced: 40}}"), shards)
    moves = sorted((m["pod"], m["from"], m["to"], m["by"]) for m in data["migrations"])
    assert moves == [
        ("default/s3", "node0", "node1", "default/w5"),
        ("default/s4", "node0", "node2", "default/w5"),
    ]
    assert data["pods"]["default/w5"]["node"] == "node0"
