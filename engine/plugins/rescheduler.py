"""Rescheduler: make room for a pod that fits nowhere by moving running pods (PostFilter).

After preemption (the post-filter before it) found nothing, or may not evict anyone, the
rescheduler looks for a *migration plan*: pods to move off one node so that the waiting
pod fits there, each moved pod placed on another node by its own profile, all staged in
the attempt's statement and committed whole (or discarded whole).

Which plan: the fewest moves, then the least work lost (the lowest priorities, then the
pods that started last), then the lowest node slot. Searched over at most
``MAX_CANDIDATES`` nodes (those with the fewest movable pods first), plans of up to
``maxMoves`` pods (default 3) and at most ``MAX_TRIALS`` staged trials, so an attempt
stays bounded. A pod that fits nowhere even then is told the cheapest plan found that
needs more moves than allowed, in its reason.

Never moved: a pod that says no (annotation ``shoal.io/migratable: "false"``), one of
higher priority than the waiting pod, a member
of a gang (gangs move whole or not at all, and whole-gang moves are not planned yet),
a pod not yet bound, and the waiting pod's own gang. A gang that cannot be placed is not
helped by migrations yet. A pod that named its node (``nodeName``, how a scenario says
"node1 runs podA") is where it runs, not a constraint on where it may restart: a move
places it by its other filters (in Kubernetes its controller's replacement is placed).
Disruption budgets are not known to the engine: in Kubernetes the Eviction API enforces
them when the move is carried out.

What a plan becomes: ``PodMigrated`` for each moved pod (from, to, the pod it made room
for), then the waiting pod's ``PodBound``. In the simulated cluster a moved pod restarts
on its new node (its ``shoal.io/runtime`` starts again).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import numpy as np

from engine.framework.cycle import CycleState
from engine.framework.handle import STATEMENT, Handle
from engine.framework.interfaces import PostFilterResult
from engine.framework.status import SUCCESS, unschedulable
from engine.model.disruption import broken_by
from engine.model.pods import PodInfo
from engine.model.state import Bools, ClusterState
from engine.model.statement import Statement
from events.errors import InputError

NAME: Final = "Rescheduler"
MIGRATABLE: Final = "shoal.io/migratable"
MAX_MOVES: Final = 3
MAX_CANDIDATES: Final = 32
MAX_TRIALS: Final = 64
MAX_COMBINATIONS: Final = 4096
PLACED: Final = "placed"
"""Cycle key: the slot the waiting pod was placed on (the plan staged it already)."""
SKIP: Final = "skip"
"""Cycle key: not this attempt (no plan was found for the pod's shape in this pass)."""
CHEAPEST: Final = "cheapest"
"""Cycle key: a plan found that needs more moves than allowed (said in the reason)."""
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


@dataclass(frozen=True, slots=True)
class _Plan:
    cost: tuple[int, int, int, int]
    slot: int
    moved: tuple[str, ...]


class Rescheduler:
    name = NAME

    def __init__(
        self, handle: Handle, max_moves: int = MAX_MOVES, defrag: Budget | None = None
    ) -> None:
        self.handle = handle
        self.max_moves = max_moves
        self.defrag = defrag
        """The defragmentation's budget (:mod:`engine.passes.defrag`); None: off."""

    def __repr__(self) -> str:
        return f"Rescheduler(max_moves={self.max_moves})"

    @classmethod
    def create(cls, args: Mapping[str, Any], where: str, handle: Handle) -> Rescheduler:
        unknown = set(args) - {"maxMoves", "defragmentation"}
        if unknown:
            raise InputError(
                f"unknown args {sorted(unknown)} (maxMoves, defragmentation)", location=where
            )
        moves = args.get("maxMoves", MAX_MOVES)
        if not isinstance(moves, int) or isinstance(moves, bool) or not 0 <= moves <= 8:
            raise InputError(f"maxMoves must be an integer 0..8, got {moves!r}", location=where)
        return cls(
            handle, moves, Budget.parse(args.get("defragmentation"), f"{where}.defragmentation")
        )

    def post_filter(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools
    ) -> PostFilterResult:
        """Stage the cheapest migration plan for ``pod`` in the cycle's statement, the
        pod's own placement included (``PLACED``); nothing staged when none exists."""
        statement = cycle.read("", STATEMENT)
        handle = self.handle
        if (
            not isinstance(statement, Statement)
            or cycle.read(NAME, SKIP, False)
            or not handle.migrates
            or pod.spec.group
            or self.max_moves == 0
        ):
            return NOTHING
        framework = handle.framework_for(pod)
        if framework is None or not framework.run_pre_filters(CycleState(), pod, state).ok:
            return NOTHING  # moves free room on nodes, nothing else (a quota, a gang)
        allowances = handle.disruptions_allowed(pod.key)
        movable = self._movable(pod, state, allowances)
        candidates = [
            slot
            for slot in sorted(movable, key=lambda s: (len(movable[s]), s))
            if feasible[slot] and self._fits_without(pod, state, slot, movable[slot])
        ][:MAX_CANDIDATES]
        if not candidates:
            return NOTHING
        trials = 0
        refused: list[str] = []
        for size in range(1, self.max_moves + 2):
            plans = self._plans(pod, state, candidates, movable, size, allowances, refused)
            if size > self.max_moves:
                if plans:
                    cheapest = plans[0]
                    node = state.names[cheapest.slot] or "?"
                    cycle.write(
                        NAME,
                        CHEAPEST,
                        f"moving {', '.join(cheapest.moved)} off {node} would make room, "
                        f"but that is {size} moves (maxMoves {self.max_moves})",
                    )
                elif refused:
                    cycle.write(NAME, CHEAPEST, refused[0])
                return NOTHING
            for plan in plans:
                trials += 1
                if trials > MAX_TRIALS:
                    return NOTHING
                if self._stage(statement, framework, pod, state, plan):
                    cycle.write(NAME, PLACED, plan.slot)
                    return PostFilterResult(SUCCESS, plan.slot)
        if refused:
            cycle.write(NAME, CHEAPEST, refused[0])
        return NOTHING

    def _movable(
        self, pod: PodInfo, state: ClusterState, allowances: Mapping[str, int] | None
    ) -> dict[int, list[str]]:
        """Per node, the pods there that may be moved for ``pod`` (one at a time: a
        budget that lets none of its pods go rules them out here already)."""
        handle = self.handle
        pods, started, budgets = handle.pods, handle.started, handle.budgets
        out: dict[int, list[str]] = {}
        for key, placed in state.pods.items():
            info = pods.get(key)
            if (
                info is None
                or key not in started
                or info.spec.group
                or info.priority > pod.priority
                or info.spec.annotations.get(MIGRATABLE, "").lower() == "false"
                or (allowances is None and broken_by(budgets, None, (info.spec,)))
            ):
                continue
            out.setdefault(placed.slot, []).append(key)
        return out

    @staticmethod
    def _fits_without(pod: PodInfo, state: ClusterState, slot: int, keys: list[str]) -> bool:
        """Whether ``pod`` fits ``slot``'s resources with ``keys`` gone from it."""
        card_rows = state.cards.rows
        room = {row: int(state.free[row, slot]) for row, _ in pod.request if row not in card_rows}
        released = []
        for key in keys:
            placed = state.pods[key]
            for row, amount in placed.request:
                if row in room:
                    room[row] += amount
            if placed.gpu is not None:
                released.append((placed.devices, placed.gpu))
        if any(room[row] < amount for row, amount in pod.request if row in room):
            return False
        gpu = state.gpu_of(pod.request)
        return gpu is None or state.cards.fits_after(slot, gpu, released)

    def _plans(
        self,
        pod: PodInfo,
        state: ClusterState,
        candidates: list[int],
        movable: dict[int, list[str]],
        size: int,
        allowances: Mapping[str, int] | None,
        refused: list[str],
    ) -> list[_Plan]:
        """Every plan of ``size`` moves that frees enough room and breaks no disruption
        budget (its moves counted together), cheapest first; a plan a budget refused is
        said in ``refused``."""
        pods, started, budgets = self.handle.pods, self.handle.started, self.handle.budgets
        plans: list[_Plan] = []
        combinations = 0
        for slot in candidates:
            keys = sorted(movable[slot])
            if len(keys) < size:
                continue
            for moved in itertools.combinations(keys, size):
                combinations += 1
                if combinations > MAX_COMBINATIONS:
                    break
                if not self._fits_without(pod, state, slot, list(moved)):
                    continue
                broken = broken_by(budgets, allowances, (pods[k].spec for k in moved))
                if broken:
                    if not refused:
                        refused.append(
                            f"moving {', '.join(moved)} off {state.names[slot] or '?'} would "
                            f"make room, but PodDisruptionBudget {broken} allows no more "
                            "disruptions"
                        )
                    continue
                cost = (
                    sum(pods[k].priority for k in moved),
                    -sum(started.get(k, 0) for k in moved),
                    slot,
                    0,
                )
                plans.append(_Plan(cost, slot, moved))
        plans.sort(key=lambda p: (p.cost, p.moved))
        return plans

    def _stage(
        self,
        statement: Statement,
        framework: Any,
        pod: PodInfo,
        state: ClusterState,
        plan: _Plan,
    ) -> bool:
        """Lift the plan's pods, place ``pod`` on its node and each lifted pod elsewhere
        (by its own profile); undo this trial and say False if any step fails."""
        for where in self._destinations(state, plan.slot):
            if self._stage_within(statement, framework, pod, state, plan, where):
                return True
        return False

    def _destinations(self, state: ClusterState, slot: int) -> list[Bools | None]:
        """Where moved pods may go, in the order tried: anywhere (an engine that owns
        its nodes); for the coordinator's view, nodes of the shard that owns ``slot``
        (a plan that shard carries out alone), then nodes of other shards (moves
        across shards, carried out in two steps), then anywhere."""
        owners = self.handle.slot_owners()
        if owners is None or slot >= len(owners):
            return [None]
        column = np.full(state.capacity, -1, dtype=np.int64)
        column[: min(len(owners), state.capacity)] = owners[: state.capacity]
        same = column == owners[slot]
        return [same, ~same & (column >= 0), None]

    def _stage_within(
        self,
        statement: Statement,
        framework: Any,
        pod: PodInfo,
        state: ClusterState,
        plan: _Plan,
        where: Bools | None,
    ) -> bool:
        mark = len(statement.ops)
        pods = self.handle.pods
        for key in plan.moved:
            statement.lift(key, pods[key].spec.namespace, pod.key)
        fits = framework is not None and bool(
            framework.feasible(CycleState(), pod, state)[plan.slot]
        )
        if fits:
            statement.assume_pod(pod, plan.slot)
            for key in plan.moved:
                moved = _unpinned(pods[key])
                own = self.handle.framework_for(moved)
                if own is None:
                    fits = False
                    break
                feasible = own.feasible(CycleState(), moved, state)
                if where is not None:
                    feasible = feasible & where
                feasible[plan.slot] = False  # a move back is no move
                if not np.any(feasible):
                    fits = False
                    break
                attempt = own.schedule_among(moved, state, feasible)
                if attempt < 0:
                    fits = False
                    break
                spec = moved.spec
                statement.land(
                    key,
                    spec.namespace,
                    attempt,
                    moved.request,
                    moved.priority,
                    spec.host_ports,
                    pod.key,
                )
        if not fits:
            statement.rollback(mark)
        return fits


def _unpinned(pod: PodInfo) -> PodInfo:
    """``pod`` as a move places it: without the node it named (see the docstring)."""
    if not pod.spec.node_name:
        return pod
    spec = msgspec.structs.replace(pod.spec, node_name="")
    static_key = ("", *pod.static_key[1:])
    return dataclasses.replace(
        pod, spec=spec, static_key=static_key, shape_key=(pod.request, static_key)
    )
