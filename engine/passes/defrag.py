"""Defragmentation: between passes, empty nearly-empty GPU machines so that whole
machines are free for large jobs (off by default).

Enabled per profile with the ``Rescheduler`` plugin's args::

    pluginConfig:
    - name: Rescheduler
      args:
        defragmentation: {movesPerMinute: 10, movesPerNodePerMinute: 2}

After each pass of an engine that owns its nodes, while the budget allows (at most
``movesPerMinute`` moves in the last 60 s of log time in all, and
``movesPerNodePerMinute`` off any one node), the GPU machine with the least busy
compute among the *nearly empty* ones (some card busy, at most a quarter of its cards
busy) is emptied: every pod on it moves, each to the busiest other GPU machine that is
not nearly empty and that its profile's filters allow, all staged together and kept
only if every pod found a place (the emptied machine is then whole). Pods the
rescheduler may never move (``shoal.io/migratable: "false"``, gang members, pods not
yet bound) keep a machine from being emptied, and so does a PodDisruptionBudget the
machine's moves would break (the moves of one pass counted together). Each move is a
``PodMigrated`` made for ``shoal.io/defragmentation``, replayed like any decision. At
several shards the coordinator defragments, on its view of every node and within one
budget, as one engine does (:func:`staged_defragmentation`), and the shards that own
the nodes carry the moves out (``shards.coordinator.dispatch``); a shard under a
coordinator does not defragment on its own.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from engine.framework.cycle import CycleState
from engine.model.cards import ABSENT
from engine.model.devices import WHOLE
from engine.model.disruption import broken_by
from engine.model.statement import Statement
from engine.passes.context import PassContext
from engine.passes.dispatch import migrate
from engine.plugins.migration import MIGRATABLE
from engine.plugins.migration import unpinned as _unpinned
from engine.plugins.rescheduler import Budget
from events.types import SECOND

BY: Final = "shoal.io/defragmentation"
WINDOW: Final = 60 * SECOND
NEARLY_EMPTY: Final = 4
"""A machine is nearly empty when at most 1/NEARLY_EMPTY of its cards are busy."""
MAX_SOURCES: Final = 16
"""Machines tried per pass at most (each a staged trial)."""


def defragment(p: PassContext, budget: Budget, cap: int | None = None) -> None:
    """Empty nearly-empty GPU machines within ``budget`` and at most ``cap`` moves (what
    the ``Rescheduler``'s budget in percent of placed pods leaves; None: no cap); see
    the module docstring: the moves :func:`staged_defragmentation` finds, carried out."""
    e = p.e
    statement = Statement(e.state, e.quotas)
    moves = staged_defragmentation(p, budget, cap, statement)
    statement.commit()
    for key, origin, slot, _ in moves:
        migrate(p, key, origin, slot, BY)


def staged_defragmentation(
    p: PassContext, budget: Budget, cap: int | None, statement: Statement
) -> list[tuple[str, int, int, tuple[int, ...]]]:
    """The moves defragmentation makes now, staged in ``statement`` (pod, from slot, to
    slot, its GPU cards there) and counted in the budget's window as made now: carried
    out here (:func:`defragment`), or by the shards that own the nodes (the
    coordinator's view)."""
    staged: list[tuple[str, int, int, tuple[int, ...]]] = []
    e = p.e
    state = e.state
    cards = state.cards
    moves = e.defrag_moves
    moves[:] = [(t, slot) for t, slot in moves if t > e.now - WINDOW]
    left = budget.per_minute - len(moves)
    if cap is not None:
        left = min(left, cap)
    if left <= 0 or (not cards.rows and not cards.count.any()):
        return staged
    count = cards.count
    busy_cards = (cards.free != WHOLE).sum(axis=1) - (cards.free == ABSENT).sum(axis=1)
    busy_milli = np.where(cards.free >= 0, WHOLE - cards.free, 0).sum(axis=1)
    gpu = state.valid & (count > 0)
    nearly = gpu & (busy_cards > 0) & (busy_cards * NEARLY_EMPTY <= count)
    targets = gpu & ~nearly & (busy_cards > 0)
    if not nearly.any() or not targets.any():
        return staged
    sources = np.flatnonzero(nearly)
    order = np.lexsort((sources, busy_milli[sources]))
    per_node: dict[int, int] = {}
    for _, slot in moves:
        per_node[slot] = per_node.get(slot, 0) + 1
    counted = e.disruptions_allowed(BY)
    allowances = dict(counted) if counted is not None else None
    for source in (int(s) for s in sources[order][:MAX_SOURCES]):
        keys = sorted(state.node_pods[source])
        allowed = budget.per_node_per_minute - per_node.get(source, 0)
        if not keys or len(keys) > min(left, allowed) or not all(_movable(p, k) for k in keys):
            continue
        if broken_by(e.budgets, allowances, (e.pods[k].spec for k in keys)):
            continue
        landed = _empty(p, statement, source, keys, targets, busy_milli)
        if landed is None:
            continue
        for key, slot in landed:
            staged.append((key, source, slot, state.pods[key].devices))
            moves.append((e.now, source))
        if allowances:
            # the pass's moves count together (in Kubernetes each is an eviction first)
            for key in keys:
                for covering in e.budgets.covering(e.pods[key].spec):
                    allowances[covering] = allowances.get(covering, 0) - 1
        left -= len(landed)
        per_node[source] = per_node.get(source, 0) + len(landed)
        targets[source] = False
        if left <= 0:
            return staged
    return staged


def _movable(p: PassContext, key: str) -> bool:
    e = p.e
    pod = e.pods.get(key)
    return (
        pod is not None
        and key in e.bindings
        and not e.gang_member(pod.spec)
        and pod.spec.annotations.get(MIGRATABLE, "").lower() != "false"
    )


def _empty(
    p: PassContext, statement: Statement, source: int, keys: list[str], targets: Any, busy: Any
) -> list[tuple[str, int]] | None:
    """Stage every pod of ``source`` onto the busiest allowed target in ``statement``; the
    moves, or None (nothing more staged) if any pod finds no place."""
    e = p.e
    state = e.state
    mark = len(statement.ops)
    for key in keys:
        statement.lift(key, e.pods[key].spec.namespace, BY)
    landed: list[tuple[str, int]] = []
    for key in keys:
        pod = _unpinned(e.pods[key])
        framework = p.profiles.framework_for(pod)
        if framework is None:
            statement.rollback(mark)
            return None
        feasible = framework.feasible(CycleState(), pod, state) & targets
        feasible[source] = False
        slots = np.flatnonzero(feasible)
        if slots.size == 0:
            statement.rollback(mark)
            return None
        slot = int(slots[np.lexsort((slots, -busy[slots]))[0]])
        statement.land_pod(pod, slot, BY)
        landed.append((key, slot))
    return landed
