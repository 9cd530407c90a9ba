"""Disruption budgets as the engine counts them, against a recount written apart: a set of
pods may be taken away together exactly when, for every budget, no more of its pods go
than its healthy pods exceed its desired healthy (percents rounded up)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.disruption import DisruptionBudgets, broken_by, violating
from engine.model.pods import pod_info
from engine.model.resources import ResourceIndex
from events.types import BudgetSpec, LabelSelector, PodSpec

APPS = ("a", "b", "c")
VALUES = st.one_of(
    st.integers(min_value=0, max_value=6),
    st.integers(min_value=0, max_value=100).map(lambda p: f"{p}%"),
)


@st.composite
def budgets(draw: st.DrawFn) -> BudgetSpec:
    app = draw(st.sampled_from(APPS))
    kind = draw(st.sampled_from(("min", "max", "neither")))
    value = draw(VALUES)
    return BudgetSpec(
        namespace=draw(st.sampled_from(("default", "other"))),
        name=f"b-{app}-{kind}-{value}",
        selector=LabelSelector(match_labels={"app": app}),
        min_available=value if kind == "min" else (1 if kind == "neither" else None),
        max_unavailable=value if kind == "max" else None,
    )


def _scaled(value: int | str, total: int) -> int:
    if isinstance(value, int):
        return value
    return math.ceil(int(value[:-1]) * total / 100)


def _room(budget: BudgetSpec, pods: list[PodSpec], healthy: set[str]) -> int:
    """How many of ``budget``'s pods may go, recounted from the definition."""
    picked = [
        p
        for p in pods
        if p.namespace == budget.namespace
        and budget.selector is not None
        and p.labels.get("app") == budget.selector.match_labels["app"]
    ]
    if not picked:
        return 0
    up = sum(1 for p in picked if p.key in healthy)
    if budget.max_unavailable is not None:
        desired = max(0, len(picked) - _scaled(budget.max_unavailable, len(picked)))
    else:
        assert budget.min_available is not None
        desired = _scaled(budget.min_available, len(picked))
    return max(0, up - desired)


@settings(max_examples=200, deadline=None)
@given(
    specs=st.lists(budgets(), max_size=4, unique_by=lambda b: b.key),
    shapes=st.lists(
        st.tuples(st.sampled_from(("default", "other")), st.sampled_from(APPS), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    data=st.data(),
)
def test_a_set_of_moves_passes_exactly_when_every_budget_has_room_for_it(
    specs: list[BudgetSpec], shapes: list[tuple[str, str, bool]], data: st.DataObject
) -> None:
    book = DisruptionBudgets()
    for spec in specs:
        book.set(spec)
    pods = [
        PodSpec(namespace=ns, name=f"p{i}", labels={"app": app})
        for i, (ns, app, _) in enumerate(shapes)
    ]
    healthy = {p.key for p, (_, _, up) in zip(pods, shapes, strict=True) if up}
    index = ResourceIndex()
    infos = {p.key: pod_info(p, index, seq=i) for i, p in enumerate(pods)}
    allowances = book.allowances(infos, healthy)
    for spec in specs:
        assert allowances[spec.key] == _room(spec, pods, healthy)
    moved = data.draw(
        st.lists(st.sampled_from(sorted(healthy)), unique=True) if healthy else st.just([])
    )
    specs_moved = [p for p in pods if p.key in moved]
    fits = all(
        sum(1 for p in specs_moved if spec.key in book.covering(p)) <= _room(spec, pods, healthy)
        for spec in specs
    )
    assert (broken_by(book, allowances, specs_moved) == "") == fits
    # preemption's count: with room for all, none violates; each pod beyond a budget's
    # room violates it
    breaking = violating(book, allowances, specs_moved)
    assert (not breaking) == fits
    # not counted (None): any pod a budget picks is refused
    covered = any(book.covering(p) for p in specs_moved)
    assert (broken_by(book, None, specs_moved) == "") == (not covered)
