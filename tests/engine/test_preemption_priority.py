"""Priority preemption's fast path gives the exact path's plan (same node, same victims
in the same order, same cost), on random clusters with gangs, disruption budgets,
priorities and starts that tie or differ (:mod:`engine.plugins.preemption_priority`).
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.engine import Engine
from engine.plugins.preemption import plan
from engine.plugins.preemption_priority import DECLINED, plan_by_priority, priority_candidates
from events.types import (
    BudgetSpec,
    DisruptionBudgetSet,
    GroupSpec,
    LabelSelector,
    PodGroupSubmitted,
    SchedulerConfigured,
)
from tests.builders import env, make_node, make_pod

RUNNING = st.tuples(
    st.sampled_from([1, 2, 4]),  # cpu
    st.sampled_from([0, 10, 100, 500]),  # priority
    st.integers(0, 2),  # when it starts
    st.sampled_from(["a", "b"]),  # app label
    st.booleans(),  # in the node's gang
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(
        st.tuples(st.sampled_from([4, 8]), st.lists(RUNNING, max_size=4)),
        min_size=1,
        max_size=7,
    ),
    need=st.integers(2, 8),
    priority=st.sampled_from([100, 1000]),
    budget=st.one_of(st.none(), st.integers(0, 3)),
    cordoned=st.sets(st.integers(0, 6), max_size=2),
)
def test_the_fast_path_plans_what_the_exact_path_plans(
    nodes: list[tuple[int, list[tuple[int, int, int, str, bool]]]],
    need: int,
    priority: int,
    budget: int | None,
    cordoned: set[int],
) -> None:
    engine = Engine()
    engine.apply(env(SchedulerConfigured()))
    for i, (cpu, _) in enumerate(nodes):
        engine.apply(env(make_node(f"n{(i * 5) % 7}{i}").cpu(cpu).added()))
    if budget is not None:
        spec = BudgetSpec(
            namespace="default",
            name="pdb-a",
            selector=LabelSelector(match_labels={"app": "a"}),
            min_available=budget,
        )
        engine.apply(env(DisruptionBudgetSet(budget=spec)))
    for when in range(3):  # pods start at 0, 1 or 2 s: ties and differences
        for i, (_, running) in enumerate(nodes):
            node = f"n{(i * 5) % 7}{i}"
            members = [r for r in running if r[4]]
            group = f"g{i}"
            if when == 0 and len(members) >= 2:
                spec_g = GroupSpec(namespace="default", name=group, min_member=len(members))
                engine.apply(env(PodGroupSubmitted(group=spec_g), time=when))
            for j, (cpu, prio, start, app, ganged) in enumerate(running):
                if start != when and not (ganged and len(members) >= 2 and when == 0):
                    continue
                builder = make_pod(f"p{i}-{j}").cpu(str(cpu)).priority(prio).on(node)
                builder = builder.labels(app=app)
                if ganged and len(members) >= 2:
                    builder = builder.group(f"default/{group}")
                engine.apply(env(builder.submitted(), time=when))
        engine.schedule()
    engine.apply(env(make_pod("urgent").cpu(str(need)).priority(priority).submitted(), time=3))
    pod = engine.pods["default/urgent"]
    allowed = engine.state.valid.copy()
    for i in cordoned:
        if i < len(nodes):
            allowed[engine.state.index[f"n{(i * 5) % 7}{i}"]] = False
    exact = plan(pod, engine.state, allowed, engine, exact=True)
    fast = plan(pod, engine.state, allowed, engine)
    assert fast == exact
    candidates = priority_candidates(pod, engine.state, allowed)
    taken = plan_by_priority(pod, engine.state, allowed, engine, "", candidates, lambda v: set())
    event("declined" if taken == DECLINED else "fast path")
    event("no plan" if exact is None else f"{len(exact.victims)} victim(s)")
    gangs = sum(1 for g in engine.groups.values() if set(g.members) & set(engine.state.pods))
    event(f"gangs placed: {min(gangs, 2)}")
