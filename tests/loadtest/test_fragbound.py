"""Lower bounds on the fragmentation benchmark's unallocated GPU (loadtest/fragbound.py):
never above what a placement reaches, exact on small cases, tighter as fewer pods may be
left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtest.fragbound import Arrived, bounds, lp_bound
from loadtest.fragmentation import Run, run_one
from loadtest.gputrace import TracePod
from shards.cli import main


def _arrived(shares: list[int], whole: int) -> Arrived:
    return Arrived(tuple(shares), whole, sum(shares) + 1000 * whole)


def test_three_shares_on_two_cards() -> None:
    # 600 + 600 + 800 on 2 cards: no two share a card, so one is left out; leaving a
    # 600 out allocates 1400 of 2000: 30% idle, with any pod or a 600 refusable
    arrived = _arrived([600, 600, 800], 0)
    assert lp_bound(arrived, 2) == pytest.approx(30.0)
    assert lp_bound(arrived, 2, (600,)) == pytest.approx(30.0)
    # with only the 800 refusable, both 600s are placed: 1200 of 2000
    assert lp_bound(arrived, 2, (800,)) == pytest.approx(40.0)
    with pytest.raises(ValueError):
        lp_bound(arrived, 2, ())  # three cards' worth of shares on two


def test_a_share_left_out_for_a_whole_card_pod() -> None:
    # 810 + a whole-card pod on 1 card... two cards: 810 and a 1000 fill both, 190 idle
    # of 2000 (9.5%); on one card the whole pod wins (1000 of 1000)
    assert lp_bound(_arrived([810], 1), 2) == pytest.approx(9.5)
    assert lp_bound(_arrived([810], 1), 1) == pytest.approx(0.0)


def _greedy_idle(shares: list[int], whole: int, cards: int) -> float:
    """A placement: shares in order on the fullest card that holds them (or a new card
    while there is one), then whole-card pods on the cards left."""
    free: list[int] = []
    allocated = 0
    for share in shares:
        fits = [i for i, f in enumerate(free) if f >= share]
        if fits:
            i = min(fits, key=lambda i: (free[i], i))
            free[i] -= share
        elif len(free) < cards:
            free.append(1000 - share)
        else:
            continue
        allocated += share
    allocated += 1000 * min(whole, cards - len(free))
    return 100 * (cards * 1000 - allocated) / (cards * 1000)


@settings(max_examples=20, deadline=None)
@given(
    shares=st.lists(st.sampled_from([110, 230, 320, 470, 650, 810]), max_size=14),
    whole=st.integers(0, 4),
    cards=st.integers(1, 6),
    late=st.integers(0, 14),
)
def test_no_placement_beats_the_bound(shares: list[int], whole: int, cards: int, late: int) -> None:
    arrived = _arrived(shares, whole)
    anything = lp_bound(arrived, cards)
    assert anything <= _greedy_idle(shares, whole, cards) + 1e-6
    # fewer pods that may be left out: a bound no lower (and one, whenever the shares
    # that may not be left out fit on the cards, as they do when a greedy placement
    # of them alone places them all)
    required = shares[:late]
    try:
        assert anything <= lp_bound(arrived, cards, shares[late:]) + 1e-6
    except ValueError:
        assert _greedy_idle(required, 0, cards) > 100 * (1 - sum(required) / (cards * 1000))


def test_the_runs_bounds_on_trace_like_pods() -> None:
    pods = [TracePod("a", 1000, 1024, 1, 810, ()), TracePod("b", 1000, 1024, 1, 1000, ())]
    row = bounds(pods * 20, 8, seed=1)
    assert set(row) == {"placed", "late", "any"}
    assert row["any"] is not None and row["late"] is not None and row["placed"] is not None
    assert row["any"] <= row["late"] <= row["placed"]
    # more share pods than the cards hold: no policy places them all
    crowded = bounds([TracePod("a", 1000, 1024, 1, 600, ())] * 40, 8, seed=1)
    assert crowded["placed"] is None and crowded["any"] is not None


TRACE = Path(__file__).parent.parent / "fixtures" / "gputrace"


def test_the_command_prints_bounds_no_run_beats(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["loadtest", "fragmentation", "--trace", str(TRACE), "--workload", "big"]
    assert main([*argv, "--bound", "--seeds", "1-2", "--json"]) == 0
    rows = json.loads(capsys.readouterr()[0])["bounds"]
    assert [(r["workload"], r["seed"]) for r in rows] == [("big", 1), ("big", 2)]
    for row, policy in zip(rows, ["bestfit", "gpupacking"], strict=True):
        reached = run_one(TRACE, Run("big", policy, row["seed"]))["unallocated_pct_at_100"]
        assert row["any"] <= row["late"] <= row["placed"]
        assert row["any"] <= reached + 1e-6
