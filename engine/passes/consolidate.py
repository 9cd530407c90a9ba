"""Consolidation: between passes, spend what the move budget allows on the single move
that lowers fragmentation most (off by default).

Enabled per profile with the ``Rescheduler`` plugin's args, next to a budget in percent
of placed pods (consolidation without one is refused: it would move pods without end)::

    pluginConfig:
    - name: Rescheduler
      args:
        budget: {percentOfPlaced: 2}
        consolidate: true

After each pass of an engine that owns its nodes, while the budget has a move left
(:func:`engine.plugins.rescheduler.moves_left`), the pods of the ``SOURCES`` most
fragmented nodes (the profile's score's own measure,
:class:`~engine.framework.interfaces.PotentialPlugin`; highest first, then the lowest
slot) are each tried on the node their profile would place them on now (the node
itself excluded), staged and undone; the move whose change of fragmentation, summed over
its two nodes, is the most negative is carried out (ties: the earlier node, then the
pod's name). A move that does not lower it is never made, nor one that leaves fewer of
its two nodes able to start one of the largest pods the score expects
(:meth:`~engine.framework.interfaces.PotentialPlugin.largest_room`): a move buys a
little fragmentation now, and must not buy it with the room the largest pods, which
arrive late and fail first, need. On the trace, without this rule, moves at a budget
of 2% left more GPU idle than none on ``gpushare100`` and ``cpu250`` (the pods they
cost were the runs' largest); counting that room in pods rather than in nodes (a move
that gathers it on one node allowed) did worse on ``default`` and ``gpushare100``
(docs/benchmarks.md). With nothing to gain the
engine makes no move, and looks again only after ``RETRY_PLACED`` more placements or a
pod leaving its node (a search that found nothing counts only in a pass that decided
something: a pass that decides nothing is not replayed, so it must leave nothing that
changes a later pass). Up to ``PER_PASS`` moves per pass, each found by a search of its
own on the state the last one left; every one pays for itself in fragmentation, the
largest gain first.

Several shards: the coordinator consolidates, on its view of every node, as one engine
does (:func:`staged_moves`: the same search, each move staged on the state the one before
left), and the shards that own the nodes carry the moves out
(``shards.coordinator.dispatch``); a shard under a coordinator does not consolidate.

Never moved: what the rescheduler never moves (``shoal.io/migratable: "false"``, pods
not yet bound, pods with inter-pod rules), gang members (a gang moves only whole, and
consolidation moves single pods), and a pod whose PodDisruptionBudget allows no more
disruptions. Each move is a ``PodMigrated`` made for ``shoal.io/consolidation``,
replayed like any decision, and counted in the budget.

Cost: one evaluation of the potential over all nodes (cached per node by the score
plugin), then for at most ``SOURCES`` nodes' pods one filter and score each, only on
passes where the budget has a move left and the last search was not fruitless.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from engine.framework.cycle import CycleState
from engine.framework.interfaces import PotentialPlugin
from engine.model.disruption import broken_by
from engine.model.pods import PodInfo
from engine.model.shard import ShardModel
from engine.model.statement import Statement
from engine.passes.context import PassContext
from engine.passes.dispatch import migrate
from engine.plugins.migration import MIGRATABLE, placement_rules, unpinned
from engine.plugins.rescheduler import Rescheduler
from events.types import PodMigrated, is_decision

BY: Final = "shoal.io/consolidation"
SOURCES: Final = 16
"""Nodes whose pods are tried per search (the most fragmented)."""
PER_PASS: Final = 8
"""Moves per pass at most (each found by a search of its own)."""
RETRY_PLACED: Final = 16
"""Placements after a fruitless search before the next (unless a pod left a node)."""


def consolidate(p: PassContext, rescheduler: Rescheduler) -> None:
    """Make up to ``PER_PASS`` moves, each the one that lowers fragmentation most, while
    the budget allows and one lowers it (see the module docstring): those
    :func:`staged_moves` finds, each on the state the one before left, carried out."""
    e = p.e
    statement = Statement(e.state, e.quotas)
    # no pod moved twice by a pass (by a plan, defragmentation, or here)
    moved = {event.pod for event in p.out if isinstance(event, PodMigrated)}
    decided = any(is_decision(event) for event in p.out)
    moves = staged_moves(p, rescheduler, statement, decided=decided, moved=moved)
    statement.commit()
    for key, origin, target, _ in moves:
        migrate(p, key, origin, target, BY)


def staged_moves(
    p: PassContext,
    rescheduler: Rescheduler,
    statement: Statement,
    *,
    decided: bool,
    before: int = 0,
    moved: set[str] | None = None,
) -> list[tuple[str, int, int, tuple[int, ...]]]:
    """The moves consolidation makes now, each staged in ``statement`` on the state the
    one before left (pod, from slot, to slot, its GPU cards there): carried out here
    (:func:`consolidate`), or by the shards that own the nodes (the coordinator's view,
    which makes them from the whole view, as one engine makes them). ``decided``:
    this instant decided something (a fruitless search then waits for a change, as in a
    pass that did); ``before``: moves staged already (defragmentation's), counted in the
    budget; ``moved``: pods not to move again (moved by this instant already)."""
    e = p.e
    moves: list[tuple[str, int, int, tuple[int, ...]]] = []
    for _ in range(PER_PASS):
        found = _best_move(
            p,
            rescheduler,
            staged=before + len(moves),
            decided=decided or bool(moves),
            moved=(moved or set()) | {key for key, _, _, _ in moves},
        )
        if found is None:
            break
        key, target = found
        origin = _stage(statement, e.pods[key], target)
        moves.append((key, origin, target, e.state.pods[key].devices))
    return moves


def _stage(statement: Statement, info: PodInfo, target: int) -> int:
    """Move running pod ``info`` onto ``target`` in ``statement``; its old slot."""
    origin = statement.lift(info.key, info.spec.namespace, BY)
    statement.land_pod(unpinned(info), target, BY)
    return origin


def _best_move(
    p: PassContext, rescheduler: Rescheduler, *, staged: int, decided: bool, moved: set[str]
) -> tuple[str, int] | None:
    """The move that lowers fragmentation most now (pod, destination), or None: the
    budget has no move left (``staged``: moves made but not counted yet), nothing
    changed since the last fruitless search, or no move lowers it (then, where
    ``decided``, nothing is searched again until something changes). A pod of
    ``moved`` (moved by this pass already) is not moved again: it would restart twice,
    and the second move undo or redo the first."""
    e = p.e
    left = rescheduler.moves_left()
    if left is None or left - staged <= 0:
        return None
    epoch = (e.released_total, e.placed_total // RETRY_PLACED)
    if e.consolidation_epoch == epoch:
        return None  # the last search found nothing, and nothing that could change it did
    framework = rescheduler.handle.framework_for
    state = e.state
    slots = np.flatnonzero(state.valid)
    if slots.size == 0:
        return None
    # the profile whose Rescheduler this is judges every node
    judge = _judge(p, rescheduler)
    if judge is None:
        return None
    frag = judge.potential(state, slots)
    order = np.lexsort((slots, -frag))
    counted = e.disruptions_allowed(BY)
    best: tuple[int, int, str, int] | None = None  # (delta, rank, key, destination)
    rank = 0
    for source in (int(s) for s in slots[order]):
        keys = sorted(state.node_pods[source])
        if not keys:
            continue
        rank += 1
        if rank > SOURCES:
            break
        for key in keys:
            info = e.pods.get(key)
            if info is None or key not in e.bindings or key in moved or e.gang_member(info.spec):
                continue
            spec = info.spec
            if spec.annotations.get(MIGRATABLE, "").lower() == "false" or placement_rules(spec):
                continue
            if broken_by(e.budgets, counted, (spec,)):
                continue
            pod = unpinned(info)
            own = framework(pod)
            if own is None:
                continue
            statement = Statement(state, e.quotas)
            statement.lift(key, spec.namespace, BY)
            feasible = own.feasible(CycleState(), pod, state)
            feasible[source] = False
            target = own.schedule_among(pod, state, feasible) if feasible.any() else -1
            statement.discard()
            if target < 0:
                continue
            delta, hosts = staged_change(e, judge, key, source, target)
            if delta < 0 and hosts >= 0 and (best is None or (delta, rank, key) < best[:3]):
                best = (delta, rank, key, target)
    if best is None:
        if decided:
            # (only in a pass that decides something: one that decides nothing is not
            # replayed, so what its search found must not change what a later one does)
            e.consolidation_epoch = epoch
        return None
    _, _, key, target = best
    return key, target


def staged_change(
    e: ShardModel, judge: PotentialPlugin, key: str, source: int, target: int
) -> tuple[int, int]:
    """The change of ``judge``'s potential, summed over the two nodes, of moving running
    pod ``key`` from ``source`` to ``target`` (staged, then undone): the move's own
    accounting, what the move is chosen by; and the change of how many of the two could
    start one of the largest pods ``judge`` expects (a move that lowers it is never
    made)."""
    state = e.state
    info = e.pods[key]
    pod = unpinned(info)
    spec = info.spec
    pair = np.array([source, target], dtype=np.int64)
    statement = Statement(state, e.quotas)
    statement.lift(key, spec.namespace, BY)
    statement.land_pod(pod, target, BY)
    after = int(judge.potential(state, pair).sum())
    hosts_after = int((judge.largest_room(state, pair) > 0).sum())
    statement.discard()
    before = int(judge.potential(state, pair).sum())
    hosts_before = int((judge.largest_room(state, pair) > 0).sum())
    return after - before, hosts_after - hosts_before


def _judge(p: PassContext, rescheduler: Rescheduler) -> PotentialPlugin | None:
    for framework in p.profiles.frameworks.values():
        if framework.plugins.get("Rescheduler") is rescheduler:
            return framework.potential
    return None
