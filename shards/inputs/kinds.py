"""Kinds a scenario may hold besides those shoal reads: skipped with a warning, or refused.

A bundle pasted from a cluster or a chart holds Namespaces, ConfigMaps, Services and
the like next to its workloads. The rule for a document whose kind shoal does not read:

1. **Known, not about placement** (:data:`SKIPPED`: Namespace, ConfigMap, Secret,
   Service, RBAC, networking, autoscaling...): skipped, with a warning naming the file,
   the document and the kind; where such a kind does bear on scheduling in a real
   cluster (a LimitRange's default requests, a RuntimeClass's overhead, volumes), the
   warning says what is not modelled.
2. **Looks like a kind shoal reads** (a kind shoal reads under another apiVersion, or
   one spelt nearly like it: ``Pdo``, ``Deploymnet``, ``apps/v1beta1 Deployment``):
   refused with exit 2, suggesting the kind meant. A typo must not drop a workload.
3. **Anything else** (a custom resource shoal does not know: an operator's job, a
   monitoring object): skipped with a warning that says so, and that pods it would make
   a controller create are not simulated.

A ``batch/v1 CronJob`` is skipped with a warning too: it creates Jobs on a schedule, and
a scenario has no clock of calendars; write the Job its ``jobTemplate`` holds, with
``shoal.io/arrive-at``, to simulate one run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from shards.inputs.fields import typo_of
from shards.inputs.limits import shown

NOT_PLACEMENT: Final = "does not concern scheduling"
SKIPPED: Final[dict[tuple[str, str], str]] = {
    **{
        ("", kind): NOT_PLACEMENT
        for kind in (
            "Namespace",
            "ConfigMap",
            "Secret",
            "Service",
            "ServiceAccount",
            "Endpoints",
            "Event",
            "PodTemplate",
            "ReplicationController",
            "ComponentStatus",
        )
    },
    ("", "LimitRange"): "not acted on: its default requests are not applied to pods "
    "(state them in the pods)",
    ("", "ResourceQuota"): "not acted on: a namespace's ResourceQuota is not enforced "
    "(an ElasticQuota or a Kueue ClusterQueue is)",
    ("", "PersistentVolume"): "not acted on: volumes are not modelled",
    ("", "PersistentVolumeClaim"): "not acted on: volumes are not modelled; pods are "
    "placed as if their claims bind on any node",
    ("storage.k8s.io", "StorageClass"): "not acted on: volumes are not modelled",
    ("storage.k8s.io", "CSIDriver"): "not acted on: volumes are not modelled",
    ("storage.k8s.io", "CSINode"): "not acted on: volumes are not modelled",
    ("storage.k8s.io", "VolumeAttachment"): "not acted on: volumes are not modelled",
    ("node.k8s.io", "RuntimeClass"): "not acted on: a RuntimeClass's overhead and node "
    "selector are not read (state them in the pods' spec.overhead and nodeSelector)",
    ("apps", "ControllerRevision"): NOT_PLACEMENT,
    ("batch", "CronJob"): "not acted on: a CronJob creates Jobs on its schedule, which "
    "a scenario does not run; to simulate one run, write its jobTemplate as a batch/v1 "
    "Job with shoal.io/arrive-at",
    **{
        ("networking.k8s.io", kind): NOT_PLACEMENT
        for kind in ("Ingress", "IngressClass", "NetworkPolicy")
    },
    ("discovery.k8s.io", "EndpointSlice"): NOT_PLACEMENT,
    **{
        ("rbac.authorization.k8s.io", kind): NOT_PLACEMENT
        for kind in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
    },
    ("autoscaling", "HorizontalPodAutoscaler"): "not acted on: replicas stay as the "
    "workload states them",
    **{
        ("admissionregistration.k8s.io", kind): NOT_PLACEMENT
        for kind in (
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        )
    },
    ("apiextensions.k8s.io", "CustomResourceDefinition"): NOT_PLACEMENT,
    ("apiregistration.k8s.io", "APIService"): NOT_PLACEMENT,
    ("coordination.k8s.io", "Lease"): NOT_PLACEMENT,
    ("events.k8s.io", "Event"): NOT_PLACEMENT,
    ("certificates.k8s.io", "CertificateSigningRequest"): NOT_PLACEMENT,
    ("kueue.x-k8s.io", "Workload"): "not acted on: Kueue makes Workloads of the jobs "
    "it admits; shoal admits the pods by their queue-name label",
    ("scheduling.volcano.sh", "Queue"): "not acted on: Volcano queues are not "
    "modelled (shoal's quotas are per namespace: an ElasticQuota, or a Kueue "
    "ClusterQueue through a LocalQueue)",
}
"""(API group, kind) → why it is skipped (any version of the group)."""
_KIND: Final = re.compile(r"[A-Za-z][A-Za-z0-9]{0,62}")
_VERSION: Final = re.compile(r"(?:[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?v[a-z0-9]{1,20}")


def group_of(api_version: str) -> str:
    """``apps/v1`` → ``apps``; ``v1`` → ``""`` (the core group)."""
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def skipped(api_version: str, kind: str) -> str | None:
    """Why a document of a kind known not to concern scheduling is skipped (rule 1), or
    None for any other kind."""
    return SKIPPED.get((group_of(api_version), kind))


def nearest(kind: str, read: Iterable[tuple[str, str]]) -> tuple[str, tuple[str, ...]] | None:
    """The kind shoal reads that ``kind`` names or resembles, with the apiVersions shoal
    reads it under; None when it resembles none."""
    versions: dict[str, list[str]] = {}
    for version, known in read:
        versions.setdefault(known, []).append(version)
    meant = typo_of(kind, versions)
    return None if meant is None else (meant, tuple(sorted(versions[meant])))


def is_object(version: object, kind: object) -> bool:
    """Whether ``apiVersion`` and ``kind`` can name a Kubernetes kind at all."""
    return (
        isinstance(version, str)
        and isinstance(kind, str)
        and _VERSION.fullmatch(version) is not None
        and _KIND.fullmatch(kind) is not None
    )


def unknown_kind_message(version: object, kind: object, read: Iterable[tuple[str, str]]) -> str:
    """The refusal of a document whose kind looks like one shoal reads, or that is no
    Kubernetes object (no apiVersion and kind as the API spells them): short enough to
    be whole."""
    if not is_object(version, kind):
        return (
            "not a Kubernetes object: needs an apiVersion (v1, GROUP/VERSION) and a kind "
            f"(letters and digits), got apiVersion {shown(version)} and kind {shown(kind)}"
        )
    assert isinstance(kind, str)
    near = nearest(kind, read)
    if near is None:  # never refused (rule 3); kept for callers that refuse anyway
        return f"unknown kind {shown(kind)} with apiVersion {shown(version)}"
    name, versions = near
    if name == kind:
        return f"shoal reads {kind} with apiVersion {' or '.join(versions)}, not {shown(version)}"
    return (
        f"unknown kind {shown(kind)} with apiVersion {shown(version)}: did you mean "
        f"{versions[0]} {name}?"
    )


def skip_warning(version: object, kind: object, read: Iterable[tuple[str, str]]) -> str | None:
    """The warning for a document that is skipped, or None when it must be refused."""
    if not is_object(version, kind):
        return None
    assert isinstance(version, str) and isinstance(kind, str)
    why = skipped(version, kind)
    if why is not None:
        article = "an" if kind[:1] in "AEIOU" else "a"
        return f"skipped: {article} {kind} {why}" if why == NOT_PLACEMENT else f"skipped, {why}"
    if nearest(kind, read) is not None:
        return None
    return (
        f"skipped: shoal does not read {shown(kind)} ({shown(version)}); pods a "
        "controller would create from it are not simulated"
    )
