"""The binder's part of DRA: a pod's claims allocated and reserved before it is bound.

What kube-scheduler's DynamicResources plugin does in PreBind, for a ``PodBound`` whose
pod has DRA claims (:attr:`PodSpec.claims`): for each claim, one update of its
``status`` subresource (optimistic, on the ``resourceVersion`` read) that writes

- ``status.allocation.devices.results``: one ``{request, driver, pool, device}`` per
  card, the devices the engine gave the pod (:func:`engine.model.dra.claim_results`:
  the node's devices, as ingest recorded them from its ResourceSlices);
- ``status.allocation.devices.config``: the configuration of the requests' DeviceClasses
  (``source: FromClass``) then the claim's own (``FromClaim``), as the scheduler copies
  them for the driver;
- ``status.allocation.nodeSelector``: the node (``matchFields`` on ``metadata.name``);
- ``status.reservedFor``: the pod (``resource: pods``, name, uid).

Only then is the pod bound, so a pod never runs without its devices. A claim that is
reserved for another pod, or that is no longer the object the pod's spec named (another
uid), fails the binding (``BindFailed``): the engine decides again. A claim already
allocated and reserved for this pod alone is allocated again as decided (a binding
tried twice, or a decision made again after a failed binding). The claims are left
allocated if the binding then fails: the next decision for the pod overwrites them,
and the resourceclaim controller releases them when the pod is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from engine.model.dra import DeviceMismatch, claim_results
from events.types import (
    ClaimRequest,
    DeviceRef,
    Event,
    NodeAdded,
    NodeRemoved,
    NodeSpec,
    NodeUpdated,
    PodAdopted,
    PodBound,
    PodDeleted,
    PodFailed,
    PodRouted,
    PodSpec,
    PodSubmitted,
    PodSucceeded,
    ReservationRequested,
)
from shards.kube.client import api_message

log = logging.getLogger(__name__)

JSON = dict[str, Any]
T = TypeVar("T")
Retry = Callable[[Callable[[], Awaitable[T]]], Awaitable[T]]
CONFLICT_TRIES = 3


class DraAllocator:
    def __init__(self, api: ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.nodes: dict[str, NodeSpec] = {}
        """Nodes with DRA devices, as the log last told them."""
        self.pods: dict[str, PodSpec] = {}
        """Live pods with DRA claims."""
        self.allocated = 0

    def __repr__(self) -> str:
        return f"DraAllocator(nodes={len(self.nodes)}, pods={len(self.pods)})"

    def learn(self, event: Event) -> None:
        """Keep the nodes' devices and the pods' claims from the records that bring them."""
        match event:
            case NodeAdded(node=node) | NodeUpdated(node=node):
                if node.devices:
                    self.nodes[node.name] = node
                else:
                    self.nodes.pop(node.name, None)
            case NodeRemoved(name=name):
                self.nodes.pop(name, None)
            case PodSubmitted(pod=spec) | PodRouted(pod=spec):
                self._pod(spec)
            case PodAdopted(placement=placement):
                self._pod(placement.pod)
            case ReservationRequested(pods=specs):
                for spec in specs:
                    self._pod(spec)
            case PodDeleted(pod=key) | PodSucceeded(pod=key) | PodFailed(pod=key):
                self.pods.pop(key, None)
            case _:
                pass

    def _pod(self, spec: PodSpec) -> None:
        if spec.claims:
            self.pods[spec.key] = spec

    async def allocate(self, event: PodBound, uid: str | None, retry: Retry[Any]) -> str | None:
        """Allocate and reserve the claims of ``event``'s pod (none: nothing to do);
        None when done, else why not (the binding then fails). ``retry`` runs an API
        call with the binder's back-off."""
        pod = self.pods.get(event.pod)
        if pod is None:
            return None
        node = self.nodes.get(event.node)
        if node is None:
            return f"node {event.node} has no DRA devices known"
        if not uid:
            return "the pod's uid is not known: its claims cannot be reserved for it"
        try:
            results = claim_results(pod, node, event.devices)
        except DeviceMismatch as exc:
            return str(exc)
        by_claim: dict[str, list[tuple[ClaimRequest, DeviceRef]]] = {}
        for request, device in results:
            by_claim.setdefault(request.claim, []).append((request, device))
        for name, allocated in by_claim.items():
            why = await self._claim(pod, name, allocated, event.node, uid, retry)
            if why is not None:
                return f"ResourceClaim {pod.namespace}/{name}: {why}"
        self.allocated += len(by_claim)
        return None

    async def _claim(
        self,
        pod: PodSpec,
        name: str,
        allocated: list[tuple[ClaimRequest, DeviceRef]],
        node: str,
        uid: str,
        retry: Retry[Any],
    ) -> str | None:
        for _ in range(CONFLICT_TRIES):
            try:
                claim = await retry(lambda: self._read(pod.namespace, name))
            except ApiException as exc:
                return f"cannot be read: {exc.status} {exc.reason}"
            meta = claim.get("metadata") or {}
            expected = allocated[0][0].uid
            if expected and meta.get("uid") != expected:
                return "is another object than the one the pod named (deleted and created again)"
            status = claim.get("status") or {}
            reserved = [r for r in status.get("reservedFor") or () if isinstance(r, dict)]
            if any(r.get("uid") != uid for r in reserved):
                return "is reserved for another pod"
            try:
                config = await self._config(claim, allocated, retry)
            except ApiException as exc:
                return f"its DeviceClass cannot be read: {exc.status} {exc.reason}"
            claim["status"] = {
                **status,
                "allocation": _allocation(allocated, config, node),
                "reservedFor": [{"resource": "pods", "name": pod.name, "uid": uid}],
            }
            try:
                await retry(lambda: self._write(pod.namespace, name, claim))  # noqa: B023
            except ApiException as exc:
                if exc.status == 409:
                    continue  # changed since it was read: read it again
                return f"status not written: {exc.status} {exc.reason}: {api_message(exc)}"[:1000]
            return None
        return f"changed under every one of {CONFLICT_TRIES} updates"

    async def _read(self, namespace: str, name: str) -> JSON:
        found: JSON = await self.custom.get_namespaced_custom_object(
            "resource.k8s.io", "v1", namespace, "resourceclaims", name
        )
        return found

    async def _write(self, namespace: str, name: str, claim: JSON) -> JSON:
        written: JSON = await self.custom.replace_namespaced_custom_object_status(
            "resource.k8s.io", "v1", namespace, "resourceclaims", name, claim
        )
        return written

    async def _class(self, name: str) -> JSON:
        found: JSON = await self.custom.get_cluster_custom_object(
            "resource.k8s.io", "v1", "deviceclasses", name
        )
        return found

    async def _config(
        self, claim: JSON, allocated: list[tuple[ClaimRequest, DeviceRef]], retry: Retry[Any]
    ) -> list[JSON]:
        """The configuration the driver is given: the classes' then the claim's."""
        requests = {request.request for request, _ in allocated}
        devices = (claim.get("spec") or {}).get("devices") or {}
        classes: dict[str, list[str]] = {}
        for request in devices.get("requests") or ():
            exactly = request.get("exactly") or {}
            if request.get("name") in requests and exactly.get("deviceClassName"):
                classes.setdefault(exactly["deviceClassName"], []).append(request["name"])
        out: list[JSON] = []
        for class_name, names in sorted(classes.items()):
            found: JSON = await retry(lambda: self._class(class_name))  # noqa: B023 (awaited here)
            for entry in (found.get("spec") or {}).get("config") or ():
                out.append({"source": "FromClass", "requests": names, **entry})
        for entry in devices.get("config") or ():
            out.append({"source": "FromClaim", **entry})
        return out


def _allocation(
    allocated: list[tuple[ClaimRequest, DeviceRef]], config: list[JSON], node: str
) -> JSON:
    devices: JSON = {
        "results": [
            {"request": r.request, "driver": d.driver, "pool": d.pool, "device": d.device}
            for r, d in allocated
        ]
    }
    if config:
        devices["config"] = config
    return {
        "devices": devices,
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }
