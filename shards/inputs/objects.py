"""Kubernetes objects (plain data from YAML or the API) → validated event specs.

Every error names the field (``spec.containers[0].resources.requests.cpu``); the caller
prefixes file and document. Used by the scenario loader and the Kubernetes adapter, so
the rules are those of the API server where they matter to scheduling.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from events.errors import InputError
from events.types import (
    SECOND,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    NodeSpec,
    PodSpec,
    PreferredSchedulingTerm,
    Taint,
    Toleration,
)
from shards.inputs.limits import (
    MAX_LABEL_VALUE,
    MAX_PRIORITY,
    MAX_QUANTITY,
    MAX_SECONDS,
    MAX_USER_PRIORITY,
    MIN_PRIORITY,
    shown,
)
from shards.inputs.quantity import canonical, format_quantity

ARRIVE_AT: Final = "shoal.io/arrive-at"
RUNTIME: Final = "shoal.io/runtime"
FAILS: Final = "shoal.io/fails"
TAINT_EFFECTS: Final = ("NoSchedule", "PreferNoSchedule", "NoExecute")
SELECTOR_OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
DEFAULT_MAX_PODS: Final = 110
"""kubelet's default ``maxPods``, used when a node does not state ``pods``."""
BUILTIN_PRIORITY_CLASSES: Final = {
    "system-cluster-critical": 2_000_000_000,
    "system-node-critical": 2_000_001_000,
}
MAX_NAME: Final = 253


def _map(value: Any, where: str, *, required: bool = False) -> Mapping[str, Any]:
    if value is None:
        if required:
            raise InputError("missing", location=where)
        return {}
    if not isinstance(value, Mapping):
        raise InputError(f"must be a mapping, got {type(value).__name__}", location=where)
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputError(f"must be a list, got {type(value).__name__}", location=where)
    return value


def _str(value: Any, where: str, *, default: str | None = None) -> str:
    if value is None and default is not None:
        return default
    if not isinstance(value, str):
        raise InputError(
            "missing" if value is None else f"must be a string, got {shown(value)}", location=where
        )
    return value


def _string_map(value: Any, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, val in _map(value, where).items():
        if not isinstance(key, str) or not key:
            raise InputError(f"keys must be non-empty strings, got {shown(key)}", location=where)
        if isinstance(val, bool) or val is None or not isinstance(val, str | int | float):
            raise InputError(f"value must be a string, got {shown(val)}", location=f"{where}.{key}")
        out[key] = val if isinstance(val, str) else str(val)
    return out


def _labels(value: Any, where: str) -> dict[str, str]:
    """Labels: a string map whose values have at most 63 characters (Kubernetes' rule;
    ``Gt``/``Lt`` read them as numbers, which must fit a float)."""
    labels = _string_map(value, where)
    for key, val in labels.items():
        if len(val) > MAX_LABEL_VALUE:
            raise InputError(
                f"a label value has at most {MAX_LABEL_VALUE} characters, got {len(val)}",
                location=f"{where}.{key}",
            )
    return labels


def _name(meta: Mapping[str, Any], where: str) -> str:
    name = _str(meta.get("name"), f"{where}.name")
    if not name or len(name) > MAX_NAME or "/" in name or name.strip() != name:
        raise InputError(f"invalid name {shown(name)}", location=f"{where}.name")
    return name


def _seconds(value: Any, where: str, *, positive: bool) -> int:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InputError(
            f"must be a number of seconds, got {shown(value)}", location=where
        ) from None
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        raise InputError(
            f"must be {'positive' if positive else 'non-negative'}, got {shown(value)}",
            location=where,
        )
    if seconds > MAX_SECONDS:
        raise InputError(
            f"must be at most {MAX_SECONDS} seconds, got {shown(value)}", location=where
        )
    nanoseconds = round(seconds * SECOND)
    if positive and nanoseconds == 0:
        raise InputError(f"must be at least a nanosecond, got {shown(value)}", location=where)
    return nanoseconds


def arrival(obj: Mapping[str, Any], where: str) -> int:
    """The ``shoal.io/arrive-at`` annotation in nanoseconds (0 when absent)."""
    annotations = _string_map(_map(obj.get("metadata"), "metadata").get("annotations"), where)
    raw = annotations.get(ARRIVE_AT)
    if raw is None:
        return 0
    return _seconds(raw, f'metadata.annotations["{ARRIVE_AT}"]', positive=False)


def quantities(value: Any, where: str, *, required: bool = False) -> dict[str, int]:
    out: dict[str, int] = {}
    for resource, amount in _map(value, where, required=required).items():
        loc = f"{where}.{resource}"
        if not isinstance(resource, str) or not resource:
            raise InputError("resource names must be non-empty strings", location=where)
        if amount is None:
            raise InputError("missing quantity", location=loc)
        try:
            out[resource] = canonical(resource, amount)
        except InputError as exc:
            raise InputError(exc.message, location=loc) from None
    return out


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


def node_spec(obj: Mapping[str, Any]) -> NodeSpec:
    """A ``v1 Node`` → :class:`NodeSpec` (allocatable, else capacity)."""
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
    return NodeSpec(
        name=_name(meta, "metadata"),
        allocatable=allocatable,
        labels=_labels(meta.get("labels"), "metadata.labels"),
        taints=_taints(spec.get("taints"), "spec.taints"),
        unschedulable=unschedulable,
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


def pod_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """Effective requests: max(sum of containers, each init container) + overhead."""
    containers = _list(spec.get("containers"), "spec.containers")
    if not containers:
        raise InputError("a pod needs at least one container", location="spec.containers")
    total: dict[str, int] = {}
    for i, raw in enumerate(containers):
        container = _map(raw, f"spec.containers[{i}]", required=True)
        for resource, amount in _container_requests(container, f"spec.containers[{i}]").items():
            total[resource] = total.get(resource, 0) + amount
    for i, raw in enumerate(_list(spec.get("initContainers"), "spec.initContainers")):
        init = _map(raw, f"spec.initContainers[{i}]", required=True)
        for resource, amount in _container_requests(init, f"spec.initContainers[{i}]").items():
            total[resource] = max(total.get(resource, 0), amount)
    for resource, amount in quantities(spec.get("overhead"), "spec.overhead").items():
        total[resource] = total.get(resource, 0) + amount
    for resource, amount in sorted(total.items()):
        if amount > MAX_QUANTITY:
            raise InputError(
                f"the pod requests more than {format_quantity(resource, MAX_QUANTITY)} "
                f"of {resource} in all",
                location="spec.containers",
            )
    return total


def pod_spec(obj: Mapping[str, Any], priority_classes: Mapping[str, int] | None = None) -> PodSpec:
    """A ``v1 Pod`` → :class:`PodSpec`. ``priority_classes`` maps class name → value;
    the name ``""`` holds the global default, if any."""
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
        priority = classes[class_name]
    elif priority is None:
        priority = classes.get("", 0)
    policy = _str(
        spec.get("preemptionPolicy"), "spec.preemptionPolicy", default="PreemptLowerPriority"
    )
    if policy not in ("PreemptLowerPriority", "Never"):
        raise InputError(
            f"unknown preemption policy {shown(policy)}", location="spec.preemptionPolicy"
        )
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
    return PodSpec(
        fails=fails == "true",
        namespace=namespace,
        name=_name(meta, "metadata"),
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
        labels=_labels(meta.get("labels"), "metadata.labels"),
        annotations=annotations,
        runtime=runtime,
    )


def priority_class(obj: Mapping[str, Any]) -> tuple[str, int, bool]:
    """A ``scheduling.k8s.io/v1 PriorityClass`` → (name, value, globalDefault).

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
    return _name(meta, "metadata"), value, default
