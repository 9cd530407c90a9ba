"""The rescheduler's search: which running pods to move, and where (see
:mod:`engine.plugins.rescheduler` for the rules).

What moves is a *unit*: a pod, or a gang whole (every bound member of a Scheduled gang,
each counted as a move; a gang is never split). A plan is units whose members on one
node free enough room there for the waiting pod; the members of a gang that run
elsewhere move too, to any node but their own. Plans are searched by size (pods moved),
then cost (the lowest priorities, the pods that started last, the lowest slot), and
staged one by one until one lands every moved pod: all in the attempt's statement,
undone on failure.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import numpy as np

from engine.framework.cycle import CycleState
from engine.framework.handle import Handle
from engine.model.disruption import broken_by
from engine.model.groups import SCHEDULED
from engine.model.pods import PodInfo
from engine.model.state import Bools, ClusterState
from engine.model.statement import Statement
from events.types import PodSpec

MIGRATABLE: Final = "shoal.io/migratable"
MAX_COMBINATIONS: Final = 4096
MAX_REFUSED: Final = 4
"""Plans refused by a disruption budget kept per search (to say why, if one works)."""

Unit = tuple[str, ...]
"""Pods that move together: one pod, or every bound member of a gang (sorted)."""


@dataclass(frozen=True, slots=True)
class Plan:
    cost: tuple[int, int, int, int]
    slot: int
    moved: tuple[str, ...]


def _may_move(handle: Handle, info: PodInfo, key: str, pod: PodInfo) -> bool:
    spec = info.spec
    return (
        key in handle.started
        and info.priority <= pod.priority
        and spec.annotations.get(MIGRATABLE, "").lower() != "false"
        and not placement_rules(spec)
    )


def placement_rules(spec: PodSpec) -> bool:
    """Whether a pod has required rules about the pods around it (inter-pod affinity or
    anti-affinity, a DoNotSchedule spread): such a pod is not moved, since where it
    may go can change with every other move of the same plan."""
    return bool(
        spec.pod_affinity
        or spec.pod_anti_affinity
        or any(c.when_unsatisfiable == "DoNotSchedule" for c in spec.spread_constraints)
    )


def movable_units(
    handle: Handle,
    pod: PodInfo,
    state: ClusterState,
    allowances: Mapping[str, int] | None,
    own_group: str = "",
    moved: frozenset[str] = frozenset(),
) -> dict[int, list[Unit]]:
    """Per node, the units with a member there that may be moved for ``pod`` (never
    ``own_group``, the waiting pod's gang, nor a unit with a pod of ``moved``, those
    this attempt moved already; a budget that lets none of its pods go rules them out
    here already)."""
    pods, budgets, groups = handle.pods, handle.budgets, handle.groups
    out: dict[int, list[Unit]] = {}
    gangs: dict[str, Unit | None] = {}
    for key, placed in state.pods.items():
        info = pods.get(key)
        if info is None or not _may_move(handle, info, key, pod):
            continue
        unit: Unit | None = (key,)
        name = info.spec.group
        if name:
            if name not in gangs:
                group = groups.get(name)
                members = sorted(m for m in group.members if m in state.pods) if group else []
                fine = (
                    group is not None
                    and name != own_group
                    and group.phase == SCHEDULED
                    and all(m in pods and _may_move(handle, pods[m], m, pod) for m in members)
                )
                gangs[name] = tuple(members) if fine else None
            unit = gangs[name]
        if (
            unit is None
            or not moved.isdisjoint(unit)
            or (allowances is None and broken_by(budgets, None, (pods[k].spec for k in unit)))
        ):
            continue
        here = out.setdefault(placed.slot, [])
        if unit not in here:
            here.append(unit)
    return out


def landable(
    handle: Handle,
    pod: PodInfo,
    state: ClusterState,
    feasible: Bools,
    movable: dict[int, list[Unit]],
) -> dict[int, list[Unit]]:
    """``movable`` with the pods that could go nowhere left out: on the nodes where
    ``pod`` could fit with every unit gone (``feasible`` ones), a one-pod unit stays only
    if its profile's filters allow it on some node other than its own now. Exact, not
    a guess: a plan frees room only on the node it empties, where the moved pod may not
    go back, so a pod with no other node now has none within any plan. Whether it fits
    is asked once per pod shape."""
    out: dict[int, list[Unit]] = {}
    somewhere: dict[Any, Bools | None] = {}
    pods = handle.pods
    for slot, units in movable.items():
        if not feasible[slot] or not fits_without(
            pod, state, slot, [k for unit in units for k in unit]
        ):
            continue
        kept = []
        for unit in units:
            if len(unit) == 1:
                info = unpinned(pods[unit[0]])
                if info.shape_key not in somewhere:
                    own = handle.framework_for(info)
                    somewhere[info.shape_key] = (
                        None if own is None else own.feasible(CycleState(), info, state).copy()
                    )
                where = somewhere[info.shape_key]
                if where is None or not (where.sum() - bool(where[slot])):
                    continue
            kept.append(unit)
        if kept:
            out[slot] = kept
    return out


def fits_without(pod: PodInfo, state: ClusterState, slot: int, keys: list[str]) -> bool:
    """Whether ``pod`` fits ``slot``'s resources with ``keys`` (those there) gone."""
    card_rows = state.cards.rows
    room = {row: int(state.free[row, slot]) for row, _ in pod.request if row not in card_rows}
    released = []
    for key in keys:
        placed = state.pods[key]
        if placed.slot != slot:
            continue
        for row, amount in placed.request:
            if row in room:
                room[row] += amount
        if placed.gpu is not None:
            released.append((placed.devices, placed.gpu))
    if any(room[row] < amount for row, amount in pod.request if row in room):
        return False
    gpu = state.gpu_of(pod.request)
    return gpu is None or state.cards.fits_after(slot, gpu, released)


def plans(
    handle: Handle,
    pod: PodInfo,
    state: ClusterState,
    candidates: list[int],
    movable: dict[int, list[Unit]],
    size: int,
    allowances: Mapping[str, int] | None,
    refused: list[tuple[Plan, str]],
    max_combinations: int = MAX_COMBINATIONS,
) -> list[Plan]:
    """Every plan of ``size`` moved pods that frees enough room and breaks no disruption
        budget (its moves counted together), cheapest first; the first ``MAX_REFUSED``
        plans a budget refused go to ``refused``, each with the budget's name (whether one
        could be carried out is for the caller to try). At most ``max_combinations`` sets
    of pods are looked at."""
    pods, started, budgets = handle.pods, handle.started, handle.budgets
    out: list[Plan] = []
    combinations = 0
    for slot in candidates:
        units = sorted(movable[slot])
        for count in range(1, min(size, len(units)) + 1):
            for chosen in itertools.combinations(units, count):
                moved = tuple(sorted(k for unit in chosen for k in unit))
                if len(moved) != size:
                    continue
                combinations += 1
                if combinations > max_combinations:
                    break
                if not fits_without(pod, state, slot, list(moved)):
                    continue
                broken = broken_by(budgets, allowances, (pods[k].spec for k in moved))
                cost = (
                    sum(pods[k].priority for k in moved),
                    -sum(started.get(k, 0) for k in moved),
                    slot,
                    0,
                )
                if broken:
                    if len(refused) < MAX_REFUSED:
                        refused.append((Plan(cost, slot, moved), broken))
                    continue
                out.append(Plan(cost, slot, moved))
    out.sort(key=lambda p: (p.cost, p.moved))
    return out


def stage(
    handle: Handle,
    statement: Statement,
    framework: Any,
    pod: PodInfo,
    state: ClusterState,
    plan: Plan,
) -> bool:
    """Lift the plan's pods, place ``pod`` on its node and each lifted pod elsewhere (by
    its own profile, on any node, as one engine that owns every node would: at the
    coordinator too, a move may land on another shard, and is then carried out in two
    steps); undo this trial and say False if any step fails."""
    mark = len(statement.ops)
    pods = handle.pods
    origins = {key: statement.lift(key, pods[key].spec.namespace, pod.key) for key in plan.moved}
    fits = framework is not None and bool(framework.feasible(CycleState(), pod, state)[plan.slot])
    if fits:
        statement.assume_pod(pod, plan.slot)
        for key in plan.moved:
            moved = unpinned(pods[key])
            own = handle.framework_for(moved)
            if own is None:
                fits = False
                break
            feasible = own.feasible(CycleState(), moved, state)
            feasible[plan.slot] = False  # a move back is no move
            feasible[origins[key]] = False
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


def unpinned(pod: PodInfo) -> PodInfo:
    """``pod`` as a move places it: without the node it named (a pod that named its node
    says where it runs, not where it may restart)."""
    if not pod.spec.node_name:
        return pod
    spec = msgspec.structs.replace(pod.spec, node_name="")
    static_key = ("", *pod.static_key[1:])
    return msgspec.structs.replace(
        pod, spec=spec, static_key=static_key, shape_key=(pod.request, static_key)
    )
