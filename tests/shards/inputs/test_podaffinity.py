"""A pod's inter-pod rules as pasted: read into the spec, resolved as the API server and
kube-scheduler resolve them (label keys merged, namespaces), or refused naming the
field; never accepted and ignored."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from events.errors import InputError
from events.types import LabelSelector, LabelSelectorRequirement
from shards.inputs.objects import pod_spec

ZONE = "topology.kubernetes.io/zone"


def pod(
    affinity: dict[str, Any] | None = None,
    spread: list[Any] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c"}]}
    if affinity is not None:
        spec["affinity"] = affinity
    if spread is not None:
        spec["topologySpreadConstraints"] = spread
    return {
        "metadata": {"name": "p", "namespace": "shop", "labels": labels or {"app": "web"}},
        "spec": spec,
    }


def term(**fields: Any) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": ZONE, **fields}


def test_terms_are_read_with_their_namespaces() -> None:
    spec = pod_spec(
        pod(
            {
                "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [term()],
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 7, "podAffinityTerm": term(namespaces=["data"])}
                    ],
                },
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [term(namespaceSelector={})],
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 3,
                            "podAffinityTerm": term(
                                namespaceSelector={
                                    "matchLabels": {"kubernetes.io/metadata.name": "ops"}
                                },
                                namespaces=["data"],
                            ),
                        }
                    ],
                },
            }
        )
    )
    (required,) = spec.pod_affinity
    assert required.namespaces == ("shop",)  # the pod's own, by default
    assert required.selector == LabelSelector(match_labels={"app": "db"})
    assert spec.pod_affinity_preferred[0].weight == 7
    assert spec.pod_affinity_preferred[0].term.namespaces == ("data",)
    assert spec.pod_anti_affinity[0].all_namespaces  # namespaceSelector: {} is all
    assert spec.pod_anti_affinity_preferred[0].term.namespaces == ("data", "ops")


def test_label_keys_are_merged_into_the_selector() -> None:
    spec = pod_spec(
        pod(
            {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        term(matchLabelKeys=["rev", "absent"], mismatchLabelKeys=["team"])
                    ]
                }
            },
            [
                {
                    "maxSkew": 1,
                    "topologyKey": ZONE,
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app": "web"}},
                    "matchLabelKeys": ["rev"],
                    "minDomains": 3,
                    "nodeTaintsPolicy": "Honor",
                }
            ],
            labels={"app": "web", "rev": "7", "team": "blue"},
        )
    )
    selector = spec.pod_anti_affinity[0].selector
    assert selector is not None
    assert selector.match_expressions == (
        LabelSelectorRequirement(key="rev", operator="In", values=("7",)),
        LabelSelectorRequirement(key="team", operator="NotIn", values=("blue",)),
    )
    (constraint,) = spec.spread_constraints
    assert constraint.min_domains == 3
    assert constraint.node_taints_policy == "Honor"
    assert constraint.node_affinity_policy == "Honor"
    assert constraint.selector is not None
    assert constraint.selector.match_expressions == (
        LabelSelectorRequirement(key="rev", operator="In", values=("7",)),
    )


SPREAD = {
    "maxSkew": 1,
    "topologyKey": ZONE,
    "whenUnsatisfiable": "DoNotSchedule",
    "labelSelector": {"matchLabels": {"app": "web"}},
}
PA = "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"


@pytest.mark.parametrize(
    ("obj", "location", "message"),
    [
        (pod({"podAffinity": {"required": []}}), "spec.affinity.podAffinity.required", "unknown"),
        (pod({"podAfinity": {}}), "spec.affinity.podAfinity", "unknown field"),
        (
            pod(
                {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [term(topologyKey="")]
                    }
                }
            ),
            f"{PA}.topologyKey",
            "must not be empty",
        ),
        (
            pod(
                {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [term(topologyKeys=ZONE)]
                    }
                }
            ),
            f"{PA}.topologyKeys",
            "unknown field",
        ),
        (
            pod(
                {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            term(namespaceSelector={"matchLabels": {"team": "a"}})
                        ]
                    }
                }
            ),
            f"{PA}.namespaceSelector.matchLabels",
            "namespace labels are not modelled",
        ),
        (
            pod(
                {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": ZONE, "matchLabelKeys": ["app"]}
                        ]
                    }
                }
            ),
            f"{PA}.matchLabelKeys",
            "needs a labelSelector",
        ),
        (
            pod(
                {
                    "podAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 0, "podAffinityTerm": term()}
                        ]
                    }
                }
            ),
            "spec.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
            "1..100",
        ),
        (
            pod(
                {
                    "podAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            term(
                                labelSelector={
                                    "matchExpressions": [
                                        {"key": "a", "operator": "Gt", "values": ["1"]}
                                    ]
                                }
                            )
                        ]
                    }
                }
            ),
            f"{PA}.labelSelector.matchExpressions[0].operator",
            "unknown operator",
        ),
        (
            pod(spread=[{**SPREAD, "maxSkew": 0}]),
            "spec.topologySpreadConstraints[0].maxSkew",
            "1..",
        ),
        (
            pod(spread=[{**SPREAD, "whenUnsatisfiable": "Never"}]),
            "spec.topologySpreadConstraints[0].whenUnsatisfiable",
            "DoNotSchedule or ScheduleAnyway",
        ),
        (
            pod(spread=[{**SPREAD, "whenUnsatisfiable": "ScheduleAnyway", "minDomains": 2}]),
            "spec.topologySpreadConstraints[0].minDomains",
            "only with",
        ),
        (
            pod(spread=[{**SPREAD, "nodeAffinityPolicy": "honor"}]),
            "spec.topologySpreadConstraints[0].nodeAffinityPolicy",
            "Honor or Ignore",
        ),
        (
            pod(spread=[SPREAD, SPREAD]),
            "spec.topologySpreadConstraints[1].topologyKey",
            "duplicate",
        ),
        (
            pod(spread=[{**SPREAD, "matchLabelKeys": ["app"]}]),
            "spec.topologySpreadConstraints[0].matchLabelKeys",
            "already in labelSelector",
        ),
    ],
)
def test_bad_rules_are_refused_naming_the_field(
    obj: dict[str, Any], location: str, message: str
) -> None:
    with pytest.raises(InputError) as info:
        pod_spec(obj)
    assert info.value.location == location
    assert message in info.value.message


def test_a_pod_file_may_not_set_the_owner_selector(tmp_path: Any) -> None:
    from shards.inputs.scenario import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
        "shoal.io/owner-selector: {matchLabels: {a: b}}\nspec: {containers: [{name: c}]}\n"
    )
    with pytest.raises(InputError, match="not a field of a Pod"):
        load_scenario([str(path)])


def test_workload_pods_carry_their_owner_selector(tmp_path: Any) -> None:
    from shards.inputs.scenario import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text(
        """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c}]}
"""
    )
    scenario = load_scenario([str(path)])
    owners = [
        e.event.pod.owner_selector
        for e in scenario.events
        if type(e.event).__name__ == "PodSubmitted"
    ]
    (owner,) = set(map(msgspec.json.encode, owners))  # the ReplicaSet's, for both
    selector = msgspec.json.decode(owner, type=LabelSelector)
    assert selector.match_labels["app"] == "web"
    assert set(selector.match_labels) == {"app", "pod-template-hash"}
