"""The order in which preemption compares sets of victims: kube-scheduler's.

kube-scheduler's ``pickOneNodeForPreemption`` (pkg/scheduler/framework/preemption)
takes, among the candidate nodes, the one whose victims minimise, in order: the number
of PodDisruptionBudget violations, the highest victim priority, the sum of the
victims' priorities (each counted as ``priority + MaxInt32 + 1``, so that one more
victim always weighs more than any difference of priorities), the number of victims;
then the latest start of the highest-priority victims; then the first node.
CapacityScheduling and Volcano agree on priority before count. One rule, used by
``DefaultPreemption`` per node and by a gang's attempt for its whole plan
(:mod:`engine.passes.gang_preemption`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from engine.model.disruption import DisruptionBudgets, violating
from engine.model.pods import PodInfo

Cost = tuple[int, int, int, int, int, str]
"""A plan's cost, least first (see :func:`cost_of`)."""
PRIORITY_OFFSET: Final = 2**31
"""Added to each victim's priority in the sum (kube-scheduler's ``MaxInt32 + 1``)."""


def cost_of(broken: int, victims: list[tuple[int, int]], node: str) -> Cost:
    """kube-scheduler's order of candidate nodes (``pickOneNodeForPreemption``), least
    first: the victims that break a disruption budget (``broken``), the highest victim
    priority, the sum of ``priority + 2**31`` over the victims, their number, then the
    latest start of the highest-priority victims (the node whose most valuable victims
    have run the least), then the node's name. ``victims``: (priority, start)."""
    if not victims:
        return (broken, -PRIORITY_OFFSET - 1, 0, 0, 0, node)  # below any int32 priority
    top = max(p for p, _ in victims)
    return (
        broken,
        top,
        sum(p + PRIORITY_OFFSET for p, _ in victims),
        len(victims),
        -min(s for p, s in victims if p == top),
        node,
    )


def cost_of_victims(
    pods: Mapping[str, PodInfo],
    started: Mapping[str, int],
    budgets: DisruptionBudgets,
    keys: list[str],
    allowances: Mapping[str, int] | None,
) -> Cost:
    """The cost (:func:`cost_of`) of evicting ``keys`` together, wherever they run (a
    gang's whole plan; the node left out): ``allowances`` as read for the attempt."""
    known = [key for key in keys if key in pods]
    ranked = sorted(known, key=lambda k: (-pods[k].priority, started.get(k, 0), k))
    broken = violating(budgets, allowances, (pods[k].spec for k in ranked))
    victims = [(pods[k].priority, started.get(k, 0)) for k in known]
    return cost_of(len(broken), victims, "")
