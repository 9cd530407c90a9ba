"""Pod groups, elastic quotas and dependencies as users already write them.

Pod groups (gangs), in four conventions:

- scheduler-plugins: ``scheduling.x-k8s.io/v1alpha1 PodGroup`` (``minMember``,
  ``minResources``, ``scheduleTimeoutSeconds``); pods join by the label
  ``scheduling.x-k8s.io/pod-group``.
- older coscheduling: no object; pods carry the labels
  ``pod-group.scheduling.sigs.k8s.io/name`` and ``.../min-available``.
- Volcano: ``scheduling.volcano.sh/v1beta1 PodGroup`` (``minMember``, ``queue``,
  ``priorityClassName``, ``minResources``); pods join by the annotation
  ``scheduling.k8s.io/group-name``.
- Tencent batch-scheduler: ``batch.scheduler.tencent.com/v1 PodGroup`` (``minMember``,
  ``maxScheduleTime``); pods join by the label ``group.batch.scheduler.tencent.com``.

``shoal.io/depends-on: a,b`` on a pod or a group names pods or groups of the same
namespace that must succeed first.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Any, Final

from events.errors import InputError
from events.types import SECOND, GroupSpec, QuotaSpec
from shards.inputs.limits import MAX_MIN_MEMBER, MAX_SECONDS, shown
from shards.inputs.objects import BUILTIN_PRIORITY_CLASSES, _map, _name, _string_map, quantities

DEPENDS_ON: Final = "shoal.io/depends-on"
GROUP_KINDS: Final = {
    "scheduling.x-k8s.io/v1alpha1": "scheduler-plugins",
    "scheduling.sigs.k8s.io/v1alpha1": "scheduler-plugins",
    "scheduling.volcano.sh/v1beta1": "volcano",
    "batch.scheduler.tencent.com/v1": "tencent",
}
QUOTA_VERSIONS: Final = ("scheduling.x-k8s.io/v1alpha1", "scheduling.sigs.k8s.io/v1alpha1")
MEMBER_LABELS: Final = (
    ("label", "scheduling.x-k8s.io/pod-group"),
    ("label", "pod-group.scheduling.sigs.k8s.io/name"),
    ("annotation", "scheduling.k8s.io/group-name"),
    ("label", "group.batch.scheduler.tencent.com"),
)
MIN_AVAILABLE: Final = "pod-group.scheduling.sigs.k8s.io/min-available"
_DURATION: Final = re.compile(
    r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?$"
)


def _namespace(meta: Mapping[str, Any]) -> str:
    namespace = meta.get("namespace", "default")
    if not isinstance(namespace, str) or not namespace or "/" in namespace:
        raise InputError(f"invalid namespace {shown(namespace)}", location="metadata.namespace")
    return namespace


def _positive_int(value: Any, where: str, most: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= most:
        raise InputError(
            f"must be a positive integer, got {shown(value)} (at most {most})", location=where
        )
    return value


def _go_duration(value: Any, where: str) -> int:
    """A Go duration (``90s``, ``1m30s``, ``2h``) in nanoseconds."""
    match = _DURATION.match(value) if isinstance(value, str) and value else None
    if match is None or not any(match.groups()):
        raise InputError(
            f"must be a duration such as 90s or 5m, got {shown(value)}", location=where
        )
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if not 1 / SECOND <= total <= MAX_SECONDS:
        raise InputError(f"must be from 1ns to {MAX_SECONDS}s", location=where)
    return max(round(total * SECOND), 1)


def dependencies(annotations: Mapping[str, str], namespace: str) -> tuple[str, ...]:
    raw = annotations.get(DEPENDS_ON)
    if raw is None:
        return ()
    names = [n.strip() for n in raw.split(",")]
    where = f'metadata.annotations["{DEPENDS_ON}"]'
    if not all(names):
        raise InputError(
            f"must be a comma-separated list of names, got {shown(raw)}", location=where
        )
    for name in names:
        if "/" in name:
            raise InputError(
                f"names a dependency in the same namespace, without a namespace: {shown(name)}",
                location=where,
            )
    return tuple(dict.fromkeys(f"{namespace}/{n}" for n in names))


def pod_group(obj: Mapping[str, Any], classes: Mapping[str, int]) -> GroupSpec:
    """A PodGroup object of any supported convention → :class:`GroupSpec`."""
    source = GROUP_KINDS[obj["apiVersion"]]
    meta = _map(obj.get("metadata"), "metadata", required=True)
    spec = _map(obj.get("spec"), "spec", required=True)
    namespace = _namespace(meta)
    annotations = _string_map(meta.get("annotations"), "metadata.annotations")
    min_member = _positive_int(spec.get("minMember"), "spec.minMember", MAX_MIN_MEMBER)
    timeout = None
    if source == "scheduler-plugins" and spec.get("scheduleTimeoutSeconds") is not None:
        timeout = (
            _positive_int(
                spec["scheduleTimeoutSeconds"], "spec.scheduleTimeoutSeconds", MAX_SECONDS
            )
            * SECOND
        )
    if source == "tencent" and spec.get("maxScheduleTime") is not None:
        timeout = _go_duration(spec["maxScheduleTime"], "spec.maxScheduleTime")
    priority, class_name = 0, ""
    if source == "volcano" and spec.get("priorityClassName"):
        class_name = spec["priorityClassName"]
        known = {**BUILTIN_PRIORITY_CLASSES, **classes}
        if not isinstance(class_name, str) or class_name not in known:
            raise InputError(
                f"unknown priority class {shown(class_name)}", location="spec.priorityClassName"
            )
        priority = int(known[class_name])
    queue = spec.get("queue", "") if source == "volcano" else ""
    if not isinstance(queue, str):
        raise InputError("must be a string", location="spec.queue")
    return GroupSpec(
        namespace=namespace,
        name=_name(meta, "metadata"),
        min_member=min_member,
        min_resources=quantities(spec.get("minResources"), "spec.minResources"),
        timeout=timeout,
        priority=priority,
        priority_class=class_name,
        queue=queue,
        depends_on=dependencies(annotations, namespace),
        source=source,
        uid=_uid(meta),
    )


def _uid(meta: Mapping[str, Any]) -> str:
    uid = meta.get("uid", "")
    if not isinstance(uid, str):
        raise InputError("must be a string", location="metadata.uid")
    return uid


def group_membership(obj: Mapping[str, Any]) -> tuple[str, int | None]:
    """The group a pod joins (``""`` for none) and, for the older labels, ``min-available``."""
    meta = _map(obj.get("metadata"), "metadata", required=True)
    labels = _string_map(meta.get("labels"), "metadata.labels")
    annotations = _string_map(meta.get("annotations"), "metadata.annotations")
    found: dict[str, str] = {}
    for kind, key in MEMBER_LABELS:
        value = (labels if kind == "label" else annotations).get(key)
        if value:
            found[f"{kind} {key}"] = value
    if len(set(found.values())) > 1:
        raise InputError(
            "names different pod groups: " + ", ".join(f"{k}={v}" for k, v in found.items()),
            location="metadata",
        )
    if not found:
        return "", None
    name = next(iter(found.values()))
    minimum = None
    if MIN_AVAILABLE in labels:
        text = labels[MIN_AVAILABLE]
        minimum = int(text) if text.isascii() and text.isdigit() and len(text) <= 10 else 0
        if not 0 < minimum <= MAX_MIN_MEMBER:
            raise InputError(
                f"must be a positive integer, got {shown(text)} (at most {MAX_MIN_MEMBER})",
                location=f'metadata.labels["{MIN_AVAILABLE}"]',
            )
    return f"{_namespace(meta)}/{name}", minimum


def elastic_quota(obj: Mapping[str, Any]) -> QuotaSpec:
    """A ``scheduling.x-k8s.io/v1alpha1 ElasticQuota`` → :class:`QuotaSpec`.

    A resource missing from ``max`` is unbounded; one missing from ``min`` has no
    guarantee. ``min`` above ``max`` is an error.
    """
    meta = _map(obj.get("metadata"), "metadata", required=True)
    spec = _map(obj.get("spec"), "spec", required=True)
    minimum = quantities(spec.get("min"), "spec.min")
    maximum = quantities(spec.get("max"), "spec.max")
    for resource, amount in minimum.items():
        if resource in maximum and amount > maximum[resource]:
            raise InputError(f"min of {resource} is above its max", location=f"spec.min.{resource}")
    return QuotaSpec(
        namespace=_namespace(meta), name=_name(meta, "metadata"), min=minimum, max=maximum
    )


def dependency_cycle(
    declared: Mapping[str, tuple[str, ...]], members: Mapping[str, list[str]]
) -> tuple[str, str] | None:
    """A cycle among dependencies, as (message, the object whose ``depends-on`` closes
    it), or None. ``declared`` maps each pod and group to what it names in
    ``shoal.io/depends-on``; ``members`` each group to its pods.

    A group waits for its members (naming a group means all of them), and a member
    waits for what its group depends on: a gang that depends on one of its own members
    waits for itself, and is a cycle too.
    """
    group_of = {pod: group for group, pods in members.items() for pod in pods}
    waits: dict[str, tuple[str, ...]] = dict(declared)
    for group, pods in members.items():
        waits[group] = (*waits.get(group, ()), *pods)
        for pod in pods:
            waits[pod] = (*waits.get(pod, ()), *declared.get(group, ()))
    cycle = find_cycle(waits)
    if cycle is None:
        return None
    notes: list[str] = []
    declared_by = ""
    for a, b in itertools.pairwise(cycle):
        if b in declared.get(a, ()):
            declared_by = declared_by or a
        elif a in group_of and b in declared.get(group_of[a], ()):
            declared_by = declared_by or group_of[a]
            notes.append(f"{a} waits for what its pod group {group_of[a]} depends on")
    note = f" ({'; '.join(notes)})" if notes else ""
    return "dependency cycle: " + " -> ".join(cycle) + note, declared_by


def find_cycle(edges: Mapping[str, tuple[str, ...]]) -> list[str] | None:
    """A dependency cycle in ``edges`` (node → what it waits for), or None.

    Iterative depth-first search: chains of any length, no recursion limit.
    """
    done: set[str] = set()
    for root in sorted(edges):
        if root in done:
            continue
        path: list[str] = [root]
        on_path = {root}
        iters = [iter(edges.get(root, ()))]
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                iters.pop()
                continue
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                iters.append(iter(edges.get(nxt, ())))
    return None
