"""Workloads of kube-scheduler's benchmark, scheduler_perf (``test/integration/
scheduler_perf/config/performance-config.yaml``), for ``shoal loadtest --workload NAME``.

Nodes are its ``node-default`` template: 4 CPU, 32Gi, 110 pods, labelled with their
hostname, and in three zones (``zone1``..``zone3``, as its ``labelNodePrepareStrategy``
labels them) where the workload needs zones. Pods request 100m and 500Mi. Each
workload first creates ``INIT_PODS`` pods (not measured), then the measured ones:

- ``SchedulingBasic``: plain pods, then plain pods;
- ``SchedulingPodAntiAffinity``: pods labelled ``color: green`` with a required
  anti-affinity to ``color: green`` on ``kubernetes.io/hostname`` in the namespaces
  ``sched-0`` and ``sched-1`` (init pods in one, measured ones in the other): one per node;
- ``TopologySpreading``: plain pods, then pods labelled ``color: blue`` with
  ``DoNotSchedule`` constraints of maxSkew 5 on hostname and on zone;
- ``PreferredTopologySpreading``: the same constraints, ``ScheduleAnyway``;
- ``Preemption``: four low-priority pods per node (900m and 500Mi each, priority 1:
  the nodes are full), then high-priority pods (3 CPU, priority 10) that each preempt
  three of them (its ``pod-low-priority`` and ``pod-high-priority`` templates).
"""

from __future__ import annotations

from typing import Final

from events.types import (
    LabelSelector,
    NodeSpec,
    PodAffinityTerm,
    PodSpec,
    TopologySpreadConstraint,
)

GI: Final = 1 << 30
MI: Final = 1 << 20
INIT_PODS: Final = 1000
HOSTNAME: Final = "kubernetes.io/hostname"
ZONE: Final = "topology.kubernetes.io/zone"
WORKLOADS: Final = (
    "SchedulingBasic",
    "SchedulingPodAntiAffinity",
    "TopologySpreading",
    "PreferredTopologySpreading",
    "Preemption",
)
LOW_PER_NODE: Final = 4
REQUESTS: Final = {"cpu": 100, "memory": 500 * MI}


def perf_nodes(count: int) -> list[NodeSpec]:
    return [
        NodeSpec(
            name=f"node-{i:05d}",
            allocatable={"cpu": 4000, "memory": 32 * GI, "pods": 110},
            labels={HOSTNAME: f"node-{i:05d}", ZONE: f"zone{i % 3 + 1}"},
        )
        for i in range(count)
    ]


def _anti(namespace: str, name: str) -> PodSpec:
    term = PodAffinityTerm(
        topology_key=HOSTNAME,
        selector=LabelSelector(match_labels={"color": "green"}),
        namespaces=("sched-0", "sched-1"),
    )
    return PodSpec(
        namespace=namespace,
        name=name,
        requests=dict(REQUESTS),
        labels={"color": "green", "name": "test"},
        pod_anti_affinity=(term,),
    )


def _spread(name: str, when: str) -> PodSpec:
    selector = LabelSelector(match_labels={"color": "blue"})
    return PodSpec(
        namespace="sched-1",
        name=name,
        requests=dict(REQUESTS),
        labels={"color": "blue"},
        spread_constraints=tuple(
            TopologySpreadConstraint(
                max_skew=5, topology_key=key, when_unsatisfiable=when, selector=selector
            )
            for key in (HOSTNAME, ZONE)
        ),
    )


def perf_pods(workload: str, measured: int, nodes: int = 0) -> tuple[list[PodSpec], list[PodSpec]]:
    """The init pods and the measured pods of ``workload`` (on ``nodes`` nodes)."""
    if workload == "Preemption":
        low = [
            PodSpec(
                namespace="sched-0",
                name=f"init-{i:06d}",
                requests={"cpu": 900, "memory": 500 * MI},
                priority=1,
            )
            for i in range(LOW_PER_NODE * nodes)
        ]
        high = [
            PodSpec(
                namespace="sched-1",
                name=f"pod-{i:06d}",
                requests={"cpu": 3000, "memory": 500 * MI},
                priority=10,
            )
            for i in range(measured)
        ]
        return low, high
    plain = [
        PodSpec(namespace="sched-0", name=f"init-{i:06d}", requests=dict(REQUESTS))
        for i in range(INIT_PODS)
    ]
    if workload == "SchedulingBasic":
        pods = [
            PodSpec(namespace="sched-1", name=f"pod-{i:06d}", requests=dict(REQUESTS))
            for i in range(measured)
        ]
        return plain, pods
    if workload == "SchedulingPodAntiAffinity":
        init = [_anti("sched-0", f"init-{i:06d}") for i in range(INIT_PODS)]
        return init, [_anti("sched-1", f"pod-{i:06d}") for i in range(measured)]
    when = "DoNotSchedule" if workload == "TopologySpreading" else "ScheduleAnyway"
    return plain, [_spread(f"pod-{i:06d}", when) for i in range(measured)]
