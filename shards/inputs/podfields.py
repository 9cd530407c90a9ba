"""Every field of a pod's ``spec``, and what shoal does with it: nothing silent.

:data:`POD_SPEC_FIELDS` lists the fields of core/v1 ``PodSpec`` (Kubernetes 1.31). Each
is *acted on* (``ACTED``: read into the pod shoal schedules), *not about placement*
(``RUNTIME``: the kubelet's business, where the pod runs changes nothing for it), or
read and *not acted on*, with why: such a field, when set, gives a warning naming it
(on stderr, and under ``warnings`` in ``simulate --json``; logged by ``shoal serve``).
A field missing from the table (one a later Kubernetes adds) is reported too, so a pod
never carries something shoal silently drops. ``tests/shards/inputs/test_podfields.py``
walks every field and checks each is honoured or reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

ACTED: Final = ""
RUNTIME: Final = "runtime"

POD_SPEC_FIELDS: Final[dict[str, str]] = {
    "activeDeadlineSeconds": RUNTIME,
    "affinity": ACTED,
    "automountServiceAccountToken": RUNTIME,
    "containers": ACTED,
    "dnsConfig": RUNTIME,
    "dnsPolicy": RUNTIME,
    "enableServiceLinks": RUNTIME,
    "ephemeralContainers": RUNTIME,
    "hostAliases": RUNTIME,
    "hostIPC": RUNTIME,
    "hostNetwork": ACTED,
    "hostPID": RUNTIME,
    "hostUsers": RUNTIME,
    "hostname": RUNTIME,
    "imagePullSecrets": RUNTIME,
    "initContainers": ACTED,
    "nodeName": ACTED,
    "nodeSelector": ACTED,
    "os": "not acted on: the kubelet refuses a pod whose os does not match its node's; "
    "select the node's kubernetes.io/os label to place it by os",
    "overhead": ACTED,
    "preemptionPolicy": ACTED,
    "priority": ACTED,
    "priorityClassName": ACTED,
    "readinessGates": RUNTIME,
    "resourceClaims": "not acted on: resource claims (dynamic resource allocation) are "
    "not modelled; the pod is placed by its other requests",
    "resources": "not acted on: pod-level resources are not counted; the containers' requests are",
    "restartPolicy": RUNTIME,
    "runtimeClassName": "not acted on: a RuntimeClass's overhead and node selector are "
    "not read (state them in spec.overhead and spec.nodeSelector)",
    "schedulerName": ACTED,
    "schedulingGates": ACTED,
    "securityContext": RUNTIME,
    "serviceAccount": RUNTIME,
    "serviceAccountName": RUNTIME,
    "setHostnameAsFQDN": RUNTIME,
    "shareProcessNamespace": RUNTIME,
    "subdomain": RUNTIME,
    "terminationGracePeriodSeconds": RUNTIME,
    "tolerations": ACTED,
    "topologySpreadConstraints": ACTED,
    "volumes": ACTED,
}
"""core/v1 PodSpec field → ``ACTED``, ``RUNTIME``, or why it is read and not acted on."""

VOLUME_SOURCES_PLACED: Final = frozenset({"persistentVolumeClaim", "ephemeral", "csi"})
"""Volume sources whose binding or attach limits decide where a pod may run
(kube-scheduler's VolumeBinding, VolumeZone, VolumeRestrictions and NodeVolumeLimits)."""


def unused_fields(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, message) for each field of ``spec`` set and not acted on."""
    out: list[tuple[str, str]] = []
    for key in spec:
        meaning = POD_SPEC_FIELDS.get(key)
        if meaning is None:
            out.append((f"spec.{key}", "not acted on: not a pod field shoal knows"))
        elif meaning not in (ACTED, RUNTIME) and spec[key] not in (None, [], {}, ""):
            out.append((f"spec.{key}", meaning))
    volumes = spec.get("volumes")
    if isinstance(volumes, list):
        for i, volume in enumerate(volumes):
            if not isinstance(volume, Mapping):
                continue
            placed = sorted(VOLUME_SOURCES_PLACED.intersection(volume))
            if placed:
                out.append(
                    (
                        f"spec.volumes[{i}].{placed[0]}",
                        "not acted on: volume binding, zones and attach limits are not "
                        "modelled; the pod is placed as if its volumes fit every node",
                    )
                )
    return out


def gated(spec: Mapping[str, Any]) -> bool:
    """Whether the pod waits for scheduling gates to be removed (kube-scheduler does
    not schedule it meanwhile; neither does shoal)."""
    gates = spec.get("schedulingGates")
    return isinstance(gates, list) and bool(gates)
