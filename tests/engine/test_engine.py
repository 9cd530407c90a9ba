"""Engine scenarios: events in, decisions out."""

from __future__ import annotations

from engine.config import parse_config
from engine.engine import Engine
from events.types import (
    SECOND,
    BindFailed,
    ClockTicked,
    Event,
    GroupSpec,
    NodeRemoved,
    NodeUpdated,
    PodBound,
    PodDeleted,
    PodGroupSubmitted,
    PodRouted,
    PodSucceeded,
    PodUnschedulable,
)
from tests.builders import env, make_node, make_pod


def feed(engine: Engine, *events: Event, at: float = 0) -> list[Event]:
    for event in events:
        engine.apply(env(event, at))
    return engine.schedule()


def bound(decisions: list[Event]) -> dict[str, str]:
    return {d.pod: d.node for d in decisions if isinstance(d, PodBound)}


def test_places_and_explains_failure() -> None:
    engine = Engine()
    out = feed(
        engine,
        make_node("a").cpu("4").added(),
        make_pod("p1").cpu("3").submitted(),
        make_pod("p2").cpu("3").submitted(),
    )
    assert bound(out) == {"default/p1": "a"}
    (failure,) = [d for d in out if isinstance(d, PodUnschedulable)]
    assert failure.reason == "0/1 nodes are available: 1 Insufficient cpu."
    assert failure.plugins == ("NodeResourcesFit",)
    assert failure.rejections == {"Insufficient cpu": 1}


def test_rejected_pod_retries_on_a_helpful_event_only() -> None:
    engine = Engine()
    feed(engine, make_node("a").cpu("4").added(), make_pod("p1").cpu("3").runtime(60).submitted())
    assert bound(feed(engine, make_pod("p2").cpu("3").submitted())) == {}
    # an unrelated event (a label change that keeps capacity) retries nothing useful
    out = feed(engine, ClockTicked(), at=30)
    assert out == []
    out = feed(engine, PodSucceeded(pod="default/p1"), at=60)
    assert bound(out) == {"default/p2": "a"}


def test_backoff_delays_a_retry_until_the_engine_wakes() -> None:
    engine = Engine()
    feed(engine, make_node("a").cpu("1").added(), make_pod("big").cpu("2").submitted())
    # capacity grows right away, but the pod is still backing off (1 s)
    assert feed(engine, NodeUpdated(node=make_node("a").cpu("4").spec()), at=0.5) == []
    assert engine.next_wakeup() == SECOND
    assert bound(feed(engine, ClockTicked(), at=1)) == {"default/big": "a"}


def test_bind_failure_rolls_back_and_requeues() -> None:
    engine = Engine()
    out = feed(
        engine,
        make_node("a").cpu("4").added(),
        make_node("b").cpu("2").added(),
        make_pod("p").cpu("1").submitted(),
    )
    (decision,) = [d for d in out if isinstance(d, PodBound)]
    first = decision.node
    engine.apply(
        env(BindFailed(pod="default/p", node=first, decision_id=decision.decision_id, reason="x"))
    )
    assert "default/p" not in engine.state.pods
    engine.apply(env(NodeRemoved(name=first)))
    out = feed(engine, ClockTicked(), at=2)
    assert bound(out) == {"default/p": "b" if first == "a" else "a"}


def test_stale_bind_failure_is_ignored() -> None:
    engine = Engine()
    out = feed(engine, make_node("a").added(), make_pod("p").submitted())
    (decision,) = out
    assert isinstance(decision, PodBound)
    engine.apply(env(BindFailed(pod="default/p", node="a", decision_id="other", reason="x")))
    assert "default/p" in engine.state.pods


def test_decisions_applied_twice_change_nothing() -> None:
    engine = Engine()
    out = feed(engine, make_node("a").cpu("4").added(), make_pod("p").cpu("1").submitted())
    before = engine.state.used.copy()
    for decision in out:
        engine.apply(env(decision))
        engine.apply(env(decision))
    assert (engine.state.used == before).all()
    engine.apply(env(make_pod("p").cpu("1").submitted()))  # duplicate submission
    assert engine.schedule() == []


def test_deleted_pending_pod_is_forgotten() -> None:
    engine = Engine()
    feed(engine, make_node("a").cpu("1").added(), make_pod("big").cpu("2").submitted())
    feed(engine, PodDeleted(pod="default/big"))
    assert "default/big" not in engine.pods and len(engine.queue) == 0


def test_higher_priority_goes_first() -> None:
    engine = Engine()
    out = feed(
        engine,
        make_node("a").cpu("2").added(),
        make_pod("low").cpu("2").priority(1).submitted(),
        make_pod("high").cpu("2").priority(100).submitted(),
    )
    assert bound(out) == {"default/high": "a"}


def test_profiles_by_scheduler_name() -> None:
    cfg = parse_config(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "profiles": [
                {"schedulerName": "spread"},
                {
                    "schedulerName": "pack",
                    "pluginConfig": [
                        {
                            "name": "NodeResourcesFit",
                            "args": {"scoringStrategy": {"type": "MostAllocated"}},
                        }
                    ],
                    "plugins": {
                        "score": {"disabled": [{"name": "NodeResourcesBalancedAllocation"}]}
                    },
                },
            ],
        }
    )
    engine = Engine(cfg)
    feed(
        engine,
        make_node("a").cpu("8").added(),
        make_node("b").cpu("8").added(),
        make_pod("seed").cpu("4").on("a").submitted(),
    )
    out = feed(
        engine,
        make_pod("packed").cpu("1").scheduler("pack").submitted(),
        make_pod("spread").cpu("1").scheduler("spread").submitted(),
        make_pod("stray").scheduler("nobody").submitted(),
        make_pod("unnamed").submitted(),
    )
    assert bound(out) == {"default/packed": "a", "default/spread": "b"}
    reasons = {d.pod: d.reason for d in out if isinstance(d, PodUnschedulable)}
    assert reasons == {
        "default/stray": "no scheduling profile serves schedulerName 'nobody'",
        # the API server names the default scheduler on a pod that names none
        "default/unnamed": "no scheduling profile serves schedulerName 'default-scheduler'",
    }


def test_ties_are_spread_deterministically() -> None:
    def run() -> dict[str, str]:
        engine = Engine()
        nodes = [make_node(f"n{i}").cpu("64").added() for i in range(8)]
        pods = [make_pod(f"p{i}").cpu("1").submitted() for i in range(8)]
        return bound(feed(engine, *nodes, *pods))

    first = run()
    assert first == run()
    assert len(set(first.values())) > 1


def test_explain_records_diagnosis_for_the_pod() -> None:
    engine = Engine()
    engine.explain = "default/p"
    feed(
        engine,
        make_node("a").cpu("4").added(),
        make_node("b").cpu("1").added(),
        make_node("t").taint("x").added(),
        make_pod("p").cpu("2").submitted(),
    )
    (exp,) = engine.explanations
    assert exp.node == "a" and exp.diagnosis is not None
    assert exp.diagnosis.rejected == {"TaintToleration": 1, "NodeResourcesFit": 1}
    assert [n.node for n in exp.diagnosis.top] == ["a"]


def test_a_freed_node_wakes_only_what_it_can_hold() -> None:
    """100 one-CPU pods wait for a two-CPU node: each completion must not retry all of
    them (they would fail again and flood the log), only as many as now fit."""
    engine = Engine()
    out = feed(
        engine,
        make_node("a").cpu("2").added(),
        *[make_pod(f"p{i:03d}").cpu("1").submitted() for i in range(100)],
    )
    assert len(bound(out)) == 2
    attempts = engine.stats()["attempts"]
    running = sorted(bound(out))
    for step in range(10):
        finished = running.pop(0)
        out = feed(engine, PodSucceeded(pod=finished), at=10 + step * 10)
        out += feed(engine, ClockTicked(), at=15 + step * 10)  # let any back-off expire
        running += sorted(bound(out))
    retries = engine.stats()["attempts"] - attempts
    assert len(running) == 2
    assert retries <= 10 * 2, f"{retries} attempts for 10 freed slots"


def test_waking_follows_priority() -> None:
    engine = Engine()
    feed(engine, make_node("a").cpu("1").added(), make_pod("run").cpu("1").priority(9).submitted())
    feed(
        engine,
        make_pod("low").cpu("1").priority(1).submitted(),
        make_pod("high").cpu("1").priority(9).submitted(),
    )
    out = feed(engine, PodSucceeded(pod="default/run"), at=5)
    assert bound(out) == {"default/high": "a"}


def test_a_pod_that_arrives_before_any_node_waits_for_one() -> None:
    engine = Engine()
    (failure,) = feed(engine, make_pod("early").cpu("1").submitted())
    assert isinstance(failure, PodUnschedulable)
    assert failure.reason == "0/0 nodes are available."
    assert bound(feed(engine, make_node("late").added(), at=2)) == {"default/early": "late"}


def test_a_name_used_again_by_another_pod_is_scheduled_again() -> None:
    """Kubernetes lets a pod's name be used again once the pod is gone (a StatefulSet's
    pods always are; so is a pod deleted and applied again): another uid is another
    pod, scheduled like any; the same pod told twice (same uid, or none) is not."""
    engine = Engine()
    first = make_pod("web-0").cpu("1").uid("u1")
    assert bound(feed(engine, make_node("a").cpu("4").added(), first.submitted())) == {
        "default/web-0": "a"
    }
    feed(engine, PodDeleted(pod="default/web-0"))
    assert feed(engine, first.submitted()) == []  # a relist telling the old one again
    assert engine.outcomes == {"default/web-0": "Failed"}
    again = make_pod("web-0").cpu("1").uid("u2")
    assert bound(feed(engine, again.submitted())) == {"default/web-0": "a"}
    assert engine.outcomes == {} and engine.pods["default/web-0"].spec.uid == "u2"
    feed(engine, PodSucceeded(pod="default/web-0"))
    assert engine.outcomes == {"default/web-0": "Succeeded"}
    assert feed(engine, again.submitted()) == []  # the second one, told twice
    nameless = Engine()
    feed(nameless, make_node("a").cpu("4").added(), make_pod("p").cpu("1").submitted())
    feed(nameless, PodDeleted(pod="default/p"))
    assert feed(nameless, make_pod("p").cpu("1").submitted()) == []  # no uid: the same


def test_a_pod_named_like_one_that_finished_elsewhere_is_taken() -> None:
    """A shard that knows a name's outcome only as another shard's fact (a dependency)
    takes a pod of that name routed to it: the router sends only new pods."""
    engine = Engine()
    feed(engine, make_node("a").cpu("4").added(), PodSucceeded(pod="default/dep"))
    assert engine.outcomes == {"default/dep": "Succeeded"}
    routed = PodRouted(pod=make_pod("dep").cpu("1").uid("u9").spec())
    assert bound(feed(engine, routed)) == {"default/dep": "a"}
    assert feed(engine, PodRouted(pod=make_pod("dep").cpu("1").spec())) == []


def _gang(uid: str, *members: str) -> list[Event]:
    spec = GroupSpec(namespace="default", name="job", min_member=len(members), uid=uid)
    return [
        PodGroupSubmitted(group=spec),
        *(make_pod(m).cpu("1").uid(f"{uid}-{m}").group("default/job").submitted() for m in members),
    ]


def test_a_gang_deleted_and_created_again_under_its_name_runs_again() -> None:
    """A job deleted and applied again: its PodGroup and pods come back under the same
    names as other objects. Once every pod of the first is gone, the name is the new
    group's, whichever comes first, the group or its pods; its pods still go all or
    nothing."""
    for group_first in (True, False):
        engine = Engine()
        feed(engine, make_node("a").cpu("4").added())
        assert bound(feed(engine, *_gang("g1", "w0", "w1"))) == {
            "default/w0": "a",
            "default/w1": "a",
        }
        feed(engine, PodDeleted(pod="default/w0"), PodDeleted(pod="default/w1"))
        group, *pods = _gang("g2", "w0", "w1", "w2")
        if group_first:
            waiting = feed(engine, group, *pods[:2])  # two of minMember 3: nothing placed
            assert bound(waiting) == {}
            assert "2 of minMember 3 present" in waiting[0].reason  # type: ignore[attr-defined]
            out = feed(engine, pods[2])
        else:
            # the pods first: they wait for their group, as any pods that come first
            out = feed(engine, pods[0])
            assert bound(out) == {}
            assert engine.groups["default/job"].spec is None
            out = feed(engine, group, *pods[1:])
        assert bound(out) == {"default/w0": "a", "default/w1": "a", "default/w2": "a"}
        live = engine.groups["default/job"]
        assert live.spec is not None and live.spec.uid == "g2" and live.phase == "Scheduled"


def test_a_gang_whose_pods_still_run_keeps_its_name() -> None:
    """A PodGroup of another uid while the first group's pods still run is not taken
    (they are that group's), nor is a group without an object ever renewed."""
    engine = Engine()
    feed(engine, make_node("a").cpu("4").added())
    assert len(bound(feed(engine, *_gang("g1", "w0", "w1")))) == 2
    group, *_ = _gang("g2", "w0", "w1")
    feed(engine, group)
    assert engine.groups["default/job"].spec.uid == "g1"  # type: ignore[union-attr]
    plain = Engine()
    feed(plain, make_node("a").cpu("4").added())
    assert len(bound(feed(plain, *_gang("", "w0", "w1")))) == 2
    feed(plain, PodDeleted(pod="default/w0"), PodDeleted(pod="default/w1"))
    assert feed(plain, *_gang("", "w0", "w1")) == []  # no uid: the same group and pods


def test_a_gang_created_again_while_its_first_run_runs_waits_for_it() -> None:
    """A PodGroup of another uid while the first run's pods still run: it and the pods
    that come for it wait, with the reason, and start as a run of their own (all or
    nothing) once the first run is over."""
    engine = Engine()
    feed(engine, make_node("a").cpu("4").added())
    first = [
        make_pod(f"w{i}").cpu("1").uid(f"a{i}").group("default/job").runtime(10) for i in (0, 1)
    ]
    spec = GroupSpec(namespace="default", name="job", min_member=2, uid="g1")
    assert (
        len(bound(feed(engine, PodGroupSubmitted(group=spec), *(p.submitted() for p in first))))
        == 2
    )
    again = GroupSpec(namespace="default", name="job", min_member=2, uid="g2")
    new = [make_pod(f"v{i}").cpu("1").uid(f"b{i}").group("default/job") for i in (0, 1)]
    out = feed(engine, PodGroupSubmitted(group=again), *(p.submitted() for p in new), at=1)
    waiting = [d for d in out if isinstance(d, PodUnschedulable)]
    assert bound(out) == {} and {d.pod for d in waiting} == {"default/v0", "default/v1"}
    assert "run of pod group default/job" in waiting[0].reason
    feed(engine, PodSucceeded(pod="default/w0"), at=10)
    out = feed(engine, PodSucceeded(pod="default/w1"), at=10)
    assert bound(out) == {"default/v0": "a", "default/v1": "a"}
    group = engine.groups["default/job"]
    assert group.spec is not None and group.spec.uid == "g2" and engine.next_runs == {}
