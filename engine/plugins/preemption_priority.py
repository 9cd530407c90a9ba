"""Priority preemption on a large cluster: the same plan as the exact path, for less.

``DefaultPreemption`` (:mod:`engine.plugins.preemption`) in its priority mode (the
preemptor's namespace has no quota: room on a node is all that is missing) chooses
among at most ``MAX_CANDIDATES`` nodes, found over the columns
(:mod:`engine.plugins.preemption_candidates`), the one whose victims cost least in
kube-scheduler's order (:func:`engine.model.victims.cost_of`). The exact path builds
every eligible victim of every candidate and selects victims on each candidate node.
This path gives the same plan and evaluates few nodes:

1. per candidate, its eligible pods are read lightly (priority, start, request), and
   the nodes where evicting them all makes room are kept, as the exact path keeps
   them (:func:`_examine`);
2. each kept node gets a lower bound of its cost, from the victims it could take
   (their units included): at least the fewest of them that cover what the node
   lacks, so their priorities and sum at least those of as many of the lowest, no
   budget broken, the latest start, the node's name. A plan never costs less than
   its bound (see :func:`_bound`);
3. nodes are evaluated exactly (:func:`engine.plugins.victim_choice.victims_for`, the
   exact path's own selection) in the order of their bounds, until the next bound is
   above the best cost found. Costs end with the node's name, so no two are equal: the
   least is the exact path's choice. Where room on the node is all that decides (no
   gang among its victims, no disruption budget, no GPU cards asked for), the same
   selection runs over integers per resource
   (:func:`engine.plugins.victim_choice.lean_plan`).

Where the exact path could stop early (a kept node where the pod fits without
evicting anything, which it returns at once in its own order), or a priority lies
below int32 (the bound on the sum assumes ``priority + 2**31 >= 0``), this path
declines (returns :data:`DECLINED`) and the exact path decides. The exact path
(:func:`engine.plugins.preemption.plan` with ``exact=True``) also decides every
preemption that involves quotas (reclaim, a namespace's own pods).

Identical preemptors (a wave: one request, one priority) find the same candidates
again but for the nodes the last preemption changed: the candidates are kept up to
date from the cluster's journal (``CandidateCache`` in
:mod:`engine.plugins.preemption_candidates`), and so are the nodes as examined and the
candidates ranked by bound (:class:`SlotMemo`, where no quota and no gang makes a
node's reading depend on anything but the node): the next preemptor examines and
re-ranks only the candidates that changed, left the first ``MAX_CANDIDATES`` or came
into them (one or two in a wave), with a sorted-list update each.

Cost per preemptor: the candidates (whole, a few array operations per priority level
below it; kept, a loop over the levels per changed node); the ranking (whole, per
candidate node a memo lookup or Python work per pod, and a sort of at most 64 bounds;
kept, set operations over the 64 candidates and Python work per pod of the changed
ones); and the exact selection on the nodes whose bound can still win: one node when
the candidates tie on all but the name (a wave of identical preemptors over
identical victims), the 64 of the exact path at worst.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
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
    lean_plan,
    named,
    units_of,
    victim_of,
    victims_for,
    with_gangs,
)

DECLINED: Final = "declined"
""":func:`plan_by_priority`'s answer where the exact path must decide."""
INT32_MIN: Final = -(2**31)
MEMOS: Final = 8
"""Requests (with priorities and excluded gangs) whose candidate nodes are kept."""


Examined = tuple[list[str], bool, "Cost | None"] | None
"""A candidate node as this path reads it: None where it is no candidate (no victims,
or no room even with all of them gone); else its eligible pods, whether the pod would
fit there with none of them gone, and the bound of its cost (None: no bound)."""


@dataclass
class SlotMemo:
    """Candidate nodes as examined for one request, priority and excluded gang, kept
    while their nodes do not change (the cluster's journal says which did): a wave of
    identical preemptors examines again only the nodes each preemption changed.

    Kept only where what is examined depends on the node alone: no quotas (they
    decide who is eligible), and no node where a pod belongs to a gang (a gang's
    fall depends on its members elsewhere).

    With the nodes, the last candidates' bounds in order (``ranked``), so that the
    next preemptor re-ranks only the candidates that changed, left or came: kept
    while every candidate's reading lasts (none declined, none with a gang)."""

    state: ClusterState | None = None
    position: int = 0
    slots: dict[int, Examined] = field(default_factory=dict)
    ranked: list[tuple[Cost, int]] | None = None
    """(bound, slot) of the last candidates that are candidates, least first."""
    listed: dict[int, Cost | None] = field(default_factory=dict)
    """The last candidates (those allowed), each with its bound (None: no candidate)."""

    def __repr__(self) -> str:
        return f"SlotMemo(slots={len(self.slots)})"

    def fresh(self, state: ClusterState) -> dict[int, Examined]:
        """The nodes examined and not changed since (all dropped for another state)."""
        return self.refresh(state)[0]

    def refresh(self, state: ClusterState) -> tuple[dict[int, Examined], list[int] | None]:
        """:meth:`fresh`, with the slots changed since (None: everything dropped)."""
        changed = state.changed_since(self.position) if self.state is state else None
        if changed is None:
            self.slots = {}
            self.ranked = None
        else:
            for slot in changed:
                self.slots.pop(slot, None)
        self.state = state
        self.position = state.journal_end
        return self.slots, changed


@dataclass
class SlotMemos:
    """A :class:`SlotMemo` per request, priority and excluded gang (the recent ones)."""

    memos: OrderedDict[tuple[object, ...], SlotMemo] = field(default_factory=OrderedDict)

    def __repr__(self) -> str:
        return f"SlotMemos({len(self.memos)})"

    def get(self, key: tuple[object, ...]) -> SlotMemo:
        memo = self.memos.get(key)
        if memo is None:
            memo = self.memos[key] = SlotMemo()
            if len(self.memos) > MEMOS:
                self.memos.popitem(last=False)
        self.memos.move_to_end(key)
        return memo


def plan_by_priority(
    pod: PodInfo,
    state: ClusterState,
    allowed: Bools,
    handle: Handle,
    exclude: str,
    candidates: list[int],
    breaking: Callable[[list[Victim]], set[str]],
    memo: SlotMemo | None = None,
) -> Plan | str | None:
    """The exact path's plan for ``pod`` in priority mode (see the module docstring),
    None where it finds none, or :data:`DECLINED`. ``candidates``: the first
    candidate nodes in their order (:mod:`engine.plugins.preemption_candidates`);
    ``breaking``: the victims of a set that would break a disruption budget, as the
    exact path counts them; ``memo``: the nodes examined for the same request,
    priority and excluded gang (kept up to date here)."""
    at = np.array(candidates, dtype=np.int64)
    listed = [slot for slot, ok in zip(candidates, allowed[at].tolist(), strict=True) if ok]
    if memo is not None and not handle.quotas:
        ranked = _rank_kept(pod, state, handle, exclude, listed, memo)
    else:
        ranked = _rank(pod, state, handle, exclude, listed, None, None)
    if isinstance(ranked, str):
        return ranked
    kept, examined = ranked
    best: Plan | None = None
    for bound, slot in kept:
        if best is not None and bound > best.cost:
            break  # every later bound is higher still, and a plan never costs less
        entry = examined[slot]
        assert entry is not None
        chosen = _evaluate(pod, state, handle, slot, entry[0], breaking)
        if isinstance(chosen, str):
            return chosen
        if chosen is not None and (best is None or chosen.cost < best.cost):
            best = chosen
    return best


Ranked = tuple[list[tuple[Cost, int]], dict[int, Examined]]
"""The kept candidates, (bound, slot) least first, and each one's reading."""


def _rank(
    pod: PodInfo,
    state: ClusterState,
    handle: Handle,
    exclude: str,
    listed: list[int],
    known: dict[int, Examined] | None,
    memo: SlotMemo | None,
) -> Ranked | str:
    """Every candidate of ``listed`` examined (``known``: those read already, kept up
    to date here), ranked by bound; :data:`DECLINED` where the exact path must decide.
    ``memo``: given the ranking to keep, where every reading lasts."""
    kept: list[tuple[Cost, int]] = []
    examined: dict[int, Examined] = {}
    bounds: dict[int, Cost | None] = {}
    empty = False
    lasting_all = True
    for slot in listed:
        if known is not None and slot in known:
            reading = known[slot]
        else:
            reading, lasting = _examine(pod, state, handle, exclude, slot)
            if known is not None and lasting:
                known[slot] = reading
            lasting_all = lasting_all and lasting
        examined[slot] = reading
        if reading is None:
            bounds[slot] = None
            continue
        _, fits_now, bound = reading
        if fits_now:
            empty = True
        if bound is None:
            return DECLINED
        bounds[slot] = bound
        kept.append((bound, slot))
    if empty:
        return DECLINED  # (the exact path returns the node where it fits at once)
    kept.sort()  # (bounds end with the node's name: no two are equal)
    if memo is not None and lasting_all:
        memo.ranked = list(kept)
        memo.listed = bounds
    return kept, examined


def _rank_kept(
    pod: PodInfo,
    state: ClusterState,
    handle: Handle,
    exclude: str,
    listed: list[int],
    memo: SlotMemo,
) -> Ranked | str:
    """:func:`_rank` through ``memo``: the last ranking, with the candidates that
    changed, left or came ranked again (the same ranking as a whole one: a reading
    that lasts depends on its node alone)."""
    known, changed = memo.refresh(state)
    ranked = memo.ranked
    if ranked is None or changed is None:
        memo.ranked = None
        return _rank(pod, state, handle, exclude, listed, known, memo)
    before = memo.listed
    now = set(listed)
    dropped = before.keys() - now
    if changed:
        dropped |= before.keys() & set(changed)
    for slot in dropped:
        bound = before.pop(slot)
        if bound is not None:
            del ranked[bisect.bisect_left(ranked, (bound, slot))]
    fresh = now.difference(before)
    # (the candidates not ranked yet, in their order: a wave's next preemptor has one
    # or two, of its 64)
    for slot in [slot for slot in listed if slot in fresh] if fresh else ():
        if slot in known:
            reading = known[slot]
        else:
            reading, lasting = _examine(pod, state, handle, exclude, slot)
            if not lasting:
                memo.ranked = None
                return _rank(pod, state, handle, exclude, listed, known, memo)
            known[slot] = reading
        if reading is None:
            before[slot] = None
            continue
        _, fits_now, bound = reading
        if fits_now or bound is None:
            memo.ranked = None
            return DECLINED
        before[slot] = bound
        bisect.insort(ranked, (bound, slot))
    return ranked, known


def _evaluate(
    pod: PodInfo,
    state: ClusterState,
    handle: Handle,
    slot: int,
    keys: list[str],
    breaking: Callable[[list[Victim]], set[str]],
) -> Plan | str | None:
    """The exact path's plan on ``slot`` (its eligible pods ``keys``), None where
    evicting them makes no room, or :data:`DECLINED`: by :func:`lean_plan` where room
    on the node is all that decides, else by :func:`plan_on`."""
    if not handle.budgets and state.gpu_of(pod.request) is None:
        pods = handle.pods
        if not any(pods[key].spec.group for key in keys):
            lean = lean_plan(pod, state, handle, slot, keys)
            return DECLINED if lean is not None and not lean.victims else lean
    return plan_on(pod, state, handle, slot, keys, breaking)


def plan_on(
    pod: PodInfo,
    state: ClusterState,
    handle: Handle,
    slot: int,
    keys: list[str],
    breaking: Callable[[list[Victim]], set[str]],
) -> Plan | str | None:
    """The exact path's own selection on ``slot`` (:func:`victims_for`, gangs and
    budgets included) and the plan's cost; as :func:`_evaluate`."""
    here = [victim_of(handle, state, k) for k in keys]
    chosen = victims_for(
        pod,
        state,
        slot,
        here,
        [],
        named(state, pod.request),
        {},
        {},
        handle.quotas,
        Mode.PRIORITY,
        units_of(here, state, handle),
        breaking,
    )
    if chosen is None:
        return None
    expanded = with_gangs(handle, state, chosen)
    infos = [describe(handle, key) for key in expanded]
    if not infos:
        return DECLINED  # (not reached: nodes that fit with none declined above)
    broken = 0
    if handle.budgets:  # (none: nothing breaks one)
        broken = len(breaking([victim_of(handle, state, k) for k in expanded]))
    return Plan(slot, tuple(expanded), cost_of(broken, infos, state.names[slot] or ""))


def _examine(
    pod: PodInfo, state: ClusterState, handle: Handle, exclude: str, slot: int
) -> tuple[Examined, bool]:
    """Candidate ``slot`` as the exact path keeps it (its eligible pods, their room),
    with the bound of its cost (:func:`_bound`); and whether that depends on the node
    alone (no pod there in a gang), so that it holds until the node changes."""
    pods = handle.pods
    quotas = handle.quotas
    placed_pods = state.pods
    gpu = state.gpu_of(pod.request)
    card_row = state.resources.card_row(gpu.need) if gpu is not None else -1
    card_rows = state.cards.rows
    keys: list[str] = []
    extra: dict[int, int] = {}
    lasting = True
    for key in state.node_pods[slot]:
        victim = pods.get(key)
        placed = placed_pods.get(key)
        if victim is not None and victim.spec.group:
            lasting = False
        if victim is None or placed is None or (exclude and victim.spec.group == exclude):
            continue
        if victim.priority >= pod.priority or quotas.get(victim.spec.namespace) is not None:
            continue
        keys.append(key)
        for row, amount in placed.request:
            extra[row] = extra.get(row, 0) + amount
    if extra.get(PODS, 0) <= 0:
        return None, lasting  # (the exact path's test: room on a node needs victims there)
    free = {row: int(state.free[row, slot]) for row, _ in pod.request}
    for row, amount in pod.request:
        if row == card_row and gpu is not None:
            here = [victim_of(handle, state, k) for k in keys]
            potential = gpu.cards * cards_fit(state, gpu, slot, here)
        else:
            potential = free[row] + extra.get(row, 0)
        if potential < amount:
            return None, lasting
    # would the pod fit with no victims at all? (the exact path returns that at once)
    fits_now = all(free[row] >= amount for row, amount in pod.request if row not in card_rows) and (
        gpu is None or cards_fit(state, gpu, slot, [])
    )
    lack = [
        (row, amount - free[row])
        for row, amount in pod.request
        if row not in card_rows and amount > free[row]
    ]
    return (keys, fits_now, _bound(handle, state, slot, keys, lack)), lasting


def _bound(
    handle: Handle, state: ClusterState, slot: int, keys: list[str], lack: list[tuple[int, int]]
) -> Cost | None:
    """A cost no plan on ``slot`` goes below, or None where a priority is below int32.

    A plan's victims are among ``keys`` and their units (gangs that fall with them):
    the *pool*. Those on ``slot`` must free what the node lacks (``lack``: per
    resource, the pod's request less the node's free room), so a plan takes at least
    ``k`` of them, ``k`` the most, over the resources, of the fewest of the pool's
    largest requests there that cover the lack (and at least one: the pod fits
    nowhere without victims). So it breaks at least no budget; its highest priority
    is at least the pool's ``k``-th lowest; its sum at least the sum of the ``k``
    lowest ``priority + 2**31`` (every term is at least 0); it has at least ``k``
    victims; and every victim started at most at the pool's latest start. The node's
    name is the plan's own."""
    pods = handle.pods
    started = handle.started
    pool: dict[str, tuple[int, int]] = {}
    room: list[list[int]] = [[] for _ in lack]
    for key in keys:
        for member in gang_of(handle, state, key) or (key,):
            info = pods.get(member)
            if info is None or member in pool:
                continue
            if info.priority < INT32_MIN:
                return None
            pool[member] = (info.priority, started.get(member, 0))
            placed = state.pods.get(member)
            if placed is not None and placed.slot == slot and lack:
                request = dict(placed.request)
                for i, (row, _) in enumerate(lack):
                    room[i].append(request.get(row, 0))
    if not pool:
        return None
    least = 1
    for (_, need), amounts in zip(lack, room, strict=True):
        freed = 0
        taken = 0
        for amount in sorted(amounts, reverse=True):
            if freed >= need:
                break
            freed += amount
            taken += 1
        least = max(least, taken)
    least = min(least, len(pool))
    priorities = sorted(priority for priority, _ in pool.values())
    latest = max(start for _, start in pool.values())
    return (
        0,
        priorities[least - 1],
        sum(p + PRIORITY_OFFSET for p in priorities[:least]),
        least,
        -latest,
        state.names[slot] or "",
    )
