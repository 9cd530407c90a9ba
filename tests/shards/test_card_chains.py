"""The rescheduler's card search (``engine/plugins/cardchain.py``): a pod that asks for one
card is placed by moving the pods that share a card off it, each landing directly or
after a pod of another card steps aside for it (a chain); at 1, 2 and 4 shards, replayed
with ``--verify``, the pods it moves bound by name or placed by a GPU policy (at several
shards, on the coordinator)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.passes.dispatch import Local
from engine.plugins import cardchain
from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import gpu_node, gpu_pod, pod_group, rescheduler_config

SHARDS = (1, 2, 4)
EVERY = (1, 2, 4, 8)
"""The shard counts of the random scenarios (the cases above run at ``SHARDS``)."""


def chain_case(args: str = "{}", *, protected: str = "", pools: bool = False) -> str:
    """node1's card runs a (600m), node2's b (400m) and e (100m), node3's d (500m); e and d
    may not move. podC (a whole card) fits only on node1's card once a is gone, and a has
    no card with 600m free until b steps aside onto node3. Two moves: b to node3, a to
    node2, and podC takes node1's card. ``pools``: each node in a pool of its own (at 4
    shards each on a shard of its own: node2's shard takes a in as b leaves it)."""
    text = rescheduler_config(args)
    text += "".join(
        gpu_node(name, 1, pool=f"p{i}" if pools else "")
        for i, name in enumerate(("node1", "node2", "node3"))
    )
    text += gpu_pod("a", milli=600, on="node1", group=protected)
    text += gpu_pod("b", milli=400, on="node2")
    text += gpu_pod("e", milli=100, on="node2", migratable=False)
    text += gpu_pod("d", milli=500, on="node3", migratable=False)
    return text + gpu_pod("podC", cards=1, at=10)


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("placed", ["by name", "by a GPU policy", "across pools"])
def test_a_chain_of_two_moves_frees_a_card(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, placed: str
) -> None:
    # placed by a GPU policy, before: a shard took a pod held under a part of its own
    # for a gang's member and left it to the first search, so the coordinator's plan
    # was never found there, and the pod went back and forth between them for ever
    # across pools, before: at 4 shards node2's shard was asked to take a in while b
    # still ran there, and refused, and so did the shards after two tries
    if placed == "by a GPU policy":
        case = placed_chain_case()
    else:
        case = chain_case(pools=placed == "across pools")
    data, _ = shoal(tmp_path, capsys, case, shards)
    # (across shards, the report lists the moves by partition: the same moves)
    assert sorted(_moves(data)) == sorted(CHAIN)
    assert shards > 1 or _moves(data) == CHAIN
    assert data["pods"]["default/podC"]["node"] == "node1"


CHAIN = [("default/b", "node2", "node3"), ("default/a", "node1", "node2")]


def placed_chain_case() -> str:
    """The chain case with a and b placed by the ShoalGpu policy, each held to its two
    nodes by GPU model (a: node1's A or node2's B; b: node2's or node3's C), all three
    nodes in one pool: at several shards a and b are decided on the coordinator and
    held on their shard each under a reservation part of its own, and the plan is
    within that shard, which carries it out. node9, in a pool of its own (another
    shard's at 2 and 4), has no room for podC."""
    text = rescheduler_config("{}", score="ShoalGpu")
    for name, model in (("node1", "A"), ("node2", "B"), ("node3", "C")):
        text += gpu_node(name, 1, model=model, pool="p1")
    text += gpu_node("node9", 1, pool="p2")
    text += gpu_pod("e", milli=100, on="node2", migratable=False)
    text += gpu_pod("d", milli=500, on="node3", migratable=False)
    text += gpu_pod("z", milli=500, on="node9", migratable=False)
    text += gpu_pod("b", milli=400, models=("B", "C"), at=1)
    text += gpu_pod("a", milli=600, models=("A", "B"), at=2)
    return text + gpu_pod("podC", cards=1, at=10)


@pytest.mark.parametrize("shards", (2, 4))
def test_a_plan_its_shard_does_not_find_is_given_up_after_two_hand_backs(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    shards: int,
) -> None:
    """Should a shard's engine not find the plan of moves the coordinator found within
    that shard (here made so: the shards' card search sees no pod it may move), the pod
    handed back twice waits, saying why, instead of going back and forth for ever."""
    found = cardchain._Index.of

    def blind(handle: Any, state: Any, units: Any) -> Any:
        return found(handle, state, {} if isinstance(handle.dispatch, Local) else units)

    monkeypatch.setattr(cardchain._Index, "of", blind)
    data, _ = shoal(tmp_path, capsys, placed_chain_case(), shards)
    assert _moves(data) == []
    view = data["pods"]["default/podC"]
    assert view["node"] is None
    assert "refused its plans of moves 2 times" in view["reason"], view


def _moves(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(m["pod"], m["from"], m["to"]) for m in data["migrations"]]


def _moved_for(data: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Every move and the pod it made room for, in no particular order."""
    return sorted((m["pod"], m["from"], m["to"], m["by"]) for m in data["migrations"])


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


RUNTIMES = st.sampled_from([None, None, 5.0, 30.0])
Share = tuple[int, int, bool, float | None, int, int]
"""(whole cards or 0, milli-GPU of one card or 0, movable, runtime in seconds or None,
priority, seconds after the pod before)."""

SHARE = st.tuples(
    st.just(0),
    st.sampled_from([100, 200, 300, 400, 500, 600, 700]),
    st.booleans(),
    RUNTIMES,
    st.sampled_from([0, 0, 0, 10]),
    st.sampled_from([0, 1, 1, 2]),
)
WHOLE = st.tuples(
    st.sampled_from([1, 1, 2]),
    st.just(0),
    st.just(True),
    RUNTIMES,
    st.sampled_from([0, 0, 0, 10]),
    st.sampled_from([0, 1, 1, 2]),
)
Gang = tuple[int, int, int]
"""(members, milli-GPU of one card each or 0 for a whole card, seconds it arrives at)."""
CONSOLIDATE = "{budget: {percentOfPlaced: 30}, consolidate: true}"
DEFRAGMENT = "{defragmentation: {movesPerMinute: 10, movesPerNodePerMinute: 2}}"


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    nodes=st.lists(
        st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([4, 64])), min_size=2, max_size=4
    ),
    pools=st.sampled_from([1, 2]),
    policy=st.sampled_from(["ShoalGpu", "ShoalGpu", "GpuFragmentation", "GpuBestFit"]),
    args=st.sampled_from(
        ["{}", "{maxMoves: 3}", "{budget: {percentOfPlaced: 20}}", CONSOLIDATE, DEFRAGMENT]
    ),
    pods=st.lists(st.one_of(SHARE, SHARE, SHARE, WHOLE), min_size=4, max_size=14),
    gangs=st.lists(
        st.tuples(st.integers(2, 3), st.sampled_from([0, 300, 500]), st.integers(0, 12)),
        max_size=2,
    ),
)
# found at 2 and 4 shards: the shard took another card for pod2 than the policy chose,
# and the whole card pod3 asks for was gone
@example(
    nodes=[(1, 4), (2, 4)],
    pools=1,
    policy="ShoalGpu",
    args="{}",
    pods=[(0, 400, False, None, 0, 1)] * 2
    + [(0, 300, False, None, 0, 1), (1, 0, True, None, 0, 1)],
    gangs=[],
)
# found at 2 shards: pod5's plan moved pod2 to the other shard before pod2's own shard
# had granted its claim; that shard then bound pod2 where it no longer ran
@example(
    nodes=[(1, 4), (1, 4)],
    pools=2,
    policy="ShoalGpu",
    args="{}",
    pods=[
        (0, 300, True, 5.0, 0, 0),
        (0, 200, True, None, 0, 0),
        (0, 200, True, None, 0, 1),
        (0, 400, False, 30.0, 0, 0),
        (0, 100, False, None, 0, 0),
        (0, 600, True, 30.0, 0, 0),
        (1, 0, True, None, 0, 2),
        (0, 200, False, 5.0, 0, 2),
        (2, 0, True, None, 0, 0),
    ],
    gangs=[(2, 500, 9), (2, 300, 3)],
)
@example(
    nodes=[(1, 4), (1, 4)],
    pools=2,
    policy="ShoalGpu",
    args="{}",
    pods=[
        (0, 200, True, None, 0, 0),
        (0, 300, False, 5.0, 0, 0),
        (1, 0, True, None, 0, 1),
        (0, 600, False, None, 0, 0),
        (1, 0, True, None, 0, 0),
        (1, 0, True, None, 0, 1),
        (0, 100, True, None, 0, 1),
        (0, 500, False, None, 0, 1),
        (0, 600, False, None, 10, 0),
        (0, 400, False, None, 0, 1),
    ],
    gangs=[],
)
# found at 2 shards: pod3 was evicted for pod12, and before pod12 came its shard
# consolidated pod10 into that room
@example(
    nodes=[(1, 4), (1, 4), (4, 4)],
    pools=1,
    policy="ShoalGpu",
    args=CONSOLIDATE,
    pods=[
        (0, 100, True, None, 0, 2),
        (1, 0, True, None, 0, 0),
        (0, 100, False, None, 0, 0),
        (1, 0, True, None, 0, 0),
        (0, 100, True, None, 0, 1),
        (0, 100, False, None, 10, 0),
        (0, 100, False, None, 0, 0),
        (1, 0, True, None, 0, 0),
        (1, 0, True, None, 0, 0),
        (2, 0, True, None, 10, 0),
        (1, 0, True, None, 10, 0),
        (1, 0, True, None, 0, 0),
        (1, 0, True, None, 10, 0),
    ],
    gangs=[],
)
# found at 2 and 4 shards: each shard consolidated its own pool, by its own count of
# the budget, and moved fewer pods than one shard (now the coordinator consolidates)
@example(
    nodes=[(4, 8), (1, 8), (1, 8)],
    pools=2,
    policy="ShoalGpu",
    args=CONSOLIDATE,
    pods=[
        (0, 700, True, None, 0, 2),
        (0, 500, True, None, 0, 1),
        (0, 300, True, None, 0, 0),
        (0, 100, True, None, 0, 0),
        (0, 700, True, None, 0, 0),
        (0, 700, True, 30.0, 0, 2),
        (0, 400, False, 30.0, 100, 1),
        (0, 700, False, 5.0, 0, 1),
        (1, 0, True, None, 0, 0),
        (0, 400, True, 5.0, 100, 1),
        (0, 500, True, 30.0, 0, 2),
        (0, 700, False, 5.0, 0, 0),
    ],
    gangs=[(3, 500, 4)],
)
@example(
    nodes=[(1, 64), (1, 64), (4, 64)],
    pools=2,
    policy="ShoalGpu",
    args=CONSOLIDATE,
    pods=[
        (0, 100, True, None, 0, 2),
        (1, 0, True, 5.0, 0, 1),
        (0, 500, True, 30.0, 100, 1),
        (0, 400, True, 5.0, 0, 1),
        (1, 0, True, 30.0, 0, 0),
        (1, 0, True, None, 0, 1),
        (0, 100, False, 5.0, 0, 2),
        (0, 500, False, 5.0, 0, 1),
        (2, 0, True, None, 0, 2),
        (0, 300, True, None, 0, 1),
        (0, 600, True, 30.0, 0, 1),
        (0, 200, True, None, 0, 2),
        (0, 500, False, 30.0, 0, 1),
    ],
    gangs=[(3, 300, 5), (3, 500, 15), (3, 500, 16), (2, 0, 16), (2, 0, 17)],
)
# found at 2 and 4 shards: consolidation moved pod4 within shard 1 onto cards that
# pods leaving for shard 0 held, while a pod from shard 0 landed on pod4's node; sent
# in one step, pod4 took other cards on its new node (now the moves across go first,
# as they fit with pod4 still in place)
@example(
    nodes=[(2, 8), (1, 64), (1, 8), (4, 8), (2, 8)],
    pools=2,
    policy="ShoalGpu",
    args=CONSOLIDATE,
    pods=[
        (1, 0, True, 5.0, 0, 2),
        (0, 500, True, None, 0, 1),
        (0, 200, False, 30.0, 0, 2),
        (0, 500, True, None, 10, 0),
        (0, 600, True, None, 0, 0),
        (0, 200, False, 30.0, 0, 1),
        (0, 200, True, 5.0, 0, 0),
        (0, 400, True, 30.0, 10, 0),
        (0, 100, True, None, 100, 1),
        (0, 500, False, 5.0, 0, 1),
        (2, 0, True, 5.0, 0, 2),
        (0, 100, True, None, 10, 1),
        (0, 100, True, 5.0, 10, 0),
        (0, 200, False, None, 10, 2),
        (0, 400, True, None, 0, 1),
        (0, 300, True, 30.0, 0, 2),
        (0, 600, True, 5.0, 0, 1),
        (0, 500, True, None, 0, 1),
    ],
    gangs=[],
)
def test_moves_and_cards_are_one_schedulers_at_every_shard_count(
    capsys: pytest.CaptureFixture[str],
    nodes: list[tuple[int, int]],
    pools: int,
    policy: str,
    args: str,
    pods: list[Share],
    gangs: list[Gang],
) -> None:
    """GPU pods a GPU policy places (decided on the coordinator at several shards), some
    finishing, some of higher priority, whole cards among the shares (the rescheduler
    moves shares for them), gangs, consolidation, defragmentation: at 1, 2, 4 and 8
    shards the same moves, each pod on the same node and cards, and every log
    replays."""
    text = rescheduler_config(args, score=policy)
    for i, (cards, cpu) in enumerate(nodes):
        text += gpu_node(f"node{i}", cards, cpu=cpu, pool=f"p{i % pools}")
    at = 0
    for j, (whole, milli, movable, runtime, priority, gap) in enumerate(pods):
        at += gap
        text += gpu_pod(
            f"pod{j}",
            cards=whole,
            milli=milli,
            at=at,
            migratable=movable,
            runtime=runtime,
            priority=priority or None,
        )
    for j, (size, milli, when) in enumerate(gangs):
        text += pod_group(f"g{j}", size, at=when)
        for m in range(size):
            text += gpu_pod(
                f"g{j}-{m}", cards=0 if milli else 1, milli=milli, at=when, group=f"g{j}"
            )
    seen = []
    with tempfile.TemporaryDirectory() as where:
        for shards in EVERY:
            data, _ = shoal(Path(where), capsys, text, shards)
            seen.append(
                (
                    # each pod's moves in order (the moves of one instant on several
                    # shards' partitions are merged in no particular order)
                    sorted(_moves(data), key=lambda move: move[0]),
                    _moved_for(data),
                    {k: (v["node"], v.get("devices")) for k, v in data["pods"].items()},
                )
            )
    for other in seen[1:]:
        assert other == seen[0]
