"""The rescheduler's card search (``engine/plugins/cardchain.py``): a pod that asks for one
card is placed by moving the pods that share a card off it, each landing directly or
after a pod of another card steps aside for it (a chain); at 1, 2 and 4 shards, replayed
with ``--verify``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import gpu_node, gpu_pod, pod_group, rescheduler_config

SHARDS = (1, 2, 4)


def chain_case(args: str = "{}", *, protected: str = "") -> str:
    """node1's card runs a (600m), node2's b (400m) and e (100m), node3's d (500m); e and d
    may not move. podC (a whole card) fits only on node1's card once a is gone, and a has
    no card with 600m free until b steps aside onto node3. Two moves: b to node3, a to
    node2, and podC takes node1's card."""
    text = rescheduler_config(args)
    text += "".join(gpu_node(name, 1) for name in ("node1", "node2", "node3"))
    text += gpu_pod("a", milli=600, on="node1", group=protected)
    text += gpu_pod("b", milli=400, on="node2")
    text += gpu_pod("e", milli=100, on="node2", migratable=False)
    text += gpu_pod("d", milli=500, on="node3", migratable=False)
    return text + gpu_pod("podC", cards=1, at=10)


@pytest.mark.parametrize("shards", SHARDS)
def test_a_chain_of_two_moves_frees_a_card(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    data, _ = shoal(tmp_path, capsys, chain_case(), shards)
    assert _moves(data) == CHAIN
    assert data["pods"]["default/podC"]["node"] == "node1"


CHAIN = [("default/b", "node2", "node3"), ("default/a", "node1", "node2")]


def _moves(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(m["pod"], m["from"], m["to"]) for m in data["migrations"]]


@pytest.mark.parametrize(
    ("enough", "short"),
    [
        ("{maxMoves: 2}", "{maxMoves: 1}"),
        # 4 pods placed: 50% allows two moves, 49% one
        ("{budget: {percentOfPlaced: 50}}", "{budget: {percentOfPlaced: 49}}"),
    ],
)
def test_a_chain_is_made_only_within_the_moves_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], enough: str, short: str
) -> None:
    for args, made in ((enough, True), (short, False)):
        (tmp_path / args).mkdir()
        data, _ = shoal(tmp_path / args, capsys, chain_case(args), 1)
        assert _moves(data) == (CHAIN if made else []), args
        assert data["pods"]["default/podC"]["node"] == ("node1" if made else None)


BUDGET = """
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: all, namespace: default}
spec: {minAvailable: "100%", selector: {}}
---"""


@pytest.mark.parametrize("protect", ["gang", "disruption budget"])
def test_gang_members_and_disruption_budgets_stop_a_chain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], protect: str
) -> None:
    # the same case unprotected makes the chain (test_a_chain_of_two_moves_frees_a_card);
    # a gang of one bound member is left to the first search (which has no plan: a
    # lands nowhere directly); a budget that allows no disruption moves nobody
    if protect == "gang":
        text = pod_group("g", 1) + chain_case(protected="g")
    else:
        text = BUDGET + chain_case()
    for case, made in ((chain_case(), True), (text, False)):
        where = tmp_path / str(made)
        where.mkdir()
        data, _ = shoal(where, capsys, case, 1)
        assert _moves(data) == (CHAIN if made else [])
        assert data["pods"]["default/podC"]["node"] == ("node1" if made else None)
