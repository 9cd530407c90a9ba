"""Nothing silent: every field of a pod's spec and of a KubeSchedulerConfiguration that
can change where pods go is honoured (the pod or the configuration shoal builds
differs), reported (a warning naming it), or refused (exit 2 naming it).

The field lists below are copied from the Kubernetes API (core/v1 PodSpec and
kubescheduler.config.k8s.io/v1 KubeSchedulerConfiguration, 1.31), independently of the
table the code keeps, so a field the code forgot fails here.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.config import default_config, parse_config
from events.errors import InputError
from shards.inputs.objects import pod_spec
from shards.inputs.podfields import ACTED, POD_SPEC_FIELDS, RUNTIME, gated, unused_fields

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
            honoured = pod_spec(obj, CLASSES) != plain or gated(obj["spec"])
        except InputError:
            honoured = True  # refused, naming the field
        # volumes: the field is read; a claim in it is reported (not modelled)
        assert honoured or any(f.startswith(f"spec.{field}") for f in reported), field
    elif meaning == RUNTIME:
        # the kubelet's business: where the pod runs changes nothing for it
        assert pod_spec(obj, CLASSES) == plain, field
        assert not reported, field
    else:
        assert f"spec.{field}" in reported, field


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
