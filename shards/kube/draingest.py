"""What ingest keeps of the cluster's DRA objects (``resource.k8s.io/v1``), and what it
makes of them: nodes with their devices as cards, pods asking for their claims.

Ingest watches ``ResourceSlice``, ``DeviceClass`` and ``ResourceClaim`` (where the
server serves ``resource.k8s.io/v1``: v1.34 and later) and hands each object here
(:meth:`DraIngest.changed`), which says what it changes:

- a slice changes its node's cards: ingest tells the node again (``NodeUpdated``) with
  its devices (:meth:`shards.inputs.dra.DraCatalog.node`);
- a claim or a class may complete a pod that waits for it: ingest tells those pods again.

**A pod waits** (nothing is appended for it) until every claim it names is known, and
its class: a claim from a template is created by kube-controller-manager's
resourceclaim controller, which writes its name into the pod's
``status.resourceClaimStatuses``; shoal does not create claims (it is a scheduler, not
that controller), so a pod whose template has not been instantiated yet waits for that
update of the pod. A pod already bound is told with the claims that are known.
The rules for what is read and what is refused are :mod:`shards.inputs.dra`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from events.types import NodeSpec, PodBound, PodSpec
from shards.inputs.dra import ClaimPending, DraCatalog

log = logging.getLogger(__name__)

JSON = dict[str, Any]
KINDS: Final = {
    "resourceslices": "ResourceSlice",
    "deviceclasses": "DeviceClass",
    "resourceclaims": "ResourceClaim",
}
"""The plurals ingest watches → their kind."""


class DraIngest:
    def __init__(self) -> None:
        self.catalog = DraCatalog()
        self.base: dict[str, NodeSpec] = {}
        """Nodes as their Node objects say, before their devices are added."""
        self.waiting: dict[str, JSON] = {}
        """Pods that wait for a claim or a class → the pod object last seen."""

    def __repr__(self) -> str:
        return f"DraIngest({self.catalog!r}, waiting={len(self.waiting)})"

    def stats(self) -> dict[str, int]:
        return {
            "dra_slices": len(self.catalog.slices),
            "dra_claims": len(self.catalog.claims),
            "dra_waiting": len(self.waiting),
        }

    def node(self, spec: NodeSpec) -> NodeSpec:
        """``spec`` (from its Node object) with its devices (raises ``InputError``)."""
        self.base[spec.name] = spec
        return self.catalog.node(spec)

    def node_gone(self, name: str) -> None:
        self.base.pop(name, None)

    def changed(self, plural: str, event: str, obj: JSON) -> tuple[list[str], list[str]]:
        """Keep (or forget, ``event`` DELETED) a DRA object; the nodes whose cards may
        have changed, and the waiting pods to try again. Raises ``InputError`` for an
        object out of scope (it is then not kept)."""
        kind = KINDS[plural]
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        namespace = str(meta.get("namespace") or "default")
        catalog = self.catalog
        before = catalog.slices.get(name) if kind == "ResourceSlice" else None
        if event == "DELETED":
            if kind == "ResourceSlice":
                catalog.slices.pop(name, None)
            elif kind == "DeviceClass":
                catalog.classes.pop(name, None)
            else:
                catalog.claims.pop((namespace, name), None)
        else:
            catalog.add({**obj, "kind": kind})
        if kind == "ResourceSlice":
            nodes = {s.node for s in (before, catalog.slices.get(name)) if s is not None}
            # an allocationMode All request waits for a node whose devices match it
            return sorted(n for n in nodes if n in self.base), sorted(self.waiting)
        return [], sorted(self.waiting)

    def pod(self, key: str, spec: PodSpec, obj: Mapping[str, Any], bound: bool) -> PodSpec | None:
        """``spec`` asking for its claims; None while it waits for one (a pending pod).
        Raises ``InputError`` for claims out of scope."""
        raw_spec = obj.get("spec") or {}
        if not raw_spec.get("resourceClaims"):
            return spec
        try:
            found, _ = self.catalog.pod(spec, raw_spec, obj.get("status") or {})
        except ClaimPending as exc:
            if bound:
                log.warning("pod=%s bound, its DRA devices not counted: %s unknown", key, exc)
                return spec
            if key not in self.waiting:
                log.info("pod=%s waits for %s", key, exc)
            self.waiting[key] = dict(obj)
            return None
        self.waiting.pop(key, None)
        return found

    def observed(self, bound: PodBound, spec: PodSpec, node: NodeSpec | None) -> PodBound:
        """``bound`` (a pod found bound) on the cards its claims' allocations name, where
        its annotations name none (a pod kube-scheduler placed)."""
        if bound.devices or not spec.claims or node is None:
            return bound
        cards = self.catalog.allocated_cards(spec, node)
        return msgspec.structs.replace(bound, devices=cards) if cards else bound

    def forget_pod(self, key: str) -> None:
        self.waiting.pop(key, None)
