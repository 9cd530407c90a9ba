"""``shoal serve`` (ingest, shard or shards and coordinator, binder) against the in-repo
API server: the rescheduler moves a pod a ReplicaSet-style controller owns.

In Kubernetes a pod cannot move: the binder evicts it through the Eviction API, the
pod waiting for its room is nominated there, and once the evicted pod is gone the node
it was planned onto is held for its owner. The test plays the kubelet (it deletes the
terminating pod) and the ReplicaSet controller (it creates the replacement with the
same ``ownerReferences``): the replacement lands on the planned node, and the waiting
pod binds where the plan said. A PodDisruptionBudget that allows no disruption of the
owner's pods means no plan at all: nothing is evicted, the pod waits with the reason."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from events.types import Envelope, MigrationEvicted, PodMigrated, PodUnschedulable
from shards.replay import replay, replay_routed
from tests.kube.apiserver import FakeApiServer
from tests.kube.test_ingest import eventually, node, pod
from tests.kube.test_serve import running

OWNER = {
    "apiVersion": "apps/v1",
    "kind": "ReplicaSet",
    "name": "web",
    "uid": "uid-replicaset-web",
    "controller": True,
    "blockOwnerDeletion": True,
}


def _pod(
    name: str, cpu: str, *, node_name: str = "", owned: bool = False, **annotations: str
) -> Any:
    obj = pod(name, node_name=node_name, labels={"app": "web"} if owned else {})
    obj["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    if owned:
        obj["metadata"]["ownerReferences"] = [OWNER]
    if annotations:
        obj["metadata"]["annotations"] = annotations
    if node_name:
        obj["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return obj


def _cluster(apiserver: FakeApiServer) -> None:
    """n1 (4 cpu) runs web-1 (2 cpu, owned by ReplicaSet web) and fixed-1 (1 cpu, may
    not move); n2 (4 cpu) runs fixed-2 (2 cpu, may not move). big (3 cpu) fits
    nowhere, but does on n1 once web-1 runs on n2."""
    apiserver.put("Node", node("n1", cpu="4"))
    apiserver.put("Node", node("n2", cpu="4"))
    apiserver.put("Pod", _pod("web-1", "2", node_name="n1", owned=True))
    stay = {"shoal.io/migratable": "false"}
    apiserver.put("Pod", _pod("fixed-1", "1", node_name="n1", **stay))
    apiserver.put("Pod", _pod("fixed-2", "2", node_name="n2", **stay))


def _node_of(apiserver: FakeApiServer, name: str) -> str:
    obj = apiserver.get("Pod", name, "default") or {}
    return str(obj.get("spec", {}).get("nodeName") or "")


def _terminating(apiserver: FakeApiServer, name: str) -> bool:
    obj = apiserver.get("Pod", name, "default") or {}
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


@pytest.mark.parametrize("shards", [1, 2])
async def test_a_pod_of_a_replicaset_is_moved_by_eviction_and_its_replacement_lands_where_planned(
    apiserver: FakeApiServer, shards: int
) -> None:
    _cluster(apiserver)
    async with running(apiserver, shards=shards) as service:
        apiserver.put("Pod", _pod("big", "3"))
        # the move is an eviction: web-1 terminates (graceful), big waits, nominated on n1
        await eventually(lambda: _terminating(apiserver, "web-1"), timeout=30)
        await eventually(
            lambda: (
                (apiserver.get("Pod", "big", "default") or {})
                .get("status", {})
                .get("nominatedNodeName")
                == "n1"
            ),
            timeout=30,
        )
        assert _node_of(apiserver, "big") == ""
        apiserver.remove("Pod", "web-1", "default")  # the kubelet: the pod is gone
        await eventually(lambda: _node_of(apiserver, "big") == "n1", timeout=30)
        # the ReplicaSet controller replaces it; the replacement lands on the held node
        apiserver.put("Pod", _pod("web-2", "2", owned=True))
        await eventually(lambda: _node_of(apiserver, "web-2") != "", timeout=30)
        assert _node_of(apiserver, "web-2") == "n2"
        assert service.bus is not None
        parts = [await service.bus.read(p, 0) for p in range(service.partitions)]
    _verified(parts)
    records = [e.event for part in parts for e in part]
    moved = [e for e in records if isinstance(e, PodMigrated)]
    assert {(e.pod, e.from_node, e.to_node, e.by) for e in moved} == {
        ("default/web-1", "n1", "n2", "default/big")
    }
    assert any(isinstance(e, MigrationEvicted) and e.pod == "default/web-1" for e in records)


@pytest.mark.parametrize("shards", [1, 2])
async def test_a_budget_that_allows_no_disruption_means_no_plan(
    apiserver: FakeApiServer, shards: int
) -> None:
    _cluster(apiserver)
    apiserver.put(
        "PodDisruptionBudget",
        {
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
        },
    )
    async with running(apiserver, shards=shards) as service:
        apiserver.put("Pod", _pod("big", "3"))
        assert service.bus is not None
        bus = service.bus

        async def reasons() -> list[str]:
            return [
                e.event.reason
                for p in range(service.partitions)
                for e in await bus.read(p, 0)
                if isinstance(e.event, PodUnschedulable) and e.event.pod == "default/big"
            ]

        found: list[str] = []

        async def told() -> bool:
            found[:] = await reasons()
            return any("PodDisruptionBudget default/web" in r for r in found)

        await _eventually_async(told, timeout=30)
        assert not _terminating(apiserver, "web-1")
        assert _node_of(apiserver, "big") == ""
        parts = [await bus.read(p, 0) for p in range(service.partitions)]
    _verified(parts)
    records = [e.event for part in parts for e in part]
    assert not any(isinstance(e, PodMigrated | MigrationEvicted) for e in records)


def _verified(parts: list[list[Envelope]]) -> None:
    """The run's log replays exactly (``replay --verify``)."""
    if len(parts) == 1:
        assert replay(parts[0], verify=True).mismatch is None
    else:
        assert replay_routed(parts, verify=True).mismatch is None


async def _eventually_async(check: Any, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)
