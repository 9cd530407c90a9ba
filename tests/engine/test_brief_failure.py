"""A preemptor's failed attempt may come without reasons (``Framework.schedule(brief=
True)``, :mod:`engine.framework.rejecting`): what it says (which filters rejected how
many nodes, how many passed, the status's code and plugin) is what a full diagnosis
says on the same state, and the engine decides and answers exactly as with full
diagnoses, on random clusters and waves of preemptors. After a brief failure, the
attempt that follows the evictions looks at the changed nodes only
(``Framework.sole_fit``), and chooses what a whole attempt chooses.
"""

from __future__ import annotations

from unittest import mock

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import engine.passes.pods as pods_pass
from engine.engine import Engine
from engine.framework.cycle import CycleState
from engine.framework.results import Attempt
from engine.framework.runtime import Framework
from engine.model.pods import PodInfo
from engine.model.state import ClusterState
from events.types import Event, NodeRemoved, PodSucceeded, SchedulerConfigured
from tests.builders import PodBuilder, env, make_node, make_pod

NODE = st.tuples(
    st.sampled_from([2, 4, 8]),  # cpu
    st.sampled_from(["a", "b"]),  # zone label
    st.sampled_from([False, False, True]),  # tainted
    st.sampled_from([False, False, False, True]),  # cordoned
)
STEP = st.tuples(
    st.sampled_from(["wave", "wave", "wave", "finish", "remove", "add"]),
    st.integers(0, 63),  # which pod / node
    st.integers(1, 3),  # wave size
    st.sampled_from([1, 2, 3, 6]),  # cpu per preemptor
    st.sampled_from([0, 20, 100, 100]),  # priority
    st.sampled_from(["", "a", "b"]),  # zone the preemptors select ("" any)
    st.booleans(),  # they tolerate the taint
    st.sampled_from(["", "", "anti", "spread"]),  # a rule that reads other nodes
)


def engine_with_nodes(nodes: list[tuple[int, str, bool, bool]]) -> Engine:
    """An engine with nodes ``n0``, ``n1``...: per node its cpu, zone label, whether it
    is tainted (``dedicated``) and whether it is cordoned."""
    engine = Engine()
    engine.apply(env(SchedulerConfigured()))
    for i, (cpu, zone, tainted, cordoned) in enumerate(nodes):
        node = make_node(f"n{i}").cpu(cpu).label("zone", zone)
        if tainted:
            node = node.taint("dedicated", "x")
        if cordoned:
            node = node.cordoned()
        engine.apply(env(node.added()))
    return engine


def with_rules(pod: PodBuilder, zone: str, tolerate: bool, rule: str) -> PodBuilder:
    """``pod`` held to ``zone`` (if any), tolerating the ``dedicated`` taint (if
    ``tolerate``), and with ``rule``: "anti" (zone anti-affinity to ``app=w``),
    "spread" (spread over zones, skew 1) or none."""
    if zone:
        pod = pod.selector(zone=zone)
    if tolerate:
        pod = pod.tolerate("dedicated", "Equal", "x", "NoSchedule")
    if rule == "anti":
        pod = pod.labels(app="w").anti("zone", app="w")
    elif rule == "spread":
        pod = pod.labels(app="w").spread("zone", 1, app="w")
    return pod


def _run(
    nodes: list[tuple[int, str, bool, bool]],
    running: list[tuple[int, int, int]],
    steps: list[tuple[str, int, int, int, int, str, bool, str]],
) -> list[Event]:
    engine = engine_with_nodes(nodes)
    for j, (at, cpu, prio) in enumerate(running):
        spec = make_pod(f"r{j}").cpu(str(cpu)).priority(prio).on(f"n{at % len(nodes)}")
        spec = spec.tolerate()  # (runs on tainted and cordoned nodes too)
        engine.apply(env(spec.submitted()))
    out = engine.schedule()
    added = len(nodes)
    for t, (kind, pick, size, cpu, prio, zone, tolerate, rule) in enumerate(steps, start=1):
        if kind == "wave":
            for k in range(size):
                pod = make_pod(f"w{t}-{k}").cpu(str(cpu)).priority(prio)
                pod = with_rules(pod, zone, tolerate, rule)
                engine.apply(env(pod.submitted(), time=t))
        elif kind == "finish":
            placed = sorted(engine.state.pods)
            if placed:
                key = placed[pick % len(placed)]
                engine.apply(env(PodSucceeded(pod=key), time=t))
        elif kind == "remove":
            engine.apply(env(NodeRemoved(name=f"n{pick % len(nodes)}"), time=t))
        else:
            engine.apply(env(make_node(f"x{added}").cpu(4).label("zone", "a").added(), time=t))
            added += 1
        out += engine.schedule()
    return out


def _checked_brief(
    self: Framework, cycle: CycleState, pod: PodInfo, state: ClusterState
) -> Attempt | None:
    """The brief failure, checked against a full diagnosis on the same state."""
    brief = ORIGINAL(self, cycle, pod, state)
    if brief is None:
        event("brief: declined")
        return None
    full = self._failure(cycle, pod, state, None, None)
    assert brief.diagnosis is not None and full.diagnosis is not None
    assert list(brief.diagnosis.plugins) == list(full.diagnosis.plugins)
    assert brief.diagnosis.rejected == full.diagnosis.rejected
    assert brief.diagnosis.feasible == full.diagnosis.feasible
    assert brief.diagnosis.nodes == full.diagnosis.nodes
    assert (brief.status.code, brief.status.plugin) == (full.status.code, full.status.plugin)
    event("brief: given")
    return brief


ORIGINAL = Framework._brief_failure
SOLE_FIT = Framework.sole_fit


def _checked_sole_fit(
    self: Framework, pod: PodInfo, state: ClusterState, changed: list[int]
) -> int | None:
    """The preemptor's attempt after its evictions, read off the changed nodes,
    checked against a whole attempt on the same state."""
    slot = SOLE_FIT(self, pod, state, changed)
    if slot is None:
        event("after evictions: scheduled in full")
        return None
    assert slot == self.schedule(pod, state).slot
    event("after evictions: the one changed node that fits")
    return slot


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(NODE, min_size=1, max_size=6),
    running=st.lists(
        st.tuples(st.integers(0, 7), st.sampled_from([1, 2, 4]), st.sampled_from([0, 10, 50])),
        max_size=20,
    ),
    steps=st.lists(STEP, min_size=1, max_size=8),
)
def test_brief_failures_decide_and_answer_as_full_diagnoses(
    nodes: list[tuple[int, str, bool, bool]],
    running: list[tuple[int, int, int]],
    steps: list[tuple[str, int, int, int, int, str, bool, str]],
) -> None:
    with (
        mock.patch.object(Framework, "_brief_failure", _checked_brief),
        mock.patch.object(Framework, "sole_fit", _checked_sole_fit),
    ):
        brief = _run(nodes, running, steps)
    with mock.patch.object(pods_pass, "preempts_only", lambda *_: False):
        full = _run(nodes, running, steps)
    assert brief == full
    event(f"preempted: {min(sum(type(e).__name__ == 'PodPreempted' for e in full), 3)}")
    event(f"unschedulable: {min(sum(type(e).__name__ == 'PodUnschedulable' for e in full), 3)}")


def test_whether_to_fail_briefly_is_asked_only_of_an_attempt_that_fails() -> None:
    """The pass hands ``schedule`` a predicate (is a failure for preemption alone?), not
    its answer: a pod that fits, most pods, never pays for asking it."""
    engine = Engine()
    engine.apply(env(SchedulerConfigured()))
    engine.apply(env(make_node("n0").cpu(2).added()))
    engine.apply(env(make_pod("fits").cpu("1").submitted()))
    engine.apply(env(make_pod("big").cpu("4").submitted()))
    fits, big = engine.pods["default/fits"], engine.pods["default/big"]
    framework = engine.profiles.framework_for(fits)
    assert framework is not None
    asked: list[str] = []

    def predicate(pod: PodInfo) -> bool:
        asked.append(pod.key)
        return True

    placed = framework.schedule(fits, engine.state, brief=lambda: predicate(fits))
    assert placed.slot >= 0 and asked == []
    failed = framework.schedule(big, engine.state, brief=lambda: predicate(big))
    assert failed.slot < 0 and failed.brief and asked == ["default/big"]
    no = framework.schedule(big, engine.state, brief=lambda: False)
    assert no.slot < 0 and not no.brief and no.status.message()
