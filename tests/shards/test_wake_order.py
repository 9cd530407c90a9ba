"""Parked pods woken by room a preemption frees take it in queue order, whatever their
shapes, and the room a pass frees on a node wakes them once, however many pods freed
it: so one shard and a coordinator (which hears of a node's victims together) wake the
same pods, and place them where one scheduler, waking every pod the room may help,
places them. At 1, 2 and 4 shards, replayed with ``--verify``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import gpu_node, gpu_pod, pod_group, rescheduler_config


@pytest.mark.parametrize("shards", (1, 2, 4))
def test_room_freed_by_a_preemption_wakes_parked_pods_in_queue_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """node1 (5 CPUs, 4 cards, its own pool) runs a0 and a1 (700m each on cards 0 and
    1) and gang g (a whole card each, cards 2 and 3). s6 (600m), w7 (a whole card) and
    s9 (600m) arrive in that order and wait. s10 (400m, priority 100) evicts g and takes
    card 2: two CPUs are left, so two of the waiting pods can run. In queue order s6
    takes card 2's other 600m and w7 card 3; s9 finds no card. Before, s6 and s9 (one
    shape) took the two CPUs together, ahead of w7: at 1 shard w7 was woken by the
    second victim's wake-up only; at 2 and 4 shards, where the coordinator hears of
    both victims together, w7 stayed parked and s9 ran on card 3."""
    text = rescheduler_config("{}", score="GpuBestFit")
    text += gpu_node("node0", 1, pool="p0") + gpu_node("node1", 4, cpu=5, pool="p1")
    text += gpu_pod("keep", milli=700, on="node0", priority=100, migratable=False)
    text += gpu_pod("a0", milli=700, on="node1", migratable=False)
    text += gpu_pod("a1", milli=700, on="node1", migratable=False)
    text += pod_group("g", 2, at=1)
    text += "".join(gpu_pod(f"g-{i}", cards=1, group="g", at=1) for i in (0, 1))
    text += gpu_pod("s6", milli=600, at=2)
    text += gpu_pod("w7", cards=1, at=3)
    text += gpu_pod("s9", milli=600, at=4)
    text += gpu_pod("s10", milli=400, at=5, priority=100)
    data, _ = shoal(tmp_path, capsys, text, shards)
    pods = data["pods"]
    where = {
        n: (pods[f"default/{n}"]["node"], pods[f"default/{n}"].get("devices"))
        for n in ("s10", "s6", "w7", "s9")
    }
    assert where == {
        "s10": ("node1", [2]),
        "s6": ("node1", [2]),
        "w7": ("node1", [3]),
        "s9": (None, None),
    }
    assert [pods[f"default/g-{i}"]["phase"] for i in (0, 1)] == ["Failed", "Failed"]
    # the room holds two pods, and s6 and w7 come first: s9 is not tried again (a
    # wake-up per victim tried it again at 1 shard, once the first had woken s6 and w7)
    assert pods["default/s9"]["attempts"] == 1
