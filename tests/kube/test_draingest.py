"""What ingest makes of DRA objects, without a server (shards/kube/draingest.py): a
slice changes its node's cards, a pod waits for its claim, and a pod another scheduler
bound is counted on the devices its claims' allocations name."""

from __future__ import annotations

from typing import Any

from events.types import NodeSpec, PodBound, PodSpec
from shards.kube.draingest import DraIngest

DRIVER = "gpu.example.com"


def _slice(node: str, devices: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-gpus"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1},
            "devices": [{"name": f"gpu-{i}"} for i in range(devices)],
        },
    }


def _claim(allocated: list[str] | None = None) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "metadata": {"name": "c", "namespace": "default", "uid": "claim-uid"},
        "spec": {
            "devices": {
                "requests": [{"name": "r", "exactly": {"deviceClassName": "gpu", "count": 2}}]
            }
        },
    }
    if allocated is not None:
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": DRIVER, "pool": "n", "device": d}
                        for d in allocated
                    ]
                }
            }
        }
    return claim


POD = {
    "metadata": {"name": "p", "namespace": "default", "uid": "pod-uid"},
    "spec": {"resourceClaims": [{"name": "g", "resourceClaimName": "c"}]},
}


def _ingest() -> DraIngest:
    dra = DraIngest()
    selectors = [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
    dra.changed(
        "deviceclasses", "ADDED", {"metadata": {"name": "gpu"}, "spec": {"selectors": selectors}}
    )
    return dra


def test_a_slice_tells_its_node_again_and_a_waiting_pod_is_tried_when_its_claim_comes() -> None:
    dra = _ingest()
    node = dra.node(NodeSpec(name="n", allocatable={"cpu": 8000}))
    assert node.devices == ()
    assert dra.changed("resourceslices", "ADDED", _slice("n", 4)) == (["n"], [])
    assert len(dra.node(dra.base["n"]).devices) == 4
    spec = PodSpec(namespace="default", name="p", uid="pod-uid")
    assert dra.pod("default/p", spec, POD, bound=False) is None
    assert list(dra.waiting) == ["default/p"]
    assert dra.changed("resourceclaims", "ADDED", _claim()) == ([], ["default/p"])
    found = dra.pod("default/p", spec, POD, bound=False)
    assert found is not None and found.requests == {"nvidia.com/gpu": 2}
    assert not dra.waiting
    assert dra.changed("resourceslices", "DELETED", _slice("n", 4))[0] == ["n"]
    assert dra.node(dra.base["n"]).devices == ()


def test_a_pod_bound_by_another_scheduler_holds_the_devices_its_claim_was_allocated() -> None:
    dra = _ingest()
    dra.changed("resourceslices", "ADDED", _slice("n", 4))
    node = dra.node(NodeSpec(name="n", allocatable={"cpu": 8000}))
    dra.changed("resourceclaims", "ADDED", _claim(["gpu-3", "gpu-1"]))
    spec = dra.pod("default/p", PodSpec(namespace="default", name="p"), POD, bound=True)
    assert spec is not None
    seen = PodBound(pod="default/p", node="n", decision_id="observed:x", attempt=0)
    assert dra.observed(seen, spec, node).devices == (1, 3)
    # an allocation that names another node's devices is not trusted: the engine
    # charges the cards with the most room
    dra.changed("resourceclaims", "MODIFIED", _claim(["gpu-9", "gpu-1"]))
    spec = dra.pod("default/p", PodSpec(namespace="default", name="p"), POD, bound=True)
    assert spec is not None and dra.observed(seen, spec, node).devices == ()
