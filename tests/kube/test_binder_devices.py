"""The binder writes each pod's GPU cards where its convention's device plugin reads
them, as the annotations of its Binding (the API server copies them onto the pod);
against the in-repo API server and a real kube-apiserver."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.model.devices import GpuRequest, gpu_request
from events.memory import MemoryLog
from events.types import BindFailed, Envelope, NodeAdded, NodeSpec, PodBound, PodSpec, PodSubmitted
from shards.kube.binder import KubeBinder
from shards.kube.devices import cards_of, device_annotations, hami_uuids
from tests.kube.apiserver import FakeApiServer
from tests.kube.test_ingest import pod

GI = 1 << 30


def _gpu(requests: dict[str, int]) -> GpuRequest:
    gpu = gpu_request(requests)
    assert gpu is not None
    return gpu


def test_koordinator_reads_minor_and_shares_per_card() -> None:
    gpu = _gpu({"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 25})
    # 25% of a 40,960 MiB card is 10,240 MiB
    out, warning = device_annotations(gpu, (3,), "n1", card_mib=40960)
    assert warning is None
    assert out["shoal.io/gpu-devices"] == "3"
    assert json.loads(out["scheduling.koordinator.sh/device-allocated"]) == {
        "gpu": [
            {
                "minor": 3,
                "resources": {
                    "koordinator.sh/gpu-core": "50",
                    "koordinator.sh/gpu-memory-ratio": "25",
                    "koordinator.sh/gpu-memory": "10240Mi",
                },
            }
        ]
    }
    whole = _gpu({"koordinator.sh/gpu-core": 200})
    out, _ = device_annotations(whole, (0, 1), "n1")
    cards = json.loads(out["scheduling.koordinator.sh/device-allocated"])["gpu"]
    assert [c["minor"] for c in cards] == [0, 1]
    assert all(c["resources"]["koordinator.sh/gpu-core"] == "100" for c in cards)


def test_hami_names_cards_by_the_uuids_its_plugin_registered() -> None:
    register = "GPU-aaa,10,32768,100,NVIDIA-V100,0,true:GPU-bbb,10,32768,100,NVIDIA-V100,0,true:"
    assert hami_uuids({"hami.io/node-nvidia-register": register}) == ["GPU-aaa", "GPU-bbb"]
    gpu = _gpu({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30, "nvidia.com/gpumem": 4000})
    out, warning = device_annotations(
        gpu, (1,), "n1", 32768, {"hami.io/node-nvidia-register": register}
    )
    assert warning is None
    assert out["hami.io/vgpu-devices-to-allocate"] == "GPU-bbb,NVIDIA,4000,30:;"
    assert out["hami.io/vgpu-devices-allocated"] == out["hami.io/vgpu-devices-to-allocate"]
    assert out["hami.io/vgpu-node"] == "n1"
    unregistered, warning = device_annotations(gpu, (1,), "n2", 32768, {})
    assert warning is not None and "hami.io/node-nvidia-register" in warning
    assert unregistered["hami.io/vgpu-devices-to-allocate"] == "GPU-1,NVIDIA,4000,30:;"


def _gpu_pod(name: str, requests: dict[str, str]) -> dict[str, Any]:
    body = pod(name)
    body["spec"]["containers"][0]["resources"] = {"limits": requests}
    return body


def decision(event: Any) -> Envelope:
    return Envelope(event=event, producer="shard-0")


@pytest.mark.real_kube
async def test_the_binder_writes_the_cards_then_binds(apiserver: FakeApiServer, api: Any) -> None:
    """Three conventions in one cluster: each pod carries its cards under shoal's
    annotation and, for Koordinator and HAMi, under theirs, and is bound."""
    register = "GPU-x0,10,40960,100,NVIDIA-A100,0,true:GPU-x1,10,40960,100,NVIDIA-A100,0,true:"
    node = NodeSpec(
        name="n1",
        allocatable={"cpu": 64000, "nvidia.com/gpu": 2},
        labels={"nvidia.com/gpu.memory": "40960"},
        annotations={"hami.io/node-nvidia-register": register},
    )
    specs = {
        "whole": {"nvidia.com/gpu": 2},
        "koord": {"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50},
        "hami": {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 20, "nvidia.com/gpumem": 1024},
    }
    for name, requests in specs.items():
        apiserver.put("Pod", _gpu_pod(name, {k: str(v) for k, v in requests.items()}))
    log = MemoryLog()
    binder = KubeBinder(api, log, initial_backoff=0.01)
    events: list[Envelope] = [decision(NodeAdded(node=node))]
    for name, requests in specs.items():
        spec = PodSpec(namespace="default", name=name, requests=requests)
        events.append(decision(PodSubmitted(pod=spec)))
    devices = {"whole": (0, 1), "koord": (1,), "hami": (0,)}
    for i, (name, cards) in enumerate(devices.items()):
        events.append(
            decision(
                PodBound(
                    pod=f"default/{name}", node="n1", decision_id=f"d{i}", attempt=1, devices=cards
                )
            )
        )
    await log.append(events)
    assert await binder.poll() == 0
    got = {name: apiserver.get("Pod", name, "default") for name in specs}
    for name, cards in devices.items():
        assert got[name]["spec"]["nodeName"] == "n1"
        annotations = got[name]["metadata"]["annotations"]
        assert annotations["shoal.io/gpu-devices"] == ",".join(map(str, cards))
    koord = json.loads(
        got["koord"]["metadata"]["annotations"]["scheduling.koordinator.sh/device-allocated"]
    )
    assert koord["gpu"][0]["minor"] == 1
    assert koord["gpu"][0]["resources"]["koordinator.sh/gpu-memory"] == "20480Mi"
    hami = got["hami"]["metadata"]["annotations"]
    assert hami["hami.io/vgpu-devices-to-allocate"] == "GPU-x0,NVIDIA,1024,20:;"
    assert binder.counters["devices_written"] == 3
    if isinstance(apiserver, FakeApiServer):  # (the real one keeps no list of requests)
        assert not [r for r in apiserver.requests if r[0] in ("PATCH", "PUT") and "/pods/" in r[1]]


@pytest.mark.real_kube
async def test_a_pod_whose_binding_is_refused_gets_no_cards(
    apiserver: FakeApiServer, api: Any
) -> None:
    """The cards and the node are one write: a pod some other scheduler bound first
    keeps its own annotations, and the decision fails."""
    taken = _gpu_pod("taken", {"nvidia.com/gpu": "1"})
    taken["spec"]["nodeName"] = "n2"
    apiserver.put("Pod", taken)
    log = MemoryLog()
    binder = KubeBinder(api, log, initial_backoff=0.01, max_attempts=2)
    spec = PodSpec(namespace="default", name="taken", requests={"nvidia.com/gpu": 1})
    await log.append(
        [
            decision(PodSubmitted(pod=spec)),
            decision(
                PodBound(pod="default/taken", node="n1", decision_id="d", attempt=1, devices=(0,))
            ),
        ]
    )
    assert await binder.poll() == 1
    failed = [e.event for e in log._parts[0] if isinstance(e.event, BindFailed)]
    assert len(failed) == 1 and "409" in failed[0].reason
    found = apiserver.get("Pod", "taken", "default")
    assert found["spec"]["nodeName"] == "n2"
    assert "shoal.io/gpu-devices" not in (found["metadata"].get("annotations") or {})
    assert binder.counters["devices_written"] == 0


@pytest.mark.parametrize(
    ("annotations", "cards"),
    [
        ({"shoal.io/gpu-devices": "3,1"}, (1, 3)),
        ({"scheduling.koordinator.sh/device-allocated": '{"gpu":[{"minor":2}]}'}, (2,)),
        ({"shoal.io/gpu-devices": "x"}, ()),
        ({"scheduling.koordinator.sh/device-allocated": "{"}, ()),
        ({"scheduling.koordinator.sh/device-allocated": '{"gpu":[{"minor":-1}]}'}, ()),
        ({}, ()),
    ],
)
def test_a_bound_pod_found_in_the_cluster_keeps_the_cards_it_holds(
    annotations: dict[str, str], cards: tuple[int, ...]
) -> None:
    """What ingest reports for a pod bound before shoal saw it (or before a restart):
    the cards its annotations name, or none when they name none it can read."""
    assert cards_of(annotations) == cards
