"""GPUs through DRA, ``shoal serve`` on a real kube-apiserver v1.37 (``resource.k8s.io/v1``,
GA): the test publishes ResourceSlices as a GPU driver would, and plays the
resourceclaim controller for a template (no kube-controller-manager runs here: it
creates the pod's claim and writes its name into ``status.resourceClaimStatuses``).
shoal allocates each claim (``status.allocation``), reserves it for the pod
(``status.reservedFor``), then binds the pod; at 1 and 2 shards, and the log replays.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from engine.engine import Engine
from engine.model.pools import POOL_LABEL
from events.memory import MemoryLog
from shards.kube.binder import KubeBinder
from shards.kube.client import api_client
from shards.kube.ingest import KubeIngest
from shards.replay import replay, replay_routed
from shards.worker import ShardWorker
from tests.kube.realkube import RealApiServer
from tests.kube.serving import serving
from tests.kube.test_ingest import eventually, node, pod

DRIVER = "gpu.example.com"
V1 = "resource.k8s.io/v1"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


@pytest.fixture
def server(rbac_apiserver: RealApiServer) -> Iterator[RealApiServer]:
    """v1.37 with RBAC and deploy/'s roles (``serve`` below runs as the administrator;
    the last test as ingest and binder): the session's RBAC server, left empty."""
    yield rbac_apiserver
    _empty(rbac_apiserver)


def _slice(node_name: str, devices: int, model: str) -> dict[str, Any]:
    return {
        "apiVersion": V1,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node_name}-gpus"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {"productName": {"string": model}, "index": {"int": i}},
                    "capacity": {"memory": {"value": "80Gi"}},
                }
                for i in range(devices)
            ],
        },
    }


def _claim_spec(count: int, model: str) -> dict[str, Any]:
    """``count`` devices of ``model``; 0: all of a node's (``allocationMode: All``)."""
    selector = f'device.attributes["{DRIVER}"].productName == "{model}"'
    amount: dict[str, Any] = {"count": count} if count else {"allocationMode": "All"}
    return {
        "devices": {
            "requests": [
                {
                    "name": "gpus",
                    "exactly": {
                        "deviceClassName": "gpu",
                        **amount,
                        "selectors": [{"cel": {"expression": selector}}],
                    },
                }
            ],
            "config": [
                {"requests": ["gpus"], "opaque": {"driver": DRIVER, "parameters": {"x": 1}}}
            ],
        }
    }


def _dra_pod(name: str, source: dict[str, str]) -> dict[str, Any]:
    item = pod(name)
    item["spec"]["resourceClaims"] = [{"name": "gpu", **source}]
    item["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return item


def _empty(server: RealApiServer) -> None:
    server.empty()
    for path in (
        CLAIMS,
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates",
        "/apis/resource.k8s.io/v1/resourceslices",
        "/apis/resource.k8s.io/v1/deviceclasses",
    ):
        server._call("DELETE", path)


def _publish(server: RealApiServer) -> None:
    """A DeviceClass; n0 with 4 H100s, n1 with 2 A100s, n2 with 2 L4s (pools a, b, c);
    pods naming a claim of 3 H100s, a template of 2 A100s, a claim of all a node's L4s."""
    _empty(server)
    server.apply(
        {
            "apiVersion": V1,
            "kind": "DeviceClass",
            "metadata": {"name": "gpu"},
            "spec": {
                "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                "config": [{"opaque": {"driver": DRIVER, "parameters": {"from": "class"}}}],
            },
        }
    )
    for i, (devices, model) in enumerate([(4, "H100"), (2, "A100"), (2, "L4")]):
        item = node(f"n{i}", cpu="8")
        item["metadata"]["labels"][POOL_LABEL] = "abc"[i]
        server.put("Node", item)
        server.apply(_slice(f"n{i}", devices, model))
    server.apply(
        {
            "apiVersion": V1,
            "kind": "ResourceClaim",
            "metadata": {"name": "three-h100", "namespace": "default"},
            "spec": _claim_spec(3, "H100"),
        }
    )
    server.apply(
        {
            "apiVersion": V1,
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "two-a100", "namespace": "default"},
            "spec": {"spec": _claim_spec(2, "A100")},
        }
    )
    server.apply(
        {
            "apiVersion": V1,
            "kind": "ResourceClaim",
            "metadata": {"name": "all-l4", "namespace": "default"},
            "spec": _claim_spec(0, "L4"),
        }
    )
    server.put("Pod", _dra_pod("direct", {"resourceClaimName": "three-h100"}))
    server.put("Pod", _dra_pod("whole", {"resourceClaimName": "all-l4"}))
    server.put("Pod", _dra_pod("templated", {"resourceClaimTemplateName": "two-a100"}))


def _instantiate(server: RealApiServer) -> None:
    """The resourceclaim controller's part: the templated pod's claim, named in its status."""
    server.apply(
        {
            "apiVersion": V1,
            "kind": "ResourceClaim",
            "metadata": {"name": "templated-gpu-x7k2q", "namespace": "default"},
            "spec": _claim_spec(2, "A100"),
        }
    )
    templated = server.get("Pod", "templated", "default") or {}
    templated["status"] = {
        "phase": "Pending",
        "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "templated-gpu-x7k2q"}],
    }
    server.put("Pod", templated)


def _node_of(server: RealApiServer, name: str) -> str:
    found = server.get("Pod", name, "default") or {}
    return str((found.get("spec") or {}).get("nodeName") or "")


def _both_bound(server: RealApiServer) -> bool:
    return (
        _node_of(server, "direct") == "n0"
        and _node_of(server, "templated") == "n1"
        and _node_of(server, "whole") == "n2"
    )


def _check_claims(server: RealApiServer) -> None:
    """Each claim allocated on its pod's node, with its count of distinct devices, the
    class's and the claim's config, and reserved for its pod; the pod's cards named."""
    for pod_name, claim_name, count, node_name in (
        ("direct", "three-h100", 3, "n0"),
        ("templated", "templated-gpu-x7k2q", 2, "n1"),
        ("whole", "all-l4", 2, "n2"),
    ):
        bound = server.get("Pod", pod_name, "default") or {}
        claim = server._call("GET", f"{CLAIMS}/{claim_name}")
        allocation = claim["status"]["allocation"]
        results = allocation["devices"]["results"]
        assert len(results) == count
        assert {(r["request"], r["driver"], r["pool"]) for r in results} == {
            ("gpus", DRIVER, node_name)
        }
        assert len({r["device"] for r in results}) == count
        terms = allocation["nodeSelector"]["nodeSelectorTerms"]
        assert terms[0]["matchFields"][0]["values"] == [node_name]
        sources = [c["source"] for c in allocation["devices"]["config"]]
        assert sources == ["FromClass", "FromClaim"]
        assert claim["status"]["reservedFor"] == [
            {"resource": "pods", "name": pod_name, "uid": bound["metadata"]["uid"]}
        ]
        cards = bound["metadata"]["annotations"]["shoal.io/gpu-devices"].split(",")
        assert len(cards) == count


@pytest.mark.parametrize("shards", [1, 2])
async def test_a_dra_gpu_pod_is_allocated_reserved_and_bound(
    server: RealApiServer, shards: int
) -> None:
    _publish(server)
    async with serving(server, shards) as service:
        # the templated pod waits for its claim: the resourceclaim controller's part
        await eventually(
            lambda: (
                service.ingest is not None and "default/templated" in service.ingest.dra.waiting
            ),
            60,
        )
        assert _node_of(server, "templated") == ""
        _instantiate(server)
        try:
            await eventually(lambda: _both_bound(server), 60)
        except AssertionError:
            ingest = service.ingest.stats() if service.ingest else None
            binder = service.binder.stats() if service.binder else None
            raise AssertionError(f"not bound: ingest={ingest} binder={binder}") from None
        assert service.bus is not None
        parts = [await service.bus.read(p, 0) for p in range(service.bus.partitions)]
    _check_claims(server)
    verified = replay_routed(parts, verify=True) if shards > 1 else replay(parts[0], verify=True)
    assert verified.mismatch is None, verified.mismatch


async def test_ingest_and_binder_need_nothing_beyond_their_roles_for_dra(
    server: RealApiServer,
) -> None:
    """deploy/'s roles: ingest lists and watches the DRA kinds, the binder reads claims
    and classes and writes claims' status, under their own ServiceAccounts' tokens."""
    _publish(server)
    _instantiate(server)
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
        await eventually(lambda: _both_bound(server), 60)
    except AssertionError:
        failed = [e.event for e in await log.read(0, 0) if type(e.event).__name__ == "BindFailed"]
        why = f"{failed} binder={binder.stats()}"
        raise AssertionError(f"not bound: {why}") from None
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        await ingest_api.close()
        await binder_api.close()
    _check_claims(server)
    assert binder.counters["bind_failed"] == 0, binder.stats()
    assert ingest.stats()["resourceslices_lists"] >= 1
    assert replay(await log.read(0, 0), verify=True).mismatch is None
