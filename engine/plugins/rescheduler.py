"""Rescheduler: make room for a pod that fits nowhere by moving running pods (PostFilter).

After preemption (the post-filter before it) found nothing, or may not evict anyone, the
rescheduler looks for a *migration plan*: pods to move off one node so that the waiting
pod fits there, each moved pod placed on another node by its own profile, all staged in
the attempt's statement and committed whole (or discarded whole). The search itself is
:mod:`engine.plugins.migration`.

Which plan: the fewest moves, then the least work lost (the lowest priorities, then the
pods that started last); among the plans of that size and cost, where the profile's
score measures fragmentation (:class:`~engine.framework.interfaces.PotentialPlugin`:
GpuFragmentation's ``F_n``, ShoalGpu's ``F_n`` plus its stranded-GPU and model-pressure
terms), the one whose staged outcome leaves the least of it on the nodes it touches (up
to ``CHOICES`` compared), else the lowest node slot. Pods that could go to no other
node now are never part of a plan (:func:`engine.plugins.migration.landable`).

When that search finds nothing for a pod that asks for one card (whole or a share),
a second one frees a card (:mod:`engine.plugins.cardchain`): the pods sharing a card of
a node the pod fits but for its card move off it, each landing where its profile would
place it, or after one pod of another card steps aside for it (a chain of two moves);
the fewest moves first; of those, up to four tried, the cheapest (least work lost)
first, and the one that leaves the least fragmentation kept. Gang members are left to
the first search.

Budget (arg ``budget: {percentOfPlaced: P}``): the moves this engine makes in all (the
rescheduler's, the defragmentation's, the consolidation's) stay within P% of the pods it
has placed so far, both counted from what it folded (``placed_total``,
``moved_total``); a plan larger than what is left is not made (the reason says so).
With ``consolidate: true`` the budget's moves left go to the moves that lower
fragmentation most (:mod:`engine.passes.consolidate`). Searched over at most
``MAX_CANDIDATES`` nodes (those with the fewest movable units first), plans of up to
``maxMoves`` pods (default 3) and at most ``MAX_TRIALS`` staged trials, so an attempt
stays bounded. A pod that fits nowhere even then is told, in its reason, the plan a
disruption budget refused, or else the cheapest plan that needs more moves than allowed
(the fewest moves, up to ``MAX_REPORTED``), but only a plan that could be carried out:
it is staged (every moved pod landing on another node by its profile) and undone. A
plan that frees room on a node but whose pods can go nowhere else (a one-node cluster)
is never offered as a fix.

Never moved: a pod that says no (annotation ``shoal.io/migratable: "false"``), one of
higher priority than the waiting pod, a pod not yet bound, the waiting pod's own gang,
and pods whose PodDisruptionBudgets would be broken (the plan's moves counted
together, :mod:`engine.model.disruption`; an engine that cannot count a budget, a
shard under a coordinator without the coordinator's count, moves none of its pods).
A gang moves only whole: every bound member of a Scheduled gang in one plan, each a
move. A pod that named its node (``nodeName``, how a scenario says "node1 runs podA")
is where it runs, not a constraint on where it may restart: a move places it by its
other filters (in Kubernetes its controller's replacement is placed).

A waiting gang's members are planned for within the gang's attempt
(:func:`engine.passes.gangs.attempt_group`): the cycle names the gang (``GANG``) and the
moves its earlier members left (``MOVES_LEFT``), so that ``maxMoves`` bounds the whole
gang's plan.

What a plan becomes: ``PodMigrated`` for each moved pod (from, to, the pod it made room
for), then the waiting pod's ``PodBound``. In the simulated cluster a moved pod restarts
on its new node (its ``shoal.io/runtime`` starts again).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from engine.framework.cycle import CycleState
from engine.framework.handle import STATEMENT, Handle
from engine.framework.interfaces import PostFilterResult
from engine.framework.status import SUCCESS, unschedulable
from engine.model.pods import PodInfo
from engine.model.state import Bools, ClusterState
from engine.model.statement import Statement
from engine.plugins.cardchain import free_card
from engine.plugins.migration import (
    MAX_COMBINATIONS,
    Plan,
    Unit,
    fits_without,
    landable,
    movable_units,
    plans,
    stage,
)
from events.errors import InputError

NAME: Final = "Rescheduler"
MAX_MOVES: Final = 3
MAX_CANDIDATES: Final = 32
MAX_TRIALS: Final = 64
MAX_REPORTED: Final = 8
"""The largest plan a reason names (``maxMoves`` is at most 8 too)."""
REPORT_TRIALS: Final = 16
"""Plans beyond ``maxMoves`` tried (staged, then undone) before a reason names one."""
CHOICES: Final = 8
"""Plans of the fewest moves that a profile with a fragmentation score
(:class:`~engine.framework.interfaces.PotentialPlugin`) compares, each staged and
undone, before it keeps the one that leaves the least fragmentation."""
PLACED: Final = "placed"
"""Cycle key: the slot the waiting pod was placed on (the plan staged it already)."""
SKIP: Final = "skip"
"""Cycle key: not this attempt (no plan was found for the pod's shape in this pass)."""
CHEAPEST: Final = "cheapest"
"""Cycle key: a plan found that needs more moves than allowed (said in the reason)."""
GANG: Final = "gang"
"""Cycle key: the gang whose attempt plans for one of its members."""
MOVES_LEFT: Final = "moves_left"
"""Cycle key: the moves a gang's attempt has left for this member (its earlier members'
plans used the others)."""
ROOM: Final = "NodeResourcesFit"
"""The filter whose rejections moves can answer (room on a node, GPU cards included)."""
NOTHING = PostFilterResult(unschedulable("no migration makes room"))


@dataclass(frozen=True, slots=True)
class Budget:
    per_minute: int
    per_node_per_minute: int

    @classmethod
    def parse(cls, raw: Any, where: str) -> Budget | None:
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise InputError("must be a mapping", location=where)
        unknown = set(raw) - {"movesPerMinute", "movesPerNodePerMinute"}
        if unknown:
            raise InputError(f"unknown field {sorted(unknown)[0]!r}", location=where)
        values = []
        for key in ("movesPerMinute", "movesPerNodePerMinute"):
            value = raw.get(key, 10 if key == "movesPerMinute" else 2)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 10_000:
                raise InputError(
                    f"must be an integer 0..10000, got {value!r}", location=f"{where}.{key}"
                )
            values.append(value)
        return cls(values[0], values[1])


def parse_share(raw: Any, where: str) -> int | None:
    """``budget: {percentOfPlaced: P}``: the moves this engine may make in all, as a
    percent (integer 0..100) of the pods it has placed; None: no such bound."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError("must be a mapping", location=where)
    unknown = set(raw) - {"percentOfPlaced"}
    if unknown:
        raise InputError(f"unknown field {sorted(unknown)[0]!r}", location=where)
    value = raw.get("percentOfPlaced")
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 100:
        raise InputError(
            f"must be an integer 0..100, got {value!r}", location=f"{where}.percentOfPlaced"
        )
    return value


def moving_on_its_own(plugins: Iterable[Mapping[str, object]]) -> Rescheduler | None:
    """The ``Rescheduler`` that defragments or consolidates after a pass (the first
    profile's, of the profiles' ``plugins``, that does either), or None."""
    for named in plugins:
        plugin = named.get(NAME)
        if isinstance(plugin, Rescheduler) and (plugin.defrag is not None or plugin.consolidate):
            return plugin
    return None


def moves_left(handle: Handle, percent: int | None, for_pod: str = "") -> int | None:
    """Moves the budget of ``percent`` of placed pods still allows (None: unbounded):
    ``percent`` of the pods placed so far, less the moves made so far; for ``for_pod``,
    as counted over every shard where the coordinator handed it with a plan of moves
    (:meth:`~engine.framework.handle.Handle.move_counts`)."""
    if percent is None:
        return None
    placed, moved = handle.move_counts(for_pod)
    return max(0, placed * percent // 100 - moved)


class Rescheduler:
    name = NAME

    def __init__(
        self,
        handle: Handle,
        max_moves: int = MAX_MOVES,
        defrag: Budget | None = None,
        share: int | None = None,
        consolidate: bool = False,
    ) -> None:
        self.handle = handle
        self.max_moves = max_moves
        self.defrag = defrag
        """The defragmentation's budget (:mod:`engine.passes.defrag`); None: off."""
        self.share = share
        """Moves in all at most this percent of the pods placed so far (``budget:
        {percentOfPlaced: P}``; the rescheduler's and the defragmentation's moves
        together); None: no such bound."""
        self.consolidate = consolidate
        """Spend the budget's moves left on the moves that lower fragmentation most
        (:mod:`engine.passes.consolidate`)."""

    def __repr__(self) -> str:
        return f"Rescheduler(max_moves={self.max_moves}, share={self.share})"

    def moves_left(self, for_pod: str = "") -> int | None:
        """What the budget in percent of placed pods still allows (None: unbounded),
        to make room for ``for_pod`` (``""``: this engine's own moves)."""
        return moves_left(self.handle, self.share, for_pod)

    @classmethod
    def create(cls, args: Mapping[str, Any], where: str, handle: Handle) -> Rescheduler:
        unknown = set(args) - {"maxMoves", "defragmentation", "budget", "consolidate"}
        if unknown:
            raise InputError(
                f"unknown args {sorted(unknown)} (maxMoves, defragmentation, budget, consolidate)",
                location=where,
            )
        consolidate = args.get("consolidate", False)
        if not isinstance(consolidate, bool):
            raise InputError(
                f"must be true or false, got {consolidate!r}", location=f"{where}.consolidate"
            )
        if consolidate and args.get("budget") is None:
            raise InputError(
                "needs a budget ({percentOfPlaced: P}): it would move pods without end",
                location=f"{where}.consolidate",
            )
        moves = args.get("maxMoves", MAX_MOVES)
        if not isinstance(moves, int) or isinstance(moves, bool) or not 0 <= moves <= 8:
            raise InputError(f"maxMoves must be an integer 0..8, got {moves!r}", location=where)
        return cls(
            handle,
            moves,
            Budget.parse(args.get("defragmentation"), f"{where}.defragmentation"),
            parse_share(args.get("budget"), f"{where}.budget"),
            consolidate,
        )

    def post_filter(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools
    ) -> PostFilterResult:
        """Stage the cheapest migration plan for ``pod`` in the cycle's statement, the
        pod's own placement included (``PLACED``); nothing staged when none exists. A
        gang's member is planned for only within its gang's attempt (``GANG``), with
        the moves its gang has left (``MOVES_LEFT``)."""
        statement = cycle.read("", STATEMENT)
        handle = self.handle
        gang = cycle.read(NAME, GANG, "")
        limit = min(self.max_moves, int(cycle.read(NAME, MOVES_LEFT, self.max_moves)))
        budget_left = self.moves_left(pod.key)
        if budget_left is not None and isinstance(statement, Statement):
            # the moves this attempt staged already (a gang's earlier members) count too
            limit = min(limit, budget_left - len(statement.moves()))
        if (
            not isinstance(statement, Statement)
            or cycle.read(NAME, SKIP, False)
            or not handle.migrates
            or (pod.spec.group and pod.spec.group != gang)
            or limit <= 0
        ):
            return NOTHING
        framework = handle.framework_for(pod)
        if framework is None or not framework.run_pre_filters(CycleState(), pod, state).ok:
            return NOTHING  # moves free room on nodes, nothing else (a quota, a gang)
        allowances = handle.disruptions_allowed(pod.key)
        moved = frozenset(key for key, _, _, _ in statement.moves())
        if moved and allowances:
            # the moves this attempt staged already (a gang's earlier members) count too
            left = dict(allowances)
            for key in sorted(moved):
                for budget in handle.budgets.covering(handle.pods[key].spec):
                    left[budget] = left.get(budget, 0) - 1
            allowances = left
        units = movable_units(handle, pod, state, allowances, pod.spec.group, moved)
        movable = landable(handle, pod, state, feasible, units)
        candidates = [
            slot
            for slot in sorted(movable, key=lambda s: (len(movable[s]), s))
            if feasible[slot]
            and fits_without(pod, state, slot, [k for unit in movable[slot] for k in unit])
        ][:MAX_CANDIDATES]
        trials = 0
        refused: list[tuple[Plan, str]] = []
        for size in range(1, limit + 1 if candidates else 1):
            found = plans(handle, pod, state, candidates, movable, size, allowances, refused)
            best, trials = _least_fragmenting(
                handle, statement, framework, pod, state, found, trials
            )
            if best is not None and stage(handle, statement, framework, pod, state, best):
                cycle.write(NAME, PLACED, best.slot)
                return PostFilterResult(SUCCESS, best.slot)
            if trials > MAX_TRIALS:
                break
        if not gang:
            # a card freed by moving the pods that share it, directly or by chains
            chain = free_card(
                handle, statement, framework, pod, state, feasible, units, limit, allowances
            )
            if chain is not None:
                cycle.write(NAME, PLACED, chain.slot)
                return PostFilterResult(SUCCESS, chain.slot)
        if not candidates or trials > MAX_TRIALS:
            return NOTHING
        note = _why_not(handle, statement, framework, pod, state, refused, MAX_TRIALS - trials)
        if not note:
            cheapest = self._beyond(
                handle, statement, framework, pod, state, candidates, movable, limit, allowances
            )
            if cheapest is not None:
                plan, size = cheapest
                if budget_left is not None and limit == budget_left - len(statement.moves()):
                    allowed = f"{max(limit, 0)} left of the budget, {self.share}% of placed pods"
                elif limit == self.max_moves:
                    allowed = f"maxMoves {self.max_moves}"
                else:
                    allowed = f"{limit} left of maxMoves {self.max_moves} for the gang"
                node = state.names[plan.slot] or "?"
                note = (
                    f"moving {', '.join(plan.moved)} off {node} would make room, "
                    f"but that is {size} moves ({allowed})"
                )
        if note:
            cycle.write(NAME, CHEAPEST, note)
        return NOTHING

    def _beyond(
        self,
        handle: Handle,
        statement: Statement,
        framework: Any,
        pod: PodInfo,
        state: ClusterState,
        candidates: list[int],
        movable: dict[int, list[Unit]],
        limit: int,
        allowances: Mapping[str, int] | None,
    ) -> tuple[Plan, int] | None:
        """The cheapest plan of more than ``limit`` moves (at most ``MAX_REPORTED``) that
        could be carried out: every moved pod lands elsewhere (tried, then undone), and
        its size; None when there is none within ``REPORT_TRIALS`` trials (and as many
        sets of pods looked at, over all sizes, as one size of the search may)."""
        trials = 0
        sizes = range(limit + 1, MAX_REPORTED + 1)
        share = MAX_COMBINATIONS // max(len(sizes), 1)
        for size in sizes:
            found = plans(handle, pod, state, candidates, movable, size, allowances, [], share)
            for plan in found:
                trials += 1
                if trials > REPORT_TRIALS:
                    return None
                if _would_stage(handle, statement, framework, pod, state, plan):
                    return plan, size
        return None


def _least_fragmenting(
    handle: Handle,
    statement: Statement,
    framework: Any,
    pod: PodInfo,
    state: ClusterState,
    found: list[Plan],
    trials: int,
) -> tuple[Plan | None, int]:
    """Of ``found`` (plans of one size, cheapest first), the plan to carry out and the
    trials counted so far (past ``MAX_TRIALS``: stop). Without a fragmentation score in
    the profile, the first that can be carried out. With one, the plans of the least
    cost (work lost) that can be carried out, up to ``CHOICES`` of them, each staged
    and undone, are compared by the change of the score's fragmentation summed over the
    nodes the plan touches (the waiting pod's placement included): the least wins, then
    the earlier (cheaper) plan. Nothing stays staged."""
    potential = framework.potential if framework is not None else None
    best: tuple[int, Plan] | None = None
    compared = 0
    for plan in found:
        if best is not None and (compared >= CHOICES or plan.cost[:2] != best[1].cost[:2]):
            break
        trials += 1
        if trials > MAX_TRIALS:
            break
        mark = len(statement.ops)
        if not stage(handle, statement, framework, pod, state, plan):
            continue
        if potential is None:
            statement.rollback(mark)
            return plan, trials
        touched = np.unique(np.array([op.slot for op in statement.ops[mark:]], dtype=np.int64))
        after = int(potential.potential(state, touched).sum())
        statement.rollback(mark)
        before = int(potential.potential(state, touched).sum())
        compared += 1
        if best is None or after - before < best[0]:
            best = (after - before, plan)
    return (best[1] if best is not None else None), trials


def _would_stage(
    handle: Handle,
    statement: Statement,
    framework: Any,
    pod: PodInfo,
    state: ClusterState,
    plan: Plan,
) -> bool:
    """Whether ``plan`` could be carried out (staged, then undone)."""
    mark = len(statement.ops)
    if not stage(handle, statement, framework, pod, state, plan):
        return False
    statement.rollback(mark)
    return True


def _why_not(
    handle: Handle,
    statement: Statement,
    framework: Any,
    pod: PodInfo,
    state: ClusterState,
    refused: list[tuple[Plan, str]],
    trials: int,
) -> str:
    """The first plan a disruption budget refused that could otherwise be carried out,
    said; "" when there is none."""
    for plan, budget in refused[: max(trials, 0)]:
        if _would_stage(handle, statement, framework, pod, state, plan):
            return (
                f"moving {', '.join(plan.moved)} off {state.names[plan.slot] or '?'} would "
                f"make room, but PodDisruptionBudget {budget} allows no more disruptions"
            )
    return ""
