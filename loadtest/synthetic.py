"""Synthetic clusters and workloads, seeded.

``basic`` follows kube-scheduler's SchedulingBasic benchmark in spirit (plain pods, no
affinity, every pod fits somewhere) with a spread of sizes instead of one template:
nodes of 32 to 96 CPU with 4 GiB per CPU and 110 pods; pods of 100m to 4 CPU and 100Mi to 8Gi
drawn from the sizes people actually write.
"""

from __future__ import annotations

import random
from typing import Final

from events.types import GroupSpec, NodeSpec, PodSpec

GI: Final = 1 << 30
MI: Final = 1 << 20
NODE_CPUS: Final = (32, 48, 64, 96)
POD_MILLICPU: Final = (100, 250, 500, 1000, 2000, 4000)
POD_MEMORY: Final = (100 * MI, 256 * MI, 512 * MI, 1 * GI, 2 * GI, 4 * GI, 8 * GI)


def basic_nodes(count: int, rng: random.Random) -> list[NodeSpec]:
    nodes = []
    for i in range(count):
        cpus = rng.choice(NODE_CPUS)
        nodes.append(
            NodeSpec(
                name=f"node-{i:05d}",
                allocatable={"cpu": cpus * 1000, "memory": cpus * 4 * GI, "pods": 110},
                labels={
                    "kubernetes.io/hostname": f"node-{i:05d}",
                    "topology.kubernetes.io/zone": f"zone-{i % 3}",
                },
            )
        )
    return nodes


def gang_workload(
    count: int, gang_size: int, rng: random.Random, namespace: str = "load"
) -> list[tuple[GroupSpec, list[PodSpec]]]:
    """``count`` pods in gangs of ``gang_size`` (``minMember`` = size); the members of
    a gang share one shape, as the workers of a distributed training job do."""
    gangs = []
    for g in range(count // gang_size):
        group = GroupSpec(namespace=namespace, name=f"gang-{g:05d}", min_member=gang_size)
        requests = {"cpu": rng.choice(POD_MILLICPU), "memory": rng.choice(POD_MEMORY)}
        members = [
            PodSpec(
                namespace=namespace,
                name=f"gang-{g:05d}-{i:04d}",
                requests=dict(requests),
                group=group.key,
            )
            for i in range(gang_size)
        ]
        gangs.append((group, members))
    return gangs


def basic_pods(count: int, rng: random.Random, namespace: str = "load") -> list[PodSpec]:
    return [
        PodSpec(
            namespace=namespace,
            name=f"pod-{i:06d}",
            requests={"cpu": rng.choice(POD_MILLICPU), "memory": rng.choice(POD_MEMORY)},
        )
        for i in range(count)
    ]
