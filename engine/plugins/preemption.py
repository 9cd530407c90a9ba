"""DefaultPreemption: make room for a pod that fits nowhere by evicting others (PostFilter).

Who may be evicted is CapacityScheduling's rule (scheduler-plugins), which is
kube-scheduler's priority preemption wherever no elastic quota is involved:

- a pod whose namespace has no quota evicts pods of strictly lower priority from
  namespaces without a quota;
- a pod within its namespace's ``min`` (with itself) *reclaims*: it evicts pods of other
  namespaces that use more than their ``min`` (any priority), never taking one below
  its ``min`` in the resources being reclaimed (those over the sum of the ``min``s, or
  short on the node);
- a pod beyond its namespace's ``min`` evicts only lower-priority pods of its own
  namespace;
- a pod with ``preemptionPolicy: Never`` evicts nothing.

Which: per candidate node (one that only resources keep the pod from), every eligible
pod there is removed; if the quota still refuses (the cluster is larger than the quotas'
``min``, so room on a node is not what is missing), eligible pods elsewhere are added,
least valuable first; then victims are reprieved one unit at a time while the pod still
fits the node and its quota, as kube-scheduler's ``selectVictimsOnNode`` does: those
whose eviction would break a PodDisruptionBudget first, then the most valuable first
(highest priority, then earliest start). A victim whose gang would drop below
``minMember`` takes its whole gang: the gang is one unit in the choice on a node (as
valuable as its most valuable member), in the namespaces' floors and in the cost.

The node chosen is kube-scheduler's (``pickOneNodeForPreemption``): it minimises, in
order, the number of victims whose eviction would break a budget (the most valuable
victims use a budget's allowance first), the highest victim priority, the sum of the
victims' priorities (each counted as ``priority + 2**31``, as kube-scheduler does, so
that one more victim always costs more than any difference of priorities), the number
of victims (gangs expanded); then it prefers the node whose highest-priority victims
started last, then the first node by name. So a priority-1000 pod evicts two
priority-100 pods before one priority-500 pod: priority comes before count, as in
kube-scheduler, CapacityScheduling and Volcano. A budget never forbids a preemption.
The per-node work runs on at most ``MAX_CANDIDATES`` nodes, those whose victims could
have the lowest highest priority first (then the fewest eligible pods). The coordinator
decides the preemptions of several shards with this same plugin on its exact view, so
the choice is the same at any number of shards.

The victims and the pod are staged in the attempt's statement; the pass commits them
(evictions first) or discards them whole, so nothing half-done is ever visible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Final

import numpy as np

from engine.framework.cycle import CycleState
from engine.framework.handle import STATEMENT, Handle
from engine.framework.interfaces import PostFilterResult
from engine.framework.status import SUCCESS, unschedulable
from engine.model.devices import GpuRequest
from engine.model.disruption import violating
from engine.model.groups import SCHEDULED
from engine.model.pods import PodInfo
from engine.model.quota import QuotaTable
from engine.model.resources import PODS
from engine.model.state import Bools, ClusterState, Request
from engine.model.statement import Statement
from engine.model.victims import Cost, cost_of

NAME: Final = "DefaultPreemption"
MAX_CANDIDATES: Final = 64
EXCLUDE: Final = "exclude_group"
"""Cycle key: a gang whose members are never victims of its own attempt."""
SKIP: Final = "skip"
"""Cycle key: this attempt may not evict (only a later post-filter may act)."""
NOTHING = PostFilterResult(unschedulable("no victims make room"))


class Mode(Enum):
    """Whose pods a preemptor may evict (see the module docstring)."""

    PRIORITY = "priority"
    RECLAIM = "reclaim"
    OWN = "own"


@dataclass(frozen=True, slots=True)
class Plan:
    slot: int
    victims: tuple[str, ...]
    cost: Cost


@dataclass(frozen=True, slots=True)
class _Victim:
    key: str
    priority: int
    started: int
    namespace: str
    slot: int
    request: dict[str, int]
    """What it holds on its node, by resource name (its cards' rows aside)."""
    counted: dict[str, int]
    """What it counts in quotas (:meth:`QuotaTable.named`: its cards in milli-cards)."""

    def rank(self) -> tuple[int, int, str]:
        """Most valuable first: higher priority, then earlier start."""
        return (-self.priority, self.started, self.key)


class DefaultPreemption:
    name = NAME

    def __init__(self, handle: Handle) -> None:
        self.handle = handle

    def __repr__(self) -> str:
        return "DefaultPreemption()"

    def post_filter(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools
    ) -> PostFilterResult:
        """Stage the cheapest set of evictions that lets ``pod`` fit (``feasible``: the
        nodes only resources keep it from) in the cycle's statement; the node they free
        is nominated. Nothing staged when no plan exists."""
        statement = cycle.read("", STATEMENT)
        if (
            not isinstance(statement, Statement)
            or pod.spec.preemption_policy == "Never"
            or cycle.read(NAME, SKIP, False)
        ):
            return NOTHING
        chosen = plan(pod, state, feasible, self.handle, cycle.read(NAME, EXCLUDE, ""))
        if chosen is None:
            return NOTHING
        pods = self.handle.pods
        for victim in chosen.victims:
            if victim in state.pods:
                statement.evict(victim, pods[victim].spec.namespace, by=pod.key)
        return PostFilterResult(SUCCESS, chosen.slot)

    def worth_trying(self, pod: PodInfo, refused_by_quota: bool) -> bool:
        """Could any pod be a victim of ``pod`` at all (a cheap test before planning)?"""
        if pod.spec.preemption_policy == "Never":
            return False
        quotas = self.handle.quotas
        if refused_by_quota or quotas.get(pod.spec.namespace) is not None:
            return True
        return any(p < pod.priority for p in _priorities(self.handle))


def _priorities(handle: Handle) -> list[int]:
    return list(handle.state.used_by_priority)


def mode_of(pod: PodInfo, quotas: QuotaTable) -> Mode:
    quota = quotas.get(pod.spec.namespace)
    if quota is None:
        return Mode.PRIORITY
    if quotas.within_min(pod.spec.namespace, pod.request):
        return Mode.RECLAIM
    return Mode.OWN


def plan(
    pod: PodInfo,
    state: ClusterState,
    allowed: Bools,
    handle: Handle,
    exclude_group: str = "",
) -> Plan | None:
    """The cheapest way to make room for ``pod``, or None (see the module docstring)."""
    quotas = handle.quotas
    mode = mode_of(pod, quotas)
    exclude = exclude_group or pod.spec.group
    wanted = _names(state, pod.request)
    quota = quotas.get(pod.spec.namespace)
    agg_short: dict[str, int] = {}
    max_short: dict[str, int] = {}
    if quota is not None:
        counted = quotas.wanted(quota, pod.request)
        agg_short = quotas.short(counted)
        for resource, amount in counted.items():
            limit = quota.max_of(resource)
            if limit is not None and quota.used.get(resource, 0) + amount > limit:
                max_short[resource] = quota.used.get(resource, 0) + amount - limit

    def eligible(key: str) -> _Victim | None:
        victim = handle.pods.get(key)
        placed = state.pods.get(key)
        if victim is None or placed is None or (exclude and victim.spec.group == exclude):
            return None
        namespace = victim.spec.namespace
        theirs = quotas.get(namespace)
        if mode == Mode.PRIORITY:
            ok = theirs is None and victim.priority < pod.priority
        elif mode == Mode.OWN:
            ok = namespace == pod.spec.namespace and victim.priority < pod.priority
        else:
            ok = namespace != pod.spec.namespace and theirs is not None and theirs.borrowing()
        if not ok:
            return None
        return _victim(handle, state, key)

    if mode == Mode.PRIORITY and not (agg_short or max_short):
        # room on a node is all that is missing: only pods on the nodes that lower
        # priorities could free enough can be victims (found over the columns, not
        # pod by pod: a cluster holds many more pods than candidate nodes)
        keys = [k for s in _priority_candidates(pod, state, allowed) for k in state.node_pods[s]]
    else:
        keys = list(state.pods)
    everyone = [v for key in keys if (v := eligible(key)) is not None]
    if not everyone:
        return None
    units = _units(everyone, state, handle)
    by_slot: dict[int, list[_Victim]] = {}
    extra = np.zeros_like(state.free)
    for victim in everyone:
        by_slot.setdefault(victim.slot, []).append(victim)
        for row, amount in state.pods[victim.key].request:
            extra[row, victim.slot] += amount
    potential = state.free + extra
    gpu = state.gpu_of(pod.request)
    if gpu is not None:
        # card rows are not sums: count the cards that would satisfy the pod's need
        # with every eligible pod of the node gone
        row = state.resources.card_row(gpu.need)
        for slot_, here in by_slot.items():
            potential[row, slot_] = gpu.cards * _cards_fit(state, gpu, slot_, here)
    fits = allowed.copy()
    for row, amount in pod.request:
        fits &= potential[row] >= amount
    if not (agg_short or max_short):
        fits &= extra[PODS] > 0  # room on a node is all that is missing: need victims there
    slots = np.flatnonzero(fits)
    if slots.size == 0:
        return None
    order = np.lexsort((slots, extra[PODS][slots]))
    least_first = sorted(everyone, key=lambda v: v.rank(), reverse=True)
    budgets = handle.budgets
    allowances = handle.disruptions_allowed(pod.key) if budgets else {}

    def breaking(victims: list[_Victim]) -> set[str]:
        """The victims whose eviction would break a disruption budget, the most
        valuable using its allowance first (kube-scheduler's order)."""
        ranked = sorted(victims, key=lambda v: v.rank())
        return violating(budgets, allowances, (handle.pods[v.key].spec for v in ranked))

    best: Plan | None = None
    for slot in (int(s) for s in slots[order][:MAX_CANDIDATES]):
        chosen = _victims_for(
            pod,
            state,
            slot,
            by_slot.get(slot, []),
            least_first,
            wanted,
            agg_short,
            max_short,
            quotas,
            mode,
            units,
            breaking,
        )
        if chosen is None:
            continue
        expanded = dict.fromkeys(v.key for v in chosen)
        for victim in chosen:
            expanded.update(dict.fromkeys(_gang_of(handle, state, victim.key)))
        infos = [_describe(handle, key) for key in expanded]
        if not infos:
            return Plan(slot, (), cost_of(0, [], state.names[slot] or ""))  # fits already
        broken = len(breaking([_victim(handle, state, k) for k in expanded]))
        cost = cost_of(broken, infos, state.names[slot] or "")
        if best is None or cost < best.cost:
            best = Plan(slot, tuple(expanded), cost)
    return best


def _priority_candidates(pod: PodInfo, state: ClusterState, allowed: Bools) -> list[int]:
    """The nodes where evicting every pod of lower priority would make room for
    ``pod`` (its GPU cards aside: checked exactly per node later), at most
    ``MAX_CANDIDATES`` of them: those where the lowest priorities suffice first (the
    highest victim priority comes first in the choice), then those with the fewest such
    pods."""
    levels = sorted(level for level in state.used_by_priority if level < pod.priority)
    card_rows = state.cards.rows
    scalar = [(row, amount) for row, amount in pod.request if row not in card_rows]
    evictable = np.zeros_like(state.used)
    first = np.full(state.capacity, len(levels), dtype=np.int64)
    for index, level in enumerate(levels):
        evictable += state.used_by_priority[level]
        fits = allowed & (evictable[PODS] > 0) & (first == len(levels))
        for row, amount in scalar:
            fits &= state.free[row] + evictable[row] >= amount
        first[fits] = index
    slots = np.flatnonzero(first < len(levels))
    order = np.lexsort((slots, evictable[PODS][slots], first[slots]))
    return [int(s) for s in slots[order][:MAX_CANDIDATES]]


def _describe(handle: Handle, key: str) -> tuple[int, int]:
    pod = handle.pods[key]
    return pod.priority, handle.started.get(key, 0)


def _victims_for(
    pod: PodInfo,
    state: ClusterState,
    slot: int,
    here: list[_Victim],
    least_first: list[_Victim],
    wanted: dict[str, int],
    agg_short: dict[str, int],
    max_short: dict[str, int],
    quotas: QuotaTable,
    mode: Mode,
    units: dict[str, tuple[_Victim, ...]],
    breaking: Callable[[list[_Victim]], set[str]],
) -> list[_Victim] | None:
    """A minimal set of victims that lets ``pod`` fit ``slot`` and its quota, or None.
    A victim is taken with its unit (the gang that would fall with it), so the floor of
    its namespace and the room it frees count every pod that goes."""
    names = state.resources
    card_rows = state.cards.rows
    free = {
        names.name(row): int(state.free[row, slot])
        for row, _ in pod.request
        if row not in card_rows
    }
    wanted = {r: a for r, a in wanted.items() if names.get(r) not in card_rows}
    node_short = {r for r, amount in wanted.items() if free.get(r, 0) < amount}
    reclaimed = set(agg_short) | node_short
    taken: dict[str, dict[str, int]] = {}

    def floor_ok(victim: _Victim) -> bool:
        """Taking ``victim``'s unit too keeps every namespace at or above its ``min`` in
        every resource being reclaimed (reclaim only)."""
        if mode != Mode.RECLAIM:
            return True
        after: dict[str, dict[str, int]] = {}
        for member in units[victim.key]:
            if member.key in chosen_keys:
                continue
            quota = quotas.get(member.namespace)
            if quota is None:
                return False
            took = taken.get(member.namespace, {})
            left = after.setdefault(member.namespace, {})
            for resource in reclaimed:
                if resource not in quota.spec.min or not quota.names(resource):
                    continue
                floor = quota.min_of(resource)
                if resource not in left:
                    left[resource] = quota.used.get(resource, 0) - took.get(resource, 0)
                left[resource] -= member.counted.get(resource, 0)
                if left[resource] < floor:
                    return False
        return True

    def take(victim: _Victim, chosen: list[_Victim]) -> None:
        for member in units[victim.key]:
            if member.key in chosen_keys:
                continue
            chosen.append(member)
            chosen_keys.add(member.key)
            took = taken.setdefault(member.namespace, {})
            for resource, amount in member.counted.items():
                took[resource] = took.get(resource, 0) + amount

    chosen: list[_Victim] = []
    chosen_keys: set[str] = set()
    for victim in sorted(here, key=lambda v: v.rank(), reverse=True):
        if victim.key not in chosen_keys and floor_ok(victim):
            take(victim, chosen)
    covers = _coverage(pod, wanted, free, agg_short, max_short, quotas, slot)
    gpu = state.gpu_of(pod.request)
    if gpu is not None:
        covers = _with_cards(covers, state, gpu, slot)
    if not covers(chosen):
        if mode == Mode.PRIORITY or not (agg_short or max_short):
            return None
        for victim in least_first:  # the quota is what is short: victims anywhere
            if victim.slot == slot or victim.key in chosen_keys or not floor_ok(victim):
                continue
            if not any(victim.counted.get(r, 0) > 0 for r in (*agg_short, *max_short)):
                continue
            take(victim, chosen)
            if covers(chosen):
                break
        else:
            return None
    # reprieve a unit at a time, as kube-scheduler's selectVictimsOnNode does: those
    # whose eviction would break a disruption budget first, then the most valuable (a
    # gang as valuable as its most valuable member); whoever cannot be spared stays
    kept = list(chosen)
    breaks = breaking(chosen)

    def order(victim: _Victim) -> tuple[bool, tuple[int, int, str], tuple[int, int, str]]:
        unit = units[victim.key]
        unit_breaks = any(m.key in breaks for m in unit)
        return (not unit_breaks, min(m.rank() for m in unit), victim.rank())

    for victim in sorted(chosen, key=order):
        unit = {m.key for m in units[victim.key]}
        if victim.key not in {v.key for v in kept}:
            continue  # reprieved with its gang already
        trial = [v for v in kept if v.key not in unit]
        if covers(trial):
            kept = trial
    return kept


def _units(
    everyone: list[_Victim], state: ClusterState, handle: Handle
) -> dict[str, tuple[_Victim, ...]]:
    """Each eligible victim's unit: itself, or every placed member of the gang that would
    drop below ``minMember`` without it (members that are not eligible themselves
    included: they go down with it all the same)."""
    by_key = {v.key: v for v in everyone}
    units: dict[str, tuple[_Victim, ...]] = {}
    for victim in everyone:
        if victim.key in units:
            continue  # a member of a gang already seen
        gang = _gang_of(handle, state, victim.key)
        if not gang:
            units[victim.key] = (victim,)
            continue
        members = tuple(by_key.get(key) or _victim(handle, state, key) for key in gang)
        for member in members:  # the same unit for every member, eligible or not
            units[member.key] = members
    return units


def _victim(handle: Handle, state: ClusterState, key: str) -> _Victim:
    pod = handle.pods[key]
    placed = state.pods[key]
    return _Victim(
        key,
        pod.priority,
        handle.started.get(key, 0),
        pod.spec.namespace,
        placed.slot,
        _names(state, placed.request),
        handle.quotas.named(placed.request),
    )


def _names(state: ClusterState, request: Request) -> dict[str, int]:
    """``request`` by resource name (what it takes on a node)."""
    names = state.resources
    return {names.name(row): amount for row, amount in request}


def _coverage(
    pod: PodInfo,
    wanted: dict[str, int],
    free: dict[str, int],
    agg_short: dict[str, int],
    max_short: dict[str, int],
    quotas: QuotaTable,
    slot: int,
) -> Callable[[list[_Victim]], bool]:
    """Whether a set of victims makes room for ``pod`` on ``slot`` and in its quota."""

    def covers(victims: list[_Victim]) -> bool:
        room = dict(free)
        agg = dict.fromkeys(agg_short, 0)
        own = dict.fromkeys(max_short, 0)
        for victim in victims:
            if victim.slot == slot:
                for resource in room:
                    room[resource] += victim.request.get(resource, 0)
            theirs = quotas.get(victim.namespace)
            for resource in agg:
                if theirs is not None and theirs.names(resource):
                    agg[resource] += victim.counted.get(resource, 0)
            if victim.namespace == pod.spec.namespace:
                for resource in own:
                    own[resource] += victim.counted.get(resource, 0)
        return (
            all(room.get(r, 0) >= amount for r, amount in wanted.items())
            and all(agg[r] >= need for r, need in agg_short.items())
            and all(own[r] >= need for r, need in max_short.items())
        )

    return covers


def _with_cards(
    covers: Callable[[list[_Victim]], bool], state: ClusterState, gpu: GpuRequest, slot: int
) -> Callable[[list[_Victim]], bool]:
    """``covers``, and the pod's GPU cards fit ``slot`` without the victims there."""

    def both(victims: list[_Victim]) -> bool:
        here = [v for v in victims if v.slot == slot]
        return covers(victims) and _cards_fit(state, gpu, slot, here)

    return both


def _cards_fit(state: ClusterState, gpu: GpuRequest, slot: int, victims: list[_Victim]) -> bool:
    """Whether ``gpu`` fits the cards of ``slot`` with ``victims`` gone from it."""
    released = []
    for victim in victims:
        placed = state.pods.get(victim.key)
        if placed is not None and placed.gpu is not None and placed.slot == slot:
            released.append((placed.devices, placed.gpu))
    return state.cards.fits_after(slot, gpu, released)


def _gang_of(handle: Handle, state: ClusterState, key: str) -> tuple[str, ...]:
    """The placed members that go down with ``key`` (its gang, if it would drop below
    ``minMember``)."""
    pod = handle.pods.get(key)
    group = handle.groups.get(pod.spec.group) if pod is not None and pod.spec.group else None
    if group is None or group.phase != SCHEDULED:
        return ()
    placed = [m for m in group.members if m in state.pods]
    return tuple(placed) if len(placed) - 1 < group.min_member else ()
