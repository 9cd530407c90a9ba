"""Moves that free a GPU card: the rescheduler's second search, for a pod that asks for
one card (whole, or a share of one) and that no plan of whole pods off one node helps.

The first search (:mod:`engine.plugins.migration`) moves pods off a node so that the
waiting pod fits there, each moved pod placed where its profile would place it *now*.
On a cluster whose GPU is spent, that finds little: the free GPU is scattered in small
remainders of cards, and the pods sharing a card are larger than any remainder. Here
the search is per *card*: on each node that the pod fits but for its card (filters
passed, cpu and memory free), each card and each smallest set of the pods on it whose
departure leaves the card room enough, cheapest first (fewest pods, then the lowest
priorities, then the pods that started last); each moved pod lands

- directly: where its profile would place it now, among the nodes other than its own
  and the card's (the policy's own choice: its coarse scores and tie-breaks consolidate
  better than the exact least change of fragmentation, which was tried), or
- through one more move (a *chain*): a pod on a card of another node steps aside
  (directly, as above, never onto the two nodes of the chain) to leave that card room
  for it; the smallest such pod first, at most ``HOPS`` tried per moved pod.

A plan is at most the moves left (``maxMoves`` and the budget), its moves' disruption
budgets counted together; pods the rescheduler never moves stay (the same rules, via
:func:`engine.plugins.migration.movable_units`), and gang members are not moved by this
search at all (a gang moves only whole, the first search's business). Up to ``CHOICES``
plans of the fewest moves are staged and undone; the one whose nodes' fragmentation
(the profile's :class:`~engine.framework.interfaces.PotentialPlugin`) ends lowest is
kept, staged (the waiting pod's placement included), for the rescheduler to commit.
Every step is staged in the attempt's statement and checked by the filters of the pod
it places, so a plan carried out is one the filters allow move by move.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from engine.framework.cycle import CycleState
from engine.framework.handle import Handle
from engine.model.devices import WHOLE
from engine.model.disruption import broken_by
from engine.model.pods import PodInfo
from engine.model.state import Bools, ClusterState, Ints
from engine.model.statement import Statement
from engine.plugins.migration import Unit, unpinned

HOPS: Final = 3
"""Pods tried per moved pod to step aside for it (a chain of two moves)."""
CARDS: Final = 8
"""(card, pods to move) sets staged per attempt at most."""
CHOICES: Final = 4
"""Plans of the fewest moves compared by fragmentation before the best is kept."""
SETS: Final = 64
"""Sets of pods to move tried per card at most: a card's sets are its movable pods
taken ``count`` at a time, which for many small shares (twenty 10m pods, eight to
move) are far too many to list; its pods are taken largest first, then cheapest."""


@dataclass(frozen=True, slots=True)
class Chain:
    """A staged plan: the node the waiting pod goes to, the moves (pod, from, to) in the
    order staged, and the change of fragmentation over the nodes it touched."""

    slot: int
    moves: tuple[tuple[str, int, int], ...]
    change: int


class _Index:
    """The movable pods that hold one card (gang members never), as arrays: key, node
    slot, card, milli-GPU; built once per attempt (a pod moved since is skipped where it
    matters)."""

    def __init__(self, keys: list[str], slot: Ints, card: Ints, size: Ints) -> None:
        self.keys = keys
        self.slot = slot
        self.card = card
        self.size = size
        self._rows: dict[int, Ints] = {}

    @classmethod
    def of(cls, handle: Handle, state: ClusterState, units: Mapping[int, list[Unit]]) -> _Index:
        keys: list[str] = []
        slots: list[int] = []
        cards: list[int] = []
        sizes: list[int] = []
        for slot in sorted(units):
            for unit in units[slot]:
                placed = state.pods.get(unit[0])
                if len(unit) != 1 or placed is None or placed.gpu is None:
                    continue
                if handle.gang_member(handle.pods[unit[0]].spec):
                    continue  # (a gang of one bound member: the first search's)
                if len(placed.devices) != 1:
                    continue
                gpu = placed.gpu
                keys.append(unit[0])
                slots.append(slot)
                cards.append(placed.devices[0])
                sizes.append(WHOLE if gpu.whole else gpu.need.milli)
        return cls(
            keys,
            np.array(slots, dtype=np.int64),
            np.array(cards, dtype=np.int64),
            np.array(sizes, dtype=np.int64),
        )

    def amounts(self, state: ClusterState, row: int) -> Ints:
        """What each pod asks of resource row ``row``."""
        if row not in self._rows:
            self._rows[row] = np.array(
                [_amount(state.pods[k].request, row) if k in state.pods else 0 for k in self.keys],
                dtype=np.int64,
            )
        return self._rows[row]


def _amount(request: Any, row: int) -> int:
    return sum(amount for r, amount in request if r == row)


def free_card(
    handle: Handle,
    statement: Statement,
    framework: Any,
    pod: PodInfo,
    state: ClusterState,
    feasible: Bools,
    units: Mapping[int, list[Unit]],
    limit: int,
    allowances: Mapping[str, int] | None,
) -> Chain | None:
    """Stage the best plan that frees a card for ``pod`` (see the module docstring) and
    return it; None (nothing staged) when there is none. ``feasible``: the nodes the pod
    failed only for room; ``units``: per node, what may move for it."""
    gpu = state.gpu_of(pod.request)
    if gpu is None or gpu.cards != 1 or limit <= 0:
        return None
    potential = framework.potential if framework is not None else None
    index = _Index.of(handle, state, units)
    sets = _card_sets(handle, pod, state, feasible, index, limit)
    best: Chain | None = None
    compared = 0
    for size, _, slot, keys in sets[:CARDS]:
        if best is not None and (size > len(best.moves) or compared >= CHOICES):
            break
        mark = len(statement.ops)
        chain = _stage(handle, statement, framework, pod, state, slot, keys, index, limit)
        if chain is None:
            continue
        moved = [k for k, _, _ in chain]
        if broken_by(handle.budgets, allowances, (handle.pods[k].spec for k in moved)):
            statement.rollback(mark)
            continue
        touched = np.unique(np.array([op.slot for op in statement.ops[mark:]], dtype=np.int64))
        after = 0 if potential is None else int(potential.potential(state, touched).sum())
        statement.rollback(mark)
        before = 0 if potential is None else int(potential.potential(state, touched).sum())
        compared += 1
        found = Chain(slot, tuple(chain), after - before)
        if best is None or (len(found.moves), found.change) < (len(best.moves), best.change):
            best = found
    if best is None:
        return None
    keys = tuple(k for k, origin, _ in best.moves if origin == best.slot)
    mark = len(statement.ops)
    chain = _stage(handle, statement, framework, pod, state, best.slot, keys, index, limit)
    if chain is None or tuple(chain) != best.moves:  # (the same state: the same plan)
        statement.rollback(mark)
        return None
    return best


def _card_sets(
    handle: Handle,
    pod: PodInfo,
    state: ClusterState,
    feasible: Bools,
    index: _Index,
    limit: int,
) -> list[tuple[int, tuple[int, int], int, tuple[str, ...]]]:
    """Per card of a node where ``pod`` fits but for its card (its other requests free
    now): the sets of the card's movable pods, of the fewest that leave it room (at
    most :data:`SETS` a card), as (moves, (priorities, -started), node, pods),
    cheapest first."""
    gpu = state.gpu_of(pod.request)
    assert gpu is not None
    need = WHOLE if gpu.whole else gpu.need.milli
    rows = state.cards.rows
    ok = feasible.copy()
    for row, amount in pod.request:
        if row not in rows:
            ok &= state.free[row] >= amount
    free = state.cards.free
    # the largest share any card could take directly, and through a chain (a pod that
    # could itself land directly stepping aside): a set with a larger one is no plan
    direct = int(free[state.valid].max(initial=-1))
    stepping = index.size <= direct
    chained = free[index.slot, index.card] + index.size
    reach = max(direct, int(chained[stepping].max(initial=-1)))
    on_card: dict[tuple[int, int], list[int]] = {}
    for i in np.flatnonzero(ok[index.slot]).tolist():
        on_card.setdefault((int(index.slot[i]), int(index.card[i])), []).append(i)
    pods, started = handle.pods, handle.started
    out: list[tuple[int, tuple[int, int], int, tuple[str, ...]]] = []
    for (slot, card), members in sorted(on_card.items()):
        short = need - int(free[slot, card])
        members.sort(
            key=lambda i: (
                -int(index.size[i]),
                pods[index.keys[i]].priority,
                -started.get(index.keys[i], 0),
                index.keys[i],
            )
        )
        sizes = [int(index.size[i]) for i in members]
        if gpu.whole and sum(sizes) != short:
            continue  # a pod that may not move holds part of the card
        count = next((c for c in range(1, len(sizes) + 1) if sum(sizes[:c]) >= short), 0)
        if gpu.whole:
            count = len(members)
        if not count or count > limit:
            continue
        for chosen in itertools.islice(itertools.combinations(members, count), SETS):
            sizes = [int(index.size[i]) for i in chosen]
            if sum(sizes) < short or max(sizes) > reach:
                continue
            if count + sum(size > direct for size in sizes) > limit:
                continue  # each pod no card takes directly needs a chain of two moves
            keys = tuple(sorted(index.keys[i] for i in chosen))
            cost = (
                sum(pods[k].priority for k in keys),
                -sum(started.get(k, 0) for k in keys),
            )
            out.append((count, cost, slot, keys))
    out.sort()
    return out


def _stage(
    handle: Handle,
    statement: Statement,
    framework: Any,
    pod: PodInfo,
    state: ClusterState,
    slot: int,
    keys: tuple[str, ...],
    index: _Index,
    limit: int,
) -> list[tuple[str, int, int]] | None:
    """Lift ``keys`` off ``slot``, place ``pod`` there and land each lifted pod, directly
    or by a chain; the moves staged, or None (nothing left staged)."""
    mark = len(statement.ops)
    pods = handle.pods
    moves: list[tuple[str, int, int]] = []
    for key in keys:
        statement.lift(key, pods[key].spec.namespace, pod.key)
    if framework is None or not framework.feasible(CycleState(), pod, state)[slot]:
        statement.rollback(mark)
        return None
    statement.assume_pod(pod, slot)
    for key in sorted(keys, key=lambda k: (-_milli(state, k, pods), k)):
        left = limit - len(moves)
        landed = _land(handle, statement, pod, state, key, slot, (slot,), index, left)
        if landed is None:
            statement.rollback(mark)
            return None
        moves.extend(landed)
    return moves


def _milli(state: ClusterState, key: str, pods: Mapping[str, PodInfo]) -> int:
    gpu = state.gpu_of(pods[key].request)
    return 0 if gpu is None else gpu.need.milli * gpu.cards


def _land(
    handle: Handle,
    statement: Statement,
    pod: PodInfo,
    state: ClusterState,
    key: str,
    origin: int,
    barred: tuple[int, ...],
    index: _Index,
    left: int,
) -> list[tuple[str, int, int]] | None:
    """Land lifted pod ``key`` (from ``origin``) on a node not ``barred``: directly, or,
    with two moves left, after one pod of another node steps aside for it. The moves
    staged (its own last), or None (nothing staged)."""
    if left <= 0:
        return None
    info = unpinned(handle.pods[key])
    own = handle.framework_for(info)
    if own is None:
        return None
    feasible = own.feasible(CycleState(), info, state)
    feasible[list(barred)] = False
    target = _destination(own, info, state, feasible)
    spec = info.spec
    if target >= 0:
        statement.land(
            key, spec.namespace, target, info.request, info.priority, spec.host_ports, pod.key
        )
        return [(key, origin, target)]
    if left < 2:
        return None
    for other, where in _asides(state, info, barred, index):
        mark = len(statement.ops)
        statement.lift(other, handle.pods[other].spec.namespace, pod.key)
        if not own.feasible(CycleState(), info, state)[where]:
            statement.rollback(mark)
            continue
        # the pod stepping aside lands first (never on ``where``), then ``key`` there
        aside = _land(handle, statement, pod, state, other, where, (*barred, where), index, 1)
        if aside is None:
            statement.rollback(mark)
            continue
        statement.land(
            key, spec.namespace, where, info.request, info.priority, spec.host_ports, pod.key
        )
        return [*aside, (key, origin, where)]
    return None


def _asides(
    state: ClusterState, info: PodInfo, barred: tuple[int, ...], index: _Index
) -> list[tuple[str, int]]:
    """Pods that could step aside for ``info``: still where the attempt found them, on a
    node not ``barred``, on a card whose room with the pod gone holds ``info``'s share,
    its node with room for the rest of ``info``'s requests once the pod is gone; the
    smallest first (then the node, the name), at most ``HOPS``."""
    gpu = state.gpu_of(info.request)
    if gpu is None or gpu.cards != 1 or gpu.whole or not index.keys:
        return []
    ok = state.cards.free[index.slot, index.card] + index.size >= gpu.need.milli
    ok &= ~np.isin(index.slot, np.array(barred, dtype=np.int64))
    rows = state.cards.rows
    for row, amount in info.request:
        if row not in rows:
            ok &= state.free[row, index.slot] + index.amounts(state, row) >= amount
    found = []
    for i in np.flatnonzero(ok).tolist():
        key, slot = index.keys[i], int(index.slot[i])
        placed = state.pods.get(key)
        if placed is not None and placed.slot == slot:
            found.append((int(index.size[i]), slot, key))
    found.sort()
    return [(key, slot) for _, slot, key in found[:HOPS]]


def _destination(own: Any, info: PodInfo, state: ClusterState, feasible: Bools) -> int:
    """Where a moved pod lands: where its profile would place it among ``feasible``
    (the policy's own choice, coarse scores and tie-breaks included: they consolidate
    better than the exact least change); -1: nowhere."""
    if not feasible.any():
        return -1
    return int(own.schedule_among(info, state, feasible))
