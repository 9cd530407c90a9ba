"""The wire format of ``k8s.io/kube-scheduler/extender/v1``, both ways.

``ExtenderArgs`` ``{"Pod": v1.Pod, "Nodes": v1.NodeList | null, "NodeNames": [..] | null}``
(``NodeNames`` instead of ``Nodes`` for an extender that is ``nodeCacheCapable``);
``ExtenderFilterResult`` ``{"Nodes", "NodeNames", "FailedNodes": {node: reason},
"FailedAndUnresolvableNodes": {node: reason}, "Error"}``; ``HostPriorityList``
``[{"Host", "Score"}]``; ``ExtenderBindingArgs`` ``{"PodName", "PodNamespace", "PodUID",
"Node"}`` and ``ExtenderBindingResult`` ``{"Error"}``. The Go types carry no JSON tags,
so the keys are the field names, and Go decodes them case-insensitively: so do we.

Pods and nodes are rendered from what shoal knows of them (:class:`PodSpec`, a shard's
columns): metadata (name, namespace, uid, labels, annotations), the scheduler name,
priority, node selector, node affinity, tolerations and one container with the pod's
requests (host ports are not sent); a node's labels, annotations, taints,
``unschedulable`` and allocatable (as capacity too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from engine.model.state import ClusterState
from events.types import NodeSelectorTerm, PodSpec
from shards.inputs.quantity import format_quantity

MAX_ANSWER_BYTES: Final = 64 << 20
"""The largest answer (or request, served) read: a list of 5,000 full nodes is ~10 MiB."""


class WireError(ValueError):
    """A document that is not what the extender API says (the message names the field)."""


def get(doc: Mapping[str, Any], key: str) -> Any:
    """``doc[key]``, the key matched case-insensitively as Go's ``encoding/json`` does."""
    try:
        return doc[key]
    except KeyError:
        pass
    low = key.lower()
    for k, v in doc.items():
        if isinstance(k, str) and k.lower() == low:
            return v
    return None


def pod_json(spec: PodSpec) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": spec.name, "namespace": spec.namespace}
    if spec.uid:
        meta["uid"] = spec.uid
    if spec.labels:
        meta["labels"] = dict(spec.labels)
    if spec.annotations:
        meta["annotations"] = dict(spec.annotations)
    requests = {r: format_quantity(r, v) for r, v in sorted(spec.requests.items()) if r != "pods"}
    body: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"requests": requests}}],
        "schedulerName": spec.scheduler_name or "default-scheduler",
        "priority": spec.priority,
    }
    if spec.node_selector:
        body["nodeSelector"] = dict(spec.node_selector)
    if spec.node_name:
        body["nodeName"] = spec.node_name
    if spec.tolerations:
        body["tolerations"] = [
            {
                k: v
                for k, v in (
                    ("key", t.key),
                    ("operator", t.operator),
                    ("value", t.value),
                    ("effect", t.effect),
                )
                if v
            }
            for t in spec.tolerations
        ]
    if spec.priority_class:
        body["priorityClassName"] = spec.priority_class
    affinity: dict[str, Any] = {}
    if spec.required_affinity is not None:
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [_term(t) for t in spec.required_affinity]
        }
    if spec.preferred_affinity:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": p.weight, "preference": _term(p.preference)} for p in spec.preferred_affinity
        ]
    if affinity:
        body["affinity"] = {"nodeAffinity": affinity}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def _term(term: NodeSelectorTerm) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, requirements in (
        ("matchExpressions", term.match_expressions),
        ("matchFields", term.match_fields),
    ):
        if requirements:
            out[key] = [
                {
                    "key": r.key,
                    "operator": r.operator,
                    **({"values": list(r.values)} if r.values else {}),
                }
                for r in requirements
            ]
    return out


class NodeRenderer:
    """``v1.Node`` documents of a shard's nodes, kept until a node's labels, taints or
    allocatable change (the state's ``static_version``)."""

    def __init__(self) -> None:
        self._version = -1
        self._nodes: dict[str, dict[str, Any]] = {}

    def node(self, state: ClusterState, name: str) -> dict[str, Any] | None:
        if state.static_version != self._version:
            self._nodes.clear()
            self._version = state.static_version
        hit = self._nodes.get(name)
        if hit is not None:
            return hit
        slot = state.index.get(name)
        if slot is None:
            return None
        names = state.resources.names
        rows = range(min(len(names), state.alloc.shape[0]))
        alloc = {names[r]: format_quantity(names[r], int(state.alloc[r, slot])) for r in rows}
        meta: dict[str, Any] = {"name": name}
        if state.node_labels[slot]:
            meta["labels"] = dict(state.node_labels[slot])
        if state.node_annotations[slot]:
            meta["annotations"] = dict(state.node_annotations[slot])
        spec: dict[str, Any] = {}
        if state.unschedulable[slot]:
            spec["unschedulable"] = True
        if state.node_taints[slot]:
            spec["taints"] = [
                {k: v for k, v in (("key", t.key), ("value", t.value), ("effect", t.effect)) if v}
                for t in state.node_taints[slot]
            ]
        doc = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": meta,
            "spec": spec,
            "status": {"capacity": alloc, "allocatable": alloc},
        }
        self._nodes[name] = doc
        return doc


class NodeListCache:
    """The encoded ``items`` of the ``NodeList`` sent for one list of node names, reused
    while no node changes (asks of several pod shapes often name the same nodes)."""

    def __init__(self, renderer: NodeRenderer, size: int = 16) -> None:
        self.renderer = renderer
        self.size = size
        self._version = -1
        self._lists: dict[tuple[str, ...], bytes] = {}

    def items(self, state: ClusterState, names: tuple[str, ...]) -> bytes:
        if state.static_version != self._version:
            self._lists.clear()
            self._version = state.static_version
        hit = self._lists.get(names)
        if hit is None:
            docs = [d for n in names if (d := self.renderer.node(state, n)) is not None]
            hit = orjson.dumps(docs)
            if len(self._lists) >= self.size:
                self._lists.pop(next(iter(self._lists)))
            self._lists[names] = hit
        return hit


def args_bytes(pod: bytes, names: tuple[str, ...], items: bytes | None) -> bytes:
    """``ExtenderArgs`` encoded: with ``items`` (encoded nodes) the ``Nodes`` list, else
    ``NodeNames``."""
    if items is None:
        return b'{"Pod":' + pod + b',"Nodes":null,"NodeNames":' + orjson.dumps(names) + b"}"
    return (
        b'{"Pod":' + pod + b',"Nodes":{"apiVersion":"v1","kind":"NodeList","items":' + items + b"}}"
    )


def args_json(
    pod: dict[str, Any], nodes: list[str], node_docs: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """``ExtenderArgs``: with ``node_docs`` the full ``Nodes`` list, else ``NodeNames``."""
    if node_docs is None:
        return {"Pod": pod, "Nodes": None, "NodeNames": nodes}
    return {"Pod": pod, "Nodes": {"apiVersion": "v1", "kind": "NodeList", "items": node_docs}}


def _reasons(value: Any, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise WireError(f"{field} must map node names to reasons")
    return dict(value)


def node_names(result: Mapping[str, Any], field: str = "") -> list[str] | None:
    """The node names of a ``NodeNames`` list or a ``Nodes`` list (None: neither)."""
    names = get(result, "NodeNames")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise WireError(f"{field}NodeNames must be a list of strings")
        return names
    nodes = get(result, "Nodes")
    if nodes is None:
        return None
    items = get(nodes, "items") if isinstance(nodes, dict) else None
    if not isinstance(items, list):
        raise WireError(f"{field}Nodes must be a NodeList with items")
    out = []
    for i, item in enumerate(items):
        try:
            name = item["metadata"]["name"]
        except (KeyError, TypeError):
            meta = get(item, "metadata") if isinstance(item, dict) else None
            name = get(meta, "name") if isinstance(meta, dict) else None
        if type(name) is not str or not name:
            raise WireError(f"{field}Nodes.items[{i}].metadata.name must be a string")
        out.append(name)
    return out


def filter_result(doc: Any) -> tuple[list[str], dict[str, str], dict[str, str], str]:
    """An ``ExtenderFilterResult``: (passed, failed, unresolvable, error)."""
    if not isinstance(doc, dict):
        raise WireError("an ExtenderFilterResult must be a JSON object")
    error = get(doc, "Error") or ""
    if not isinstance(error, str):
        raise WireError("Error must be a string")
    passed = node_names(doc)
    return (
        passed or [],
        _reasons(get(doc, "FailedNodes"), "FailedNodes"),
        _reasons(get(doc, "FailedAndUnresolvableNodes"), "FailedAndUnresolvableNodes"),
        error,
    )


def priority_list(doc: Any) -> dict[str, int]:
    """A ``HostPriorityList``: host → score."""
    if doc is None:
        return {}
    if not isinstance(doc, list):
        raise WireError("a HostPriorityList must be a JSON array")
    out: dict[str, int] = {}
    for item in doc:
        try:
            host, score = item["Host"], item["Score"]
        except (KeyError, TypeError):
            host = get(item, "Host") if isinstance(item, dict) else None
            score = get(item, "Score") if isinstance(item, dict) else None
        if type(host) is not str or type(score) is not int:
            raise WireError(f"[{len(out)}] must be {{Host: string, Score: integer}}")
        out[host] = score
    if out and not -(2**63) <= min(out.values()) <= max(out.values()) < 2**63:
        raise WireError("a Score is out of the 64-bit range")
    return out
