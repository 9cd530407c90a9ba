"""The pods each workload controller creates, named and labelled as upstream names them
(``pkg/controller`` of kubernetes/kubernetes); :mod:`shards.inputs.workloads` reads and
checks the objects and says what each kind does.

Generated names: the API server's ``SimpleNameGenerator`` appends five characters of
:data:`ALPHABET` drawn at random to a ``generateName`` cut to 58 characters; here they
are a function of the owner's namespace and name and the pod's number or node, so a
scenario names its pods alike in every run and replay.
"""

from __future__ import annotations

import json
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
from shards.inputs.objects import _map, pod_spec

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


def count(spec: Mapping[str, Any], key: str, default: int, budget: int) -> int:
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


@dataclass(frozen=True, slots=True)
class Workload:
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


def prefixed(name: str, suffix: str) -> str:
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


def replica_pods(
    workload: Workload,
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


def stateful_pods(workload: Workload, at: int, replicas: int, out: Expansion) -> None:
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


def daemon_pods(
    workload: Workload,
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


def job_pods(workload: Workload, at: int, budget: int, out: Expansion) -> None:
    spec = workload.spec
    restart = workload.template_spec.get("restartPolicy")
    if restart not in ("Never", "OnFailure"):
        raise InputError(
            f"a Job's pods need restartPolicy Never or OnFailure, got {shown(restart)}",
            location="spec.template.spec.restartPolicy",
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
    parallelism = count(spec, "parallelism", 1, budget)
    if mode == "Indexed" and not has_completions:
        raise InputError("an Indexed Job needs completions", location="spec.completions")
    if has_completions:
        completions = count(spec, "completions", 1, budget)
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
                "to succeed (shoal.io/depends-on), not for whichever ends first (the same "
                "when they start in order and run equally long); a failed one is not "
                "replaced and fails those after it",
            )
        )
