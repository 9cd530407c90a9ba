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
- KAI-Scheduler: ``scheduling.run.ai/v2alpha2 PodGroup`` (``minMember``, 1 when absent as
  KAI reads it; ``queue``, ``priorityClassName``); pods join by the annotation
  ``pod-group-name``.
- Kubernetes' own (``GenericWorkload``, 1.36 and later): ``scheduling.k8s.io/v1alpha2``
  or ``v1beta1`` ``PodGroup`` with ``spec.schedulingPolicy`` either ``gang: {minCount:
  N}`` (all or nothing, N members) or ``basic: {}`` (each pod on its own: a group of
  minimum 1), and ``priorityClassName``/``priority``; pods join by
  ``spec.schedulingGroup.podGroupName``. The template a PodGroup came from is checked
  (1.36's ``podGroupTemplateRef``, 1.37's ``workloadRef``); 1.37's default
  ``disruptionMode: {single: {}}`` is what shoal does. A ``Workload`` object only holds
  the templates controllers copy into PodGroups: it is checked, and schedules nothing
  itself. ``shoal serve`` watches these PodGroups live (``shards.kube.groups``).

All become one :class:`~events.types.GroupSpec`. A field of a PodGroup that shoal does
not act on (KAI's ``subGroups``, any field it does not know) gives a warning
(:func:`group_warnings`). Topology constraints (Volcano's ``networkTopology``,
Kubernetes' ``schedulingConstraints``, KAI's ``topologyConstraint``, annotations) are
read by :mod:`shards.inputs.topology`.

``shoal.io/depends-on: a,b`` on a pod or a group names pods or groups of the same
namespace that must succeed first.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Any, Final

from engine.model.groups import find_cycle
from events.errors import InputError
from events.types import SECOND, GroupSpec, QuotaSpec
from shards.inputs.limits import MAX_MIN_MEMBER, MAX_SECONDS, shown
from shards.inputs.objects import BUILTIN_PRIORITY_CLASSES, _map, _name, _string_map, quantities
from shards.inputs.topology import group_topology

DEPENDS_ON: Final = "shoal.io/depends-on"
GROUP_KINDS: Final = {
    "scheduling.x-k8s.io/v1alpha1": "scheduler-plugins",
    "scheduling.sigs.k8s.io/v1alpha1": "scheduler-plugins",
    "scheduling.volcano.sh/v1beta1": "volcano",
    "batch.scheduler.tencent.com/v1": "tencent",
    "scheduling.run.ai/v2alpha2": "kai",
    "scheduling.k8s.io/v1alpha2": "kubernetes",
    "scheduling.k8s.io/v1beta1": "kubernetes",
}
WORKLOAD_VERSIONS: Final = ("scheduling.k8s.io/v1alpha2", "scheduling.k8s.io/v1beta1")
"""Kubernetes' ``Workload`` (templates of PodGroups)."""
SCHEDULING_GROUP: Final = "spec.schedulingGroup.podGroupName"
QUEUE_NOT_MODELLED: Final = (
    "Volcano and KAI queues are not modelled: shoal's quotas are per namespace (an "
    "ElasticQuota, or a Kueue ClusterQueue through a LocalQueue); the group is "
    "scheduled without its queue's capacity"
)
_GROUP_FIELDS: Final[dict[str, dict[str, str]]] = {
    "scheduler-plugins": {
        "minMember": "",
        "minResources": "",
        "scheduleTimeoutSeconds": "",
    },
    "volcano": {
        "minMember": "",
        "minResources": "",
        "queue": QUEUE_NOT_MODELLED,
        "priorityClassName": "",
        "minTaskMember": "members are not counted per task",
        "networkTopology": "",
        "subGroupPolicy": "sub-groups are not modelled",
    },
    "tencent": {"minMember": "", "minResources": "", "maxScheduleTime": ""},
    "kai": {
        "minMember": "",
        "queue": QUEUE_NOT_MODELLED,
        "priorityClassName": "",
        "preemptibility": "preemptibility follows the pods' own preemption rules",
        "parallelism": "KAI's pod-grouper reads it; the scheduler places the pods given",
        "completions": "KAI's pod-grouper reads it; the scheduler places the pods given",
        "backoffLimit": "a failed group is not retried",
        "markUnschedulable": "shoal reports why each pod is pending in its own way",
        "schedulingBackoff": "the group is retried on shoal's back-off",
        "topologyConstraint": "",
        "subGroups": "sub-groups' own minMember is not enforced, only the group's",
    },
    "kubernetes": {
        "schedulingPolicy": "",
        "podGroupTemplateRef": "",
        "workloadRef": "",
        "priorityClassName": "",
        "priority": "",
        "schedulingConstraints": "",
        "resourceClaims": "resource claims (DRA) are not modelled",
        "disruptionMode": "preemption takes pods one by one, whatever the mode",
        "preemptionPolicy": "the members' own preemptionPolicy is followed",
        "parentCompositePodGroupName": "composite pod groups are not modelled",
    },
}
"""Each convention's ``spec`` fields: acted on ("") or, with why, read and not acted on."""
QUOTA_VERSIONS: Final = ("scheduling.x-k8s.io/v1alpha1", "scheduling.sigs.k8s.io/v1alpha1")
MEMBER_LABELS: Final = (
    ("label", "scheduling.x-k8s.io/pod-group"),
    ("label", "pod-group.scheduling.sigs.k8s.io/name"),
    ("annotation", "scheduling.k8s.io/group-name"),
    ("label", "group.batch.scheduler.tencent.com"),
    ("annotation", "pod-group-name"),
)
MIN_AVAILABLE: Final = "pod-group.scheduling.sigs.k8s.io/min-available"
LABELS: Final = "labels"
"""``GroupSpec.source`` of a group declared only by its pods' older coscheduling labels."""
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
    if source == "kubernetes":
        min_member = _scheduling_policy(spec)
        _template_ref(spec.get("podGroupTemplateRef"))
        _workload_ref(spec.get("workloadRef"))
    elif source == "kai" and spec.get("minMember") is None:
        min_member = 1  # KAI schedules max(minMember, 1)
    else:
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
    if source in ("volcano", "kai", "kubernetes") and spec.get("priorityClassName"):
        class_name = spec["priorityClassName"]
        known = {**BUILTIN_PRIORITY_CLASSES, **classes}
        if not isinstance(class_name, str) or class_name not in known:
            raise InputError(
                f"unknown priority class {shown(class_name)}", location="spec.priorityClassName"
            )
        priority = int(known[class_name])
    if source == "kubernetes" and spec.get("priority") is not None:
        given = spec["priority"]
        if not isinstance(given, int) or isinstance(given, bool) or not -(2**31) <= given < 2**31:
            raise InputError(
                f"must be a 32-bit integer, got {shown(given)}", location="spec.priority"
            )
        if class_name and given != priority:
            raise InputError(
                f"priority {given} contradicts priority class {shown(class_name)} ({priority})",
                location="spec.priority",
            )
        priority = given
    required, preferred = group_topology(obj, source)
    queue = spec.get("queue", "") if source in ("volcano", "kai") else ""
    if not isinstance(queue, str):
        raise InputError("must be a string", location="spec.queue")
    return GroupSpec(
        namespace=namespace,
        name=_name(meta, "metadata"),
        min_member=min_member,
        min_resources=quantities(spec.get("minResources"), "spec.minResources")
        if "minResources" in _GROUP_FIELDS[source]
        else {},
        timeout=timeout,
        priority=priority,
        priority_class=class_name,
        queue=queue,
        depends_on=dependencies(annotations, namespace),
        source=source,
        uid=_uid(meta),
        topology_required=required,
        topology_preferred=preferred,
    )


def _scheduling_policy(spec: Mapping[str, Any], where: str = "spec.schedulingPolicy") -> int:
    """Kubernetes' ``schedulingPolicy``: exactly one of ``basic: {}`` (→ 1) and ``gang:
    {minCount: N}`` (→ N)."""
    policy = _map(spec.get(where.rsplit(".", 1)[-1]), where, required=True)
    chosen = [key for key in ("basic", "gang") if policy.get(key) is not None]
    for key in policy:
        if key not in ("basic", "gang"):
            raise InputError("unknown policy (basic or gang)", location=f"{where}.{key}")
    if len(chosen) != 1:
        raise InputError("needs exactly one of basic and gang", location=where)
    body = _map(policy[chosen[0]], f"{where}.{chosen[0]}")
    if chosen[0] == "basic":
        if body:
            raise InputError("takes no fields", location=f"{where}.basic")
        return 1
    for key in body:
        if key != "minCount":
            raise InputError("unknown field (minCount)", location=f"{where}.gang.{key}")
    return _positive_int(body.get("minCount"), f"{where}.gang.minCount", MAX_MIN_MEMBER)


def _template_ref(raw: Any) -> None:
    """``podGroupTemplateRef: {workload: {workloadName, podGroupTemplateName}}``: checked;
    the PodGroup's own ``schedulingPolicy`` is what the scheduler follows."""
    if raw is None:
        return
    where = "spec.podGroupTemplateRef"
    ref = _map(raw, where)
    workload = _map(ref.get("workload"), f"{where}.workload", required=True)
    for key in ("workloadName", "podGroupTemplateName"):
        value = workload.get(key)
        if not isinstance(value, str) or not value:
            raise InputError("needs a name", location=f"{where}.workload.{key}")


def _workload_ref(raw: Any) -> None:
    """v1.37's ``workloadRef: {workloadName, templateName}``: checked, as above."""
    if raw is None:
        return
    ref = _map(raw, "spec.workloadRef")
    for key in ("workloadName", "templateName"):
        value = ref.get(key)
        if not isinstance(value, str) or not value:
            raise InputError("needs a name", location=f"spec.workloadRef.{key}")


ONE_BY_ONE: Final[tuple[object, ...]] = ("Pod", {"single": {}})
"""``disruptionMode`` values that say what shoal does anyway (1.36's and 1.37's spelling;
1.37 defaults every PodGroup to ``{single: {}}``)."""


def group_warnings(obj: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, message) for each ``spec`` field of a PodGroup that shoal does not act on."""
    fields = _GROUP_FIELDS[GROUP_KINDS[obj["apiVersion"]]]
    out = []
    spec = _map(obj.get("spec"), "spec", required=True)
    for key in spec:
        why = fields.get(key, f"not a field shoal knows (it reads: {', '.join(fields)})")
        if key == "queue" and spec[key] in ("", "default"):
            continue  # the queue every Volcano cluster has, unbounded unless configured
        if key == "disruptionMode" and spec[key] in ONE_BY_ONE:
            continue
        if why:
            out.append((f"spec.{key}", f"not acted on: {why}"))
    return out


def workload_warnings(obj: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Check a Kubernetes ``Workload`` (its templates, at most 8, each with a name and one
    scheduling policy); warn for what in it shoal does not act on. It creates nothing:
    PodGroups copy its templates and pods join the PodGroups."""
    _name(_map(obj.get("metadata"), "metadata", required=True), "metadata")
    spec = _map(obj.get("spec"), "spec", required=True)
    out: list[tuple[str, str]] = []
    for key in spec:
        if key not in ("podGroupTemplates", "controllerRef"):
            out.append((f"spec.{key}", "not acted on: not a field shoal knows"))
    templates = spec.get("podGroupTemplates")
    if not isinstance(templates, list) or not 1 <= len(templates) <= 8:
        raise InputError("must be a list of 1 to 8 templates", location="spec.podGroupTemplates")
    names: set[str] = set()
    for i, raw in enumerate(templates):
        where = f"spec.podGroupTemplates[{i}]"
        template = _map(raw, where, required=True)
        name = template.get("name")
        if not isinstance(name, str) or not name or name in names:
            raise InputError(f"needs a unique name, got {shown(name)}", location=f"{where}.name")
        names.add(name)
        _scheduling_policy(template, f"{where}.schedulingPolicy")
        for key in template:
            if key not in ("name", "schedulingPolicy"):
                out.append(
                    (f"{where}.{key}", "not acted on: PodGroups act on what they copy of it")
                )
    return out


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
    spec = _map(obj.get("spec"), "spec")
    if spec.get("workloadRef") is not None:
        raise InputError(
            "is Kubernetes 1.35's (scheduling.k8s.io/v1alpha1), which shoal does not read: "
            "use spec.schedulingGroup.podGroupName (1.36)",
            location="spec.workloadRef",
        )
    if spec.get("schedulingGroup") is not None:
        group = _map(spec["schedulingGroup"], "spec.schedulingGroup")
        for key in group:
            if key != "podGroupName":
                raise InputError(
                    "unknown field (podGroupName)", location=f"spec.schedulingGroup.{key}"
                )
        value = group.get("podGroupName")
        if not isinstance(value, str) or not value or "/" in value:
            raise InputError(
                f"must be a PodGroup's name, got {shown(value)}", location=SCHEDULING_GROUP
            )
        found[SCHEDULING_GROUP] = value
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
    cycle = find_cycle(lambda name: waits.get(name, ()), sorted(waits))
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
