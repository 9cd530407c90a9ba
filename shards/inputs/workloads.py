"""Workload objects → the pods their controllers would create.

Kinds: ``apps/v1`` Deployment, ReplicaSet, StatefulSet, DaemonSet and ``batch/v1`` Job.
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

Every pod carries an ``ownerReferences`` entry for its controller (the ReplicaSet for a
Deployment). ``shoal.io/arrive-at`` on the workload's metadata says when it is
created; ``shoal.io/runtime``, ``shoal.io/fails`` and ``shoal.io/depends-on`` in the
template apply to every pod. A field shoal reads but does not act on gives a warning;
an unknown field is an error.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from engine.model.state import ClusterState
from engine.plugins.selector import match_labels, match_terms
from engine.plugins.taints import HARD_EFFECTS, tolerates
from events.errors import InputError
from events.types import NodeSpec, Toleration
from shards.inputs.groups import DEPENDS_ON
from shards.inputs.limits import MAX_OBJECTS, shown
from shards.inputs.objects import ARRIVE_AT, RUNTIME, _map, _name, _string_map, pod_spec

WORKLOAD_KINDS: Final = {
    ("apps/v1", "Deployment"),
    ("apps/v1", "ReplicaSet"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "DaemonSet"),
    ("batch/v1", "Job"),
}
ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
"""``k8s.io/apimachinery/pkg/util/rand``: no vowels, no look-alikes."""
MAX_GENERATED_PREFIX: Final = 58
"""``validation.MaxGeneratedNameLength``: 63 less the five generated characters."""
POD_NAME_LABEL: Final = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL: Final = "apps.kubernetes.io/pod-index"
REVISION_LABEL: Final = "controller-revision-hash"
TEMPLATE_HASH_LABEL: Final = "pod-template-hash"
COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"
JOB_NAME_LABELS: Final = ("batch.kubernetes.io/job-name", "job-name")
JOB_UID_LABELS: Final = ("batch.kubernetes.io/controller-uid", "controller-uid")
DAEMON_TOLERATIONS: Final = (
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
)
"""``util.AddOrUpdateDaemonPodTolerations`` (and ``network-unavailable`` with host
networking)."""

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


@dataclass
class Expansion:
    """What a workload object became: pod manifests with their arrival times (ns), in
    the order the controller creates them, and warnings as (field, message)."""

    pods: list[tuple[dict[str, Any], int]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class NodeArrival:
    spec: NodeSpec
    at: int


def generated_suffix(seed: str, taken: set[str]) -> str:
    """Five characters of :data:`ALPHABET`, a function of ``seed`` alone, not in
    ``taken`` (and added to it): the part of a generated name Kubernetes draws at random."""
    for attempt in range(1000):
        value = _fnv64(f"{seed}#{attempt}" if attempt else seed)
        chars = []
        for _ in range(5):
            value, digit = divmod(value, len(ALPHABET))
            chars.append(ALPHABET[digit])
        suffix = "".join(chars)
        if suffix not in taken:
            taken.add(suffix)
            return suffix
    raise InputError("could not draw a free generated name")  # 27**5 names; never


def safe_encode(text: str) -> str:
    """``rand.SafeEncodeString``: each byte mapped into :data:`ALPHABET`."""
    return "".join(ALPHABET[b % len(ALPHABET)] for b in text.encode())


def template_hash(template: Mapping[str, Any]) -> str:
    """The ``pod-template-hash`` of a template: FNV-32a of its canonical JSON, as a
    decimal string spelled by :func:`safe_encode` (the form Kubernetes' has)."""
    text = json.dumps(template, sort_keys=True, default=str)
    return safe_encode(str(_fnv32(text)))


def _fnv32(text: str) -> int:
    value = 0x811C9DC5
    for byte in text.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def _fnv64(text: str) -> int:
    value = 0xCBF29CE484222325
    for byte in text.encode():
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return value


def _count(spec: Mapping[str, Any], key: str, default: int, budget: int) -> int:
    value = spec.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError(
            f"must be a non-negative integer, got {shown(value)}", location=f"spec.{key}"
        )
    if value > budget:
        raise InputError(
            f"{value} pods would take the scenario past {MAX_OBJECTS} objects",
            location=f"spec.{key}",
        )
    return value


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


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputError(f"must be a list, got {type(value).__name__}", location=where)
    return value


@dataclass(frozen=True, slots=True)
class _Workload:
    kind: str
    api_version: str
    name: str
    namespace: str
    uid: str
    spec: Mapping[str, Any]
    template_meta: Mapping[str, Any]
    template_spec: Mapping[str, Any]
    labels: dict[str, str]
    annotations: dict[str, str]

    def owner(self, kind: str = "", name: str = "", api_version: str = "") -> dict[str, Any]:
        return {
            "apiVersion": api_version or self.api_version,
            "kind": kind or self.kind,
            "name": name or self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def pod(
        self,
        name: str,
        owner: dict[str, Any],
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        spec: Mapping[str, Any] | None = None,
        generate_name: str = "",
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": name,
            "namespace": self.namespace,
            "labels": {**self.labels, **(labels or {})},
            "annotations": {**self.annotations, **(annotations or {})},
            "ownerReferences": [owner],
        }
        if generate_name:
            meta["generateName"] = generate_name
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {**self.template_spec, **(spec or {})},
        }


def _read(
    obj: Mapping[str, Any], classes: Mapping[str, int], warnings: list[tuple[str, str]]
) -> _Workload:
    kind = str(obj["kind"])
    meta = _map(obj.get("metadata"), "metadata", required=True)
    name = _name(meta, "metadata")
    namespace = meta.get("namespace", "default")
    if not isinstance(namespace, str) or not namespace or "/" in namespace:
        raise InputError(f"invalid namespace {shown(namespace)}", location="metadata.namespace")
    uid = meta.get("uid")
    if uid is None:
        uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"shoal:{kind}/{namespace}/{name}"))
    elif not isinstance(uid, str):
        raise InputError("must be a string", location="metadata.uid")
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
    workload = _Workload(
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


def _check_selector(workload: _Workload, *, required: bool) -> None:
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
    out = Expansion()
    workload = _read(obj, classes, out.warnings)
    kind = workload.kind
    if kind == "Job":
        _job(workload, at, budget, out)
    elif kind == "DaemonSet":
        _check_selector(workload, required=True)
        _daemons(workload, at, classes, nodes, out)
    else:
        _check_selector(workload, required=True)
        replicas = _count(workload.spec, "replicas", 1, budget)
        if kind == "StatefulSet":
            _stateful(workload, at, replicas, out)
        elif kind == "Deployment":
            digest = template_hash({"template": dict(obj["spec"]["template"])})
            rs = _prefixed(workload.name, digest)
            owner = workload.owner("ReplicaSet", rs)
            _replicas(workload, at, replicas, rs, owner, {TEMPLATE_HASH_LABEL: digest}, out)
        else:
            _replicas(workload, at, replicas, workload.name, workload.owner(), {}, out)
    return out


def _prefixed(name: str, suffix: str) -> str:
    text = f"{name}-{suffix}"
    if len(text) > 253:
        raise InputError(
            f"{shown(text)} (its controller's name for what it creates) is longer than 253",
            location="metadata.name",
        )
    return text


def _generate_name(prefix: str) -> str:
    """``names.SimpleNameGenerator``: the prefix cut to 58 characters."""
    return prefix[:MAX_GENERATED_PREFIX]


def _replicas(
    workload: _Workload,
    at: int,
    replicas: int,
    owner_name: str,
    owner: dict[str, Any],
    labels: dict[str, str],
    out: Expansion,
) -> None:
    prefix = _generate_name(f"{owner_name}-")
    taken: set[str] = set()
    for i in range(replicas):
        suffix = generated_suffix(f"{workload.namespace}/{owner_name}/{i}", taken)
        pod = workload.pod(prefix + suffix, owner, labels=labels, generate_name=f"{owner_name}-")
        out.pods.append((pod, at))


def _stateful(workload: _Workload, at: int, replicas: int, out: Expansion) -> None:
    spec = workload.spec
    policy = spec.get("podManagementPolicy", "OrderedReady")
    if policy not in ("OrderedReady", "Parallel"):
        raise InputError(
            f"must be OrderedReady or Parallel, got {shown(policy)}",
            location="spec.podManagementPolicy",
        )
    if policy == "OrderedReady" and replicas > 1:
        out.warnings.append(
            (
                "spec.podManagementPolicy",
                "OrderedReady is not modelled: the pods are submitted together in ordinal "
                "order, not each once the one before it runs",
            )
        )
    service = spec.get("serviceName", "")
    if not isinstance(service, str):
        raise InputError("must be a string", location="spec.serviceName")
    ordinals = _map(spec.get("ordinals"), "spec.ordinals")
    start = ordinals.get("start", 0)
    if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < 2**31:
        raise InputError(
            f"must be a non-negative integer, got {shown(start)}", location="spec.ordinals.start"
        )
    revision = f"{workload.name}-{template_hash({'template': dict(spec['template'])})}"
    owner = workload.owner()
    for ordinal in range(start, start + replicas):
        name = f"{workload.name}-{ordinal}"
        if len(name) > 63:
            raise InputError(
                f"the pod name {shown(name)} is a label value and hostname: at most 63 characters",
                location="metadata.name",
            )
        labels = {POD_NAME_LABEL: name, POD_INDEX_LABEL: str(ordinal), REVISION_LABEL: revision}
        extra: dict[str, Any] = {"hostname": name}
        if service:
            extra["subdomain"] = service
        out.pods.append((workload.pod(name, owner, labels=labels, spec=extra), at))


def _daemons(
    workload: _Workload,
    at: int,
    classes: Mapping[str, int],
    nodes: Sequence[NodeArrival],
    out: Expansion,
) -> None:
    template = pod_spec(workload.pod(workload.name, workload.owner()), classes)
    tolerations = (
        *template.tolerations,
        *(Toleration(key=k, operator="Exists", effect=e) for k, e in DAEMON_TOLERATIONS),
    )
    if workload.template_spec.get("hostNetwork") is True:
        tolerations += (
            Toleration(
                key="node.kubernetes.io/network-unavailable", operator="Exists", effect="NoSchedule"
            ),
        )
    state = ClusterState()
    for node in nodes:
        state.add_node(node.spec)
    mask = match_labels(state, template.node_selector) if template.node_selector else state.valid
    if template.required_affinity is not None:
        mask = mask & match_terms(state, template.required_affinity)
    chosen = set(np.flatnonzero(mask).tolist())
    owner = workload.owner()
    taken: set[str] = set()
    revision = template_hash({"template": dict(workload.spec["template"])})
    toleration_list = [
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
        for t in tolerations
    ]
    prefix = _generate_name(f"{workload.name}-")
    for node in nodes:
        if state.index[node.spec.name] not in chosen:
            continue
        if any(
            taint.effect in HARD_EFFECTS and not tolerates(tolerations, taint)
            for taint in node.spec.taints
        ):
            continue
        affinity = dict(_map(workload.template_spec.get("affinity"), "spec.template.spec.affinity"))
        node_affinity = dict(
            _map(affinity.get("nodeAffinity"), "spec.template.spec.affinity.nodeAffinity")
        )
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [node.spec.name]}
                    ]
                }
            ]
        }
        affinity["nodeAffinity"] = node_affinity
        suffix = generated_suffix(f"{workload.namespace}/{workload.name}/{node.spec.name}", taken)
        pod = workload.pod(
            prefix + suffix,
            owner,
            labels={REVISION_LABEL: revision, "pod-template-generation": "1"},
            spec={"affinity": affinity, "tolerations": toleration_list},
            generate_name=f"{workload.name}-",
        )
        out.pods.append((pod, max(at, node.at)))


def _job(workload: _Workload, at: int, budget: int, out: Expansion) -> None:
    spec = workload.spec
    restart = workload.template_spec.get("restartPolicy")
    if restart not in ("Never", "OnFailure"):
        raise InputError(
            f"a Job's pods need restartPolicy Never or OnFailure, got {shown(restart)}",
            location="spec.template.spec.restartPolicy",
        )
    manual = spec.get("manualSelector", False)
    if not isinstance(manual, bool):
        raise InputError("must be true or false", location="spec.manualSelector")
    if manual:
        _check_selector(workload, required=True)
    elif spec.get("selector") is not None:
        raise InputError(
            "a Job's selector is generated unless manualSelector is true", location="spec.selector"
        )
    suspend = spec.get("suspend", False)
    if not isinstance(suspend, bool):
        raise InputError("must be true or false", location="spec.suspend")
    mode = spec.get("completionMode", "NonIndexed")
    if mode not in ("NonIndexed", "Indexed"):
        raise InputError(
            f"must be NonIndexed or Indexed, got {shown(mode)}", location="spec.completionMode"
        )
    has_completions = spec.get("completions") is not None
    parallelism = _count(spec, "parallelism", 1, budget)
    if mode == "Indexed" and not has_completions:
        raise InputError("an Indexed Job needs completions", location="spec.completions")
    if has_completions:
        completions = _count(spec, "completions", 1, budget)
    else:  # both unset: 1 and 1; parallelism alone: a work queue of that many pods
        completions = parallelism if "parallelism" in spec else 1
    if suspend or parallelism == 0:
        return
    slots = min(parallelism, completions)
    labels = {
        **dict.fromkeys(JOB_NAME_LABELS, workload.name),
        **dict.fromkeys(JOB_UID_LABELS, workload.uid),
    }
    owner = workload.owner()
    taken: set[str] = set()
    names: list[str] = []
    waits = workload.annotations.get(DEPENDS_ON, "")
    for k in range(completions):
        annotations: dict[str, str] = {}
        pod_labels = dict(labels)
        extra: dict[str, Any] = {}
        if mode == "Indexed":
            base = f"{workload.name}-{k}-"
            if len(base) > MAX_GENERATED_PREFIX:
                base = workload.name[: MAX_GENERATED_PREFIX - len(f"-{k}-")] + f"-{k}-"
            annotations[COMPLETION_INDEX] = pod_labels[COMPLETION_INDEX] = str(k)
            extra["hostname"] = f"{workload.name}-{k}"[:63]
        else:
            base = _generate_name(f"{workload.name}-")
        name = base + generated_suffix(f"{workload.namespace}/{workload.name}/{k}", taken)
        if k >= slots and slots:
            before = names[k - slots]
            annotations[DEPENDS_ON] = f"{waits},{before}" if waits else before
        names.append(name)
        pod = workload.pod(name, owner, labels=pod_labels, annotations=annotations, spec=extra)
        pod["metadata"]["generateName"] = base
        out.pods.append((pod, at))
    if completions > slots and slots:
        out.warnings.append(
            (
                "spec.completions",
                f"pods beyond the first {slots} each wait for the one {slots} before them "
                "to succeed (shoal.io/depends-on), not for whichever ends first",
            )
        )
