"""Workload objects → the pods their controllers would create.

Kinds: ``apps/v1`` Deployment, ReplicaSet, StatefulSet, DaemonSet and ``batch/v1`` Job
(and Volcano's ``batch.volcano.sh/v1alpha1`` Job: :mod:`shards.inputs.volcano`).
Each is expanded, when the scenario is read, into ``v1 Pod`` manifests named and
labelled as the Kubernetes controllers name and label them (``pkg/controller`` of
kubernetes/kubernetes):

- **Deployment** ``web``: a ReplicaSet ``web-<pod-template-hash>``, whose pods are
  ``web-<hash>-<5 chars>`` with the label ``pod-template-hash``. Kubernetes' hash is
  FNV-32a of the Go-printed template; here it is FNV-32a of the template's canonical
  JSON, spelled in the same alphabet (``bcdfghjklmnpqrstvwxz2456789``). The five
  "random" characters of a generated name are drawn from that alphabet by a hash of
  the owner's name and the pod's number, so every run and replay names pods alike.
- **ReplicaSet** ``rs``: pods ``rs-<5 chars>``.
- **StatefulSet** ``db``: pods ``db-0`` … ``db-N-1`` (from ``spec.ordinals.start``),
  labelled ``statefulset.kubernetes.io/pod-name``, ``apps.kubernetes.io/pod-index``
  and ``controller-revision-hash``; ``hostname`` is the pod's name and ``subdomain``
  the ``serviceName``. ``podManagementPolicy: Parallel`` creates them all at once, as
  shoal does. ``OrderedReady`` (the default) creates pod N+1 only once pod N is
  running and ready; shoal has no arrival "when another pod runs", so it submits them
  together in ordinal order (the queue takes them in that order) and says so in a
  warning: a pod after one that cannot run may run here, where it would not exist.
- **DaemonSet** ``agent``: one pod ``agent-<5 chars>`` per node the template may run on
  (its ``nodeSelector``, required node affinity and tolerations against the node's
  labels and ``NoSchedule``/``NoExecute`` taints, with the tolerations the DaemonSet
  controller adds), pinned to that node by a required node affinity on
  ``metadata.name`` as the controller does. It arrives when both the DaemonSet and
  the node have.
- **Job** ``train``: ``parallelism`` pods at once (default 1), ``completions`` in all
  (default: ``parallelism`` as a work queue when only ``parallelism`` is set, else 1).
  Pods are ``train-<5 chars>``, or ``train-<index>-<5 chars>`` with ``completionMode:
  Indexed`` and the ``batch.kubernetes.io/job-completion-index`` annotation and label;
  all carry ``batch.kubernetes.io/job-name`` and ``controller-uid``. Beyond the first
  ``parallelism``, pod k is created when pod k - ``parallelism`` has succeeded
  (``shoal.io/depends-on``): exact when the pods run equally long, and otherwise a
  slot waits for its own predecessor rather than for whichever pod ends first.
  ``suspend: true`` creates no pods.

Every pod manifest carries an ``ownerReferences`` entry for its controller (the
ReplicaSet for a Deployment); the scheduler's ``PodSpec`` has no owner field, so what
reaches the log is the names and labels, not the reference. ``shoal.io/arrive-at`` on
the workload's metadata says when it is created; ``shoal.io/runtime``,
``shoal.io/fails`` and ``shoal.io/depends-on`` in the template apply to every pod. A
field shoal reads but does not act on gives a warning; an unknown field is an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from events.errors import InputError
from shards.inputs.controllers import (
    TEMPLATE_HASH_LABEL,
    Expansion,
    NodeArrival,
    Workload,
    count,
    daemon_pods,
    job_pods,
    prefixed,
    replica_pods,
    stateful_pods,
    template_hash,
)
from shards.inputs.fields import _list, identity
from shards.inputs.limits import shown
from shards.inputs.objects import (
    ARRIVE_AT,
    OWNER_SELECTOR,
    RUNTIME,
    _map,
    _string_map,
    pod_spec,
)
from shards.inputs.podfields import check_spelling
from shards.inputs.volcano import API_VERSION as VOLCANO_JOB
from shards.inputs.volcano import volcano_job

__all__ = ["WORKLOAD_KINDS", "Expansion", "NodeArrival", "expand"]

WORKLOAD_KINDS: Final = {
    (VOLCANO_JOB, "Job"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "ReplicaSet"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "DaemonSet"),
    ("batch/v1", "Job"),
}
_ACTED: Final = {
    "Deployment": ("replicas", "selector", "template"),
    "ReplicaSet": ("replicas", "selector", "template"),
    "StatefulSet": (
        "replicas",
        "selector",
        "template",
        "podManagementPolicy",
        "serviceName",
        "ordinals",
    ),
    "DaemonSet": ("selector", "template"),
    "Job": (
        "parallelism",
        "completions",
        "completionMode",
        "template",
        "suspend",
        "selector",
        "manualSelector",
    ),
}
_INERT: Final = {
    "Deployment": (
        "strategy",
        "minReadySeconds",
        "revisionHistoryLimit",
        "progressDeadlineSeconds",
    ),
    "ReplicaSet": ("minReadySeconds",),
    "StatefulSet": (
        "updateStrategy",
        "revisionHistoryLimit",
        "minReadySeconds",
        "persistentVolumeClaimRetentionPolicy",
    ),
    "DaemonSet": ("updateStrategy", "minReadySeconds", "revisionHistoryLimit"),
    "Job": ("ttlSecondsAfterFinished",),
}
"""Fields that change nothing shoal simulates (updates, readiness, clean-up after)."""
_WARNED: Final = {
    "Deployment": {"paused": "a paused Deployment creates no ReplicaSet; shoal creates it"},
    "ReplicaSet": {},
    "StatefulSet": {
        "volumeClaimTemplates": "volumes are not modelled: pods are placed as if their "
        "claims bind on any node",
    },
    "DaemonSet": {},
    "Job": {
        "backoffLimit": "a failed pod is not replaced",
        "backoffLimitPerIndex": "a failed pod is not replaced",
        "maxFailedIndexes": "a failed pod is not replaced",
        "podFailurePolicy": "a failed pod is not replaced",
        "podReplacementPolicy": "a failed pod is not replaced",
        "activeDeadlineSeconds": "the Job is not stopped at its deadline",
        "successPolicy": "the Job runs all its completions",
        "managedBy": "shoal creates the pods as the built-in Job controller would",
    },
}


def _selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A ``metav1.LabelSelector`` against labels (validated by the caller)."""
    for key, value in _string_map(selector.get("matchLabels"), "spec.selector.matchLabels").items():
        if labels.get(key) != value:
            return False
    for i, raw in enumerate(
        _list(selector.get("matchExpressions"), "spec.selector.matchExpressions")
    ):
        where = f"spec.selector.matchExpressions[{i}]"
        item = _map(raw, where, required=True)
        want, op = item.get("key"), item.get("operator")
        values = _list(item.get("values"), f"{where}.values")
        if not isinstance(want, str) or not all(isinstance(v, str) for v in values):
            raise InputError("needs a key and string values", location=where)
        if op == "In":
            hit = want in labels and labels[want] in values
        elif op == "NotIn":
            hit = want not in labels or labels[want] not in values
        elif op == "Exists":
            hit = want in labels
        elif op == "DoesNotExist":
            hit = want not in labels
        else:
            raise InputError(
                f"unknown operator {shown(op)} (In, NotIn, Exists, DoesNotExist)",
                location=f"{where}.operator",
            )
        if not hit:
            return False
    return True


def _read(
    obj: Mapping[str, Any], classes: Mapping[str, int], warnings: list[tuple[str, str]]
) -> Workload:
    kind = str(obj["kind"])
    meta, name, namespace, uid = identity(obj, kind)
    _string_map(meta.get("annotations"), "metadata.annotations")
    spec = _map(obj.get("spec"), "spec", required=True)
    known = (*_ACTED[kind], *_INERT[kind], *_WARNED[kind])
    for key in spec:
        if key not in known:
            raise InputError(
                f"unknown field (a {kind} has: {', '.join(sorted(known))})", location=f"spec.{key}"
            )
        if key in _WARNED[kind]:
            warnings.append((f"spec.{key}", f"not acted on: {_WARNED[kind][key]}"))
    template = _map(spec.get("template"), "spec.template", required=True)
    template_meta = _map(template.get("metadata"), "spec.template.metadata")
    template_spec = _map(template.get("spec"), "spec.template.spec", required=True)
    labels = _string_map(template_meta.get("labels"), "spec.template.metadata.labels")
    annotations = _string_map(
        template_meta.get("annotations"), "spec.template.metadata.annotations"
    )
    if ARRIVE_AT in annotations:
        raise InputError(
            f"set {ARRIVE_AT} on the {kind}'s metadata: its pods arrive as its controller "
            "creates them",
            location=f'spec.template.metadata.annotations["{ARRIVE_AT}"]',
        )
    for key in ("nodeName", "schedulingGates"):
        if template_spec.get(key):
            raise InputError(
                f"a {kind}'s pods are placed by the scheduler: shoal does not read "
                f"{key} in a template",
                location=f"spec.template.spec.{key}",
            )
    workload = Workload(
        kind=kind,
        api_version=str(obj["apiVersion"]),
        name=name,
        namespace=namespace,
        uid=uid,
        spec=spec,
        template_meta=template_meta,
        template_spec=template_spec,
        labels=labels,
        annotations=annotations,
    )
    # the template, checked once as a pod: errors name the workload's field
    try:
        check_spelling(template_spec)
        pod_spec(workload.pod(name, workload.owner()), classes)
    except InputError as exc:
        raise InputError(exc.message, location=f"spec.template.{exc.location}") from None
    if kind != "Job" and RUNTIME in annotations:
        warnings.append(
            (
                f'spec.template.metadata.annotations["{RUNTIME}"]',
                f"a {kind}'s pods restart (restartPolicy Always): a pod whose runtime ends "
                "succeeds here and is not replaced",
            )
        )
    return workload


def _check_selector(workload: Workload, *, required: bool) -> None:
    raw = workload.spec.get("selector")
    if raw is None:
        if required:
            raise InputError("missing (apps/v1 needs a selector)", location="spec.selector")
        return
    selector = _map(raw, "spec.selector")
    for key in selector:
        if key not in ("matchLabels", "matchExpressions"):
            raise InputError(
                "unknown field (matchLabels, matchExpressions)", location=f"spec.selector.{key}"
            )
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        raise InputError("an empty selector selects every pod", location="spec.selector")
    if not _selector_matches(selector, workload.labels):
        raise InputError(
            "does not match the template's labels (`selector` does not match template "
            "`labels`, as the API server says)",
            location="spec.selector",
        )


def expand(
    obj: Mapping[str, Any],
    at: int,
    classes: Mapping[str, int],
    nodes: Sequence[NodeArrival],
    budget: int,
) -> Expansion:
    """The pods of one workload object created at ``at`` (ns): at most ``budget`` of
    them, else an :class:`InputError` naming the count's field."""
    if obj.get("apiVersion") == VOLCANO_JOB:
        return volcano_job(obj, at, classes, budget)
    out = Expansion()
    workload = _read(obj, classes, out.warnings)
    kind = workload.kind
    if kind == "Job":
        manual = workload.spec.get("manualSelector", False)
        if not isinstance(manual, bool):
            raise InputError("must be true or false", location="spec.manualSelector")
        if manual:
            _check_selector(workload, required=True)
        elif workload.spec.get("selector") is not None:
            raise InputError(
                "a Job's selector is generated unless manualSelector is true",
                location="spec.selector",
            )
        job_pods(workload, at, budget, out)
    elif kind == "DaemonSet":
        _check_selector(workload, required=True)
        daemon_pods(workload, at, classes, nodes, out)
    else:
        _check_selector(workload, required=True)
        replicas = count(workload.spec, "replicas", 1, budget)
        selector = dict(_map(workload.spec["selector"], "spec.selector"))
        if kind == "StatefulSet":
            stateful_pods(workload, at, replicas, out)
        elif kind == "Deployment":
            digest = template_hash({"template": dict(obj["spec"]["template"])})
            rs = prefixed(workload.name, digest)
            owner = workload.owner("ReplicaSet", rs)
            replica_pods(workload, at, replicas, rs, owner, {TEMPLATE_HASH_LABEL: digest}, out)
            # the ReplicaSet's selector: the Deployment's and its pod-template-hash
            labels = dict(_map(selector.get("matchLabels"), "spec.selector.matchLabels"))
            selector["matchLabels"] = {**labels, TEMPLATE_HASH_LABEL: digest}
        else:
            replica_pods(workload, at, replicas, workload.name, workload.owner(), {}, out)
        # what the profile's default spread constraints select (kube-scheduler's
        # DefaultSelector: the owning ReplicaSet's or StatefulSet's selector)
        for manifest, _ in out.pods:
            manifest[OWNER_SELECTOR] = selector
    return out
