"""The rescheduler and gangs, through ``shoal simulate`` replayed with ``--verify``: a
waiting gang placed thanks to a move (all members or none, within maxMoves for the whole
gang), and a running gang moved only whole, when that is the cheapest plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import gpu_node, gpu_pod, pod_group, rescheduler_config

SHARDS = (1, 2, 4)


def max_moves(moves: int) -> str:
    return rescheduler_config(f"{{maxMoves: {moves}}}")


def waiting_gang(third: str = "node3", **b_args: Any) -> str:
    """node1 runs podA (4 cards, stays) and podB (3); node2 podD (4, stays); ``third``
    podE (5, stays). Gang g (two 4-card members, minMember 2): g-0 fits node2 only, g-1
    nowhere, unless podB moves to ``third`` (its only other room). (node1, node2 and
    node3 are one shard's at 2 shards; node4 is the other's.)"""
    text = "".join(gpu_node(name, 8) for name in ("node1", "node2", third))
    text += gpu_pod("podA", cards=4, on="node1", migratable=False)
    text += gpu_pod("podB", cards=3, on="node1", **b_args)
    text += gpu_pod("podD", cards=4, on="node2", migratable=False)
    text += gpu_pod("podE", cards=5, on=third, migratable=False)
    text += pod_group("g", 2, at=10)
    return text + "".join(gpu_pod(f"g-{i}", cards=4, at=10, group="g") for i in range(2))


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("third", ["node3", "node4"])
def test_a_waiting_gang_is_placed_thanks_to_one_move(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, third: str
) -> None:
    data, _ = shoal(tmp_path, capsys, waiting_gang(third), shards)
    pods = data["pods"]
    assert [(m["pod"], m["from"], m["to"]) for m in data["migrations"]] == [
        ("default/podB", "node1", third)
    ]
    assert data["migrations"][0]["by"] in ("default/g-0", "default/g-1")
    assert {pods[f"default/g-{i}"]["node"] for i in range(2)} == {"node1", "node2"}
    assert data["preemptions"] == []


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("rule", ["says no", "no moves"])
def test_a_waiting_gang_is_placed_whole_or_not_at_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, rule: str
) -> None:
    """podB may not move (it says no, or maxMoves is 0): no member is placed, and
    nothing moves."""
    if rule == "says no":
        text = waiting_gang(migratable=False)
    else:
        text = max_moves(0) + waiting_gang()
    data, _ = shoal(tmp_path, capsys, text, shards)
    pods = data["pods"]
    assert data["migrations"] == []
    assert all(pods[f"default/g-{i}"]["phase"] == "Pending" for i in range(2))
    assert pods["default/podB"]["node"] == "node1"


@pytest.mark.parametrize("shards", SHARDS)
def test_a_gang_needing_more_moves_than_allowed_waits_naming_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """g-1's room takes two moves (podB's two halves); with maxMoves 1 the gang waits,
    its reason naming the plan, and nothing moves."""
    text = "".join(gpu_node(f"node{i}", 8) for i in (1, 2, 3))
    text += gpu_pod("podA", cards=4, on="node1", migratable=False)
    text += gpu_pod("half-0", cards=2, on="node1") + gpu_pod("half-1", cards=1, on="node1")
    text += gpu_pod("podD", cards=4, on="node2", migratable=False)
    text += gpu_pod("podE", cards=5, on="node3", migratable=False)
    text += pod_group("g", 2, at=10)
    text += "".join(gpu_pod(f"g-{i}", cards=4, at=10, group="g") for i in range(2))
    data, _ = shoal(tmp_path, capsys, max_moves(1) + text, shards)
    pods = data["pods"]
    assert data["migrations"] == []
    assert all(pods[f"default/g-{i}"]["phase"] == "Pending" for i in range(2))
    reasons = " ".join(pods[f"default/g-{i}"]["reason"] for i in range(2))
    assert "half-0, default/half-1 off node1 would make room" in reasons, reasons
    (tmp_path / "two").mkdir()
    allowed, _ = shoal(tmp_path / "two", capsys, max_moves(2) + text, shards)
    assert len(allowed["migrations"]) == 2
    assert {allowed["pods"][f"default/g-{i}"]["node"] for i in range(2)} == {"node1", "node2"}


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("others", [("node2", "node3"), ("node4", "node5")])
def test_a_small_gang_moves_whole_when_that_is_the_cheapest_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, others: tuple[str, str]
) -> None:
    """node1 runs gang sg (two 2-card members, started at 5 s) and p-0, p-1 (2 cards
    each, started at 0); node2 and node3 have 3 cards free. podC (4 cards) needs two
    pods moved off node1: the gang (both members, the pods that started last) is the
    cheapest such plan; one member with a pod beside it would split the gang. (At 2
    shards node4 and node5 are the other shard's: the moves go across.)"""
    text = "".join(gpu_node(name, 8) for name in ("node1", *others))
    text += pod_group("sg", 2, at=5)
    text += "".join(gpu_pod(f"s-{i}", cards=2, on="node1", group="sg", at=5) for i in range(2))
    text += "".join(gpu_pod(f"p-{i}", cards=2, on="node1") for i in range(2))
    text += gpu_pod("podD", cards=5, on=others[0], migratable=False)
    text += gpu_pod("podE", cards=5, on=others[1], migratable=False)
    text += gpu_pod("podC", cards=4, at=10)
    data, _ = shoal(tmp_path, capsys, text, shards)
    pods = data["pods"]
    moved = sorted((m["pod"], m["from"], m["by"]) for m in data["migrations"])
    assert moved == [
        ("default/s-0", "node1", "default/podC"),
        ("default/s-1", "node1", "default/podC"),
    ]
    assert {pods[f"default/s-{i}"]["node"] for i in range(2)} == set(others)
    assert pods["default/podC"]["node"] == "node1"


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(("budget", "moves"), [("minAvailable: 1", 0), ("maxUnavailable: 1", 1)])
def test_a_waiting_gang_keeps_within_disruption_budgets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, budget: str, moves: int
) -> None:
    """podB's budget decides: its one pod must stay up (no plan at all), or one may go."""
    pdb = f"""
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {{name: b}}
spec: {{selector: {{matchLabels: {{app: b}}}}, {budget}}}
---"""
    data, _ = shoal(tmp_path, capsys, pdb + waiting_gang("node4", labels={"app": "b"}), shards)
    assert len(data["migrations"]) == moves
    phases = {data["pods"][f"default/g-{i}"]["phase"] for i in range(2)}
    assert phases == ({"Bound"} if moves else {"Pending"})
