"""Volcano's ``batch.volcano.sh/v1alpha1 Job`` → the PodGroup and pods its controller
creates (``pkg/controllers/job`` of volcano-sh/volcano).

- A **PodGroup** ``<job>-<uid>`` (``scheduling.volcano.sh/v1beta1``): ``minMember`` the
  Job's ``minAvailable`` (default: every task's replicas added up; ``0`` makes a group
  of minimum 1, each pod on its own), and the Job's ``queue``, ``priorityClassName``
  and ``networkTopology``. (Volcano also sets ``minResources``, the requests of the
  first ``minAvailable`` pods: shoal places the members themselves, which says
  more.) It is read as any Volcano PodGroup (:mod:`shards.inputs.groups`): a gang, all
  of ``minAvailable`` or none.
- Per task, ``replicas`` pods ``<job>-<task>-<index>`` from the task's ``template``,
  annotated ``scheduling.k8s.io/group-name`` (the group) and labelled and annotated
  ``volcano.sh/job-name``, ``volcano.sh/task-spec``, ``volcano.sh/queue-name`` as the
  controller does; the Job's ``schedulerName`` where the template states none (a
  profile of that name schedules them: add one named ``volcano`` to the configuration
  when the Job names it).

``shoal.io/arrive-at`` on the Job says when it is created; ``shoal.io/runtime`` in a
task's template applies to its pods. What shoal does not act on (``policies``,
``maxRetry``, a task's own ``minAvailable``...) gives a warning; an unknown field is
an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from events.errors import InputError
from shards.inputs.controllers import Expansion, Workload, prefixed
from shards.inputs.fields import _list, identity
from shards.inputs.limits import MAX_MIN_MEMBER, MAX_OBJECTS, shown
from shards.inputs.objects import ARRIVE_AT, _map, _string_map, pod_spec
from shards.inputs.podfields import check_spelling

API_VERSION: Final = "batch.volcano.sh/v1alpha1"
GROUP_VERSION: Final = "scheduling.volcano.sh/v1beta1"
GROUP_ANNOTATION: Final = "scheduling.k8s.io/group-name"
JOB_NAME: Final = "volcano.sh/job-name"
JOB_NAMESPACE: Final = "volcano.sh/job-namespace"
TASK_SPEC: Final = "volcano.sh/task-spec"
QUEUE_NAME: Final = "volcano.sh/queue-name"
TASK_INDEX: Final = "volcano.sh/task-index"
_ACTED: Final = (
    "tasks",
    "minAvailable",
    "queue",
    "priorityClassName",
    "schedulerName",
    "networkTopology",
)
_INERT: Final = ("plugins", "volumes", "ttlSecondsAfterFinished", "runningEstimate")
"""Runtime matters: services, ssh keys and env for the pods, clean-up."""
_WARNED: Final = {
    "policies": "events and their actions (restart, abort) are not simulated",
    "maxRetry": "a failed pod is not retried",
    "minSuccess": "the Job runs until all its pods end",
}
_TASK_ACTED: Final = ("name", "replicas", "template")
_TASK_WARNED: Final = {
    "minAvailable": "members are not counted per task, only the Job's minAvailable",
    "policies": "events and their actions are not simulated",
    "maxRetry": "a failed pod is not retried",
    "dependsOn": "tasks start together, not in order",
    "topologyPolicy": "NUMA topology is not modelled",
    "partitionPolicy": "partitions are not modelled",
}


def _count(value: Any, where: str, budget: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError(f"must be a non-negative integer, got {shown(value)}", location=where)
    if value > budget:
        raise InputError(
            f"{value} pods would take the scenario past {MAX_OBJECTS} objects", location=where
        )
    return value


def _fields(
    raw: Mapping[str, Any],
    acted: tuple[str, ...],
    warned: Mapping[str, str],
    where: str,
    warnings: list[tuple[str, str]],
    inert: tuple[str, ...] = (),
) -> None:
    known = (*acted, *inert, *warned)
    for key in raw:
        if key not in known:
            raise InputError(
                f"unknown field (a Volcano Job has: {', '.join(sorted(known))})",
                location=f"{where}.{key}",
            )
        if key in warned and raw[key] not in (None, [], {}, ""):
            warnings.append((f"{where}.{key}", f"not acted on: {warned[key]}"))


def volcano_job(
    obj: Mapping[str, Any], at: int, classes: Mapping[str, int], budget: int
) -> Expansion:
    """The PodGroup and pods of one Volcano Job created at ``at`` (ns): at most
    ``budget`` documents, else an :class:`InputError` naming the count's field."""
    out = Expansion()
    meta, name, namespace, uid = identity(obj, "Job.batch.volcano.sh")
    annotations = _string_map(meta.get("annotations"), "metadata.annotations")
    spec = _map(obj.get("spec"), "spec", required=True)
    _fields(spec, _ACTED, _WARNED, "spec", out.warnings, _INERT)
    queue = spec.get("queue", "")
    scheduler = spec.get("schedulerName", "")
    for key, value in (("queue", queue), ("schedulerName", scheduler)):
        if not isinstance(value, str):
            raise InputError("must be a string", location=f"spec.{key}")
    tasks = _list(spec.get("tasks"), "spec.tasks")
    if not tasks:
        raise InputError("a Volcano Job needs at least one task", location="spec.tasks")
    group = prefixed(name, uid)
    owner = {
        "apiVersion": API_VERSION,
        "kind": "Job",
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    pods: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, raw in enumerate(tasks):
        where = f"spec.tasks[{i}]"
        task = _map(raw, where, required=True)
        _fields(task, _TASK_ACTED, _TASK_WARNED, where, out.warnings)
        task_name = task.get("name", "")
        if not isinstance(task_name, str) or not task_name or task_name in names:
            raise InputError(
                f"needs a unique name, got {shown(task_name)}", location=f"{where}.name"
            )
        names.add(task_name)
        replicas = _count(task.get("replicas", 0), f"{where}.replicas", budget - len(pods) - 1)
        template = _map(task.get("template"), f"{where}.template", required=True)
        template_meta = _map(template.get("metadata"), f"{where}.template.metadata")
        template_spec = dict(_map(template.get("spec"), f"{where}.template.spec", required=True))
        labels = _string_map(template_meta.get("labels"), f"{where}.template.metadata.labels")
        notes = _string_map(
            template_meta.get("annotations"), f"{where}.template.metadata.annotations"
        )
        if ARRIVE_AT in notes:
            raise InputError(
                f"set {ARRIVE_AT} on the Job's metadata: its pods arrive as its controller "
                "creates them",
                location=f'{where}.template.metadata.annotations["{ARRIVE_AT}"]',
            )
        if scheduler and not template_spec.get("schedulerName"):
            template_spec["schedulerName"] = scheduler
        workload = Workload(
            kind="Job",
            api_version=API_VERSION,
            name=name,
            namespace=namespace,
            uid=uid,
            spec=spec,
            template_meta=template_meta,
            template_spec=template_spec,
            labels=labels,
            annotations=notes,
        )
        marks = {JOB_NAME: name, JOB_NAMESPACE: namespace, TASK_SPEC: task_name}
        if queue:
            marks[QUEUE_NAME] = queue
        try:  # the template, checked once as a pod: errors name the Job's field
            check_spelling(template_spec)
            pod_spec(workload.pod(f"{name}-{task_name}-0", owner), classes)
        except InputError as exc:
            raise InputError(exc.message, location=f"{where}.template.{exc.location}") from None
        for index in range(replicas):
            pod_name = f"{name}-{task_name}-{index}"
            if len(pod_name) > 253:
                raise InputError(
                    f"the pod name {shown(pod_name)} is longer than 253", location=f"{where}.name"
                )
            pods.append(
                workload.pod(
                    pod_name,
                    owner,
                    labels=marks,
                    annotations={**marks, GROUP_ANNOTATION: group, TASK_INDEX: str(index)},
                )
            )
    minimum = spec.get("minAvailable")
    if minimum is None:
        minimum = len(pods)
    elif not isinstance(minimum, int) or isinstance(minimum, bool) or minimum < 0:
        raise InputError(
            f"must be a non-negative integer, got {shown(minimum)}", location="spec.minAvailable"
        )
    elif minimum > len(pods):
        raise InputError(
            f"{minimum} is more than the tasks' {len(pods)} replicas", location="spec.minAvailable"
        )
    if not pods:
        return out
    group_spec: dict[str, Any] = {"minMember": min(max(minimum, 1), MAX_MIN_MEMBER)}
    for key in ("queue", "priorityClassName", "networkTopology"):
        if spec.get(key):
            group_spec[key] = spec[key]
    group_meta = {
        "name": group,
        "namespace": namespace,
        "annotations": {k: v for k, v in annotations.items() if k != ARRIVE_AT},
        "ownerReferences": [owner],
    }
    out.pods.append(
        (
            {
                "apiVersion": GROUP_VERSION,
                "kind": "PodGroup",
                "metadata": group_meta,
                "spec": group_spec,
            },
            at,
        )
    )
    out.pods += ((pod, at) for pod in pods)
    return out
