"""Pods and nodes as Kubernetes admits them: priority class fields carried into the
pod, and the labels a kubelet puts on its node."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from events.errors import InputError
from events.types import PodSpec
from shards.inputs.objects import node_spec, pod_spec, priority_class


def _class(name: str, value: int, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "value": value, **extra}


def _pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}], **spec}}


def _classes(*objs: dict[str, Any]) -> dict[str, int]:
    """Class name → value, ``""`` for the global default: what the scenario loader and
    Kubernetes ingest keep."""
    out: dict[str, int] = {}
    for obj in objs:
        name, value, default = priority_class(obj)
        out[name] = value
        if default:
            out[""] = value
    return out


CLASSES = _classes(
    _class("batch", 100, preemptionPolicy="Never"),
    _class("urgent", 1000),
    _class("normal", 10, globalDefault=True, preemptionPolicy="Never"),
)


@pytest.mark.parametrize(
    ("spec", "priority", "policy", "class_name"),
    [
        ({"priorityClassName": "batch"}, 100, "Never", "batch"),
        ({"priorityClassName": "urgent"}, 1000, "PreemptLowerPriority", "urgent"),
        # no class: the global default's name, value and policy
        ({}, 10, "Never", "normal"),
        # a stated priority without a class is kept, with the policy the pod states
        ({"priority": 5}, 5, "PreemptLowerPriority", ""),
        ({"priority": 5, "preemptionPolicy": "Never"}, 5, "Never", ""),
        # stating what the class says is fine
        ({"priorityClassName": "batch", "preemptionPolicy": "Never"}, 100, "Never", "batch"),
        (
            {"priorityClassName": "system-node-critical"},
            2_000_001_000,
            "PreemptLowerPriority",
            "system-node-critical",
        ),
    ],
)
def test_priority_class_fields_are_carried_into_the_pod(
    spec: dict[str, Any], priority: int, policy: str, class_name: str
) -> None:
    pod = pod_spec(_pod(**spec), CLASSES)
    assert (pod.priority, pod.preemption_policy, pod.priority_class) == (
        priority,
        policy,
        class_name,
    )
    assert type(pod.priority) is int  # never the class's value object: it goes in events
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(pod), type=PodSpec) == pod


def test_without_a_default_class_a_pod_gets_zero_and_may_preempt() -> None:
    pod = pod_spec(_pod(), _classes(_class("batch", 100, preemptionPolicy="Never")))
    assert (pod.priority, pod.preemption_policy, pod.priority_class) == (
        0,
        "PreemptLowerPriority",
        "",
    )


@pytest.mark.parametrize(
    ("spec", "message", "location"),
    [
        (
            {"priorityClassName": "batch", "preemptionPolicy": "PreemptLowerPriority"},
            "contradicts priority class",
            "spec.preemptionPolicy",
        ),
        ({"preemptionPolicy": "PreemptLowerPriority"}, "contradicts", "spec.preemptionPolicy"),
        ({"preemptionPolicy": "Sometimes"}, "unknown preemption policy", "spec.preemptionPolicy"),
    ],
)
def test_a_pod_contradicting_its_class_is_refused(
    spec: dict[str, Any], message: str, location: str
) -> None:
    with pytest.raises(InputError) as info:
        pod_spec(_pod(**spec), CLASSES)
    assert message in info.value.message
    assert info.value.location == location


def test_a_class_with_an_unknown_policy_is_refused() -> None:
    with pytest.raises(InputError) as info:
        priority_class(_class("x", 1, preemptionPolicy="Always"))
    assert info.value.location == "preemptionPolicy"


def _node(name: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": "1"}},
    }


def test_a_node_gets_the_labels_a_kubelet_sets() -> None:
    assert node_spec(_node("gpu-7", zone="a")).labels == {
        "zone": "a",
        "kubernetes.io/hostname": "gpu-7",
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
    }


def test_labels_a_node_states_win() -> None:
    labels = node_spec(
        _node("n", **{"kubernetes.io/arch": "arm64", "kubernetes.io/hostname": "n.example"})
    ).labels
    assert labels["kubernetes.io/arch"] == "arm64"
    assert labels["kubernetes.io/hostname"] == "n.example"
    assert labels["kubernetes.io/os"] == "linux"


def test_a_long_node_name_gives_a_valid_hostname_label() -> None:
    name = "n" * 100
    assert node_spec(_node(name)).labels["kubernetes.io/hostname"] == "n" * 63
