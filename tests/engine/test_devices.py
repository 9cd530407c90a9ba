"""GPU requests in every convention, and the card table that accounts for them.

The tables give what each convention's resources mean in cards, compute (milli-cards)
and memory (per mille of a card, or MiB); the properties check the card table against a
plain per-card ledger: whatever is assumed and forgotten, in any order, no card is ever
over-committed and the card-need rows the fit filter reads count exactly the cards that
satisfy each need.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.devices import (
    HAMI,
    KOORDINATOR,
    NVIDIA,
    SHOAL,
    WHOLE_CARD,
    CardNeed,
    GpuRequest,
    GpuRequestError,
    gpu_request,
    scalar_requests,
)
from engine.model.pods import make_request, pod_info
from engine.model.state import ClusterState
from events.types import PodSpec
from tests.builders import make_node

GI = 1 << 30


@pytest.mark.parametrize(
    ("requests", "expected"),
    [
        ({"cpu": 1000}, None),
        # the device plugin: N whole cards
        ({"nvidia.com/gpu": 2}, GpuRequest(2, WHOLE_CARD, NVIDIA)),
        # shoal: a share of one card's compute, no memory reserved
        ({"shoal.io/gpu-milli": 250}, GpuRequest(1, CardNeed(250, 0), SHOAL)),
        ({"nvidia.com/gpu": 1, "shoal.io/gpu-milli": 600}, GpuRequest(1, CardNeed(600, 0), SHOAL)),
        # 1000 milli is the whole card
        ({"shoal.io/gpu-milli": 1000}, GpuRequest(1, WHOLE_CARD, SHOAL)),
        # HAMi: 2 vGPUs, each 30% of a card's compute (300m) and 4000 MiB of its memory
        # (a vGPU: it counts as a card in quotas)
        (
            {"nvidia.com/gpu": 2, "nvidia.com/gpucores": 30, "nvidia.com/gpumem": 4000},
            GpuRequest(2, CardNeed(300, 0, 4000, vgpu=True), HAMI),
        ),
        # HAMi: memory as a percentage (25% = 250 per mille); cores default to 0
        (
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25},
            GpuRequest(1, CardNeed(0, 250, vgpu=True), HAMI),
        ),
        # HAMi: no memory named takes the whole memory, as HAMi defaults it
        ({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100}, GpuRequest(1, WHOLE_CARD, HAMI)),
        # Koordinator: 50% compute with a 50% memory ratio
        (
            {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50},
            GpuRequest(1, CardNeed(500, 500), KOORDINATOR),
        ),
        # Koordinator: 200% = two whole cards
        ({"koordinator.sh/gpu-core": 200}, GpuRequest(2, WHOLE_CARD, KOORDINATOR)),
        # Koordinator: memory in bytes, rounded up to MiB (8Gi = 8192 MiB)
        (
            {"koordinator.sh/gpu-core": 20, "koordinator.sh/gpu-memory": 8 * GI},
            GpuRequest(1, CardNeed(200, 0, 8192), KOORDINATOR),
        ),
        # Koordinator's shorthand: koordinator.sh/gpu: 30 = 30% compute and memory
        ({"koordinator.sh/gpu": 30}, GpuRequest(1, CardNeed(300, 300), KOORDINATOR)),
    ],
)
def test_each_convention_maps_onto_one_request(
    requests: dict[str, int], expected: GpuRequest | None
) -> None:
    assert gpu_request(requests) == expected


@pytest.mark.parametrize(
    ("requests", "named"),
    [
        ({"nvidia.com/gpucores": 30, "koordinator.sh/gpu-core": 30}, "mixes"),
        ({"shoal.io/gpu-milli": 0}, "1..1000"),
        ({"shoal.io/gpu-milli": 1001}, "1..1000"),
        ({"shoal.io/gpu-milli": 500, "nvidia.com/gpu": 2}, "share of one card"),
        ({"nvidia.com/gpucores": 101}, "0..100"),
        ({"nvidia.com/gpumem": 100, "nvidia.com/gpumem-percentage": 10}, "keep one"),
        ({"koordinator.sh/gpu-core": 150}, "multiple of 100"),
        ({"koordinator.sh/gpu-memory-ratio": 50}, "is needed"),
        ({"koordinator.sh/gpu-core": 200, "nvidia.com/gpu": 3}, "disagrees"),
        ({"nvidia.com/gpu": 65}, "at most 64"),
    ],
)
def test_requests_that_mean_nothing_are_refused_naming_why(
    requests: dict[str, int], named: str
) -> None:
    with pytest.raises(GpuRequestError, match=named):
        gpu_request(requests)


def test_scalar_requests_keep_whole_cards_and_leave_shares_to_the_cards() -> None:
    whole = {"cpu": 1000, "nvidia.com/gpu": 2}
    assert scalar_requests(whole, gpu_request(whole)) == whole
    hami = {"cpu": 1000, "nvidia.com/gpu": 1, "nvidia.com/gpucores": 30}
    assert scalar_requests(hami, gpu_request(hami)) == {"cpu": 1000}
    koord = {"koordinator.sh/gpu-core": 200}
    assert scalar_requests(koord, gpu_request(koord)) == {"nvidia.com/gpu": 2}


def _state(cards: int, nodes: int = 1, mib: int = 0) -> ClusterState:
    state = ClusterState()
    for i in range(nodes):
        builder = make_node(f"n{i}").cpu("64").memory("256Gi").gpu(cards)
        if mib:
            builder = builder.label("nvidia.com/gpu.memory", str(mib))
        state.add_node(builder.spec())
    return state


def _share(name: str, milli: int) -> PodSpec:
    return PodSpec(namespace="d", name=name, requests={"shoal.io/gpu-milli": milli})


def test_a_two_card_pod_never_takes_two_half_free_cards() -> None:
    state = _state(2)
    state.assume("d/a", 0, make_request(_share("a", 500), state.resources))
    # best fit: the second share goes on the busy card while it fits...
    state.assume("d/b", 0, make_request(_share("b", 500), state.resources))
    assert state.pods["d/a"].devices == state.pods["d/b"].devices == (0,)
    state.forget("d/b")
    state.assume("d/c", 0, make_request(_share("c", 600), state.resources))
    assert state.pods["d/c"].devices == (1,)  # ...and a new card when it does not
    two = pod_info(
        PodSpec(namespace="d", name="t", requests={"nvidia.com/gpu": 2}), state.resources, 0
    )
    state.ensure_rows()
    row = state.resources.card_row(WHOLE_CARD)
    assert state.free[state.resources.row("nvidia.com/gpu"), 0] == 2  # the scalar says 2
    assert state.free[row, 0] == 0  # no card is whole
    assert not state.fits(two.request, 0)
    state.check_invariants()


def test_memory_in_mib_needs_the_node_to_say_its_card_memory() -> None:
    hami = PodSpec(
        namespace="d", name="h", requests={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000}
    )
    unknown = _state(1)
    info = pod_info(hami, unknown.resources, 0)
    unknown.ensure_rows()
    assert not unknown.fits(info.request, 0)
    known = _state(1, mib=40960)
    info = pod_info(hami, known.resources, 0)
    known.ensure_rows()
    assert known.fits(info.request, 0)
    known.assume("d/h", 0, info.request)
    # 20000 MiB of 40960 takes ceil(488.28) = 489 per mille
    assert int(known.cards.memory[0, 0]) == 1000 - 489
    second = pod_info(
        PodSpec(namespace="d", name="i", requests=dict(hami.requests)), known.resources, 1
    )
    assert known.fits(second.request, 0)  # 489 + 489 <= 1000
    known.assume("d/i", 0, second.request)
    third = pod_info(
        PodSpec(namespace="d", name="j", requests=dict(hami.requests)), known.resources, 2
    )
    assert not known.fits(third.request, 0)
    known.check_invariants()


Op = tuple[str, int, int]


@st.composite
def _ops(draw: st.DrawFn) -> list[Op]:
    kinds = st.sampled_from(["share", "whole", "forget"])
    return draw(
        st.lists(st.tuples(kinds, st.integers(1, 1000), st.integers(1, 4)), min_size=1, max_size=40)
    )


@settings(max_examples=60, deadline=None)
@given(cards=st.integers(1, 8), nodes=st.integers(1, 3), ops=_ops())
def test_no_card_is_ever_over_committed_and_the_need_rows_stay_exact(
    cards: int, nodes: int, ops: list[Op]
) -> None:
    """Assume pods wherever the fit check says they fit, forget some, in any order: the
    table matches a per-card ledger, no card goes over 1000, and every need row counts
    exactly the cards that satisfy it (``check_invariants`` re-derives all three)."""
    state = _state(cards, nodes)
    placed: list[str] = []
    for i, (kind, milli, count) in enumerate(ops):
        if kind == "forget":
            if placed:
                state.forget(placed.pop(milli % len(placed)))
            continue
        requests = {"shoal.io/gpu-milli": milli} if kind == "share" else {"nvidia.com/gpu": count}
        info = pod_info(PodSpec(namespace="d", name=f"p{i}", requests=requests), state.resources, i)
        state.ensure_rows()
        where = [s for s in range(nodes) if state.fits(info.request, s)]
        free = np.maximum(state.cards.free[:nodes], 0)
        if kind == "whole":
            assert bool(where) == bool(((free == 1000).sum(axis=1) >= count).any())
        else:
            assert bool(where) == bool((free >= milli).any())
        if where:
            state.assume(info.key, where[0], info.request)
            placed.append(info.key)
            assert len(state.pods[info.key].devices) == (1 if kind == "share" else count)
        state.check_invariants()
