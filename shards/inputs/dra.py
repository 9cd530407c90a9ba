"""DRA objects (``resource.k8s.io/v1``) → cards of nodes and whole-card requests of pods.

**Scope.** shoal allocates GPUs published through dynamic resource allocation as
whole cards, on the card model of :mod:`engine.model.cards` (the rule is in
:mod:`engine.model.dra`):

- ``ResourceSlice``: the devices of a slice with ``spec.nodeName`` are cards of that
  node, all of one driver per node (a node with devices of two drivers is refused).
  Only the slices of a pool's newest ``spec.pool.generation`` count, as kube-scheduler
  counts them. The cards are the devices sorted by (pool, device name); the node's
  ``nvidia.com/gpu`` is their number. Slices that are not per node (``nodeSelector``,
  ``allNodes``, ``perDeviceNodeSelection``) or that use partitionable devices
  (``sharedCounters``, ``consumesCounters``), device taints, binding conditions or
  shared allocation are refused. Device ``capacity`` is not read (a card is taken
  whole).
- ``DeviceClass``: its CEL selectors must name one driver (``device.driver == "x"``)
  and may add attribute equalities; ``config`` is copied into the allocation (serve).
- ``ResourceClaim`` and ``ResourceClaimTemplate``: each ``spec.devices.requests[]``
  must be ``exactly``, with a ``deviceClassName``, optional ``selectors``, and
  ``allocationMode: ExactCount`` (the default) with a ``count`` (default 1), or
  ``allocationMode: All``. All is every device of the node whose devices match: the
  nodes it matches must all have the same number of devices (a pool of nodes of one
  size; else it is refused), and the pod asks for that many, on nodes of that many
  (label ``dra.shoal.io/devices``); All must be the pod's only DRA request.
  ``firstAvailable``, ``adminAccess``, ``tolerations``, ``capacity`` and
  ``constraints`` are refused, naming the field. A claim serves one pod: a claim
  another pod already uses is refused.
- **CEL selectors.** Accepted: ``device.driver == "x"`` and attribute equality,
  ``device.attributes["domain"].name == <string, int or bool>`` (or
  ``...["domain"]["name"]``), joined by ``&&``. Anything else is refused with the
  expression named; never ignored. An attribute equality is honoured *per node*: each
  attribute whose value is the same on every device of a node becomes a label of that
  node (``dra.shoal.io/<domain>/<name>``, typed: ``s:H100``, ``i:80``, ``b:true``,
  ``v:1.2.0``), and a pod's selectors become its ``nodeSelector`` on those labels, with
  ``dra.shoal.io/driver`` for the driver. So a request is given devices of nodes whose
  every device matches it: exact on the usual nodes of one GPU model, conservative on a
  node that mixes models (a selector on the attribute that differs matches none of it).
- **Pods**: ``spec.resourceClaims[]`` with ``resourceClaimName`` (the claim in the
  pod's namespace) or ``resourceClaimTemplateName``. A pod with claims asks for the
  sum of their counts as ``nvidia.com/gpu`` whole cards and must not also ask for
  ``nvidia.com/gpu`` or a GPU share through its containers. In a scenario a template
  is instantiated per pod as the resourceclaim controller would (the claim named
  ``<pod>-<entry>``); in ``serve`` the controller does it, and shoal reads the claim's
  name from the pod's ``status.resourceClaimStatuses`` (a pod waits until it is there).

A scenario's slices are there from the start, with their node (``shoal.io/arrive-at``
is not read on DRA objects).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from engine.model.devices import CARDS_LABEL, GPU, MAX_NODE_CARDS, SHARE_RESOURCES
from events.errors import InputError
from events.types import ClaimRequest, DeviceRef, NodeSpec, PodSpec
from shards.inputs.draobjects import (
    ALL,
    ATTRIBUTE_PREFIX,
    DEVICES_LABEL,
    DRIVER_LABEL,
    KINDS,
    MAX_COUNT,
    ClaimPending,
    ClaimSpec,
    RequestSpec,
    Selection,
    SliceSpec,
    claim_template,
    device_class,
    merge,
    resource_claim,
    resource_slice,
)
from shards.inputs.fields import _list, _map, _str

__all__ = ["DRIVER_LABEL", "KINDS", "ClaimPending", "DraCatalog"]


@dataclass
class DraCatalog:
    """The DRA objects known (a scenario's, or what ``serve`` watches)."""

    classes: dict[str, Selection] = field(default_factory=dict)
    slices: dict[str, SliceSpec] = field(default_factory=dict)
    claims: dict[tuple[str, str], ClaimSpec] = field(default_factory=dict)
    templates: dict[tuple[str, str], tuple[RequestSpec, ...]] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (
            f"DraCatalog(classes={len(self.classes)}, slices={len(self.slices)}, "
            f"claims={len(self.claims)})"
        )

    def add(self, obj: Mapping[str, Any]) -> None:
        """Keep a DRA object (raises :class:`InputError` for one out of scope)."""
        kind = obj.get("kind")
        if kind == "DeviceClass":
            name, selection = device_class(obj)
            self.classes[name] = selection
        elif kind == "ResourceSlice":
            spec = resource_slice(obj)
            self.slices[spec.name] = spec
        elif kind == "ResourceClaim":
            claim = resource_claim(obj)
            self.claims[claim.namespace, claim.name] = claim
        elif kind == "ResourceClaimTemplate":
            name, namespace, requests = claim_template(obj)
            self.templates[namespace, name] = requests

    def nodes(self) -> set[str]:
        return {s.node for s in self.slices.values()}

    def _devices(
        self, node: str, mine: list[SliceSpec] | None = None
    ) -> list[tuple[DeviceRef, tuple[tuple[str, str], ...]]]:
        """The devices of ``node`` (from ``mine``, its slices, where given), sorted."""
        newest: dict[tuple[str, str], int] = {}
        if mine is None:
            mine = [s for s in self.slices.values() if s.node == node]
        for s in mine:
            key = (s.driver, s.pool)
            newest[key] = max(newest.get(key, s.generation), s.generation)
        out = [
            (DeviceRef(driver=s.driver, pool=s.pool, device=name), attributes)
            for s in mine
            if s.generation == newest[s.driver, s.pool]
            for name, attributes in s.devices
        ]
        out.sort(key=lambda d: (d[0].driver, d[0].pool, d[0].device))
        return out

    def node(self, spec: NodeSpec) -> NodeSpec:
        """``spec`` with the DRA devices of its slices as its cards (unchanged without)."""
        devices = self._devices(spec.name)
        if not devices and not spec.devices:
            return spec
        labels = {k: v for k, v in spec.labels.items() if not k.startswith(ATTRIBUTE_PREFIX)}
        allocatable = dict(spec.allocatable)
        if not devices:
            allocatable.pop(GPU, None)
            return msgspec.structs.replace(spec, devices=(), labels=labels, allocatable=allocatable)
        drivers = sorted({d.driver for d, _ in devices})
        if len(drivers) > 1:
            raise InputError(
                f"has DRA devices of {len(drivers)} drivers ({', '.join(drivers)}); shoal "
                "allocates one driver's devices per node",
                location="ResourceSlices",
            )
        if len(devices) > MAX_NODE_CARDS:
            raise InputError(
                f"{len(devices)} DRA devices; shoal models at most {MAX_NODE_CARDS} per node",
                location="ResourceSlices",
            )
        labels[DRIVER_LABEL] = drivers[0]
        labels[DEVICES_LABEL] = str(len(devices))
        labels.update({ATTRIBUTE_PREFIX + k: v for k, v in _shared(devices).items()})
        allocatable[GPU] = len(devices)
        if CARDS_LABEL in labels:
            labels[CARDS_LABEL] = str(len(devices))
        return msgspec.structs.replace(
            spec, devices=tuple(d for d, _ in devices), labels=labels, allocatable=allocatable
        )

    def pod(
        self,
        spec: PodSpec,
        raw_spec: Mapping[str, Any],
        raw_status: Mapping[str, Any] | None = None,
        *,
        instantiate: bool = False,
    ) -> tuple[PodSpec, list[str]]:
        """``spec`` asking for its claims' devices, and the claims' names. ``instantiate``:
        a template gives the pod a claim of its own (a scenario); else the claim's name
        is read from ``raw_status.resourceClaimStatuses`` (a cluster). Raises
        :class:`InputError` for claims out of scope, :class:`ClaimPending` for one not
        known yet."""
        entries = _list(raw_spec.get("resourceClaims"), "spec.resourceClaims")
        if not entries:
            return spec, []
        if any(name == GPU or name in SHARE_RESOURCES for name in spec.requests):
            raise InputError(
                f"asks for GPUs both through resource claims and {GPU} or a GPU share",
                location="spec.resourceClaims",
            )
        statuses = {
            str(s.get("name")): s.get("resourceClaimName")
            for s in (raw_status or {}).get("resourceClaimStatuses") or ()
            if isinstance(s, Mapping)
        }
        selection = Selection()
        requests: list[ClaimRequest] = []
        names = []
        for i, raw in enumerate(entries):
            at = f"spec.resourceClaims[{i}]"
            entry = _map(raw, at)
            entry_name = _str(entry.get("name"), f"{at}.name")
            claim_name = entry.get("resourceClaimName")
            template = entry.get("resourceClaimTemplateName")
            if (claim_name is None) == (template is None):
                raise InputError(
                    "needs one of resourceClaimName and resourceClaimTemplateName", location=at
                )
            if claim_name is not None:
                name = _str(claim_name, f"{at}.resourceClaimName")
                claim = self.claims.get((spec.namespace, name))
                if claim is None:
                    raise ClaimPending(f"ResourceClaim {spec.namespace}/{name}")
                specs, uid = claim.requests, claim.uid
                if any(r and r != spec.uid for r in claim.reserved_for):
                    raise InputError(
                        f"ResourceClaim {name} is reserved for another pod; shoal gives a "
                        "claim to one pod",
                        location=f"{at}.resourceClaimName",
                    )
            else:
                template_name = _str(template, f"{at}.resourceClaimTemplateName")
                if instantiate:
                    found = self.templates.get((spec.namespace, template_name))
                    if found is None:
                        raise ClaimPending(
                            f"ResourceClaimTemplate {spec.namespace}/{template_name}"
                        )
                    name, specs, uid = f"{spec.name}-{entry_name}", found, ""
                else:
                    generated = statuses.get(entry_name)
                    if not isinstance(generated, str) or not generated:
                        raise ClaimPending(
                            f"the claim of {entry_name} (status.resourceClaimStatuses)"
                        )
                    claim = self.claims.get((spec.namespace, generated))
                    if claim is None:
                        raise ClaimPending(f"ResourceClaim {spec.namespace}/{generated}")
                    name, specs, uid = generated, claim.requests, claim.uid
            names.append(name)
            for request in specs:
                selected = self.classes.get(request.device_class)
                if selected is None:
                    raise ClaimPending(f"DeviceClass {request.device_class}")
                merged = merge(selected, request.selection, at)
                selection = merge(selection, merged, at)
                requests.append(
                    ClaimRequest(claim=name, request=request.name, count=request.count, uid=uid)
                )
        if any(r.count == ALL for r in requests):
            requests = [self._all(requests, selection)]
        total = sum(r.count for r in requests)
        if total > MAX_COUNT:
            raise InputError(
                f"claims {total} devices; at most {MAX_COUNT} per pod",
                location="spec.resourceClaims",
            )
        selector = dict(spec.node_selector)
        selector[DRIVER_LABEL] = selection.driver
        selector.update({ATTRIBUTE_PREFIX + k: v for k, v in selection.attributes})
        pod = msgspec.structs.replace(
            spec,
            requests={**spec.requests, GPU: total},
            node_selector=selector,
            claims=tuple(requests),
        )
        return pod, names

    def allocated_cards(self, pod: PodSpec, node: NodeSpec) -> tuple[int, ...]:
        """The cards of ``node`` that ``pod``'s claims are allocated (a pod another
        scheduler bound, its claims allocated by it); () when they do not name exactly
        as many of the node's devices as the pod asks for."""
        index = {device: i for i, device in enumerate(node.devices)}
        cards: set[int] = set()
        for name in dict.fromkeys(request.claim for request in pod.claims):
            claim = self.claims.get((pod.namespace, name))
            if claim is None or any(d not in index for d in claim.allocated):
                return ()
            cards.update(index[d] for d in claim.allocated)
        if len(cards) != sum(request.count for request in pod.claims):
            return ()
        return tuple(sorted(cards))

    def _all(self, requests: list[ClaimRequest], selection: Selection) -> ClaimRequest:
        """An ``allocationMode: All`` request as the count of devices of the nodes it
        matches: every such node must have the same number (the usual pool of nodes of
        one size); the pod then asks for that many, on nodes of that many
        (:data:`DEVICES_LABEL`). A node added later with another number is not used."""
        if len(requests) > 1:
            raise InputError(
                "allocationMode All must be the pod's only DRA request (the others would "
                "need devices it takes)",
                location="spec.resourceClaims",
            )
        by_node: dict[str, list[SliceSpec]] = {}
        for found in self.slices.values():
            by_node.setdefault(found.node, []).append(found)
        sizes = set()
        for node, mine in by_node.items():
            devices = self._devices(node, mine)
            if {d.driver for d, _ in devices} != {selection.driver}:
                continue
            shared = _shared(devices)
            if all(shared.get(k) == v for k, v in selection.attributes):
                sizes.add(len(devices))
        if not sizes:
            raise ClaimPending("a node whose devices match an allocationMode All request")
        if len(sizes) > 1:
            raise InputError(
                f"allocationMode All matches nodes of {', '.join(map(str, sorted(sizes)))} "
                "devices; shoal allocates All on nodes of one size (use ExactCount)",
                location="spec.resourceClaims",
            )
        return msgspec.structs.replace(requests[0], count=sizes.pop())


def _shared(devices: list[tuple[DeviceRef, tuple[tuple[str, str], ...]]]) -> dict[str, str]:
    """The attributes every one of ``devices`` has, with the same value."""
    shared = dict(devices[0][1]) if devices else {}
    for _, attributes in devices[1:]:
        theirs = dict(attributes)
        shared = {k: v for k, v in shared.items() if theirs.get(k) == v}
    return shared
