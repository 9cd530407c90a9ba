"""Batch semantics, scenario by scenario: gangs, dependencies, quotas, preemption."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from engine.model.quota import GPU_SCALE
from events.memory import MemoryLog
from shards.inputs.scenario import load_scenario
from shards.replay import replay
from shards.simulate import simulate


def node(name: str, cpu: int = 4, gpu: int = 0, extra: str = "") -> str:
    gpus = f', nvidia.com/gpu: "{gpu}"' if gpu else ""
    return f"""
apiVersion: v1
kind: Node
metadata: {{name: {name}{extra}}}
status: {{allocatable: {{cpu: "{cpu}", memory: 64Gi{gpus}}}}}
---"""


def pod(
    name: str,
    cpu: str = "1",
    gpu: int = 0,
    ns: str = "default",
    labels: str = "",
    annotations: str = "",
    spec: str = "",
) -> str:
    gpus = f', nvidia.com/gpu: "{gpu}"' if gpu else ""
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
  labels: {{{labels}}}
  annotations: {{{annotations}}}
spec:
  containers: [{{name: c, resources: {{limits: {{cpu: "{cpu}"{gpus}}}}}}}]
{spec}
---"""


def group(name: str, min_member: int, ns: str = "default", spec: str = "", meta: str = "") -> str:
    return f"""
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata: {{name: {name}, namespace: {ns}{meta}}}
spec: {{minMember: {min_member}{spec}}}
---"""


def quota(ns: str, min_gpu: int, max_gpu: int) -> str:
    return f"""
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: ElasticQuota
metadata: {{name: quota, namespace: {ns}}}
spec:
  min: {{nvidia.com/gpu: "{min_gpu}"}}
  max: {{nvidia.com/gpu: "{max_gpu}"}}
---"""


def run(tmp_path: Path, text: str) -> dict[str, Any]:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    scenario = load_scenario([str(path)])

    async def go() -> dict[str, Any]:
        log = MemoryLog()
        result = await simulate(scenario, log)
        records = await log.read(0, 0)
        verified = replay(records, verify=True)
        assert verified.mismatch is None, verified.mismatch
        result.engine.state.check_invariants()
        result.cluster.check_invariants()
        assert list(result.engine.quotas.check()) == []
        data = result.report.to_json()
        data["engine"] = result.engine
        return data

    return asyncio.run(go())


def phases(data: dict[str, Any], *keys: str) -> list[str]:
    return [data["pods"][k]["phase"] for k in keys]


# --------------------------------------------------------------------------- gangs

MEMBERSHIP = {
    "scheduler-plugins": (
        lambda g: group(g, 5),
        lambda g: f"scheduling.x-k8s.io/pod-group: {g}",
        lambda g: "",
    ),
    "older-labels": (
        lambda g: "",
        lambda g: (
            f"pod-group.scheduling.sigs.k8s.io/name: {g}, pod-group.scheduling.sigs.k8s.io/min-available: '5'"
        ),
        lambda g: "",
    ),
    "volcano": (
        lambda g: (
            f"""
apiVersion: scheduling.volcano.sh/v1beta1
kind: PodGroup
metadata: {{name: {g}}}
spec: {{minMember: 5, queue: default}}
---"""
        ),
        lambda g: "",
        lambda g: f"scheduling.k8s.io/group-name: {g}",
    ),
    "tencent": (
        lambda g: (
            f"""
apiVersion: batch.scheduler.tencent.com/v1
kind: PodGroup
metadata: {{name: {g}}}
spec: {{minMember: 5}}
---"""
        ),
        lambda g: f"group.batch.scheduler.tencent.com: {g}",
        lambda g: "",
    ),
}


@pytest.mark.parametrize("convention", sorted(MEMBERSHIP))
def test_two_gangs_that_fit_alone_never_deadlock(tmp_path: Path, convention: str) -> None:
    """6 free CPUs, two groups of 5 one-CPU pods: exactly one group runs, entirely."""
    make_group, label, annotation = MEMBERSHIP[convention]
    text = node("a", cpu=3) + node("b", cpu=3)
    for g in ("g1", "g2"):
        text += make_group(g)
        for i in range(5):
            text += pod(f"{g}-{i}", labels=label(g), annotations=annotation(g))
    data = run(tmp_path, text)
    bound = {
        g: sum(1 for i in range(5) if data["pods"][f"default/{g}-{i}"]["phase"] == "Bound")
        for g in ("g1", "g2")
    }
    assert sorted(bound.values()) == [0, 5]
    assert data["groups"]["default/g1"]["phase"] == "Scheduled"
    assert data["groups"]["default/g2"]["phase"] == "Pending"
    assert "1 of the 5 members still needed fit" in data["pods"]["default/g2-0"]["reason"]


def test_second_gang_runs_when_the_first_finishes(tmp_path: Path) -> None:
    text = node("a", cpu=6) + group("g1", 5) + group("g2", 5)
    for g in ("g1", "g2"):
        for i in range(5):
            text += pod(
                f"{g}-{i}",
                labels=f"scheduling.x-k8s.io/pod-group: {g}",
                annotations='shoal.io/runtime: "10"',
            )
    data = run(tmp_path, text)
    assert data["groups"]["default/g1"]["phase"] == "Succeeded"
    assert data["groups"]["default/g2"]["phase"] == "Succeeded"


def test_members_beyond_min_member_are_placed_when_they_fit(tmp_path: Path) -> None:
    text = node("a", cpu=4) + group("g", 3)
    for i in range(6):
        text += pod(f"m{i}", labels="scheduling.x-k8s.io/pod-group: g")
    data = run(tmp_path, text)
    assert phases(data, *(f"default/m{i}" for i in range(6))).count("Bound") == 4
    assert data["groups"]["default/g"] == {
        "phase": "Scheduled",
        "scheduled": 4,
        "min_member": 3,
        "members": 6,
        "source": "scheduler-plugins",
    }


def test_a_group_waiting_for_members_holds_no_capacity(tmp_path: Path) -> None:
    text = (
        node("a", cpu=3)
        + group("g", 3)
        + pod("m0", labels="scheduling.x-k8s.io/pod-group: g")
        + pod("m1", labels="scheduling.x-k8s.io/pod-group: g")
        + pod("solo", cpu="2", annotations='shoal.io/arrive-at: "1", shoal.io/runtime: "5"')
        + pod(
            "m2", labels="scheduling.x-k8s.io/pod-group: g", annotations='shoal.io/arrive-at: "2"'
        )
    )
    data = run(tmp_path, text)
    assert data["pods"]["default/solo"]["phase"] == "Succeeded"
    assert phases(data, "default/m0", "default/m1", "default/m2") == ["Bound"] * 3
    engine = data["engine"]
    assert engine.groups["default/g"].phase == "Scheduled"


def test_waiting_group_says_why(tmp_path: Path) -> None:
    text = node("a") + group("g", 3) + pod("m0", labels="scheduling.x-k8s.io/pod-group: g")
    data = run(tmp_path, text)
    assert data["pods"]["default/m0"]["reason"] == (
        "waiting for members of pod group default/g: 1 of minMember 3 present"
    )
    assert data["groups"]["default/g"]["reason"].startswith("waiting for members")


def test_gang_timeout_fails_the_group_and_its_pods(tmp_path: Path) -> None:
    text = node("a", cpu=2) + group("g", 3, spec=", scheduleTimeoutSeconds: 30")
    for i in range(3):
        text += pod(f"m{i}", labels="scheduling.x-k8s.io/pod-group: g")
    data = run(tmp_path, text)
    assert data["groups"]["default/g"]["phase"] == "Failed"
    reason = data["pods"]["default/m0"]["reason"]
    assert data["pods"]["default/m0"]["phase"] == "Failed"
    assert reason.startswith(
        "pod group default/g timed out: fewer than 3 members placed within 30s"
    )
    assert data["summary"]["simulated_seconds"] == 30


def test_min_resources_is_a_cheap_prefilter(tmp_path: Path) -> None:
    text = node("a", cpu=4) + group("g", 2, spec=", minResources: {cpu: '8'}")
    text += pod("m0", labels="scheduling.x-k8s.io/pod-group: g") + pod(
        "m1", labels="scheduling.x-k8s.io/pod-group: g"
    )
    data = run(tmp_path, text)
    assert (
        "needs minResources cpu=8000, the cluster has 4000 free"
        in data["pods"]["default/m0"]["reason"]
    )


def test_pod_naming_a_group_that_never_appears_waits_with_a_reason(tmp_path: Path) -> None:
    data = run(tmp_path, node("a") + pod("lost", labels="scheduling.x-k8s.io/pod-group: ghost"))
    assert data["pods"]["default/lost"]["phase"] == "Pending"
    assert data["pods"]["default/lost"]["reason"] == (
        "waiting for pod group default/ghost, which does not exist"
    )


# --------------------------------------------------------------------------- dependencies


def test_dependency_chain_runs_in_order(tmp_path: Path) -> None:
    text = node("a", cpu=8)
    text += pod("c", annotations='shoal.io/depends-on: b, shoal.io/runtime: "5"')
    text += pod("b", annotations='shoal.io/depends-on: a, shoal.io/runtime: "10"')
    text += pod("a", annotations='shoal.io/runtime: "20"')
    data = run(tmp_path, text)
    assert phases(data, "default/a", "default/b", "default/c") == ["Succeeded"] * 3
    report = data["engine"]
    assert report.now == 35 * 10**9


def test_dependency_on_a_group_waits_for_every_member(tmp_path: Path) -> None:
    text = node("a", cpu=8) + group("train", 2)
    text += pod(
        "t0", labels="scheduling.x-k8s.io/pod-group: train", annotations='shoal.io/runtime: "10"'
    )
    text += pod(
        "t1", labels="scheduling.x-k8s.io/pod-group: train", annotations='shoal.io/runtime: "30"'
    )
    text += pod("eval", annotations='shoal.io/depends-on: train, shoal.io/runtime: "1"')
    data = run(tmp_path, text)
    assert data["pods"]["default/eval"]["phase"] == "Succeeded"
    assert data["summary"]["simulated_seconds"] == 31


def test_failed_dependency_fails_the_dependent(tmp_path: Path) -> None:
    text = node("a") + pod("a", annotations='shoal.io/runtime: "5", shoal.io/fails: "true"')
    text += pod("b", annotations="shoal.io/depends-on: a")
    data = run(tmp_path, text)
    assert data["pods"]["default/b"] == {
        "node": None,
        "phase": "Failed",
        "reason": "dependency default/a failed",
        "attempts": 0,
        "shard": 0,
    }


def test_waiting_on_a_dependency_says_so(tmp_path: Path) -> None:
    text = node("a") + pod("a") + pod("b", annotations='shoal.io/depends-on: "a, nope"')
    data = run(tmp_path, text)
    assert data["pods"]["default/b"]["reason"] == "waiting for default/a to succeed (Running)"


# --------------------------------------------------------------------------- quotas


def test_borrow_then_reclaim(tmp_path: Path) -> None:
    """A min 4 / max 6 GPUs, B min 6 / max 8, 10 GPUs in all. A runs 6 while B is idle;
    B then asks for 6: A is cut back to 4 and B gets 6."""
    text = node("gpu-0", cpu=64, gpu=5) + node("gpu-1", cpu=64, gpu=5)
    text += quota("team-a", 4, 6) + quota("team-b", 6, 8)
    for i in range(6):
        text += pod(f"a{i}", gpu=1, ns="team-a", annotations=f'shoal.io/arrive-at: "{i}"')
    for i in range(6):
        text += pod(f"b{i}", gpu=1, ns="team-b", annotations='shoal.io/arrive-at: "10"')
    data = run(tmp_path, text)
    a = phases(data, *(f"team-a/a{i}" for i in range(6)))
    b = phases(data, *(f"team-b/b{i}" for i in range(6)))
    assert a.count("Bound") == 4 and a.count("Failed") == 2
    assert b == ["Bound"] * 6
    assert len(data["preemptions"]) == 2
    # the most recently started borrowers go first
    assert {p["pod"] for p in data["preemptions"]} == {"team-a/a5", "team-a/a4"}
    assert all(p["by"].startswith("team-b/") for p in data["preemptions"])
    engine = data["engine"]
    # (the table keeps nvidia.com/gpu in milli-cards, so that shares count their part)
    assert engine.quotas.get("team-a").used["nvidia.com/gpu"] == 4 * GPU_SCALE
    assert engine.quotas.get("team-b").used["nvidia.com/gpu"] == 6 * GPU_SCALE


def test_quota_max_is_never_exceeded(tmp_path: Path) -> None:
    text = node("gpu-0", cpu=64, gpu=8) + quota("team-a", 2, 3) + quota("idle", 6, 6)
    for i in range(5):
        text += pod(f"a{i}", gpu=1, ns="team-a")
    data = run(tmp_path, text)
    assert phases(data, *(f"team-a/a{i}" for i in range(5))).count("Bound") == 3
    assert data["pods"]["team-a/a4"]["reason"] == (
        "elastic quota team-a: nvidia.com/gpu would exceed its max (3)"
    )


def test_borrowers_share_idle_capacity_by_dominant_share(tmp_path: Path) -> None:
    """Two teams with no guarantee borrow from a third's idle min: DRF alternates."""
    text = node("gpu-0", cpu=64, gpu=6) + quota("idle", 6, 6) + quota("x", 0, 6) + quota("y", 0, 6)
    for i in range(6):
        text += pod(f"x{i}", gpu=1, ns="x")
    for i in range(6):
        text += pod(f"y{i}", gpu=1, ns="y")
    data = run(tmp_path, text)
    x = phases(data, *(f"x/x{i}" for i in range(6))).count("Bound")
    y = phases(data, *(f"y/y{i}" for i in range(6))).count("Bound")
    assert (x, y) == (3, 3)


# --------------------------------------------------------------------------- preemption

PRIORITIES = """
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: low}
value: 10
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high}
value: 1000
---"""


def test_priority_preemption_evicts_the_fewest_lowest(tmp_path: Path) -> None:
    text = PRIORITIES + node("a", cpu=4) + node("b", cpu=4)
    text += pod("low-big", cpu="4", spec="  priorityClassName: low")
    text += pod("low-1", cpu="2", spec="  priorityClassName: low")
    text += pod("mid-1", cpu="2", spec="  priority: 500")
    text += pod(
        "urgent", cpu="2", spec="  priorityClassName: high", annotations='shoal.io/arrive-at: "1"'
    )
    data = run(tmp_path, text)
    assert data["pods"]["default/urgent"]["phase"] == "Bound"
    assert data["preemptions"] == [
        {
            "pod": "default/low-1",
            "node": data["pods"]["default/urgent"]["node"],
            "by": "default/urgent",
        }
    ]
    assert data["pods"]["default/low-big"]["phase"] == "Bound"
    assert data["pods"]["default/mid-1"]["phase"] == "Bound"


def test_preemption_policy_never_waits(tmp_path: Path) -> None:
    # a pod naming a class takes the class's policy (stating another is refused, as
    # Kubernetes' admission refuses it): a pod stating its priority states its policy
    text = PRIORITIES + node("a", cpu=2) + pod("low", cpu="2", spec="  priorityClassName: low")
    text += pod(
        "polite",
        cpu="2",
        spec="  priority: 1000\n  preemptionPolicy: Never",
        annotations='shoal.io/arrive-at: "1"',
    )
    data = run(tmp_path, text)
    assert data["preemptions"] == []
    assert data["pods"]["default/polite"]["phase"] == "Pending"


def test_equal_priority_is_never_preempted(tmp_path: Path) -> None:
    text = node("a", cpu=2) + pod("first", cpu="2") + pod("second", cpu="2")
    data = run(tmp_path, text)
    assert data["preemptions"] == [] and data["pods"]["default/second"]["phase"] == "Pending"


def test_gang_aware_preemption_counts_the_whole_gang(tmp_path: Path) -> None:
    """Evicting one member of a gang at minMember evicts the gang: of equal priorities,
    a node with a lone pod is the cheaper victim (one pod against the gang's two)."""
    text = PRIORITIES + node("a", cpu=2) + node("b", cpu=2) + node("c", cpu=2)
    text += group("g", 2)
    text += pod(
        "g0",
        cpu="2",
        labels="scheduling.x-k8s.io/pod-group: g",
        spec="  priority: 10\n  nodeName: a",
    )
    text += pod(
        "g1",
        cpu="2",
        labels="scheduling.x-k8s.io/pod-group: g",
        spec="  priority: 10\n  nodeName: b",
    )
    text += pod("lone", cpu="2", spec="  priorityClassName: low\n  nodeName: c")
    text += pod(
        "urgent", cpu="2", spec="  priorityClassName: high", annotations='shoal.io/arrive-at: "1"'
    )
    data = run(tmp_path, text)
    assert data["pods"]["default/urgent"]["node"] == "c", data["preemptions"]
    assert [p["pod"] for p in data["preemptions"]] == ["default/lone"]


def test_preempting_a_gang_member_evicts_the_whole_gang(tmp_path: Path) -> None:
    text = PRIORITIES + node("a", cpu=2) + node("b", cpu=2)
    text += group("g", 2)
    text += pod(
        "g0", cpu="2", labels="scheduling.x-k8s.io/pod-group: g", spec="  priorityClassName: low"
    )
    text += pod(
        "g1", cpu="2", labels="scheduling.x-k8s.io/pod-group: g", spec="  priorityClassName: low"
    )
    text += pod(
        "urgent", cpu="2", spec="  priorityClassName: high", annotations='shoal.io/arrive-at: "1"'
    )
    data = run(tmp_path, text)
    assert sorted(p["pod"] for p in data["preemptions"]) == ["default/g0", "default/g1"]
    assert data["groups"]["default/g"]["phase"] == "Failed"
    assert data["groups"]["default/g"]["reason"] == "preempted by default/urgent"


def test_a_gang_can_preempt_as_a_whole(tmp_path: Path) -> None:
    text = PRIORITIES + node("a", cpu=2) + node("b", cpu=2)
    text += pod("low-a", cpu="2", spec="  priorityClassName: low") + pod(
        "low-b", cpu="2", spec="  priorityClassName: low"
    )
    text += group("g", 2)
    for i in range(2):
        text += pod(
            f"g{i}",
            cpu="2",
            labels="scheduling.x-k8s.io/pod-group: g",
            spec="  priorityClassName: high",
            annotations='shoal.io/arrive-at: "1"',
        )
    data = run(tmp_path, text)
    assert data["groups"]["default/g"]["phase"] == "Scheduled"
    assert len(data["preemptions"]) == 2


def test_a_gang_that_cannot_preempt_enough_preempts_nothing(tmp_path: Path) -> None:
    text = PRIORITIES + node("a", cpu=2) + node("b", cpu=2)
    text += pod("low-a", cpu="2", spec="  priorityClassName: low")
    text += pod("peer-b", cpu="2", spec="  priorityClassName: high")
    text += group("g", 2)
    for i in range(2):
        text += pod(
            f"g{i}",
            cpu="2",
            labels="scheduling.x-k8s.io/pod-group: g",
            spec="  priorityClassName: high",
            annotations='shoal.io/arrive-at: "1"',
        )
    data = run(tmp_path, text)
    assert data["preemptions"] == []
    assert data["pods"]["default/low-a"]["phase"] == "Bound"
