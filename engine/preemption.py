"""Choosing victims: priority preemption and the reclaim of lent quota.

A pod that fits nowhere may evict pods to make room:

- *priority preemption*: pods of strictly lower priority (never when the preemptor's
  ``preemptionPolicy`` is ``Never``);
- *quota reclaim*: when the preemptor is within its namespace's guaranteed ``min``, pods
  of other namespaces that borrow beyond their ``min`` (any priority), never taking a
  namespace below its ``min``.

Per candidate node (one that only resources keep the pod from: no taint, selector or
name rejects it), every eligible pod is removed, then victims are reprieved one by one,
most valuable first (highest priority, earliest start), while the pod still fits: what
remains is a minimal set biased to the least valuable pods, lowest priority first and
then the most recently started. A victim whose gang would drop below ``minMember``
takes its whole gang with it, and that counts in the cost. The node chosen minimises,
in order: the number of victims (gangs expanded), the highest victim priority, the sum
of their priorities; then it prefers victims that started last (kube-scheduler's
"latest start time" rule), then the lowest slot.

Candidates are found with one vectorised pass: free plus evictable resources per node,
the evictable part kept by the state per priority (reclaim, which cuts across
priorities, scans the placed pods). The per-node work runs on at most
``MAX_CANDIDATES`` nodes, those with the fewest evictable pods first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np

from engine.model.pods import PodInfo
from engine.model.quota import QuotaTable
from engine.model.resources import PODS
from engine.model.state import Bools, ClusterState, Ints

MAX_CANDIDATES: Final = 64


@dataclass(frozen=True, slots=True)
class Plan:
    slot: int
    victims: tuple[str, ...]
    cost: tuple[int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class VictimInfo:
    key: str
    priority: int
    started: int
    namespace: str
    group: str


def plan(
    pod: PodInfo,
    state: ClusterState,
    allowed: Bools,
    info: Callable[[str], VictimInfo | None],
    quotas: QuotaTable,
    *,
    reclaim: bool,
    exclude_group: str = "",
    gang_of: Callable[[str], tuple[str, ...]] | None = None,
) -> Plan | None:
    """The cheapest way to make room for ``pod``, or None.

    ``allowed`` marks nodes the pod could use but for resources; ``info(key)``
    describes a placed pod; ``gang_of(key)`` lists the placed members a victim's
    eviction would also take down (its gang, if it would drop below ``minMember``).
    """
    if reclaim:
        extra = _reclaimable(pod, state, info, quotas)
    elif pod.spec.preemption_policy == "Never":
        return None
    else:
        # what priority preemption could free, per node, in one vectorised sum
        extra = state.evictable_below(pod.priority)
    potential = state.free + extra
    fits = allowed & (extra[PODS] > 0)
    for row, amount in pod.request:
        fits &= potential[row] >= amount
    slots = np.flatnonzero(fits)
    if slots.size == 0:
        return None
    # the most promising first: the fewest pods that could go
    order = np.lexsort((slots, extra[PODS][slots]))
    best: Plan | None = None
    for slot in (int(s) for s in slots[order][:MAX_CANDIDATES]):
        eligible = []
        for key in state.node_pods[slot]:
            victim = info(key)
            if victim is None or (exclude_group and victim.group == exclude_group):
                continue
            if _eligible(pod, victim, quotas, reclaim):
                eligible.append(victim)
        chosen = _minimal(pod, state, slot, eligible, quotas) if eligible else None
        if chosen is None:
            continue
        expanded = dict.fromkeys(chosen)
        for key in chosen:
            if gang_of is not None:
                expanded.update(dict.fromkeys(gang_of(key)))
        infos = [v for k in expanded if (v := info(k)) is not None]
        if not infos:  # room made by earlier evictions of the same attempt (a gang)
            return Plan(slot, (), (0, 0, 0, 0, slot))
        cost = (
            len(infos),
            max(v.priority for v in infos),
            sum(v.priority for v in infos),
            -max(v.started for v in infos),
            slot,
        )
        if best is None or cost < best.cost:
            best = Plan(slot, tuple(expanded), cost)
    return best


def _reclaimable(
    pod: PodInfo, state: ClusterState, info: Callable[[str], VictimInfo | None], quotas: QuotaTable
) -> Ints:
    """What reclaim (and priority) preemption could free, per node: a scan of the
    placed pods, since lent quota cuts across priorities."""
    extra = np.zeros_like(state.free)
    for key, placed in state.pods.items():
        victim = info(key)
        if victim is not None and _eligible(pod, victim, quotas, True):
            for row, amount in placed.request:
                extra[row, placed.slot] += amount
    return extra


def _eligible(pod: PodInfo, victim: VictimInfo, quotas: QuotaTable, reclaim: bool) -> bool:
    if victim.priority < pod.priority and pod.spec.preemption_policy != "Never":
        return True
    return (
        reclaim and victim.namespace != pod.spec.namespace and quotas.reclaimable(victim.namespace)
    )


def _minimal(
    pod: PodInfo, state: ClusterState, slot: int, infos: list[VictimInfo], quotas: QuotaTable
) -> list[str] | None:
    free = {row: int(state.free[row, slot]) for row, _ in pod.request}
    requests = {info.key: dict(state.pods[info.key].request) for info in infos}
    for info in infos:
        for row in free:
            free[row] += requests[info.key].get(row, 0)
    if any(free[row] < amount for row, amount in pod.request):
        return None
    # reprieve the most valuable first; whoever cannot be spared is a victim
    kept_back: list[str] = []
    for info in sorted(infos, key=lambda v: (-v.priority, v.started, v.key)):
        after = {row: free[row] - requests[info.key].get(row, 0) for row in free}
        if all(after[row] >= amount for row, amount in pod.request):
            free = after
        else:
            kept_back.append(info.key)
    return _respect_min(kept_back, infos, state, quotas, pod.priority)


def _respect_min(
    chosen: list[str],
    infos: list[VictimInfo],
    state: ClusterState,
    quotas: QuotaTable,
    priority: int,
) -> list[str] | None:
    """Reclaim only what is lent: no namespace is taken below its ``min`` by reclaim
    victims (priority victims are exempt: they would be preempted anyway)."""
    by_key = {info.key: info for info in infos}
    taken: dict[str, dict[str, int]] = {}
    for key in chosen:
        info = by_key[key]
        if info.priority < priority:
            continue
        quota = quotas.get(info.namespace)
        if quota is None:
            return None
        took = taken.setdefault(info.namespace, {})
        for row, amount in state.pods[key].request:
            name = state.resources.name(row)
            took[name] = took.get(name, 0) + amount
            floor = quota.spec.min.get(name)
            if floor is not None and quota.used.get(name, 0) - took[name] < floor:
                return None
    return chosen
