"""A pod's containers as the API server and kube-scheduler count them: effective
resource requests (init containers and native sidecars included) and the host ports
the pod binds on its node."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from typing import Any, Final

from engine.model.devices import GpuRequestError, gpu_request
from events.errors import InputError
from events.types import HostPort
from shards.inputs.fields import _list, _map, _str, quantities
from shards.inputs.limits import MAX_QUANTITY, shown
from shards.inputs.quantity import format_quantity

PROTOCOLS: Final = ("TCP", "UDP", "SCTP")
ALL_ADDRESSES: Final = "0.0.0.0"

log = logging.getLogger(__name__)


def _container_requests(container: Mapping[str, Any], where: str) -> dict[str, int]:
    resources = _map(container.get("resources"), f"{where}.resources")
    limits = quantities(resources.get("limits"), f"{where}.resources.limits")
    requests = quantities(resources.get("requests"), f"{where}.resources.requests")
    # API defaulting: a resource with a limit but no request requests its limit.
    for resource, amount in limits.items():
        requests.setdefault(resource, amount)
        if requests[resource] > amount:
            raise InputError(
                f"request of {resource} exceeds its limit",
                location=f"{where}.resources.requests.{resource}",
            )
    return requests


def _add(total: dict[str, int], amounts: Mapping[str, int]) -> None:
    for resource, amount in amounts.items():
        total[resource] = total.get(resource, 0) + amount


def _is_sidecar(init: Mapping[str, Any], where: str) -> bool:
    """A restartable init container (``restartPolicy: Always``): a native sidecar."""
    policy = init.get("restartPolicy")
    if policy is None:
        return False
    if policy != "Always":
        raise InputError(
            f"an init container's restartPolicy can only be Always, got {shown(policy)}",
            location=f"{where}.restartPolicy",
        )
    return True


def pod_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """Effective requests, as the API server and kube-scheduler compute them
    (``PodRequests`` of k8s.io/component-helpers/resource), native sidecars included:

    - the long-running part: the sum of the containers and of every sidecar (an init
      container with ``restartPolicy: Always``, which keeps running beside them);
    - init container ``i``, in order: its own requests plus those of the sidecars
      started before it (they still run while it does); a sidecar's own step counts
      the sidecars up to and including itself;
    - per resource, the larger of the long-running part and every init step, plus
      ``spec.overhead``.

    A container's limit stands for its request where it states none (API defaulting),
    for init containers as for the others.
    """
    containers = _list(spec.get("containers"), "spec.containers")
    if not containers:
        raise InputError("a pod needs at least one container", location="spec.containers")
    total: dict[str, int] = {}
    for i, raw in enumerate(containers):
        container = _map(raw, f"spec.containers[{i}]", required=True)
        _add(total, _container_requests(container, f"spec.containers[{i}]"))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for i, raw in enumerate(_list(spec.get("initContainers"), "spec.initContainers")):
        where = f"spec.initContainers[{i}]"
        init = _map(raw, where, required=True)
        requests = _container_requests(init, where)
        if _is_sidecar(init, where):
            _add(total, requests)
            _add(sidecars, requests)
            step = dict(sidecars)
        else:
            step = dict(requests)
            _add(step, sidecars)
        for resource, amount in step.items():
            init_peak[resource] = max(init_peak.get(resource, 0), amount)
    for resource, amount in init_peak.items():
        total[resource] = max(total.get(resource, 0), amount)
    _add(total, quantities(spec.get("overhead"), "spec.overhead"))
    for resource, amount in sorted(total.items()):
        if amount > MAX_QUANTITY:
            raise InputError(
                f"the pod requests more than {format_quantity(resource, MAX_QUANTITY)} "
                f"of {resource} in all",
                location="spec.containers",
            )
    try:
        gpu_request(total)
    except GpuRequestError as exc:
        raise InputError(str(exc), location=f"spec.containers resources {exc.resource}") from None
    return total


def _port_number(value: Any, where: str, *, lowest: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lowest <= value <= 65535:
        raise InputError(
            f"must be a port number {lowest}..65535, got {shown(value)}", location=where
        )
    return value


def _address(value: Any, where: str) -> str:
    """``hostIP``: an IP address (absent or empty: ``0.0.0.0``, every address)."""
    text = _str(value, where, default="")
    if not text:
        return ALL_ADDRESSES
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise InputError(f"must be an IP address, got {shown(text)}", location=where) from None
    return text


def _container_host_ports(
    container: Mapping[str, Any], where: str, host_network: bool
) -> list[HostPort]:
    out = []
    for j, raw in enumerate(_list(container.get("ports"), f"{where}.ports")):
        loc = f"{where}.ports[{j}]"
        item = _map(raw, loc, required=True)
        container_port = _port_number(item.get("containerPort"), f"{loc}.containerPort", lowest=1)
        host_port = _port_number(item.get("hostPort", 0), f"{loc}.hostPort", lowest=0)
        if host_network and host_port == 0:
            host_port = container_port  # API defaulting under hostNetwork
        protocol = _str(item.get("protocol"), f"{loc}.protocol", default="TCP")
        if protocol not in PROTOCOLS:
            raise InputError(
                f"unknown protocol {shown(protocol)} (one of {', '.join(PROTOCOLS)})",
                location=f"{loc}.protocol",
            )
        ip = _address(item.get("hostIP"), f"{loc}.hostIP")
        if host_port > 0:
            out.append(HostPort(port=host_port, protocol=protocol, ip=ip))
    return out


def host_ports(spec: Mapping[str, Any], pod: str) -> tuple[HostPort, ...]:
    """The host ports a pod binds on its node, sorted: those of its containers and of
    its sidecars (as kube-scheduler's NodePorts counts them since
    kubernetes/kubernetes#132040; under
    ``hostNetwork`` every container port is a host port). Plain init containers' host
    ports are bound by no one (the kubelet does not either): they are not counted, and
    a warning says so. A port stated twice for one protocol and address is refused, as
    the API server refuses it."""
    host_network = spec.get("hostNetwork", False)
    if not isinstance(host_network, bool):
        raise InputError("must be true or false", location="spec.hostNetwork")
    found: dict[tuple[str, str, int], str] = {}
    for field, sidecars_only in (("containers", False), ("initContainers", True)):
        for i, raw in enumerate(_list(spec.get(field), f"spec.{field}")):
            where = f"spec.{field}[{i}]"
            container = _map(raw, where, required=True)
            ports = _container_host_ports(container, where, host_network)
            if sidecars_only and not _is_sidecar(container, where):
                if ports:
                    log.warning(
                        "pod %s: %s.ports binds host ports in an init container: "
                        "not acted on (neither kube-scheduler nor the kubelet reserves them)",
                        pod,
                        where,
                    )
                continue
            for port in ports:
                key = (port.protocol, port.ip, port.port)
                if key in found:
                    raise InputError(
                        f"host port {port.protocol}/{port.ip}/{port.port} is also bound "
                        f"by {found[key]}",
                        location=f"{where}.ports",
                    )
                found[key] = where
    return tuple(
        HostPort(port=port, protocol=protocol, ip=ip) for protocol, ip, port in sorted(found)
    )
