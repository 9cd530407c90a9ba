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

Candidates are found with one vectorised pass (free + evictable resources per node);
the per-node work runs on at most ``MAX_CANDIDATES`` nodes, the most promising first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np

from engine.pod import PodInfo
from engine.quota import QuotaTable
from engine.state import Bools, ClusterState

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
    victims: Mapping[str, VictimInfo],
    quotas: QuotaTable,
    *,
    reclaim: bool,
    exclude_group: str = "",
    gang_of: Callable[[str], tuple[str, ...]] | None = None,
) -> Plan | None:
    """The cheapest way to make room for ``pod``, or None.

    ``allowed`` marks nodes the pod could use but for resources; ``victims`` describes
    every placed pod; ``gang_of(key)`` lists the placed members a victim's eviction
    would also take down (its gang, if it would drop below ``minMember``).
    """
    if pod.spec.preemption_policy == "Never" and not reclaim:
        return None
    eligible: dict[int, list[VictimInfo]] = {}
    for key, placed in state.pods.items():
        info = victims.get(key)
        if info is None or (exclude_group and info.group == exclude_group):
            continue
        if _eligible(pod, info, quotas, reclaim):
            eligible.setdefault(placed.slot, []).append(info)
    if not eligible:
        return None
    extra = np.zeros_like(state.free)
    for slot, infos in eligible.items():
        for info in infos:
            for row, amount in state.pods[info.key].request:
                extra[row, slot] += amount
    potential = state.free + extra
    fits = allowed.copy()
    for row, amount in pod.request:
        fits &= potential[row] >= amount
    candidates = [int(s) for s in np.flatnonzero(fits) if int(s) in eligible]
    # the most promising first: the fewest and least valuable pods that could go
    candidates.sort(key=lambda s: (len(eligible[s]), min(v.priority for v in eligible[s]), s))
    best: Plan | None = None
    for slot in candidates[:MAX_CANDIDATES]:
        chosen = _minimal(pod, state, slot, eligible[slot], quotas)
        if chosen is None:
            continue
        expanded = dict.fromkeys(chosen)
        for key in chosen:
            if gang_of is not None:
                expanded.update(dict.fromkeys(gang_of(key)))
        infos = [victims[k] for k in expanded if k in victims]
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
