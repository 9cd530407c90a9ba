"""The binder and ingest under exactly the permissions deploy/rbac.yaml grants them, on a
real kube-apiserver with ``--authorization-mode=RBAC`` (tests/kube/realkube.py):
everything they do in a run with a gang, a pod that cannot fit, and a preemption is
allowed, and what they are not granted is refused."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from engine.engine import Engine
from events.memory import MemoryLog
from events.types import Envelope, NodeAdded, NodeSpec, PodBound, PodSpec, PodSubmitted
from shards.kube.binder import KubeBinder
from shards.kube.client import api_client
from shards.kube.ingest import KubeIngest
from shards.kube.lease import LeaderElector
from shards.replay import replay
from shards.worker import ShardWorker
from tests.kube.realkube import RealApiServer
from tests.kube.test_ingest import eventually, node, pod


def _node_of(server: RealApiServer, name: str) -> str | None:
    found = server.get("Pod", name, "default") or {}
    return (found.get("spec") or {}).get("nodeName")


async def test_binder_and_ingest_need_nothing_beyond_their_roles(
    rbac_apiserver: RealApiServer,
) -> None:
    server = rbac_apiserver
    server.empty()  # the session's RBAC server: what another module left
    server.put("PriorityClass", {"metadata": {"name": "low"}, "value": 100})
    server.put("PriorityClass", {"metadata": {"name": "high"}, "value": 1000})
    server.put("Node", node("n1", cpu="4"))
    server.put(
        "PodGroup",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "metadata": {"name": "job", "namespace": "default"},
            "spec": {"minMember": 2},
        },
    )
    for name in ("w0", "w1"):
        server.put("Pod", pod(name, labels={"scheduling.x-k8s.io/pod-group": "job"}))
    for name in ("low-0", "low-1"):
        server.put("Pod", pod(name, priority_class="low"))
    too_big = pod("too-big")
    too_big["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "64"
    server.put("Pod", too_big)

    ingest_api = await api_client(
        kubeconfig=server.kubeconfig_for("ingest", "ingest-token-0123456789")
    )
    binder_api = await api_client(
        kubeconfig=server.kubeconfig_for("binder", "binder-token-0123456789")
    )
    log = MemoryLog()
    stop = asyncio.Event()
    ingest = KubeIngest(ingest_api, log, watch_seconds=1)
    worker = ShardWorker(Engine(), log)
    binder = KubeBinder(binder_api, log, initial_backoff=0.01)

    async def loop() -> None:
        while not stop.is_set():
            await worker.poll()
            await binder.poll()
            await asyncio.sleep(0.02)

    tasks = [asyncio.create_task(ingest.run(stop)), asyncio.create_task(loop())]
    try:
        for role, api in (("ingest", ingest_api), ("binder", binder_api)):
            leader = LeaderElector(api, namespace="shoal", name=f"shoal-{role}", identity="a")
            assert await leader.try_acquire_or_renew()  # create
            assert await leader.try_acquire_or_renew()  # get and update
        await eventually(
            lambda: all(_node_of(server, n) == "n1" for n in ("w0", "w1", "low-0", "low-1")),
            timeout=60,
        )
        await eventually(
            lambda: (
                ((server.get("PodGroup", "job", "default") or {}).get("status") or {}).get(
                    "scheduled"
                )
                == 2
            ),
            timeout=60,
        )

        def warned(times: int) -> bool:
            events = [e for e in server.all("Event") if e["involvedObject"]["name"] == "too-big"]
            # events.k8s.io/v1 counts repeats in its series (core/v1: count)
            told = [(e.get("series") or {}).get("count") or e.get("count") or 1 for e in events]
            return len(told) == 1 and told[0] >= times

        await eventually(lambda: warned(1), timeout=60)  # created
        # the engine tries it again only on a change that could make it fit; the
        # binder's next FailedScheduling for it, under the binder's own permissions:
        await binder._warn("default/too-big", "FailedScheduling", "still too big")
        assert warned(2)  # patched
        assert binder.recorder.api == "events.k8s.io/v1", binder.recorder
        urgent = pod("urgent", priority_class="high")
        urgent["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
        server.put("Pod", urgent)

        def nominated() -> bool:
            found = server.get("Pod", "urgent", "default") or {}
            return (found.get("status") or {}).get("nominatedNodeName") == "n1"

        await eventually(nominated, timeout=60)
        assert _node_of(server, "urgent") is None
        # the victims, in kube-scheduler's order: the lowest highest priority first, so
        # the gang's members (priority 0) rather than the two priority-100 pods
        for name in ("w0", "w1", "low-0", "low-1"):
            found = server.get("Pod", name, "default") or {}
            if found.get("metadata", {}).get("deletionTimestamp"):
                server.remove("Pod", name, "default")  # the kubelet, done with a victim
        await eventually(lambda: _node_of(server, "urgent") == "n1", timeout=60)
        # and nothing beyond: the binder may not delete a pod, ingest may not bind one
        with pytest.raises(ApiException) as refused:
            await client.CoreV1Api(binder_api).delete_namespaced_pod("w0", "default")
        assert refused.value.status == 403
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name="too-big", namespace="default"),
            target=client.V1ObjectReference(kind="Node", name="n1"),
        )
        with pytest.raises(ApiException) as refused:
            await client.CoreV1Api(ingest_api).create_namespaced_pod_binding(
                "too-big", "default", body
            )
        assert refused.value.status == 403
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        await ingest_api.close()
        await binder_api.close()
    assert replay(await log.read(0, 0), verify=True).mismatch is None
    assert binder.counters["bind_failed"] == 0, binder.stats()


async def test_the_binders_cards_arrive_with_the_binding_and_it_cannot_patch_a_pod(
    rbac_apiserver: RealApiServer,
) -> None:
    """deploy/'s binder role: a binding with GPU cards lands them on the pod (the API
    server copies the Binding's annotations), and the binder cannot rewrite a pod, its
    annotations or its image."""
    server = rbac_apiserver
    gpu_pod = pod("trainer")
    gpu_pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    server.put("Pod", gpu_pod)
    binder_api = await api_client(
        kubeconfig=server.kubeconfig_for("binder", "binder-token-0123456789")
    )
    try:
        log = MemoryLog()
        binder = KubeBinder(binder_api, log, initial_backoff=0.01)
        gpu_node = NodeSpec(name="gpu-1", allocatable={"cpu": 8000, "nvidia.com/gpu": 4})
        spec = PodSpec(namespace="default", name="trainer", requests={"nvidia.com/gpu": 2})
        bound = PodBound(
            pod="default/trainer", node="gpu-1", decision_id="d", attempt=1, devices=(1, 3)
        )
        await log.append(
            [
                Envelope(event=NodeAdded(node=gpu_node), producer="shard-0"),
                Envelope(event=PodSubmitted(pod=spec), producer="shard-0"),
                Envelope(event=bound, producer="shard-0"),
            ]
        )
        assert await binder.poll() == 0
        found = server.get("Pod", "trainer", "default") or {}
        assert found["spec"]["nodeName"] == "gpu-1"
        assert found["metadata"]["annotations"]["shoal.io/gpu-devices"] == "1,3"
        assert binder.counters["devices_written"] == 1, binder.stats()
        core = client.CoreV1Api(binder_api)
        for patch in (
            {"metadata": {"annotations": {"shoal.io/gpu-devices": "0"}}},
            {"spec": {"containers": [{"name": "c", "image": "evil:latest"}]}},
        ):
            with pytest.raises(ApiException) as refused:
                await core.patch_namespaced_pod("trainer", "default", patch)
            assert refused.value.status == 403
        with pytest.raises(ApiException) as refused:
            await core.replace_namespaced_pod("trainer", "default", found)
        assert refused.value.status == 403
    finally:
        await binder_api.close()
    found = server.get("Pod", "trainer", "default") or {}
    assert found["metadata"]["annotations"]["shoal.io/gpu-devices"] == "1,3"
