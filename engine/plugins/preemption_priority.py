"""Priority preemption on a large cluster: the same plan as the exact path, for less.

``DefaultPreemption`` (:mod:`engine.plugins.preemption`) in its priority mode (the
preemptor's namespace has no quota: room on a node is all that is missing) chooses
among at most ``MAX_CANDIDATES`` nodes, found over the columns
(:mod:`engine.plugins.preemption_candidates`), the one whose victims cost least in kube-scheduler's
order (:func:`engine.model.victims.cost_of`). The exact path builds every eligible
victim of every candidate and selects victims on each candidate node. This path gives
the same plan and evaluates few nodes:

1. per candidate, its eligible pods are read lightly (priority, start, request), and
   the nodes where evicting them all makes room are kept, as the exact path keeps them;
2. each kept node gets a lower bound of its cost, from the victims it could take
   (their units included): no budget broken, the lowest priority as the highest, that
   one victim's ``priority + 2**31`` as the sum, one victim, the latest start, the
   node's name. A plan never costs less than its bound (see :func:`_bound`);
3. nodes are evaluated exactly (:func:`engine.plugins.victim_choice.victims_for`, the
   exact path's own selection) in the order of their bounds, until the next bound is
   above the best cost found. Costs end with the node's name, so no two are equal: the
   least is the exact path's choice.

Where the exact path could stop early (a kept node where the pod fits without
evicting anything, which it returns at once in its own order), or a priority lies
below int32 (the bound on the sum assumes ``priority + 2**31 >= 0``), this path
declines (returns :data:`DECLINED`) and the exact path decides.

Cost: per preemptor, one pass over the priority levels below it over the columns
(a few array operations per level, on the pod's own resource rows), then per
candidate node Python work per pod on it, and the exact selection on the nodes whose
bound can still win: one node when the candidates tie on all but the name (a wave of
identical preemptors over identical victims), the 64 of the exact path at worst.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import numpy as np

from engine.framework.handle import Handle
from engine.model.pods import PodInfo
from engine.model.resources import PODS
from engine.model.state import Bools, ClusterState
from engine.model.victims import PRIORITY_OFFSET, Cost, cost_of
from engine.plugins.victim_choice import (
    Mode,
    Plan,
    Victim,
    cards_fit,
    describe,
    gang_of,
    named,
    units_of,
    victim_of,
    victims_for,
)

DECLINED: Final = "declined"
""":func:`plan_by_priority`'s answer where the exact path must decide."""
INT32_MIN: Final = -(2**31)


def plan_by_priority(
    pod: PodInfo,
    state: ClusterState,
    allowed: Bools,
    handle: Handle,
    exclude: str,
    candidates: list[int],
    breaking: Callable[[list[Victim]], set[str]],
) -> Plan | str | None:
    """The exact path's plan for ``pod`` in priority mode (see the module docstring),
    None where it finds none, or :data:`DECLINED`. ``candidates``: the first
    candidate nodes in their order (:mod:`engine.plugins.preemption_candidates`);
    ``breaking``: the victims of a set that would break a disruption budget, as the
    exact path counts them."""
    pods = handle.pods
    quotas = handle.quotas
    placed_pods = state.pods
    card_rows = state.cards.rows
    gpu = state.gpu_of(pod.request)
    card_row = state.resources.card_row(gpu.need) if gpu is not None else -1
    kept: list[tuple[int, int, list[str]]] = []  # (eligible pods, slot, their keys)
    empty = False
    at = np.array(candidates, dtype=np.int64)
    allowed_at = allowed[at].tolist()
    rows = [row for row, _ in pod.request]
    grid = np.ix_(np.array(rows, dtype=np.int64), at)
    free_at = dict(zip(rows, state.free[grid].tolist(), strict=True))
    for i, slot in enumerate(candidates):
        if not allowed_at[i]:
            continue
        keys: list[str] = []
        extra: dict[int, int] = {}
        for key in state.node_pods[slot]:
            victim = pods.get(key)
            placed = placed_pods.get(key)
            if victim is None or placed is None or (exclude and victim.spec.group == exclude):
                continue
            if victim.priority >= pod.priority or quotas.get(victim.spec.namespace) is not None:
                continue
            keys.append(key)
            for row, amount in placed.request:
                extra[row] = extra.get(row, 0) + amount
        if extra.get(PODS, 0) <= 0:
            continue  # (the exact path's test: room on a node needs victims there)
        fits = True
        for row, amount in pod.request:
            if row == card_row and gpu is not None:
                here = [victim_of(handle, state, k) for k in keys]
                potential = gpu.cards * cards_fit(state, gpu, slot, here)
            else:
                potential = free_at[row][i] + extra.get(row, 0)
            if potential < amount:
                fits = False
                break
        if not fits:
            continue
        # would the pod fit with no victims at all? (the exact path returns that at once)
        if all(
            free_at[row][i] >= amount for row, amount in pod.request if row not in card_rows
        ) and (gpu is None or cards_fit(state, gpu, slot, [])):
            empty = True
        kept.append((len(keys), slot, keys))
    if not kept:
        return None
    if empty:
        return DECLINED
    bounds: list[tuple[Cost, int, list[str]]] = []
    for _, slot, keys in kept:
        bound = _bound(handle, state, slot, keys)
        if bound is None:
            return DECLINED
        bounds.append((bound, slot, keys))
    bounds.sort(key=lambda item: item[0])
    wanted = named(state, pod.request)
    best: Plan | None = None
    for bound, slot, keys in bounds:
        if best is not None and bound > best.cost:
            break  # every later bound is higher still, and a plan never costs less
        here = [victim_of(handle, state, k) for k in keys]
        chosen = victims_for(
            pod,
            state,
            slot,
            here,
            [],
            wanted,
            {},
            {},
            quotas,
            Mode.PRIORITY,
            units_of(here, state, handle),
            breaking,
        )
        if chosen is None:
            continue
        expanded = dict.fromkeys(v.key for v in chosen)
        for taken in chosen:
            expanded.update(dict.fromkeys(gang_of(handle, state, taken.key)))
        infos = [describe(handle, key) for key in expanded]
        if not infos:
            return DECLINED  # (not reached: nodes that fit with none declined above)
        broken = len(breaking([victim_of(handle, state, k) for k in expanded]))
        cost = cost_of(broken, infos, state.names[slot] or "")
        if best is None or cost < best.cost:
            best = Plan(slot, tuple(expanded), cost)
    return best


def _bound(handle: Handle, state: ClusterState, slot: int, keys: list[str]) -> Cost | None:
    """A cost no plan on ``slot`` goes below, or None where a priority is below int32.

    A plan evicts at least one pod (the pod fits nowhere without victims), all among
    ``keys`` and their units (gangs that fall with them): so it breaks at least no
    budget, its highest priority is at least the lowest here (``low``), its sum at
    least ``low + 2**31`` (every term is at least 0), one victim at least; and when it
    is one victim of priority ``low``, that victim started at most at the latest start
    here. The node's name is the plan's own."""
    pods = handle.pods
    started = handle.started
    low: int | None = None
    latest = 0
    first = True
    for key in keys:
        members = gang_of(handle, state, key) or (key,)
        for member in members:
            info = pods.get(member)
            if info is None:
                continue
            priority = info.priority
            start = started.get(member, 0)
            if priority < INT32_MIN:
                return None
            if first or priority < (low if low is not None else priority):
                low = priority
            if first or start > latest:
                latest = start
            first = False
    if low is None:
        return None
    return (0, low, low + PRIORITY_OFFSET, 1, -latest, state.names[slot] or "")
