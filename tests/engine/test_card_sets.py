"""The card search's candidate sets (``engine/plugins/cardchain.py``) stay few however
many small pods share a card: the sets of a card are its pods taken ``count`` at a time,
which for many small shares is a number that no attempt may enumerate."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from engine.model.pods import PodInfo, pod_info
from engine.model.state import ClusterState
from engine.plugins import cardchain
from engine.plugins.cardchain import _card_sets, _Index
from events.types import PodSpec
from tests.builders import make_node, make_pod

SMALL = 20
"""Movable 10m pods sharing node ``a``'s card (a 800m pod that may not move holds the
rest): 8 of them free the 80m the waiting pod asks for, in C(20, 8) = 125,970 ways."""


def _spec(name: str, milli: int) -> PodSpec:
    builder = make_pod(name).cpu("100m")
    builder.fields["requests"]["shoal.io/gpu-milli"] = milli
    return builder.spec()


def test_a_card_of_many_small_shares_gives_few_sets() -> None:
    state = ClusterState()
    for name in ("a", "b"):
        state.add_node(make_node(name).gpu(1).spec())
    pods: dict[str, PodInfo] = {}
    for name, milli in [("big", 800)] + [(f"p{i:02d}", 10) for i in range(SMALL)]:
        info = pod_info(_spec(name, milli), state.resources, len(pods))
        pods[info.key] = info
    waiting = pod_info(_spec("w", 80), state.resources, len(pods))
    state.ensure_rows()
    for info in pods.values():
        state.assume(info.key, 0, info.request, 0, (), (0,))
    keys = sorted(k for k in pods if not k.endswith("/big"))
    index = _Index(
        keys,
        np.zeros(len(keys), dtype=np.int64),
        np.zeros(len(keys), dtype=np.int64),
        np.full(len(keys), 10, dtype=np.int64),
    )
    handle = SimpleNamespace(pods=pods, started={})
    sets = _card_sets(handle, waiting, state, state.valid.copy(), index, 8)  # type: ignore[arg-type]
    assert 0 < len(sets) <= cardchain.SETS
    assert all(count == 8 and slot == 0 for count, _, slot, _ in sets)
