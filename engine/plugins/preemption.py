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
pod there is removed; where the quota is short too (the cluster is larger than the
quotas' ``min``, so room on a node is not all that is missing), eligible pods elsewhere
are taken with them in one order, least valuable first, whatever their node, until
those from elsewhere free the quota short (:func:`engine.plugins.victim_choice.victims_for`:
so a valuable pod that shares the node is not evicted where a cheaper one elsewhere
frees the quota, and the choice does not depend on which of equal nodes pods landed on,
nor on the number of shards); then victims are reprieved one unit at a time while the
pod still fits the node and its quota, as kube-scheduler's ``selectVictimsOnNode`` does: those
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
the choice is the same at any number of shards. Priority preemption (no quota
involved) takes a faster path to the same plan (:mod:`engine.plugins.preemption_priority`:
candidates ranked by a lower bound of their cost, evaluated until none can win, kept up
to date between identical preemptors); the code below is the exact path, which decides
the rest and is the reference the fast path is tested against.

The victims and the pod are staged in the attempt's statement; the pass commits them
(evictions first) or discards them whole, so nothing half-done is ever visible.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from engine.framework.cycle import CycleState
from engine.framework.handle import STATEMENT, Handle
from engine.framework.interfaces import PostFilterResult
from engine.framework.status import SUCCESS, unschedulable
from engine.model.disruption import violating
from engine.model.pods import PodInfo
from engine.model.quota import QuotaTable
from engine.model.resources import PODS
from engine.model.state import Bools, ClusterState
from engine.model.statement import Statement
from engine.model.victims import cost_of
from engine.plugins.preemption_candidates import (
    MAX_CANDIDATES,
    CandidateCache,
    priority_candidates,
)
from engine.plugins.preemption_priority import SlotMemos, plan_by_priority
from engine.plugins.victim_choice import (
    Mode,
    Plan,
    Victim,
    cards_fit,
    describe,
    named,
    units_of,
    victim_of,
    victims_for,
    with_gangs,
)

NAME: Final = "DefaultPreemption"
EXCLUDE: Final = "exclude_group"
"""Cycle key: a gang whose members are never victims of its own attempt."""
SKIP: Final = "skip"
"""Cycle key: this attempt may not evict (only a later post-filter may act)."""
NOTHING = PostFilterResult(unschedulable("no victims make room"))


class DefaultPreemption:
    name = NAME

    def __init__(self, handle: Handle) -> None:
        self.handle = handle
        self.candidates = CandidateCache()
        """The candidate nodes of recent preemptors, for the next identical one."""
        self.examined = SlotMemos()
        """Those nodes as examined for them, likewise."""

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
        exclude = cycle.read(NAME, EXCLUDE, "")
        chosen = plan(
            pod,
            state,
            feasible,
            self.handle,
            exclude,
            cache=self.candidates,
            memos=self.examined,
        )
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
    *,
    exact: bool = False,
    cache: CandidateCache | None = None,
    memos: SlotMemos | None = None,
) -> Plan | None:
    """The cheapest way to make room for ``pod``, or None (see the module docstring).
    ``exact``: never by the fast path of priority preemption
    (:mod:`engine.plugins.preemption_priority`), which gives the same plan;
    ``cache``, ``memos``: the candidate nodes kept for identical preemptors, and as
    examined (the same plan either way)."""
    quotas = handle.quotas
    mode = mode_of(pod, quotas)
    exclude = exclude_group or pod.spec.group
    wanted = named(state, pod.request)
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

    def eligible(key: str) -> Victim | None:
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
        return victim_of(handle, state, key)

    budgets = handle.budgets
    allowances = handle.disruptions_allowed(pod.key) if budgets else {}

    def breaking(victims: list[Victim]) -> set[str]:
        """The victims whose eviction would break a disruption budget, the most
        valuable using its allowance first (kube-scheduler's order)."""
        ranked = sorted(victims, key=lambda v: v.rank())
        return violating(budgets, allowances, (handle.pods[v.key].spec for v in ranked))

    if mode == Mode.PRIORITY and not (agg_short or max_short):
        # room on a node is all that is missing: only pods on the nodes that lower
        # priorities could free enough can be victims (found over the columns, not
        # pod by pod: a cluster holds many more pods than candidate nodes)
        candidates = priority_candidates(pod, state, allowed, cache)
        if not exact:
            memo = memos.get((pod.request, pod.priority, exclude)) if memos is not None else None
            fast = plan_by_priority(
                pod, state, allowed, handle, exclude, candidates, breaking, memo
            )
            if not isinstance(fast, str):
                return fast
        keys = [k for s in candidates for k in state.node_pods[s]]
    else:
        keys = list(state.pods)
    everyone = [v for key in keys if (v := eligible(key)) is not None]
    if not everyone:
        return None
    units = units_of(everyone, state, handle)
    by_slot: dict[int, list[Victim]] = {}
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
            potential[row, slot_] = gpu.cards * cards_fit(state, gpu, slot_, here)
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
    best: Plan | None = None
    for slot in (int(s) for s in slots[order][:MAX_CANDIDATES]):
        chosen = victims_for(
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
        expanded = with_gangs(handle, state, chosen)
        infos = [describe(handle, key) for key in expanded]
        if not infos:
            return Plan(slot, (), cost_of(0, [], state.names[slot] or ""))  # fits already
        broken = len(breaking([victim_of(handle, state, k) for k in expanded]))
        cost = cost_of(broken, infos, state.names[slot] or "")
        if best is None or cost < best.cost:
            best = Plan(slot, tuple(expanded), cost)
    return best
