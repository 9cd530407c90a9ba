"""Pod disruption budgets as the engine counts them (``policy/v1`` PodDisruptionBudget).

A budget picks pods of its namespace with its selector and says how many of them may be
disrupted at once. The engine counts, per budget, as the disruption controller does:

- *expected*: the live pods it picks (pending or bound). Kubernetes reads the scale of
  the pods' controllers for ``maxUnavailable`` and percentages; the engine knows no
  controllers, and counts the pods it knows instead;
- *healthy*: the pods it picks that are placed;
- *desired healthy*: ``minAvailable`` (an int, or a percent of *expected* rounded up),
  or *expected* less ``maxUnavailable`` (an int, or a percent of *expected* rounded
  up), at least 0; neither given: ``minAvailable`` 1 (the API's default);
- *disruptions allowed*: healthy less desired, and 0 when that is negative or nothing
  is expected.

A plan (moves of the rescheduler or of defragmentation) may take at most that many
pods of each budget away together (:func:`broken_by`); preemption prefers victims
whose eviction breaks no budget and nodes with the fewest that do
(:func:`violating`), as kube-scheduler's DefaultPreemption does. A pod that two budgets
pick counts against both.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping

from engine.model.pods import PodInfo
from engine.model.podtable import selector_matches
from events.types import BudgetSpec, PodSpec


class DisruptionBudgets:
    """The budgets an engine knows, by ``namespace/name``."""

    def __init__(self) -> None:
        self.budgets: dict[str, BudgetSpec] = {}

    def __repr__(self) -> str:
        return f"DisruptionBudgets({len(self.budgets)})"

    def __len__(self) -> int:
        return len(self.budgets)

    def set(self, spec: BudgetSpec) -> None:
        self.budgets[spec.key] = spec

    def delete(self, key: str) -> None:
        self.budgets.pop(key, None)

    def covering(self, spec: PodSpec) -> list[str]:
        """The budgets that pick the pod of ``spec``, in the order they were set."""
        return [
            key
            for key, budget in self.budgets.items()
            if budget.namespace == spec.namespace and selector_matches(budget.selector, spec.labels)
        ]

    def allowances(self, pods: Mapping[str, PodInfo], healthy: Container[str]) -> dict[str, int]:
        """Per budget, the disruptions it allows now (see the module docstring):
        ``pods`` the live pods, ``healthy`` the keys of those placed."""
        expected = dict.fromkeys(self.budgets, 0)
        up = dict.fromkeys(self.budgets, 0)
        for key, pod in pods.items():
            for budget in self.covering(pod.spec):
                expected[budget] += 1
                if key in healthy:
                    up[budget] += 1
        return {
            key: allowed(budget, expected[key], up[key]) for key, budget in self.budgets.items()
        }


def scaled(value: int | str, total: int) -> int:
    """An int, or a percent (``"40%"``) of ``total`` rounded up."""
    if isinstance(value, int):
        return value
    percent = int(value.rstrip("%"))
    return -(-percent * total // 100)


def desired_healthy(budget: BudgetSpec, expected: int) -> int:
    if budget.max_unavailable is not None:
        return max(0, expected - scaled(budget.max_unavailable, expected))
    minimum = budget.min_available if budget.min_available is not None else 1
    return scaled(minimum, expected)


def allowed(budget: BudgetSpec, expected: int, healthy: int) -> int:
    """Disruptions ``budget`` allows with ``expected`` pods of which ``healthy`` run."""
    if expected <= 0:
        return 0
    return max(0, healthy - desired_healthy(budget, expected))


def broken_by(
    budgets: DisruptionBudgets, allowances: Mapping[str, int] | None, specs: Iterable[PodSpec]
) -> str:
    """The first budget that taking every pod of ``specs`` away at once would break
    (more of its pods than it allows), or "" when none would. ``allowances`` None: not
    counted here (any pod a budget picks breaks it)."""
    if not budgets.budgets:
        return ""
    taken: dict[str, int] = {}
    for spec in specs:
        for key in budgets.covering(spec):
            taken[key] = taken.get(key, 0) + 1
            if allowances is None or taken[key] > allowances.get(key, 0):
                return key
    return ""


def violating(
    budgets: DisruptionBudgets, allowances: Mapping[str, int] | None, specs: Iterable[PodSpec]
) -> set[str]:
    """The pods of ``specs`` (most valuable first) whose eviction would break a budget
    once the pods before them are evicted (kube-scheduler's
    ``filterPodsWithPDBViolation``): each pod a budget picks uses one of its
    disruptions; one that finds none left violates it."""
    if not budgets.budgets:
        return set()
    left = dict(allowances) if allowances is not None else {}
    out: set[str] = set()
    for spec in specs:
        for key in budgets.covering(spec):
            left[key] = left.get(key, 0) - 1
            if left[key] < 0:
                out.add(spec.key)
    return out
