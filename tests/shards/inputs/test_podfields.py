"""Nothing silent: every field of a pod's spec and of a KubeSchedulerConfiguration that
can change where pods go is honoured (the pod or the configuration shoal builds
differs), reported (a warning naming it), or refused (exit 2 naming it).

The field lists below are copied from the Kubernetes API (core/v1 PodSpec and
kubescheduler.config.k8s.io/v1 KubeSchedulerConfiguration, 1.31), independently of the
table the code keeps, so a field the code forgot fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from engine.config import default_config, parse_config
from events.errors import InputError
from shards.inputs.dra import ClaimPending, DraCatalog
from shards.inputs.groups import group_membership
from shards.inputs.objects import pod_spec
from shards.inputs.podfields import (
    ACTED,
    CONTAINER_FIELDS,
    POD_SPEC_FIELDS,
    RESOURCES_FIELDS,
    RUNTIME,
    check_spelling,
    gated,
    unused_fields,
)
from shards.inputs.scenario import load_scenario

POD_SPEC = [
    "activeDeadlineSeconds",
    "affinity",
    "automountServiceAccountToken",
    "containers",
    "dnsConfig",
    "dnsPolicy",
    "enableServiceLinks",
    "ephemeralContainers",
    "hostAliases",
    "hostIPC",
    "hostNetwork",
    "hostPID",
    "hostUsers",
    "hostname",
    "imagePullSecrets",
    "initContainers",
    "nodeName",
    "nodeSelector",
    "os",
    "overhead",
    "preemptionPolicy",
    "priority",
    "priorityClassName",
    "readinessGates",
    "resourceClaims",
    "resources",
    "restartPolicy",
    "runtimeClassName",
    "schedulerName",
    "schedulingGates",
    "schedulingGroup",  # Kubernetes 1.36: the pod's PodGroup
    "securityContext",
    "serviceAccount",
    "serviceAccountName",
    "setHostnameAsFQDN",
    "shareProcessNamespace",
    "subdomain",
    "terminationGracePeriodSeconds",
    "tolerations",
    "topologySpreadConstraints",
    "volumes",
]

SAMPLES: dict[str, Any] = {
    "activeDeadlineSeconds": 60,
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
    "automountServiceAccountToken": False,
    "containers": [{"name": "c", "resources": {"requests": {"cpu": "3"}}}],
    "dnsConfig": {"nameservers": ["1.1.1.1"]},
    "dnsPolicy": "None",
    "enableServiceLinks": False,
    "ephemeralContainers": [{"name": "debug"}],
    "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["x"]}],
    "hostIPC": True,
    "hostNetwork": True,
    "hostPID": True,
    "hostUsers": False,
    "hostname": "h",
    "imagePullSecrets": [{"name": "s"}],
    "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "8"}}}],
    "nodeName": "n1",
    "nodeSelector": {"zone": "a"},
    "os": {"name": "windows"},
    "overhead": {"cpu": "250m"},
    "preemptionPolicy": "Never",
    "priority": 7,
    "priorityClassName": "high",
    "readinessGates": [{"conditionType": "x"}],
    "resourceClaims": [{"name": "gpu"}],
    "resources": {"requests": {"cpu": "2"}},
    "restartPolicy": "Never",
    "runtimeClassName": "kata",
    "schedulerName": "other",
    "schedulingGates": [{"name": "kueue"}],
    "schedulingGroup": {"podGroupName": "g"},
    "securityContext": {"runAsUser": 1000},
    "serviceAccount": "sa",
    "serviceAccountName": "sa",
    "setHostnameAsFQDN": True,
    "shareProcessNamespace": True,
    "subdomain": "s",
    "terminationGracePeriodSeconds": 5,
    "tolerations": [{"key": "gpu", "operator": "Exists"}],
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "x"}},
        }
    ],
    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
}
"""A value for each field that would change where the pod may go, if anything does."""
CLASSES = {"high": 1000}


def _pod(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"containers": [{"name": "c", "ports": [{"containerPort": 80}]}]}
    base.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": base}


def test_every_pod_spec_field_is_classified() -> None:
    assert set(POD_SPEC) == set(POD_SPEC_FIELDS)
    assert set(SAMPLES) == set(POD_SPEC)


@pytest.mark.parametrize("field", POD_SPEC)
def test_a_field_that_can_move_a_pod_is_honoured_or_reported(field: str) -> None:
    plain = pod_spec(_pod(), CLASSES)
    obj = _pod(**{field: SAMPLES[field]})
    reported = [f for f, _ in unused_fields(obj["spec"])]
    meaning = POD_SPEC_FIELDS[field]
    if meaning == ACTED:
        try:
            honoured = (
                pod_spec(obj, CLASSES) != plain
                or gated(obj["spec"])
                or group_membership(obj) != ("", None)
            )
        except InputError:
            honoured = True  # refused, naming the field
        if field == "resourceClaims":
            # read by the DRA catalog (shards/inputs/dra.py), which needs the claims
            with pytest.raises(ClaimPending):
                DraCatalog().pod(
                    plain, {"resourceClaims": [SAMPLES[field][0] | {"resourceClaimName": "c"}]}
                )
            honoured = True
        # volumes: the field is read; a claim in it is reported (not modelled)
        assert honoured or any(f.startswith(f"spec.{field}") for f in reported), field
    elif meaning == RUNTIME:
        # the kubelet's business: where the pod runs changes nothing for it
        assert pod_spec(obj, CLASSES) == plain, field
        assert not reported, field
    else:
        assert f"spec.{field}" in reported, field


CONTAINER = [
    "args",
    "command",
    "env",
    "envFrom",
    "image",
    "imagePullPolicy",
    "lifecycle",
    "livenessProbe",
    "name",
    "ports",
    "readinessProbe",
    "resizePolicy",
    "resources",
    "restartPolicy",
    "restartPolicyRules",
    "securityContext",
    "startupProbe",
    "stdin",
    "stdinOnce",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "tty",
    "volumeDevices",
    "volumeMounts",
    "workingDir",
]
"""core/v1 Container, Kubernetes 1.34."""


def test_every_container_field_is_classified() -> None:
    assert set(CONTAINER) == set(CONTAINER_FIELDS)
    assert set(RESOURCES_FIELDS) == {"limits", "requests", "claims"}


def test_a_scheduling_group_is_acted_on_not_reported() -> None:
    """The gang it names is enforced: no warning says otherwise."""
    obj = _pod(schedulingGroup={"podGroupName": "g"})
    assert unused_fields(obj["spec"]) == []
    assert group_membership(obj) == ("default/g", None)


@pytest.mark.parametrize(
    ("spec", "location", "meant"),
    [
        (
            {"containers": [{"name": "c", "resource": {}}]},
            "spec.containers[0].resource",
            "resources",
        ),
        (
            {"containers": [{"name": "c", "resources": {"requets": {"cpu": 1}}}]},
            "spec.containers[0].resources.requets",
            "requests",
        ),
        (
            {"containers": [{"name": "c", "resources": {"limit": {"cpu": 1}}}]},
            "spec.containers[0].resources.limit",
            "limits",
        ),
        ({"containers": [{"name": "c", "imag": "x"}]}, "spec.containers[0].imag", "image"),
        (
            {"containers": [{"name": "c"}], "initContainers": [{"name": "i", "Resources": {}}]},
            "spec.initContainers[0].Resources",
            "resources",
        ),
        ({"containers": [{"name": "c"}], "nodeSelectr": {}}, "spec.nodeSelectr", "nodeSelector"),
        ({"containers": [{"name": "c"}], "tolerati0ns": []}, "spec.tolerati0ns", "tolerations"),
    ],
)
def test_a_misspelt_field_is_refused_naming_what_it_resembles(
    spec: dict[str, Any], location: str, meant: str
) -> None:
    with pytest.raises(InputError) as info:
        check_spelling(spec)
    assert info.value.location == location
    assert f"did you mean {meant}?" in info.value.message


KNOWN = {
    "spec": POD_SPEC_FIELDS,
    "spec.containers[0]": CONTAINER_FIELDS,
    "spec.containers[0].resources": RESOURCES_FIELDS,
}


def _placed(where: str, key: str) -> dict[str, Any]:
    if where == "spec":
        return {"containers": [{"name": "c"}], key: {}}
    if where == "spec.containers[0]":
        return {"containers": [{"name": "c", key: {}}]}
    return {"containers": [{"name": "c", "resources": {key: {}}}]}


@st.composite
def misspelt(draw: st.DrawFn) -> tuple[str, str]:
    """A field's place and a name one edit (drop, swap, change or add a letter) from a
    field known there, and not itself one."""
    where = draw(st.sampled_from(sorted(KNOWN)))
    name = draw(st.sampled_from(sorted(KNOWN[where])))
    i = draw(st.integers(0, len(name) - 1))
    letter = draw(st.sampled_from("abcdefghijklmnopqrstuvwxyz"))
    edit = draw(st.sampled_from(["drop", "swap", "change", "add"]))
    if edit == "drop" and len(name) > 2:
        typo = name[:i] + name[i + 1 :]
    elif edit == "swap" and i + 1 < len(name):
        typo = name[:i] + name[i + 1] + name[i] + name[i + 2 :]
    elif edit == "change":
        typo = name[:i] + letter + name[i + 1 :]
    else:
        typo = name[:i] + letter + name[i:]
    assume(typo not in KNOWN[where])
    return where, typo


@settings(max_examples=60, deadline=None)
@given(case=misspelt())
def test_one_edit_from_a_known_field_is_refused(case: tuple[str, str]) -> None:
    where, typo = case
    with pytest.raises(InputError) as info:
        check_spelling(_placed(where, typo))
    assert info.value.location == f"{where}.{typo}"


def test_an_unknown_container_field_unlike_any_is_reported() -> None:
    spec = {
        "containers": [{"name": "c", "futureField": 1, "resources": {"claims": [{"name": "x"}]}}]
    }
    check_spelling(spec)
    # resources.claims: which DRA claims a container sees (the kubelet's business)
    assert [f for f, _ in unused_fields(spec)] == ["spec.containers[0].futureField"]


def test_a_field_shoal_does_not_know_is_reported() -> None:
    assert unused_fields({"futureField": 1}) == [
        ("spec.futureField", "not acted on: not a pod field shoal knows")
    ]


KUBE_SCHEDULER_CONFIGURATION = {
    "parallelism": 32,
    "percentageOfNodesToScore": 50,
    "podInitialBackoffSeconds": 3,
    "podMaxBackoffSeconds": 30,
    "leaderElection": {"leaderElect": False},
    "clientConnection": {"qps": 100},
    "healthzBindAddress": "0.0.0.0:10251",
    "metricsBindAddress": "0.0.0.0:10251",
    "enableProfiling": True,
    "enableContentionProfiling": True,
    "delayCacheUntilActive": True,
    "extenders": [{"urlPrefix": "http://127.0.0.1:1/x", "filterVerb": "filter"}],
    "profiles": [{"schedulerName": "other"}],
}
PROFILE = {
    "schedulerName": "other",
    "percentageOfNodesToScore": 10,
    "plugins": {"score": {"disabled": [{"name": "NodeAffinity"}]}},
    "pluginConfig": [{"name": "Rescheduler", "args": {"maxMoves": 1}}],
}


def _config(**fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        **fields,
    }


@pytest.mark.parametrize("field", sorted(KUBE_SCHEDULER_CONFIGURATION))
def test_every_configuration_field_is_honoured_or_reported(field: str) -> None:
    value = KUBE_SCHEDULER_CONFIGURATION[field]
    try:
        parsed = parse_config(_config(**{field: value}))
    except InputError as exc:
        assert field in str(exc)  # refused, naming the field
        return
    honoured = (
        parsed.profiles != default_config().profiles
        or parsed.initial_backoff_seconds != 1
        or parsed.max_backoff_seconds != 10
        or parsed.extenders
    )
    assert honoured or any(w.startswith(f"config.{field}:") for w in parsed.warnings), field


@pytest.mark.parametrize("field", sorted(PROFILE))
def test_every_profile_field_is_honoured_or_reported(field: str) -> None:
    profile = {field: PROFILE[field]}
    parsed = parse_config(_config(profiles=[profile]))
    honoured = parsed.profiles != default_config().profiles
    reported = any(w.startswith(f"config.profiles[0].{field}:") for w in parsed.warnings)
    assert honoured or reported, field


DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: c
        resources: {requets: {cpu: "2"}}
"""


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
            "spec: {containers: [{name: c, resource: {requests: {cpu: 1}}}]}\n",
            "document 1 (Pod p): spec.containers[0].resource: unknown field 'resource': "
            "did you mean resources?",
        ),
        (
            DEPLOYMENT,
            "document 1 (Deployment web): spec.template.spec.containers[0].resources.requets",
        ),
        (
            DEPLOYMENT.replace("replicas: 2", "replicas: 0"),
            "document 1 (Deployment web): spec.template.spec.containers[0].resources.requets",
        ),
    ],
)
def test_a_scenario_with_a_misspelt_request_is_refused(
    tmp_path: Path, text: str, where: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_scenario([str(path)])
    assert str(info.value).startswith(f"{path}: {where}"), str(info.value)
    assert "requets" in str(info.value) or "resource" in str(info.value)
