"""A gang's preemption, judged whole in kube-scheduler's order.

Members that found no room preempt in turn (each through its profile's post-filters:
``DefaultPreemption`` picks each member's node and victims in kube-scheduler's order),
staged with the members already placed, until ``minMember`` is reached. What is
compared is the gang's whole plan: every victim its members' evictions take (a victim's
gang whole, where it would fall below its ``minMember``), in the order of
:func:`engine.model.victims.cost_of` (the victims that break a disruption budget,
the highest victim priority, the sum of priorities, the number of victims, the latest
start of the most valuable).

Member by member, an early member may take the cheap room a later, larger member needed,
leaving it only dear victims (a small member evicts one of two priority-100 pods, and
the large one then needs the priority-500 pod's node). So the members preempt in
arrival order and, where their requests differ, largest first too (GPU cards, then
cpu, then memory); of the plans that reach ``minMember`` the one whose whole cost is
least is kept (arrival order on a tie). Cost: one staged preemption of the gang, two
where its members differ in size and the first plan evicts anything.
"""

from __future__ import annotations

from engine.framework.results import Attempt
from engine.framework.status import Status
from engine.model.pods import PodInfo
from engine.model.resources import CPU, MEMORY
from engine.model.state import ClusterState
from engine.model.statement import Statement
from engine.model.victims import cost_of_victims
from engine.passes.context import PassContext
from engine.passes.dispatch import Placed
from engine.passes.extenders import applicable
from engine.passes.pods import may_preempt, preempt_into

Failure = tuple[str, tuple[str, ...], dict[str, int]]
"""Why a member found no node: the message, the rejecting plugins, nodes by reason."""


def preempt_for(
    p: PassContext,
    statement: Statement,
    pending: list[PodInfo],
    placed: Placed,
    failures: dict[str, Failure],
    need: int,
    key: str,
) -> None:
    """Members that failed may preempt (staged) until minMember is reached, by the
    cheapest whole plan (see the module docstring); ``placed`` and ``failures`` are
    left as that plan leaves them."""
    e = p.e
    mark = len(statement.ops)
    start_placed, start_failures = list(placed), dict(failures)
    _members(p, statement, pending, placed, failures, need, key)
    victims = [op.key for op in statement.ops[mark:] if op.kind == "evict"]
    largest = sorted(pending, key=lambda pod: _size(e.state, pod))
    if len(placed) < need or not victims or largest == pending:
        return
    allowances = e.disruptions_allowed(pending[0].key) if e.budgets else None
    first = cost_of_victims(e.pods, e.started, e.budgets, victims, allowances)
    statement.rollback(mark)
    trial_placed, trial_failures = list(start_placed), dict(start_failures)
    _members(p, statement, largest, trial_placed, trial_failures, need, key)
    victims = [op.key for op in statement.ops[mark:] if op.kind == "evict"]
    if (
        len(trial_placed) >= need
        and cost_of_victims(e.pods, e.started, e.budgets, victims, allowances) < first
    ):
        placed[:] = trial_placed
        failures.clear()
        failures.update(trial_failures)
        return
    statement.rollback(mark)  # the arrival order's plan, again (the same: deterministic)
    placed[:] = start_placed
    failures.clear()
    failures.update(start_failures)
    _members(p, statement, pending, placed, failures, need, key)


def _size(state: ClusterState, pod: PodInfo) -> tuple[int, int, int]:
    """Larger first: GPU cards, then cpu, then memory (negated, for sorting)."""
    request = dict(pod.request)
    cards = sum(amount for row, amount in pod.request if row in state.cards.rows)
    return (-cards, -request.get(CPU, 0), -request.get(MEMORY, 0))


def _members(
    p: PassContext,
    statement: Statement,
    pending: list[PodInfo],
    placed: Placed,
    failures: dict[str, Failure],
    need: int,
    key: str,
) -> None:
    """Members that failed preempt (staged), in order, until minMember is reached."""
    for pod in pending:
        if len(placed) >= need:
            break
        framework = p.profiles.framework_for(pod)
        if pod.key not in failures or framework is None or applicable(p, pod):
            continue  # (preemption does not ask extenders: a member they judge does not)
        if not failures[pod.key][1] and not statement.evicted():
            continue  # no plugin to blame: nothing preemption could change
        refused = Attempt(-1, Status(plugin=",".join(failures[pod.key][1])))
        if not may_preempt(p, pod, refused):
            continue
        slot = preempt_into(p, statement, pod, framework, exclude_group=key)
        if slot is not None:
            placed.append((pod, slot, 0))
            del failures[pod.key]
