"""Every field of a pod's ``spec``, and what shoal does with it: nothing silent.

:data:`POD_SPEC_FIELDS` lists the fields of core/v1 ``PodSpec`` (Kubernetes 1.31). Each
is *acted on* (``ACTED``: read into the pod shoal schedules), *not about placement*
(``RUNTIME``: the kubelet's business, where the pod runs changes nothing for it), or
read and *not acted on*, with why: such a field, when set, gives a warning naming it
(on stderr, and under ``warnings`` in ``simulate --json``; logged by ``shoal serve``).
A field missing from the table (one a later Kubernetes adds) is reported too, so a pod
never carries something shoal silently drops. ``tests/shards/inputs/test_podfields.py``
walks every field and checks each is honoured or reported.

The same holds one level down: :data:`CONTAINER_FIELDS` and :data:`RESOURCES_FIELDS`
(``spec.containers[i]`` and its ``resources``). A field that none of the tables knows is
reported as not acted on (a later Kubernetes may add fields); but in a scenario file an
unknown field that is *spelled nearly like* a known one (``resource:``, ``requets:``,
``limit:``, ``imag:``, ``nodeSelecter:``) is a typo, refused with exit 2 naming it and
the field it resembles (:func:`check_spelling`), as ``kubectl``'s strict field
validation refuses it: a pod whose requests were misspelt would otherwise ask for
nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

from events.errors import InputError
from shards.inputs.fields import typo_of
from shards.inputs.limits import shown

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
    "resourceClaims": ACTED,
    "resources": "not acted on: pod-level resources are not counted; the containers' requests are",
    "restartPolicy": RUNTIME,
    "runtimeClassName": "not acted on: a RuntimeClass's overhead and node selector are "
    "not read (state them in spec.overhead and spec.nodeSelector)",
    "schedulerName": ACTED,
    "schedulingGates": ACTED,
    "schedulingGroup": ACTED,
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
"""core/v1 PodSpec field → ``ACTED``, ``RUNTIME``, or why it is read and not acted on.
``schedulingGroup`` is Kubernetes 1.36's (the pod's PodGroup: a gang shoal enforces)."""

CONTAINER_FIELDS: Final[dict[str, str]] = {
    "args": RUNTIME,
    "command": RUNTIME,
    "env": RUNTIME,
    "envFrom": RUNTIME,
    "image": RUNTIME,
    "imagePullPolicy": RUNTIME,
    "lifecycle": RUNTIME,
    "livenessProbe": RUNTIME,
    "name": RUNTIME,
    "ports": ACTED,
    "readinessProbe": RUNTIME,
    "resizePolicy": RUNTIME,
    "resources": ACTED,
    "restartPolicy": ACTED,
    "restartPolicyRules": RUNTIME,
    "securityContext": RUNTIME,
    "startupProbe": RUNTIME,
    "stdin": RUNTIME,
    "stdinOnce": RUNTIME,
    "terminationMessagePath": RUNTIME,
    "terminationMessagePolicy": RUNTIME,
    "tty": RUNTIME,
    "volumeDevices": RUNTIME,
    "volumeMounts": RUNTIME,
    "workingDir": RUNTIME,
}
"""core/v1 Container field (Kubernetes 1.34) → ``ACTED`` or ``RUNTIME`` (ports: host
ports; resources: requests; restartPolicy: an init container that is a sidecar)."""
RESOURCES_FIELDS: Final[dict[str, str]] = {
    "limits": ACTED,
    "requests": ACTED,
    "claims": RUNTIME,
}
"""core/v1 ResourceRequirements field → ``ACTED`` or why it is not acted on (``claims``:
which of the pod's DRA claims a container sees, once the pod's are allocated)."""
CONTAINER_LISTS: Final = ("containers", "initContainers")
"""The container lists whose requests and host ports count (``ephemeralContainers``
request nothing: the API forbids them resources and ports)."""

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
    for where, key, meaning in _nested_fields(spec):
        if meaning is None:
            what = "container" if "resources" not in where else "resources"
            out.append((f"{where}.{key}", f"not acted on: not a {what} field shoal knows"))
        elif meaning not in (ACTED, RUNTIME):
            out.append((f"{where}.{key}", meaning))
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


def _nested_fields(spec: Mapping[str, Any]) -> Iterator[tuple[str, str, str | None]]:
    """(where, field, its meaning or None if unknown) for each field of each container
    and of its ``resources`` (shapes are checked where the fields are read)."""
    for list_name in CONTAINER_LISTS:
        containers = spec.get(list_name)
        if not isinstance(containers, list):
            continue
        for i, container in enumerate(containers):
            if not isinstance(container, Mapping):
                continue
            where = f"spec.{list_name}[{i}]"
            for key in container:
                yield where, str(key), CONTAINER_FIELDS.get(key)
            resources = container.get("resources")
            if isinstance(resources, Mapping):
                for key in resources:
                    yield f"{where}.resources", str(key), RESOURCES_FIELDS.get(key)


def check_spelling(spec: Mapping[str, Any]) -> None:
    """Refuse an unknown field of the pod spec, of a container or of its ``resources``
    that is spelt nearly like a known one (a typo, which would drop what it meant)."""
    candidates = [("spec", str(key), POD_SPEC_FIELDS.get(key)) for key in spec]
    candidates += _nested_fields(spec)
    for where, key, meaning in candidates:
        if meaning is not None:
            continue
        table = (
            POD_SPEC_FIELDS
            if where == "spec"
            else RESOURCES_FIELDS
            if where.endswith(".resources")
            else CONTAINER_FIELDS
        )
        near = typo_of(key, table)
        if near is not None:
            raise InputError(
                f"unknown field {shown(key)}: did you mean {near}?", location=f"{where}.{key}"
            )


def gated(spec: Mapping[str, Any]) -> bool:
    """Whether the pod waits for scheduling gates to be removed (kube-scheduler does
    not schedule it meanwhile; neither does shoal)."""
    gates = spec.get("schedulingGates")
    return isinstance(gates, list) and bool(gates)
