"""A gang placed by the coordinator after the evictions or moves it planned: its members
take the nodes and GPU cards that plan gave each of them, as one scheduler places them
in the same step as its evictions or moves; and moved pods land where one scheduler
would land them, on any shard's node. At 1, 2 and 4 shards, replayed with ``--verify``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.model.pools import POOL_LABEL
from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import (
    fit_config,
    gpu_node,
    gpu_pod,
    node,
    pod,
    pod_group,
    rescheduler_config,
)

SHARDS = (1, 2, 4)


def _cards(data: dict[str, Any], *names: str) -> list[tuple[str, list[int]]]:
    return [
        (data["pods"][f"default/{n}"]["node"], data["pods"][f"default/{n}"].get("devices"))
        for n in names
    ]


@pytest.mark.parametrize("shards", SHARDS)
def test_a_gang_that_preempts_takes_the_cards_its_victims_free(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """node0's card 0 runs a (300m) and b (500m), its card 1 runs c (600m); node1, in
    another pool, runs a whole-card pod of priority 1000. Gang g (two whole-card members
    of priority 100) preempts on node0: kube-scheduler's victim order keeps the pods that
    started first, so g-0 evicts c and takes card 1, and g-1 evicts a and b and takes
    card 0. Before, at several shards the gang was placed after the evictions on the
    best-fitting cards: g-0 on card 0, g-1 on card 1."""
    text = gpu_node("node0", 2, pool="p0") + gpu_node("node1", 1, pool="p1")
    text += gpu_pod("keep", cards=1, on="node1", priority=1000)
    text += gpu_pod("a", milli=300, on="node0", at=1)
    text += gpu_pod("b", milli=500, on="node0", at=2)
    text += gpu_pod("c", milli=600, on="node0", at=3)
    text += pod_group("g", 2, at=10)
    text += "".join(gpu_pod(f"g-{i}", cards=1, group="g", priority=100, at=10) for i in (0, 1))
    data, _ = shoal(tmp_path, capsys, text, shards)
    assert [data["pods"][f"default/{n}"]["phase"] for n in "abc"] == ["Failed"] * 3
    assert _cards(data, "g-0", "g-1") == [("node0", [1]), ("node0", [0])]


@pytest.mark.parametrize("shards", SHARDS)
def test_a_gang_placed_by_a_move_across_pools_keeps_each_member_where_planned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Gang g (two whole-card members) finds one free card, nodeA's: g-0 takes it, and
    g-1 has room once x (100m) moves off nodeB onto nodeC, in another pool (another
    shard's at 2 and 4 shards: a move in two steps). Before, after that move the gang was
    placed again from scratch, g-0 first, on nodeB; and moved pods went first to nodes of
    the shard the plan's node is on."""
    text = rescheduler_config("{}", score="GpuBestFit")
    text += gpu_node("nodeB", 1, pool="p1", cpu=8) + gpu_node("nodeA", 1, pool="p0")
    text += gpu_node("nodeC", 1, pool="p0") + gpu_node("nodeD", 2, pool="p1")
    text += gpu_pod("x", milli=100, on="nodeB")
    text += gpu_pod("y", milli=500, on="nodeC", migratable=False)
    text += gpu_pod("z", milli=950, on="nodeD", migratable=False)
    text += gpu_pod("w", cards=1, on="nodeD", migratable=False)
    text += pod_group("g", 2, at=10)
    text += "".join(gpu_pod(f"g-{i}", cards=1, group="g", at=10) for i in (0, 1))
    data, _ = shoal(tmp_path, capsys, text, shards)
    moves = [(m["pod"], m["from"], m["to"]) for m in data["migrations"]]
    assert moves == [("default/x", "nodeB", "nodeC")]
    assert _cards(data, "g-0", "g-1") == [("nodeA", [0]), ("nodeB", [0])]


@pytest.mark.parametrize("shards", SHARDS)
def test_a_moved_pod_lands_on_the_best_node_of_any_shard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """podW (a whole card) fits only once x (100m) leaves nodeP's card. By GpuBestFit, x
    lands best on nodeR (150m free), in another pool (another shard's at 2 and 4
    shards), not on nodeQ (900m free), in nodeP's pool. Before, at several shards the
    coordinator landed moved pods first on nodes of the shard the plan's node is on."""
    text = rescheduler_config("{}", score="GpuBestFit")
    text += gpu_node("nodeP", 1, pool="p1") + gpu_node("nodeQ", 1, pool="p1")
    text += gpu_node("nodeR", 1, pool="p0")
    text += gpu_pod("x", milli=100, on="nodeP")
    text += gpu_pod("q", milli=100, on="nodeQ", migratable=False)
    text += gpu_pod("r", milli=850, on="nodeR", migratable=False)
    text += gpu_pod("podW", cards=1, at=10)
    data, _ = shoal(tmp_path, capsys, text, shards)
    moves = [(m["pod"], m["from"], m["to"]) for m in data["migrations"]]
    assert moves == [("default/x", "nodeP", "nodeR")]
    assert _cards(data, "podW") == [("nodeP", [0])]


MOST_ALLOCATED = fit_config("{type: MostAllocated, resources: [{name: cpu, weight: 1}]}")


@pytest.mark.parametrize("shards", SHARDS)
def test_a_gang_placed_by_moves_within_one_shard_needs_only_its_min_member(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Gang g: four members of 2 CPUs, minMember 3, packed (MostAllocated). g-0 fills
    nodeA, g-1 takes nodeB, and g-2 fits on nodeB once y (1 CPU) moves onto nodeD; g-3
    fits nowhere and waits as an ordinary pod. All three nodes are in pool p0 (one
    shard's); nodeC, in pool p1, is full. Before, at several shards the gang was handed
    to that shard with all four members to place, which it refused, again and again."""
    text = MOST_ALLOCATED
    text += node("nodeA", cpu=4, labels={POOL_LABEL: "p0"})
    text += node("nodeB", cpu=4, labels={POOL_LABEL: "p0"})
    text += node("nodeD", cpu=1, labels={POOL_LABEL: "p0"})
    text += node("nodeC", cpu=2, labels={POOL_LABEL: "p1"})
    text += pod("x", cpu="2", node_name="nodeA") + pod("y", cpu="1", node_name="nodeB")
    text += pod("c", cpu="2", node_name="nodeC")
    text += pod_group("g", 3, at=10)
    text += "".join(pod(f"g-{i}", cpu="2", group="g", at=10) for i in range(4))
    data, _ = shoal(tmp_path, capsys, text, shards)
    moves = [(m["pod"], m["from"], m["to"]) for m in data["migrations"]]
    assert moves == [("default/y", "nodeB", "nodeD")]
    where = {f"g-{i}": data["pods"][f"default/g-{i}"]["node"] for i in range(4)}
    assert where == {"g-0": "nodeA", "g-1": "nodeB", "g-2": "nodeB", "g-3": None}
    assert data["groups"]["default/g"]["phase"] == "Scheduled"


def _spread_pod(name: str, *, on: str = "", cpu: str = "1", at: float = 0) -> str:
    """A pod of app z whose zone spread is a preference (``ScheduleAnyway``)."""
    node_name = f"\n  nodeName: {on}" if on else ""
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: z}}
  annotations: {{shoal.io/arrive-at: "{at:g}"}}
spec:{node_name}
  topologySpreadConstraints:
  - {{maxSkew: 1, topologyKey: zone, whenUnsatisfiable: ScheduleAnyway, labelSelector: {{matchLabels: {{app: z}}}}}}
  containers:
  - name: c
    resources: {{requests: {{cpu: "{cpu}", memory: 1Gi}}}}
---"""


@pytest.mark.parametrize("shards", SHARDS)
def test_a_moved_pod_that_spreads_lands_by_every_shards_pods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """w (4 CPUs) fits nowhere until x (2 CPUs) leaves nodeA. x prefers to spread over
    zones, and three pods of its app run on nodeD, in zone z1 (pool p1, another shard's
    at 2 and 4 shards): it lands on nodeC, in z0, not on nodeB, in z1, though packing
    prefers nodeB. nodeA, nodeB and nodeC are pool p0's. Before, at several shards the
    plan, within one shard, was that shard's to carry out, and it landed x by the pods
    it holds (none of app z in z1): on nodeB."""
    text = MOST_ALLOCATED
    for name, cpu, zone, pool in (
        ("nodeA", 4, "z0", "p0"),
        ("nodeB", 8, "z1", "p0"),
        ("nodeC", 4, "z0", "p0"),
        ("nodeD", 4, "z1", "p1"),
    ):
        text += node(name, cpu=cpu, labels={"zone": zone, POOL_LABEL: pool})
    text += "".join(_spread_pod(f"d{i}", on="nodeD") for i in range(3))
    text += "".join(gpu_pod(f"b{i}", on="nodeB", migratable=False) for i in range(5))
    text += gpu_pod("c0", on="nodeC", migratable=False)
    text += _spread_pod("x", on="nodeA", cpu="2")
    text += pod("w", cpu="4", at=10)
    data, _ = shoal(tmp_path, capsys, text, shards)
    moves = [(m["pod"], m["from"], m["to"]) for m in data["migrations"]]
    assert moves == [("default/x", "nodeA", "nodeC")]
    assert data["pods"]["default/w"]["node"] == "nodeA"


@pytest.mark.parametrize("shards", SHARDS)
def test_a_plan_within_a_shard_never_moves_part_of_a_gang_placed_across_shards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Gang g runs across pools: g-0 and g-1 on node3 (pool p1), g-2 on node2 (pool
    p0). s16 (700m of a model A card) finds no room; one scheduler moves s0 (400m on
    node0) to node4's card, not g-2 (one scheduler moves a gang only whole, and g-0 and
    g-1 have nowhere to go). At several shards the plan is within pool p0's shard, but
    that shard holds g-2 as a part of its own, which it could move alone to node5 (a
    model B card), a cheaper plan (g-2 started last): before, it was handed the pod to
    find the plan itself, and moved g-2."""
    text = rescheduler_config("{}", score="GpuBestFit")
    text += gpu_node("node0", 1, model="A", pool="p0") + gpu_node("node2", 1, model="A", pool="p0")
    text += gpu_node("node4", 1, model="A", pool="p0") + gpu_node("node5", 1, model="B", pool="p0")
    text += gpu_node("node3", 2, model="C", pool="p1")
    text += gpu_pod("x", milli=500, on="node4", migratable=False)
    text += gpu_pod("s0", milli=400, on="node0")
    text += pod_group("g", 3, at=5)
    text += gpu_pod("g-0", cards=1, group="g", at=5, models=("C",))
    text += gpu_pod("g-1", cards=1, group="g", at=5, models=("C",))
    text += gpu_pod("g-2", cards=1, group="g", at=5, on="node2")
    text += gpu_pod("s16", milli=700, at=10, models=("A",))
    data, _ = shoal(tmp_path, capsys, text, shards)
    moves = sorted((m["pod"], m["from"], m["to"], m["by"]) for m in data["migrations"])
    assert moves == [("default/s0", "node0", "node4", "default/s16")]
    assert _cards(data, "s16", "g-2") == [("node0", [0]), ("node2", [0])]
