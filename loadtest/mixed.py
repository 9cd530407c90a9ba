"""Mixed workloads for the scale harness (``shoal loadtest scale``), seeded.

A cluster of ``basic`` nodes (32 to 96 CPU, 4 GiB per CPU, 110 pods) in three zones and
four instance types, one node in eight a GPU node (8 cards, tainted), and, for a
preemption wave, that many nodes set apart (labelled and tainted ``shoal.io/wave``).

Pods come from ``templates`` pod templates, as Deployments and Jobs make them: every
pod of a template has the same shape and constraints. With one template, every pod is
``500m`` CPU and 1 GiB, nothing else (SchedulingBasic's single template). With more,
template ``i`` draws its CPU and memory from the sizes people write, and

- ``i % 10 == 9``: one GPU card (tolerates the GPU taint, selects ``gpu=yes``), drawn a
  quarter as often as the others so that the cards suffice;
- ``i % 5 == 2``: a node selector on one zone;
- ``i % 5 == 3``: a node selector on one instance type;
- ``i % 5 == 4``: a topology spread over zones (``maxSkew`` 5, ``DoNotSchedule``)
  among the template's own pods.

A fraction of the pods (``gang_fraction``) come in gangs of ``gang_size`` (``minMember``
the size, one template per gang). A preemption wave of ``wave`` pods: first ``wave``
low-priority fillers, one per wave node (32 CPU each) and as large as the node's CPU, then ``wave``
high-priority pods of the same size: each can only run by evicting a filler.
"""

from __future__ import annotations

import random
from typing import Final

from events.types import (
    Event,
    GroupSpec,
    LabelSelector,
    NodeSpec,
    PodGroupSubmitted,
    PodSpec,
    PodSubmitted,
    Taint,
    Toleration,
    TopologySpreadConstraint,
)
from loadtest.synthetic import GI, NODE_CPUS, POD_MEMORY, POD_MILLICPU

ZONES: Final = 3
GPU_EVERY: Final = 8
GPU_CARDS: Final = 8
WAVE_KEY: Final = "shoal.io/wave"
WAVE_PRIORITY: Final = 1000
WAVE_CPUS: Final = 32
ZONE: Final = "topology.kubernetes.io/zone"
INSTANCE_TYPE: Final = "node.kubernetes.io/instance-type"


def mixed_nodes(count: int, rng: random.Random, wave: int = 0) -> list[NodeSpec]:
    """``count`` nodes, the last ``wave`` of them set apart for the preemption wave."""
    nodes = []
    for i in range(count):
        cpus = rng.choice(NODE_CPUS)
        if i >= count - wave:
            cpus = WAVE_CPUS  # one size: a wave pod fits where any filler was
        name = f"node-{i:06d}"
        allocatable = {"cpu": cpus * 1000, "memory": cpus * 4 * GI, "pods": 110}
        labels = {
            "kubernetes.io/hostname": name,
            ZONE: f"zone-{i % ZONES}",
            INSTANCE_TYPE: f"type-{cpus}",
        }
        taints: tuple[Taint, ...] = ()
        if i >= count - wave:
            labels[WAVE_KEY] = "yes"
            taints = (Taint(key=WAVE_KEY, effect="NoSchedule"),)
        elif i % GPU_EVERY == GPU_EVERY - 1:
            allocatable["nvidia.com/gpu"] = GPU_CARDS
            labels["gpu"] = "yes"
            taints = (Taint(key="nvidia.com/gpu", effect="NoSchedule"),)
        nodes.append(NodeSpec(name=name, allocatable=allocatable, labels=labels, taints=taints))
    return nodes


def templates(count: int, rng: random.Random, namespace: str = "load") -> list[PodSpec]:
    """``count`` pod templates (named ``tmpl-I``; a pod is a template renamed)."""
    if count == 1:
        return [
            PodSpec(
                namespace=namespace,
                name="tmpl-0",
                requests={"cpu": 500, "memory": 1 * GI},
                labels={"app": "tmpl-0"},
            )
        ]
    out = []
    for i in range(count):
        app = f"tmpl-{i}"
        requests = {"cpu": rng.choice(POD_MILLICPU), "memory": rng.choice(POD_MEMORY)}
        selector: dict[str, str] = {}
        tolerations: tuple[Toleration, ...] = ()
        spread: tuple[TopologySpreadConstraint, ...] = ()
        if i % 10 == 9:
            requests["nvidia.com/gpu"] = 1
            selector["gpu"] = "yes"
            tolerations = (Toleration(key="nvidia.com/gpu", operator="Exists"),)
        elif i % 5 == 2:
            selector[ZONE] = f"zone-{i % ZONES}"
        elif i % 5 == 3:
            selector[INSTANCE_TYPE] = f"type-{NODE_CPUS[i % len(NODE_CPUS)]}"
        elif i % 5 == 4:
            spread = (
                TopologySpreadConstraint(
                    max_skew=5,
                    topology_key=ZONE,
                    when_unsatisfiable="DoNotSchedule",
                    selector=LabelSelector(match_labels={"app": app}),
                ),
            )
        out.append(
            PodSpec(
                namespace=namespace,
                name=app,
                requests=requests,
                labels={"app": app},
                node_selector=selector,
                tolerations=tolerations,
                spread_constraints=spread,
            )
        )
    return out


def _weight(template: PodSpec) -> float:
    return 0.25 if "nvidia.com/gpu" in template.requests else 1.0


def _pod(template: PodSpec, name: str, group: str = "") -> PodSpec:
    return PodSpec(
        namespace=template.namespace,
        name=name,
        requests=dict(template.requests),
        labels=dict(template.labels),
        node_selector=dict(template.node_selector),
        tolerations=template.tolerations,
        spread_constraints=template.spread_constraints,
        group=group,
    )


def mixed_batches(
    pods: int,
    shapes: list[PodSpec],
    rng: random.Random,
    *,
    batch: int = 1000,
    gang_fraction: float = 0.0,
    gang_size: int = 4,
) -> list[list[Event]]:
    """Ingest batches of about ``batch`` pods drawn from ``shapes``; about
    ``gang_fraction`` of them in gangs of ``gang_size`` (a gang is never split)."""
    weights = [_weight(t) for t in shapes]
    gangs = int(pods * gang_fraction) // gang_size if gang_size > 0 else 0
    units = [gang_size] * gangs + [1] * (pods - gangs * gang_size)
    rng.shuffle(units)
    batches: list[list[Event]] = [[]]
    count = 0
    made = 0
    for g, size in enumerate(units):
        if count and count + size > batch:
            batches.append([])
            count = 0
        template = rng.choices(shapes, weights)[0]
        if size == 1:
            batches[-1].append(PodSubmitted(pod=_pod(template, f"pod-{made:07d}")))
        else:
            group = GroupSpec(namespace=template.namespace, name=f"gang-{g:07d}", min_member=size)
            batches[-1].append(PodGroupSubmitted(group=group))
            batches[-1].extend(
                PodSubmitted(pod=_pod(template, f"pod-{made + m:07d}", group.key))
                for m in range(size)
            )
        made += size
        count += size
    return [b for b in batches if b]


def wave_pods(
    nodes: list[NodeSpec], namespace: str = "wave"
) -> tuple[list[PodSpec], list[PodSpec]]:
    """The fillers (priority 0) and the wave (priority ``WAVE_PRIORITY``) for the wave
    nodes of ``nodes``: one of each per node, each asking for the node's whole CPU."""
    fillers: list[PodSpec] = []
    wave: list[PodSpec] = []
    toleration = (Toleration(key=WAVE_KEY, operator="Exists"),)
    for node in nodes:
        if WAVE_KEY not in node.labels:
            continue
        requests = {"cpu": node.allocatable["cpu"], "memory": 1 * GI}
        for out, prefix, priority in ((fillers, "filler", 0), (wave, "wave", WAVE_PRIORITY)):
            out.append(
                PodSpec(
                    namespace=namespace,
                    name=f"{prefix}-{len(out):06d}",
                    requests=dict(requests),
                    priority=priority,
                    node_selector={WAVE_KEY: "yes"},
                    tolerations=toleration,
                )
            )
    return fillers, wave
