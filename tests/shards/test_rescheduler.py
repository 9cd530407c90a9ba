"""The rescheduler: running pods move to make room, through ``shoal simulate`` at 1 and 2
shards, replayed with ``--verify``.

Seed 001's case with numbers of its own (a node running two pods, another too full for
the newcomer, one move makes room), each "never move" rule, a plan that needs more moves
than allowed (pending, naming the cheapest plan found), and moved pods restarting.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shards.cli import main
from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import gpu_node, pod_group, rescheduler_config
from tests.shards.scenario_text import gpu_pod as _gpu_pod

SHARDS = (1, 2, 4)


def gpu_pod(name: str, cards: int, **args: Any) -> str:
    return _gpu_pod(name, cards=cards, **args)


def podgroup(name: str, min_member: int) -> str:
    return pod_group(name, min_member)


def max_moves(moves: int) -> str:
    return rescheduler_config(f"{{maxMoves: {moves}}}")


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, shards: int) -> Any:
    data, _ = shoal(tmp_path, capsys, text, shards)
    return data


def seed(cards: int, a: int, b: int, d: int, c: int, **b_args: Any) -> str:
    """node1 runs podA (a cards) and podB (b), node2 runs podD (d); podC (c) arrives and
    fits neither node as they stand (c > cards - a - b and c > cards - d), but does on
    node1 once podB moves to node2 (b <= cards - d and c <= cards - a)."""
    assert c > cards - a - b and c > cards - d and b <= cards - d and c <= cards - a
    text = gpu_node("node1", cards) + gpu_node("node2", cards)
    text += gpu_pod("podA", a, on="node1") + gpu_pod("podB", b, on="node1", **b_args)
    text += gpu_pod("podD", d, on="node2", migratable=False)
    return text + gpu_pod("podC", c, at=10, priority=0)


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(
    ("cards", "a", "b", "d", "c"), [(8, 4, 3, 5, 4), (4, 2, 1, 3, 2), (8, 2, 4, 4, 5)]
)
def test_seed_001_one_move_makes_room(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shards: int,
    cards: int,
    a: int,
    b: int,
    d: int,
    c: int,
) -> None:
    data = run(tmp_path, capsys, seed(cards, a, b, d, c), shards)
    pods = data["pods"]
    assert data["migrations"] == [
        {"pod": "default/podB", "from": "node1", "to": "node2", "by": "default/podC"}
    ]
    assert pods["default/podC"]["node"] == "node1" and pods["default/podA"]["node"] == "node1"
    assert pods["default/podB"]["node"] == "node2" and pods["default/podB"]["phase"] == "Bound"
    assert data["preemptions"] == []
    held = {k: set(v["devices"]) for k, v in pods.items()}
    assert held["default/podA"].isdisjoint(held["default/podC"])
    assert held["default/podB"].isdisjoint(held["default/podD"])
    log = tmp_path / f"run-{shards}.log"
    assert main(["replay", str(log), "--explain", "default/podC", "--json"]) == 0
    explained = json.loads(capsys.readouterr().out)
    assert explained["migrations"] == data["migrations"]


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(
    "rule",
    ["says no", "higher priority", "gang member"],
)
def test_a_pod_that_may_not_move_is_not_moved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, rule: str
) -> None:
    b_args: dict[str, Any] = {}
    text = ""
    if rule == "says no":
        b_args["migratable"] = False
    elif rule == "higher priority":
        b_args["priority"] = 10
    else:
        # podB's gang has podE on node2 too: only the whole gang may move, and podE
        # finds no other node (node1 is the room being made), so no plan moves podB
        text += podgroup("pair", 2) + gpu_pod("podE", 1, on="node2", group="pair")
        b_args["group"] = "pair"
    text += seed(8, 4, 3, 5, 4, **b_args)
    data = run(tmp_path, capsys, text, shards)
    assert data["migrations"] == []
    assert data["pods"]["default/podC"]["phase"] == "Pending"
    assert data["pods"]["default/podB"]["node"] == "node1"


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(("nodes", "moves"), [(1, 3), (1, 8), (2, 3)])
def test_a_reason_never_offers_moves_that_have_nowhere_to_go(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, nodes: int, moves: int
) -> None:
    """Each node runs eight 1-card pods and is full; a 4-card pod waits. Moving four
    pods would free room on a node, but there is nowhere to move them (one node, or
    every other node full as well): whatever ``maxMoves``, the reason offers no moves
    (issue #28, item 4)."""
    text = max_moves(moves) + "".join(gpu_node(f"node{i}", 8) for i in range(1, nodes + 1))
    for n in range(1, nodes + 1):
        text += "".join(gpu_pod(f"one-{n}-{i}", 1, on=f"node{n}") for i in range(8))
    text += gpu_pod("big", 4, at=10)
    data = run(tmp_path, capsys, text, shards)
    big = data["pods"]["default/big"]
    assert big["phase"] == "Pending" and data["migrations"] == []
    assert "would make room" not in big["reason"] and "moves" not in big["reason"], big


@pytest.mark.parametrize("shards", SHARDS)
def test_the_reason_names_the_fewest_moves_that_could_be_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """node1 runs eight 1-card pods; node2 has room for two of them, node3 for three.
    A 5-card pod needs five of node1's pods moved, and all five can go: with maxMoves 3
    its reason names that plan, with its real size (the fewest moves that could be made,
    not merely one more than allowed)."""
    text = "".join(gpu_node(f"node{i}", 8) for i in (1, 2, 3))
    text += "".join(gpu_pod(f"one-{i}", 1, on="node1") for i in range(8))
    text += gpu_pod("stay-2", 6, on="node2", migratable=False)
    text += gpu_pod("stay-3", 5, on="node3", migratable=False)
    text += gpu_pod("big", 5, at=10)
    data = run(tmp_path, capsys, text, shards)
    big = data["pods"]["default/big"]
    assert big["phase"] == "Pending" and data["migrations"] == []
    assert "5 moves (maxMoves 3)" in big["reason"] and "off node1" in big["reason"], big


@pytest.mark.parametrize("shards", SHARDS)
def test_a_plan_needing_too_many_moves_is_named_not_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """node1 runs eight 1-card pods; node2 and node3 have 3 cards free each, held by
    pods that stay. A 4-card pod needs four of node1's pods moved: beyond the default
    of 3 moves it waits, its reason naming that plan; allowed 4, it is placed. (At 4
    shards node1 shares its shard with node3: the four moves mix moves within a shard
    and across shards, carried out as parts of the plan on each shard.)"""
    text = "".join(gpu_node(f"node{i}", 8) for i in (1, 2, 3))
    text += "".join(gpu_pod(f"one-{i}", 1, on="node1") for i in range(8))
    text += gpu_pod("stay-2", 5, on="node2", migratable=False)
    text += gpu_pod("stay-3", 5, on="node3", migratable=False)
    text += gpu_pod("big", 4, at=10)
    data = run(tmp_path, capsys, text, shards)
    big = data["pods"]["default/big"]
    assert big["phase"] == "Pending" and data["migrations"] == []
    assert "4 moves (maxMoves 3)" in big["reason"] and "off node1" in big["reason"]
    (tmp_path / "four").mkdir()
    allowed = run(tmp_path / "four", capsys, max_moves(4) + text, shards)
    assert allowed["pods"]["default/big"]["node"] == "node1"
    moved = allowed["migrations"]
    assert len(moved) == 4 and {m["to"] for m in moved} <= {"node2", "node3"}


@pytest.mark.parametrize("shards", SHARDS)
def test_a_moved_pod_restarts_on_its_new_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """podB runs 100 s; moved at 10 s, it runs 100 s again there (succeeds at 110, not
    at 100): the pod placed in its room finishes first."""
    text = seed(8, 4, 3, 5, 4, runtime=100)
    data = run(tmp_path, capsys, text, shards)
    assert data["pods"]["default/podB"]["phase"] == "Succeeded"
    assert data["summary"]["simulated_seconds"] == pytest.approx(110)


@pytest.mark.parametrize("shards", SHARDS)
def test_a_pod_that_fits_is_placed_without_moves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """The node already has room: nothing moves."""
    text = gpu_node("node1", 8) + gpu_node("node2", 8)
    text += gpu_pod("podA", 4, on="node1") + gpu_pod("podB", 3, on="node1")
    text += gpu_pod("podC", 4, at=10)
    data = run(tmp_path, capsys, text, shards)
    assert data["migrations"] == []
    assert data["pods"]["default/podC"]["node"] == "node2"


def defrag_config(per_minute: int, per_node: int = 2) -> str:
    return rescheduler_config(
        f"{{defragmentation: {{movesPerMinute: {per_minute}, movesPerNodePerMinute: {per_node}}}}}"
    )


@pytest.mark.parametrize("shards", (1, 2))
@pytest.mark.parametrize(("budget", "moved"), [(10, 2), (1, 0), (0, 0)])
def test_defragmentation_empties_nearly_empty_machines_within_its_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, budget: int, moved: int
) -> None:
    """Off by default. On, between passes: spare holds two 1-card pods (a quarter of
    its cards, nearly empty) and busy holds 5 cards; both small pods move to busy, so
    spare is whole. A budget smaller than what emptying spare takes moves nothing."""
    text = defrag_config(budget) if budget else ""
    text += gpu_node("spare", 8) + gpu_node("busy", 8)
    text += gpu_pod("small-0", 1, on="spare") + gpu_pod("small-1", 1, on="spare")
    text += gpu_pod("big-0", 5, on="busy", migratable=False)
    data = run(tmp_path, capsys, text, shards)
    moves = [m for m in data["migrations"] if m["by"] == "shoal.io/defragmentation"]
    assert len(moves) == moved
    if moved:
        assert {m["from"] for m in moves} == {"spare"} and {m["to"] for m in moves} == {"busy"}
        assert all(data["pods"][f"default/small-{i}"]["node"] == "busy" for i in range(2))
