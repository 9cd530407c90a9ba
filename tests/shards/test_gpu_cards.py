"""GPU cards end to end: ``shoal simulate`` at 1 and 2 shards, replayed with ``--verify``.

Each test is a rule with numbers of its own: a multi-card pod takes wholly free cards
only; shares of a card never add up past the card; a GPU model named by node affinity
is honoured; a gang of multi-card pods is placed whole or not at all; preemption frees
the cards the preemptor then takes. The simulated cluster checks every decision's cards
as a device plugin would (a wrong card fails the bind), and replay checks the engine's
card table against its pods.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import gpu_node, gpu_pod
from tests.shards.scenario_text import pod_group as podgroup

SHARDS = (1, 2, 4)


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, shards: int) -> Any:
    data, _ = shoal(tmp_path, capsys, text, shards)
    return data


def cards_in_use(data: Any, sizes: dict[str, int]) -> dict[tuple[str, int], int]:
    """(node, card) → milli-cards the bound pods hold there, from the report."""
    used: dict[tuple[str, int], int] = {}
    for key, view in data["pods"].items():
        if view["phase"] != "Bound":
            continue
        for card in view.get("devices", []):
            where = (view["node"], card)
            used[where] = used.get(where, 0) + sizes[key]
    return used


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(("cards", "share"), [(2, 501), (4, 600), (3, 999)])
def test_a_multi_card_pod_never_takes_cards_that_are_partly_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, cards: int, share: int
) -> None:
    """Every card of every node holds a share of more than half a card: the scalar
    ``nvidia.com/gpu`` says the node has all its cards free, but no card is whole (and
    no two shares fit one card, so no move can free one), so a pod asking for two whole
    cards waits, saying why."""
    nodes = 2
    text = "".join(gpu_node(f"n{i}", cards) for i in range(nodes))
    text += "".join(gpu_pod(f"s{i}", milli=share) for i in range(nodes * cards))
    text += gpu_pod("two", cards=2, at=1)
    data = run(tmp_path, capsys, text, shards)
    assert all(data["pods"][f"default/s{i}"]["phase"] == "Bound" for i in range(nodes * cards))
    two = data["pods"]["default/two"]
    assert two["phase"] == "Pending"
    assert "whole cards" in two["reason"]


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("cards", [5, 8])
def test_shares_fill_a_card_best_fit_and_leave_the_others_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, cards: int
) -> None:
    """Four 250m shares on one node go on one card; a pod asking for every other card
    of the node then finds them whole."""
    text = gpu_node("a", cards)
    text += "".join(gpu_pod(f"q{i}", milli=250, at=i) for i in range(4))
    text += gpu_pod("rest", cards=cards - 1, at=5)
    data = run(tmp_path, capsys, text, shards)
    quarters = [data["pods"][f"default/q{i}"] for i in range(4)]
    assert {(q["node"], tuple(q["devices"])) for q in quarters} == {("a", (0,))}
    rest = data["pods"]["default/rest"]
    assert rest["phase"] == "Bound" and rest["devices"] == list(range(1, cards))


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    shares=st.lists(st.integers(1, 1000), min_size=1, max_size=14),
    cards=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    shards=st.sampled_from(SHARDS),
)
def test_shared_cards_never_go_over_a_whole_card(
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    shares: list[int],
    cards: list[int],
    shards: int,
) -> None:
    """Shares arriving over time, on nodes of any size: no card holds more than 1000m,
    and a share left pending fits on no card at the end (nothing departs, so it never
    could have)."""
    tmp_path = tmp_path_factory.mktemp("shares")
    text = "".join(gpu_node(f"n{i}", n) for i, n in enumerate(cards))
    text += "".join(gpu_pod(f"p{i}", milli=m, at=i) for i, m in enumerate(shares))
    data = run(tmp_path, capsys, text, shards)
    sizes = {f"default/p{i}": m for i, m in enumerate(shares)}
    used = cards_in_use(data, sizes)
    assert all(0 < milli <= 1000 for milli in used.values()), used
    free = [1000 - used.get((f"n{i}", card), 0) for i, n in enumerate(cards) for card in range(n)]
    for key, milli in sizes.items():
        if data["pods"][key]["phase"] != "Bound":
            assert max(free) < milli, (key, milli, free)


@pytest.mark.parametrize("shards", SHARDS)
def test_a_gpu_model_named_by_node_affinity_is_honoured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    text = gpu_node("v100", 8, model="V100") + gpu_node("a100", 2, model="A100")
    text += gpu_node("t4", 8, model="T4")
    text += gpu_pod("train", cards=2, models=("A100",))
    text += gpu_pod("more", cards=1, models=("A100",), at=1)
    text += gpu_pod("either", milli=300, models=("A100", "T4"), at=2)
    data = run(tmp_path, capsys, text, shards)
    pods = data["pods"]
    assert pods["default/train"]["node"] == "a100"
    assert pods["default/more"]["phase"] == "Pending"  # the A100 node's two cards are taken
    assert pods["default/either"]["node"] == "t4"


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(("min_member", "placed"), [(5, 5), (4, 5), (6, 0)])
def test_a_gang_of_multi_card_pods_is_placed_whole_or_not_at_all(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shards: int,
    min_member: int,
    placed: int,
) -> None:
    """Three 8-card nodes, one with a share on a card: a member asks for 4 cards, so
    the nodes hold 2 + 2 + 1 members, never one on the shared card. A gang needing 4 or
    5 of its 6 members gets the 5 that fit; one needing 6 holds nothing."""
    text = "".join(gpu_node(f"n{i}", 8) for i in range(3))
    text += gpu_pod("share", milli=100)
    text += podgroup("train", min_member)
    text += "".join(gpu_pod(f"w{i}", cards=4, group="train", at=1) for i in range(6))
    data = run(tmp_path, capsys, text, shards)
    members = [data["pods"][f"default/w{i}"] for i in range(6)]
    assert sum(m["phase"] == "Bound" for m in members) == placed
    if placed:
        used: dict[tuple[str, int], int] = {}
        for m in members:
            for card in m.get("devices", []):
                used[(m["node"], card)] = used.get((m["node"], card), 0) + 1
        assert all(n == 1 for n in used.values())
        share = data["pods"]["default/share"]
        assert (share["node"], share["devices"][0]) not in used


@pytest.mark.parametrize("shards", SHARDS)
def test_preemption_frees_the_cards_the_preemptor_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """One 4-card node: low-priority shares on cards 0 and 1 (one pod on card 0, two on
    card 1), low-priority whole-card pods on cards 2 and 3. A high-priority pod asking
    for two whole cards evicts the fewest pods that free two whole cards: two (the pod
    of card 0 and a whole-card pod, or both whole-card pods), never the three that
    card 0 and card 1 would cost; it then holds exactly the cards they held."""
    text = gpu_node("n", 4)
    text += gpu_pod("a", milli=600, priority=1)
    text += gpu_pod("b", milli=300, priority=1, at=1)
    text += gpu_pod("c", milli=300, priority=1, at=1)
    text += gpu_pod("d", cards=1, priority=1, at=2)
    text += gpu_pod("e", cards=1, priority=1, at=2)
    text += gpu_pod("boss", cards=2, priority=100, at=3)
    data = run(tmp_path, capsys, text, shards)
    pods = data["pods"]
    held = {key: set(view.get("devices", [])) for key, view in pods.items()}
    boss = pods["default/boss"]
    assert boss["phase"] == "Bound"
    victims = {p["pod"] for p in data["preemptions"]}
    assert len(victims) == 2, victims
    assert {p["by"] for p in data["preemptions"]} == {"default/boss"}
    freed: set[int] = set()
    for victim in victims:
        assert pods[victim]["phase"] != "Bound"
    # the cards the victims held, from the bound survivors' complement
    survivors = {k for k, v in pods.items() if v["phase"] == "Bound" and k != "default/boss"}
    taken = set().union(*(held[k] for k in survivors))
    freed = set(range(4)) - taken
    assert set(boss["devices"]) <= freed and len(boss["devices"]) == 2


@pytest.mark.parametrize("shards", SHARDS)
def test_half_cards_are_moved_together_to_free_whole_cards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """One node, two cards, a 500m share on each: a pod asking for one whole card fits
    once one share moves beside the other (the rescheduler, one move)."""
    text = gpu_node("n", 2)
    text += gpu_pod("s0", milli=500) + gpu_pod("s1", milli=500, at=1)
    text += gpu_pod("one", cards=1, at=2)
    data = run(tmp_path, capsys, text, shards)
    pods = data["pods"]
    # best fit put both shares on card 0 already: no move needed
    assert pods["default/s0"]["devices"] == pods["default/s1"]["devices"] == [0]
    assert pods["default/one"]["devices"] == [1]
    assert data["migrations"] == []
