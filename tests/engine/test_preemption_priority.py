"""Priority preemption's fast path gives the exact path's plan (same node, same victims
in the same order, same cost), on random clusters with gangs, disruption budgets,
priorities and starts that tie or differ (:mod:`engine.plugins.preemption_priority`).
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.engine import Engine
from engine.plugins.preemption import plan
from engine.plugins.preemption_candidates import CandidateCache, priority_candidates
from engine.plugins.preemption_priority import DECLINED, SlotMemos, plan_by_priority
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
    pod = None
    cache, memos = CandidateCache(), SlotMemos()
    for n in range(3):  # a wave of identical preemptors, each plan carried out
        name = f"urgent-{n}"
        urgent = make_pod(name).cpu(str(need)).priority(priority).submitted()
        engine.apply(env(urgent, time=3 + n))
        pod = engine.pods[f"default/{name}"]
        allowed = engine.state.valid.copy()
        for i in cordoned:
            if i < len(nodes):
                allowed[engine.state.index[f"n{(i * 5) % 7}{i}"]] = False
        exact = plan(pod, engine.state, allowed, engine, exact=True)
        fast = plan(pod, engine.state, allowed, engine)
        kept = plan(pod, engine.state, allowed, engine, cache=cache, memos=memos)
        assert fast == exact
        assert kept == exact
        candidates = priority_candidates(pod, engine.state, allowed)
        taken = plan_by_priority(
            pod, engine.state, allowed, engine, "", candidates, lambda v: set()
        )
        event("declined" if taken == DECLINED else "fast path")
        event("no plan" if exact is None else f"{len(exact.victims)} victim(s)")
        if exact is None:
            break
        for victim in exact.victims:
            engine.state.forget(victim)
        engine.state.assume(pod.key, exact.slot, pod.request, priority=pod.priority)
    gangs = sum(1 for g in engine.groups.values() if set(g.members) & set(engine.state.pods))
    event(f"gangs placed: {min(gangs, 2)}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(st.sampled_from([2, 4, 8]), min_size=2, max_size=8),
    running=st.lists(
        st.tuples(st.integers(0, 7), st.sampled_from([1, 2]), st.sampled_from([0, 10, 50])),
        max_size=16,
    ),
    steps=st.lists(
        st.tuples(st.sampled_from(["evict", "place", "preempt"]), st.integers(0, 63)),
        min_size=1,
        max_size=12,
    ),
    need=st.integers(1, 6),
)
def test_the_candidate_cache_answers_what_a_whole_computation_answers(
    nodes: list[int],
    running: list[tuple[int, int, int]],
    steps: list[tuple[str, int]],
    need: int,
) -> None:
    """Identical preemptors ask for candidates between evictions and placements; the
    cache, kept up to date from the journal, answers as a computation from scratch."""
    engine = Engine()
    engine.apply(env(SchedulerConfigured()))
    for i, cpu in enumerate(nodes):
        engine.apply(env(make_node(f"n{i}").cpu(cpu).added()))
    for j, (at, cpu, prio) in enumerate(running):
        spec = make_pod(f"r{j}").cpu(str(cpu)).priority(prio).on(f"n{at % len(nodes)}")
        engine.apply(env(spec.submitted()))
    engine.schedule()
    engine.apply(env(make_pod("urgent").cpu(str(need)).priority(40).submitted()))
    pod = engine.pods["default/urgent"]
    state = engine.state
    allowed = state.valid.copy()
    cache = CandidateCache()
    for kind, pick in steps:
        assert priority_candidates(pod, state, allowed, cache) == priority_candidates(
            pod, state, allowed
        )
        placed = sorted(state.pods)
        if kind == "evict" and placed:
            state.forget(placed[pick % len(placed)])
        elif kind == "place":
            slot = state.index[f"n{pick % len(nodes)}"]
            state.assume(f"default/new-{pick}", slot, pod.request, priority=pick % 3 * 10)
        elif kind == "preempt" and placed:
            key = placed[pick % len(placed)]
            slot = state.forget(key)
            assert slot is not None
            state.assume(f"default/wave-{pick}", slot, pod.request, priority=40)
    assert priority_candidates(pod, state, allowed, cache) == priority_candidates(
        pod, state, allowed
    )
    assert cache.hits + cache.misses == len(steps) + 1
    event(f"hits: {min(cache.hits, 3)}")
