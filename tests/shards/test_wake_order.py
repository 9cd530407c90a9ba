"""Parked pods woken by room that a preemption frees: every pod the room may hold is
woken (a bucket of one shape up to what the node holds of its request, each bucket
against the whole room), and a node that lost several victims in one step wakes them
once. So one shard and a coordinator (which hears of a node's victims together, and
of the pods that finish on several shards in another order) wake the same pods, and
place them where one scheduler, waking every pod the room may help, places them. At
1, 2 and 4 shards, replayed with ``--verify``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import (
    gpu_node,
    gpu_pod,
    node,
    pod,
    pod_group,
    rescheduler_config,
)

SHARDS = (1, 2, 4)


@pytest.mark.parametrize("shards", SHARDS)
def test_room_freed_by_a_preemption_wakes_every_pod_it_may_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """node1 (5 CPUs, 4 cards, its own pool) runs a0 and a1 (700m each on cards 0 and
    1) and gang g (a whole card each, cards 2 and 3). s6 (600m), w7 (a whole card) and
    s9 (600m) arrive in that order and wait. s10 (400m, priority 100) evicts g and takes
    card 2: two CPUs are left. All three waiting pods are woken and tried in queue
    order: s6 takes card 2's other 600m, w7 card 3, and s9 finds no card. Before, s6
    and s9 (one shape) took the two CPUs ahead of w7: at 1 shard w7 was woken by the
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
    names = ("s10", "s6", "w7", "s9")
    where = {n: (pods[f"default/{n}"]["node"], pods[f"default/{n}"].get("devices")) for n in names}
    assert where == {
        "s10": ("node1", [2]),
        "s6": ("node1", [2]),
        "w7": ("node1", [3]),
        "s9": (None, None),
    }
    assert [pods[f"default/g-{i}"]["phase"] for i in (0, 1)] == ["Failed", "Failed"]
    assert pods["default/s9"]["attempts"] == 2  # on arrival, and once woken


@pytest.mark.parametrize("shards", SHARDS)
def test_a_node_that_loses_two_victims_wakes_its_parked_pods_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """node0 (4 CPUs) runs a and b (2 CPUs each, priority 0); p0, p1 and p2 (1 CPU each)
    wait. h (3 CPUs, priority 100) evicts both and leaves one CPU: one waiting pod is
    woken and runs, the other two are not tried again. A wake-up per victim woke a
    second one at 1 shard (tried in vain), where the coordinator, hearing of both
    victims together, woke one."""
    text = node("node0", cpu=4, labels={"shoal.io/pool": "p0"})
    text += node("node1", cpu=1, labels={"shoal.io/pool": "p1"})
    text += pod("fill", cpu="1", node_name="node1", priority=1000)
    text += pod("a", cpu="2", node_name="node0")
    text += pod("b", cpu="2", node_name="node0")
    text += "".join(pod(f"p{i}", cpu="1", at=1) for i in range(3))
    text += pod("h", cpu="3", at=2, priority=100)
    data, _ = shoal(tmp_path, capsys, text, shards)
    pods = data["pods"]
    assert [pods[f"default/{n}"]["phase"] for n in ("a", "b")] == ["Failed", "Failed"]
    assert pods["default/h"]["node"] == "node0"
    assert [pods[f"default/p{i}"]["node"] for i in range(3)] == ["node0", None, None]
    assert [pods[f"default/p{i}"]["attempts"] for i in (1, 2)] == [1, 1]
