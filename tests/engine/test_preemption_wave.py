"""A wave of identical preemptors, planned through the kept ranking of candidates
(:class:`engine.plugins.preemption_priority.SlotMemo`) and the lean selection of
victims (:func:`engine.plugins.victim_choice.lean_plan`), plans what the exact path
plans, preemptor after preemptor, while other pods come and go and the nodes allowed
change; and the lean selection chooses what the exact selection chooses."""

from __future__ import annotations

from unittest import mock

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import engine.plugins.preemption_candidates as candidates
from engine.engine import Engine
from engine.plugins import preemption
from engine.plugins.preemption import plan
from engine.plugins.preemption_candidates import CandidateCache
from engine.plugins.preemption_priority import SlotMemos, plan_on
from engine.plugins.victim_choice import lean_plan
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
    st.sampled_from([1, 2, 3]),  # cpu
    st.sampled_from([1, 2, 4]),  # memory, Gi
    st.sampled_from([0, 10, 100]),  # priority
    st.integers(0, 2),  # when it starts
    st.booleans(),  # in the node's gang
)
STEP = st.tuples(
    st.sampled_from(["preempt", "preempt", "preempt", "finish", "cordon", "place"]),
    st.integers(0, 63),
)


def _cluster(
    nodes: list[list[tuple[int, int, int, int, bool]]], gangs: bool, budget: bool
) -> Engine:
    engine = Engine()
    engine.apply(env(SchedulerConfigured()))
    for i in range(len(nodes)):
        engine.apply(env(make_node(f"n{(i * 7) % 10}{i}").cpu(4).memory("8Gi").added()))
    if budget:
        spec = BudgetSpec(
            namespace="default",
            name="pdb",
            selector=LabelSelector(match_labels={"app": "a"}),
            min_available=1,
        )
        engine.apply(env(DisruptionBudgetSet(budget=spec)))
    for when in range(3):  # pods start at 0, 1 or 2 s: ties and differences
        for i, running in enumerate(nodes):
            node = f"n{(i * 7) % 10}{i}"
            members = [r for r in running if r[4]] if gangs else []
            if when == 0 and len(members) >= 2:
                group = GroupSpec(namespace="default", name=f"g{i}", min_member=len(members))
                engine.apply(env(PodGroupSubmitted(group=group), time=when))
            for j, (cpu, memory, prio, start, ganged) in enumerate(running):
                in_gang = ganged and len(members) >= 2
                if start != when and not (in_gang and when == 0):
                    continue
                pod = make_pod(f"p{i}-{j}").cpu(cpu).memory(f"{memory}Gi").priority(prio)
                pod = pod.on(node).labels(app="a" if j % 2 else "b")
                if in_gang:
                    pod = pod.group(f"default/g{i}")
                engine.apply(env(pod.submitted(), time=when))
        engine.schedule()
    return engine


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(st.lists(RUNNING, max_size=4), min_size=2, max_size=9),
    steps=st.lists(STEP, min_size=1, max_size=10),
    cpu=st.integers(1, 4),
    memory=st.sampled_from([1, 2, 6]),
    gangs=st.booleans(),
    budget=st.sampled_from([False, False, True]),
    first=st.sampled_from([2, 3, 64]),
)
def test_a_wave_through_the_kept_ranking_plans_as_the_exact_path(
    nodes: list[list[tuple[int, int, int, int, bool]]],
    steps: list[tuple[str, int]],
    cpu: int,
    memory: int,
    gangs: bool,
    budget: bool,
    first: int,
) -> None:
    """``first``: how many candidates are read (``MAX_CANDIDATES``; a few, so that
    candidates leave and come between preemptors)."""
    engine = _cluster(nodes, gangs, budget)
    state = engine.state
    allowed = state.valid.copy()
    cache, memos = CandidateCache(), SlotMemos()
    waves = 0
    with (
        mock.patch.object(candidates, "MAX_CANDIDATES", first),
        mock.patch.object(preemption, "MAX_CANDIDATES", first),
    ):
        for t, (kind, pick) in enumerate(steps, start=3):
            placed = sorted(state.pods)
            if kind == "finish" and placed:
                state.forget(placed[pick % len(placed)])
                continue
            if kind == "cordon":
                slot = pick % len(nodes)
                allowed[slot] = not allowed[slot]
                continue
            if kind == "place":  # a pod of priority 5 placed meanwhile, wherever
                engine.apply(env(make_pod(f"other-{t}").cpu(1).priority(5).submitted(), time=t))
                other = engine.pods[f"default/other-{t}"]
                state.assume(other.key, pick % len(nodes), other.request, priority=5)
                continue
            name = f"urgent-{t}"
            urgent = make_pod(name).cpu(cpu).memory(f"{memory}Gi").priority(1000)
            engine.apply(env(urgent.submitted(), time=t))
            pod = engine.pods[f"default/{name}"]
            exact = plan(pod, state, allowed, engine, exact=True)
            kept = plan(pod, state, allowed, engine, cache=cache, memos=memos)
            assert kept == exact
            if exact is None:
                continue
            waves += 1
            for victim in exact.victims:
                state.forget(victim)
            state.assume(pod.key, exact.slot, pod.request, priority=pod.priority)
    ranked = any(m.ranked is not None for m in memos.memos.values())
    event(f"preemptions: {min(waves, 3)}; ranking kept: {ranked}")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    running=st.lists(RUNNING, min_size=1, max_size=6),
    cpu=st.integers(1, 6),
    memory=st.sampled_from([1, 3, 8]),
)
def test_the_lean_selection_chooses_as_the_exact_selection(
    running: list[tuple[int, int, int, int, bool]], cpu: int, memory: int
) -> None:
    """One node, no gang, no budget: the same victims in the same order, the same
    cost (or the same None where even all of them leave no room)."""
    engine = _cluster([running], gangs=False, budget=False)
    urgent = make_pod("urgent").cpu(cpu).memory(f"{memory}Gi").priority(1000).submitted()
    engine.apply(env(urgent, time=3))
    pod = engine.pods["default/urgent"]
    state = engine.state
    slot = state.index["n00"]
    keys = [k for k in state.node_pods[slot] if engine.pods[k].priority < pod.priority]
    lean = lean_plan(pod, state, engine, slot, keys)
    exact = plan_on(pod, state, engine, slot, keys, lambda v: set())
    if lean is not None and not lean.victims:
        event("fits without victims")
        assert exact == "declined"
        return
    assert lean == exact
    event("no room" if lean is None else f"{len(lean.victims)} victim(s)")
