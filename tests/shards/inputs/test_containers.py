"""A pod's containers as the API server counts them: effective requests (init
containers and native sidecars included), host ports, and the fields read but not
acted on (a warning each)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.errors import InputError
from events.types import HostPort
from shards.inputs.containers import host_ports, pod_requests
from shards.inputs.objects import pod_spec
from shards.inputs.podfields import unused_fields

GI = 1 << 30


def c(cpu: str | None = None, memory: str | None = None, **extra: Any) -> dict[str, Any]:
    """A container requesting ``cpu``/``memory``; ``extra`` goes into the container."""
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"name": "c", "resources": {"requests": requests}, **extra}


def sidecar(cpu: str | None = None, memory: str | None = None) -> dict[str, Any]:
    return c(cpu, memory, restartPolicy="Always")


REQUEST_TABLE: list[tuple[str, dict[str, Any], dict[str, int]]] = [
    (
        "containers add up",
        {"containers": [c("1", "1Gi"), c("500m", "2Gi")]},
        # cpu 1000 + 500; memory 1Gi + 2Gi
        {"cpu": 1500, "memory": 3 * GI},
    ),
    (
        "the largest init container wins over a smaller sum",
        {"initContainers": [c("3"), c("2")], "containers": [c("1"), c("1")]},
        # max(1 + 1, 3, 2) = 3
        {"cpu": 3000},
    ),
    (
        "a sidecar runs beside the containers",
        {"initContainers": [sidecar("1")], "containers": [c("1")]},
        # long-running: 1 + 1 = 2; init step of the sidecar: 1 (itself) → 2
        {"cpu": 2000},
    ),
    (
        "the issue's case: a sidecar and a container of 1 cpu each, an init of 1",
        {"initContainers": [sidecar("1"), c("1")], "containers": [c("1")]},
        # long-running: 1 + 1 = 2; init after the sidecar: 1 + 1 = 2 → 2 per pod,
        # so two such pods need 4 cpu (a 3-cpu node holds one)
        {"cpu": 2000},
    ),
    (
        "an init container after sidecars runs beside them",
        {"initContainers": [sidecar("1"), sidecar("1"), c("4")], "containers": [c("1")]},
        # long-running: 1 + 1 + 1 = 3; init step: 4 + (1 + 1) = 6 → 6
        {"cpu": 6000},
    ),
    (
        "an init container before the sidecars runs alone",
        {"initContainers": [c("4"), sidecar("1"), sidecar("1")], "containers": [c("1")]},
        # init step: 4 (no sidecar yet); sidecar steps: 1, 2; long-running: 1 + 2 = 3 → 4
        {"cpu": 4000},
    ),
    (
        "per resource: cpu from one step, memory from another",
        {
            "initContainers": [c("2", "1Gi"), sidecar("1", "1Gi"), c("1", "4Gi")],
            "containers": [c("1", "1Gi")],
        },
        # cpu: init 2, sidecar 1, init 1 + 1 = 2, long-running 1 + 1 = 2 → 2
        # memory: init 1, sidecar 1, init 4 + 1 = 5, long-running 1 + 1 = 2 → 5Gi
        {"cpu": 2000, "memory": 5 * GI},
    ),
    (
        "overhead is added last",
        {
            "initContainers": [sidecar("1")],
            "containers": [c("1")],
            "overhead": {"cpu": "100m"},
        },
        # max(1 + 1, 1) + 0.1
        {"cpu": 2100},
    ),
    (
        "a limit stands for a missing request, init containers included",
        {
            "initContainers": [{"name": "i", "resources": {"limits": {"cpu": "5"}}}],
            "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        },
        # cpu: max(0, 5); gpu: its limit
        {"cpu": 5000, "nvidia.com/gpu": 2},
    ),
]


@pytest.mark.parametrize(
    ("spec", "expected"), [t[1:] for t in REQUEST_TABLE], ids=[t[0] for t in REQUEST_TABLE]
)
def test_requests_follow_the_api_server(spec: dict[str, Any], expected: dict[str, int]) -> None:
    assert pod_requests(spec) == expected


def _upstream(inits: list[tuple[int, bool]], containers: list[int], overhead: int) -> int:
    """kube's PodRequests for one resource, written as upstream loops over it."""
    reqs = sum(containers)
    restartable = 0
    init_max = 0
    for amount, is_sidecar in inits:
        if is_sidecar:
            reqs += amount
            restartable += amount
            step = restartable
        else:
            step = amount + restartable
        init_max = max(init_max, step)
    return max(reqs, init_max) + overhead


@given(
    inits=st.lists(st.tuples(st.integers(0, 4000), st.booleans()), max_size=6),
    containers=st.lists(st.integers(0, 4000), min_size=1, max_size=4),
    overhead=st.integers(0, 500),
)
def test_requests_match_upstream_for_any_order(
    inits: list[tuple[int, bool]], containers: list[int], overhead: int
) -> None:
    spec = {
        "initContainers": [sidecar(f"{m}m") if s else c(f"{m}m") for m, s in inits],
        "containers": [c(f"{m}m") for m in containers],
        "overhead": {"cpu": f"{overhead}m"},
    }
    assert pod_requests(spec).get("cpu", 0) == _upstream(inits, containers, overhead)


def test_an_init_container_restart_policy_other_than_always_is_refused() -> None:
    spec = {"initContainers": [c("1", restartPolicy="OnFailure")], "containers": [c("1")]}
    with pytest.raises(InputError) as info:
        pod_requests(spec)
    assert info.value.location == "spec.initContainers[0].restartPolicy"


def _port(host: int = 0, container: int = 80, **extra: Any) -> dict[str, Any]:
    port: dict[str, Any] = {"containerPort": container, **extra}
    if host:
        port["hostPort"] = host
    return port


def test_host_ports_of_containers_and_sidecars() -> None:
    spec = {
        "containers": [
            c(ports=[_port(8080), _port(), _port(53, protocol="UDP", hostIP="10.0.0.1")])
        ],
        "initContainers": [c(restartPolicy="Always", ports=[_port(9090)])],
    }
    assert host_ports(spec, "default/p") == (
        HostPort(port=8080),
        HostPort(port=9090),
        HostPort(port=53, protocol="UDP", ip="10.0.0.1"),
    )


def test_host_network_makes_every_container_port_a_host_port() -> None:
    spec = {"hostNetwork": True, "containers": [c(ports=[_port(container=8443)])]}
    assert host_ports(spec, "default/p") == (HostPort(port=8443),)


def test_plain_init_container_host_ports_are_not_counted_and_say_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = {"initContainers": [c(ports=[_port(8080)])], "containers": [c()]}
    with caplog.at_level(logging.WARNING):
        assert host_ports(spec, "ml/p") == ()
    assert "ml/p" in caplog.text and "spec.initContainers[0].ports" in caplog.text


@pytest.mark.parametrize(
    ("ports", "message", "location"),
    [
        ([_port(70000)], "port number", "spec.containers[0].ports[0].hostPort"),
        ([{"hostPort": 80}], "port number", "spec.containers[0].ports[0].containerPort"),
        ([_port(80, protocol="HTTP")], "unknown protocol", "spec.containers[0].ports[0].protocol"),
        ([_port(80, container=0)], "port number 1..", "spec.containers[0].ports[0].containerPort"),
        ([_port(80, hostIP="10.0.0.300")], "IP address", "spec.containers[0].ports[0].hostIP"),
        ([_port(80), _port(80, container=81)], "also bound", "spec.containers[0].ports"),
        (["80"], "mapping", "spec.containers[0].ports[0]"),
    ],
)
def test_bad_ports_name_the_field(ports: list[Any], message: str, location: str) -> None:
    with pytest.raises(InputError) as info:
        host_ports({"containers": [c(ports=ports)]}, "default/p")
    assert message in info.value.message
    assert info.value.location == location


def test_pod_level_resources_are_not_silently_ignored() -> None:
    obj = {
        "metadata": {"name": "p"},
        "spec": {"resources": {"requests": {"cpu": "8"}}, "containers": [c("1")]},
    }
    spec = pod_spec(obj)
    assert spec.requests == {"cpu": 1000}
    assert [f for f, _ in unused_fields(obj["spec"])] == ["spec.resources"]
