"""Kubernetes objects (plain data from YAML or the API) → validated event specs.

Every error names the field (``spec.containers[0].resources.requests.cpu``); the caller
prefixes file and document. Used by the scenario loader and the Kubernetes adapter, so
the rules are those of the API server where they matter to scheduling.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from engine.model.devices import CARDS_LABEL, GPU, MAX_NODE_CARDS
from events.errors import InputError
from events.types import (
    NodeSelectorRequirement,
    NodeSelectorTerm,
    NodeSpec,
    PodSpec,
    PreferredSchedulingTerm,
    Taint,
    Toleration,
)
from shards.inputs.containers import host_ports, pod_requests
from shards.inputs.fields import _labels, _list, _seconds, _str

# re-exported: these helpers lived here before fields.py, and groups.py imports them from here
from shards.inputs.fields import _map as _map  # noqa: PLC0414
from shards.inputs.fields import _name as _name  # noqa: PLC0414
from shards.inputs.fields import _string_map as _string_map  # noqa: PLC0414
from shards.inputs.fields import quantities as quantities  # noqa: PLC0414
from shards.inputs.limits import (
    MAX_LABEL_VALUE,
    MAX_PRIORITY,
    MAX_USER_PRIORITY,
    MIN_PRIORITY,
    cut,
    shown,
)
from shards.inputs.podaffinity import label_selector, pod_affinity, spread_constraints

ARRIVE_AT: Final = "shoal.io/arrive-at"
RUNTIME: Final = "shoal.io/runtime"
FAILS: Final = "shoal.io/fails"
OWNER_SELECTOR: Final = "shoal.io/owner-selector"
"""Key (beside ``metadata`` and ``spec``) under which a workload's expansion hands its
pods the selector of the ReplicaSet or StatefulSet that owns them: never in a pod read
from a file or the API (a manifest naming it is refused)."""
TAINT_EFFECTS: Final = ("NoSchedule", "PreferNoSchedule", "NoExecute")
SELECTOR_OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
DEFAULT_MAX_PODS: Final = 110
"""kubelet's default ``maxPods``, used when a node does not state ``pods``."""
BUILTIN_PRIORITY_CLASSES: Final = {
    "system-cluster-critical": 2_000_000_000,
    "system-node-critical": 2_000_001_000,
}
PREEMPTION_POLICIES: Final = ("PreemptLowerPriority", "Never")
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
WELL_KNOWN_LABELS: Final = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
"""What a kubelet labels its node with (besides its hostname) on the usual machine;
a simulated node that states them keeps its own."""


class PriorityClassValue(int):
    """A priority class's value that also carries what admission copies into a pod
    along with it: the class's name and its ``preemptionPolicy``.

    An ``int``, so that the tables of class name → value kept by the scenario loader
    and by Kubernetes ingest (``""`` for the global default) carry the policy without
    knowing of it. Never put one in an event: take ``int(value)``.
    """

    class_name: str
    preemption_policy: str

    def __new__(cls, value: int, class_name: str, preemption_policy: str) -> PriorityClassValue:
        out = super().__new__(cls, value)
        out.class_name = class_name
        out.preemption_policy = preemption_policy
        return out

    def __repr__(self) -> str:
        return f"PriorityClassValue({int(self)}, {self.class_name!r}, {self.preemption_policy!r})"


def arrival(obj: Mapping[str, Any], where: str) -> int:
    """The ``shoal.io/arrive-at`` annotation in nanoseconds (0 when absent)."""
    annotations = _string_map(_map(obj.get("metadata"), "metadata").get("annotations"), where)
    raw = annotations.get(ARRIVE_AT)
    if raw is None:
        return 0
    return _seconds(raw, f'metadata.annotations["{ARRIVE_AT}"]', positive=False)


# --------------------------------------------------------------------------- nodes


def _taints(value: Any, where: str) -> tuple[Taint, ...]:
    out = []
    for i, raw in enumerate(_list(value, where)):
        loc = f"{where}[{i}]"
        item = _map(raw, loc, required=True)
        effect = _str(item.get("effect"), f"{loc}.effect")
        if effect not in TAINT_EFFECTS:
            raise InputError(
                f"unknown effect {shown(effect)} (one of {', '.join(TAINT_EFFECTS)})",
                location=f"{loc}.effect",
            )
        out.append(
            Taint(
                key=_str(item.get("key"), f"{loc}.key"),
                value=_str(item.get("value"), f"{loc}.value", default=""),
                effect=effect,
            )
        )
    return tuple(out)


def _well_known_labels(name: str, labels: dict[str, str]) -> dict[str, str]:
    """The labels a kubelet sets, where the node does not state them:
    ``kubernetes.io/hostname`` (the node's name, cut to a label value's 63 characters),
    ``kubernetes.io/os: linux`` and ``kubernetes.io/arch: amd64``; so that selectors
    pasted from real manifests match simulated nodes."""
    defaults = {HOSTNAME_LABEL: name[:MAX_LABEL_VALUE], **WELL_KNOWN_LABELS}
    return {**labels, **{k: v for k, v in defaults.items() if k not in labels}}


def _check_cards(allocatable: Mapping[str, int], labels: Mapping[str, str], field: str) -> None:
    """A node's GPU cards (``nvidia.com/gpu``, or the ``shoal.io/gpu-cards`` label that
    overrides it) are at most :data:`~engine.model.devices.MAX_NODE_CARDS`: the card
    table has a column per card of the largest node."""
    label = labels.get(CARDS_LABEL)
    if label is not None:
        if not (label.isascii() and label.isdigit()) or int(label) > MAX_NODE_CARDS:
            raise InputError(
                f"must be a number of GPU cards, 0 to {MAX_NODE_CARDS}, got {shown(label)}",
                location=f"metadata.labels.{CARDS_LABEL}",
            )
        return
    if allocatable.get(GPU, 0) > MAX_NODE_CARDS:
        raise InputError(
            f"{allocatable[GPU]} GPU cards on one node; shoal models at most "
            f"{MAX_NODE_CARDS} (if it counts shared replicas, label the node "
            f"{CARDS_LABEL} with its physical cards)",
            location=f"status.{field}.{GPU}",
        )


def node_spec(obj: Mapping[str, Any]) -> NodeSpec:
    """A ``v1 Node`` → :class:`NodeSpec` (allocatable, else capacity), with the
    well-known labels a kubelet sets where the node does not state them."""
    meta = _map(obj.get("metadata"), "metadata", required=True)
    spec = _map(obj.get("spec"), "spec")
    status = _map(obj.get("status"), "status", required=True)
    if status.get("allocatable") is not None:
        allocatable = quantities(status["allocatable"], "status.allocatable", required=True)
    else:
        allocatable = quantities(status.get("capacity"), "status.allocatable", required=True)
    if not allocatable:
        raise InputError("no resources", location="status.allocatable")
    allocatable.setdefault("pods", DEFAULT_MAX_PODS)
    unschedulable = spec.get("unschedulable", False)
    if not isinstance(unschedulable, bool):
        raise InputError("must be true or false", location="spec.unschedulable")
    name = _name(meta, "metadata")
    labels = _labels(meta.get("labels"), "metadata.labels")
    _check_cards(allocatable, labels, "allocatable" if "allocatable" in status else "capacity")
    return NodeSpec(
        name=name,
        allocatable=allocatable,
        labels=_well_known_labels(name, labels),
        taints=_taints(spec.get("taints"), "spec.taints"),
        unschedulable=unschedulable,
        annotations=_string_map(meta.get("annotations"), "metadata.annotations"),
    )


# --------------------------------------------------------------------------- pods


def _requirements(value: Any, where: str, *, fields: bool) -> tuple[NodeSelectorRequirement, ...]:
    out = []
    for i, raw in enumerate(_list(value, where)):
        loc = f"{where}[{i}]"
        item = _map(raw, loc, required=True)
        key = _str(item.get("key"), f"{loc}.key")
        op = _str(item.get("operator"), f"{loc}.operator")
        allowed = ("In", "NotIn") if fields else SELECTOR_OPERATORS
        if op not in allowed:
            raise InputError(
                f"unknown operator {shown(op)} (one of {', '.join(allowed)})",
                location=f"{loc}.operator",
            )
        if fields and key != "metadata.name":
            raise InputError("only metadata.name is supported", location=f"{loc}.key")
        values = tuple(
            str(v)
            if isinstance(v, int | float) and not isinstance(v, bool)
            else _str(v, f"{loc}.values[{j}]")
            for j, v in enumerate(_list(item.get("values"), f"{loc}.values"))
        )
        if op in ("In", "NotIn") and not values:
            raise InputError(f"{op} needs at least one value", location=f"{loc}.values")
        if op in ("Exists", "DoesNotExist") and values:
            raise InputError(f"{op} takes no values", location=f"{loc}.values")
        if op in ("Gt", "Lt"):
            if len(values) != 1:
                raise InputError(f"{op} needs exactly one value", location=f"{loc}.values")
            try:
                number = int(values[0]) if len(values[0]) <= MAX_LABEL_VALUE else None
            except ValueError:
                number = None
            if number is None or not -(2**63) <= number < 2**63:
                raise InputError(
                    f"{op} needs an integer (64-bit), got {shown(values[0])}",
                    location=f"{loc}.values",
                )
        out.append(NodeSelectorRequirement(key=key, operator=op, values=values))
    return tuple(out)


def _term(value: Any, where: str) -> NodeSelectorTerm:
    item = _map(value, where, required=True)
    return NodeSelectorTerm(
        match_expressions=_requirements(
            item.get("matchExpressions"), f"{where}.matchExpressions", fields=False
        ),
        match_fields=_requirements(item.get("matchFields"), f"{where}.matchFields", fields=True),
    )


def _affinity(
    spec: Mapping[str, Any],
) -> tuple[tuple[NodeSelectorTerm, ...] | None, tuple[PreferredSchedulingTerm, ...]]:
    where = "spec.affinity.nodeAffinity"
    node_affinity = _map(_map(spec.get("affinity"), "spec.affinity").get("nodeAffinity"), where)
    required: tuple[NodeSelectorTerm, ...] | None = None
    raw_required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if raw_required is not None:
        loc = f"{where}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
        terms = _list(_map(raw_required, loc).get("nodeSelectorTerms"), loc)
        if not terms:
            raise InputError("needs at least one term", location=loc)
        required = tuple(_term(t, f"{loc}[{i}]") for i, t in enumerate(terms))
    preferred = []
    loc = f"{where}.preferredDuringSchedulingIgnoredDuringExecution"
    for i, raw in enumerate(
        _list(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution"), loc)
    ):
        item = _map(raw, f"{loc}[{i}]", required=True)
        weight = item.get("weight")
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
            raise InputError(
                f"weight must be an integer 1..100, got {shown(weight)}",
                location=f"{loc}[{i}].weight",
            )
        preferred.append(
            PreferredSchedulingTerm(
                weight=weight, preference=_term(item.get("preference"), f"{loc}[{i}].preference")
            )
        )
    return required, tuple(preferred)


def _tolerations(value: Any, where: str) -> tuple[Toleration, ...]:
    out = []
    for i, raw in enumerate(_list(value, where)):
        loc = f"{where}[{i}]"
        item = _map(raw, loc, required=True)
        op = _str(item.get("operator"), f"{loc}.operator", default="Equal")
        if op not in ("Equal", "Exists"):
            raise InputError(
                f"unknown operator {shown(op)} (Equal or Exists)", location=f"{loc}.operator"
            )
        effect = _str(item.get("effect"), f"{loc}.effect", default="")
        if effect and effect not in TAINT_EFFECTS:
            raise InputError(f"unknown effect {shown(effect)}", location=f"{loc}.effect")
        key = _str(item.get("key"), f"{loc}.key", default="")
        value_ = _str(item.get("value"), f"{loc}.value", default="")
        if op == "Exists" and value_:
            raise InputError("operator Exists takes no value", location=f"{loc}.value")
        if not key and op != "Exists":
            raise InputError("an empty key needs operator Exists", location=f"{loc}.operator")
        out.append(Toleration(key=key, operator=op, value=value_, effect=effect))
    return tuple(out)


def controller_of(meta: Mapping[str, Any]) -> str:
    """``KIND/NAME`` of the ``ownerReferences`` entry with ``controller: true``, or ""."""
    refs = meta.get("ownerReferences")
    if refs is None:
        return ""
    if not isinstance(refs, list):
        raise InputError("must be a list", location="metadata.ownerReferences")
    for i, ref in enumerate(refs):
        if not isinstance(ref, Mapping):
            raise InputError("must be a mapping", location=f"metadata.ownerReferences[{i}]")
        if ref.get("controller") is True:
            kind, name = ref.get("kind"), ref.get("name")
            if not isinstance(kind, str) or not isinstance(name, str) or not kind or not name:
                raise InputError(
                    "needs a kind and a name", location=f"metadata.ownerReferences[{i}]"
                )
            return f"{cut(kind, 63)}/{cut(name, 253)}"
    return ""


def pod_spec(obj: Mapping[str, Any], priority_classes: Mapping[str, int] | None = None) -> PodSpec:
    """A ``v1 Pod`` → :class:`PodSpec`. ``priority_classes`` maps class name → value
    (a :class:`PriorityClassValue` carries the class's preemption policy too); the name
    ``""`` holds the global default, if any.

    Priority is admitted as Kubernetes' Priority admission plugin does: a pod naming a
    class gets its value and its ``preemptionPolicy`` (a pod stating another value or
    policy is refused); a pod naming none and stating no ``priority`` gets the global
    default class's name, value and policy (0 and ``PreemptLowerPriority`` without
    one). A pod that states ``priority`` and no class keeps it (shoal's leniency for
    scenarios; the API server would compare it with the default's)."""
    classes = {**BUILTIN_PRIORITY_CLASSES, **(priority_classes or {})}
    meta = _map(obj.get("metadata"), "metadata", required=True)
    spec = _map(obj.get("spec"), "spec", required=True)
    annotations = _string_map(meta.get("annotations"), "metadata.annotations")
    namespace = _str(meta.get("namespace"), "metadata.namespace", default="default")
    if not namespace or "/" in namespace:
        raise InputError(f"invalid namespace {shown(namespace)}", location="metadata.namespace")
    class_name = _str(spec.get("priorityClassName"), "spec.priorityClassName", default="")
    priority = spec.get("priority")
    if priority is not None and (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or not MIN_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise InputError(
            f"must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, got {shown(priority)}",
            location="spec.priority",
        )
    stated_policy = spec.get("preemptionPolicy")
    if stated_policy is not None and stated_policy not in PREEMPTION_POLICIES:
        raise InputError(
            f"unknown preemption policy {shown(stated_policy)}", location="spec.preemptionPolicy"
        )
    class_policy: str | None = None
    if class_name:
        if class_name not in classes:
            raise InputError(
                f"unknown priority class {shown(class_name)}", location="spec.priorityClassName"
            )
        if priority is not None and priority != classes[class_name]:
            raise InputError(
                f"priority {priority} contradicts priority class {shown(class_name)} "
                f"({classes[class_name]})",
                location="spec.priority",
            )
        value = classes[class_name]
        priority = int(value)
        class_policy = (
            value.preemption_policy
            if isinstance(value, PriorityClassValue)
            else "PreemptLowerPriority"
        )
    elif priority is None:
        default = classes.get("")
        priority = 0 if default is None else int(default)
        if isinstance(default, PriorityClassValue):
            class_name, class_policy = default.class_name, default.preemption_policy
    if class_policy is not None and stated_policy not in (None, class_policy):
        raise InputError(
            f"preemption policy {stated_policy} contradicts priority class "
            f"{shown(class_name)} ({class_policy})",
            location="spec.preemptionPolicy",
        )
    policy = class_policy or stated_policy or "PreemptLowerPriority"
    runtime = None
    if RUNTIME in annotations:
        runtime = _seconds(
            annotations[RUNTIME], f'metadata.annotations["{RUNTIME}"]', positive=True
        )
    required, preferred = _affinity(spec)
    fails = annotations.get(FAILS, "false").lower()
    if fails not in ("true", "false"):
        raise InputError(
            f'must be "true" or "false", got {shown(fails)}',
            location=f'metadata.annotations["{FAILS}"]',
        )
    if fails == "true" and runtime is None:
        raise InputError(
            f"needs {RUNTIME} (when it fails)", location=f'metadata.annotations["{FAILS}"]'
        )
    name = _name(meta, "metadata")
    labels = _labels(meta.get("labels"), "metadata.labels")
    return PodSpec(
        fails=fails == "true",
        namespace=namespace,
        name=name,
        uid=_str(meta.get("uid"), "metadata.uid", default=""),
        requests=pod_requests(spec),
        priority=priority,
        priority_class=class_name,
        preemption_policy=policy,
        scheduler_name=_str(spec.get("schedulerName"), "spec.schedulerName", default=""),
        node_name=_str(spec.get("nodeName"), "spec.nodeName", default=""),
        node_selector=_string_map(spec.get("nodeSelector"), "spec.nodeSelector"),
        required_affinity=required,
        preferred_affinity=preferred,
        tolerations=_tolerations(spec.get("tolerations"), "spec.tolerations"),
        labels=labels,
        annotations=annotations,
        runtime=runtime,
        host_ports=host_ports(spec, f"{namespace}/{name}"),
        spread_constraints=spread_constraints(spec, labels),
        owner_selector=label_selector(obj.get(OWNER_SELECTOR), OWNER_SELECTOR),
        owner=controller_of(meta),
        **pod_affinity(spec, namespace, labels),
    )


def priority_class(obj: Mapping[str, Any]) -> tuple[str, PriorityClassValue, bool]:
    """A ``scheduling.k8s.io/v1 PriorityClass`` → (name, value, globalDefault); the
    value carries the class's ``preemptionPolicy`` (default ``PreemptLowerPriority``)
    into the pods admitted with it.

    As the API server validates them: a value above the user limit only for the
    built-in ``system-`` classes, each with its own value (every cluster has them, and a
    name starting with ``system-`` is reserved for them)."""
    meta = _map(obj.get("metadata"), "metadata", required=True)
    value = obj.get("value")
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputError(f"must be an integer, got {shown(value)}", location="value")
    name = meta.get("name")
    if isinstance(name, str) and name.startswith("system-"):
        if BUILTIN_PRIORITY_CLASSES.get(name) != value:
            known = ", ".join(f"{k} ({v})" for k, v in BUILTIN_PRIORITY_CLASSES.items())
            raise InputError(
                f"the prefix system- is reserved for the built-in classes {known}",
                location="metadata.name",
            )
    elif not MIN_PRIORITY <= value <= MAX_USER_PRIORITY:
        raise InputError(
            f"must be from {MIN_PRIORITY} to {MAX_USER_PRIORITY} (the most a user priority "
            f"class may have), got {shown(value)}",
            location="value",
        )
    default = obj.get("globalDefault", False)
    if not isinstance(default, bool):
        raise InputError("must be true or false", location="globalDefault")
    policy = _str(obj.get("preemptionPolicy"), "preemptionPolicy", default="PreemptLowerPriority")
    if policy not in PREEMPTION_POLICIES:
        raise InputError(
            f"unknown preemption policy {shown(policy)} (one of {', '.join(PREEMPTION_POLICIES)})",
            location="preemptionPolicy",
        )
    name = _name(meta, "metadata")
    return name, PriorityClassValue(value, name, policy), default
