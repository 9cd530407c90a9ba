"""Topology levels and gangs' constraints as each convention writes them: what is read
into the configuration and the GroupSpec, and what is refused (naming the field)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import parse_config
from events.errors import InputError
from events.types import PodGroupSubmitted
from shards.inputs.scenario import Scenario, load_scenario

KUEUE = """
apiVersion: kueue.x-k8s.io/v1beta1
kind: Topology
metadata: {name: default}
spec:
  levels:
  - {nodeLabel: example.com/block}
  - {nodeLabel: example.com/rack}
---"""


def load(tmp_path: Path, text: str) -> Scenario:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return load_scenario([str(path)])


def group_of(scenario: Scenario) -> tuple[str, str]:
    (group,) = [e.event.group for e in scenario.events if isinstance(e.event, PodGroupSubmitted)]
    return group.topology_required, group.topology_preferred


GROUPS = [
    (
        """
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata: {name: g, annotations: {shoal.io/topology-required: example.com/rack}}
spec: {minMember: 2}""",
        ("example.com/rack", ""),
    ),
    (
        """
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata:
  name: g
  annotations: {kueue.x-k8s.io/podset-preferred-topology: example.com/rack}
spec: {minMember: 2}""",
        ("", "example.com/rack"),
    ),
    (
        """
apiVersion: scheduling.volcano.sh/v1beta1
kind: PodGroup
metadata: {name: g}
spec: {minMember: 2, networkTopology: {mode: hard, highestTierAllowed: 2}}""",
        ("2", ""),
    ),
    (
        """
apiVersion: scheduling.volcano.sh/v1beta1
kind: PodGroup
metadata: {name: g}
spec: {minMember: 2, networkTopology: {mode: soft}}""",
        ("", "1"),
    ),
    (
        """
apiVersion: scheduling.k8s.io/v1alpha2
kind: PodGroup
metadata: {name: g}
spec:
  schedulingPolicy: {gang: {minCount: 2}}
  schedulingConstraints: {topology: [{key: example.com/block}]}""",
        ("example.com/block", ""),
    ),
    (
        """
apiVersion: scheduling.run.ai/v2alpha2
kind: PodGroup
metadata: {name: g}
spec:
  minMember: 2
  topologyConstraint:
    topology: default
    requiredTopologyLevel: example.com/block
    preferredTopologyLevel: example.com/rack""",
        ("example.com/block", "example.com/rack"),
    ),
]


@pytest.mark.parametrize(("text", "expected"), GROUPS)
def test_each_convention_names_its_levels(
    tmp_path: Path, text: str, expected: tuple[str, str]
) -> None:
    scenario = load(tmp_path, KUEUE + text)
    assert group_of(scenario) == expected
    assert not scenario.warnings
    assert scenario.config is not None
    topology = scenario.config.topology
    for level in expected:
        if level:
            assert topology.resolve(level) is not None


def test_kueue_levels_are_listed_broadest_first(tmp_path: Path) -> None:
    scenario = load(tmp_path, KUEUE)
    assert scenario.config is not None
    topology = scenario.config.topology
    assert [level.label for level in topology.levels] == ["example.com/rack", "example.com/block"]
    assert topology.resolve("1") == 0  # tier 1: the narrowest
    assert topology.resolve("example.com/block") == 1


REFUSED = [
    (
        KUEUE + KUEUE,
        "document 2 (Topology default): metadata.name: a second Topology",
    ),
    (
        """
apiVersion: scheduling.volcano.sh/v1beta1
kind: PodGroup
metadata: {name: g}
spec: {minMember: 2, networkTopology: {mode: strict}}""",
        "spec.networkTopology.mode: must be hard or soft",
    ),
    (
        """
apiVersion: scheduling.volcano.sh/v1beta1
kind: PodGroup
metadata: {name: g}
spec: {minMember: 2, networkTopology: {highestTierAllowed: 1, highestTierName: leaf}}""",
        "highestTierAllowed and highestTierName cannot both be set",
    ),
    (
        """
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata:
  name: g
  annotations:
    shoal.io/topology-required: rack
    kueue.x-k8s.io/podset-required-topology: block
spec: {minMember: 2}""",
        "names different required topology levels",
    ),
    (
        """
apiVersion: scheduling.k8s.io/v1alpha2
kind: PodGroup
metadata: {name: g}
spec:
  schedulingPolicy: {gang: {minCount: 2}}
  schedulingConstraints: {topology: [{key: a}, {key: b}]}""",
        "spec.schedulingConstraints.topology: must be a list of at most one",
    ),
    (
        """
apiVersion: topology.volcano.sh/v1alpha1
kind: HyperNode
metadata: {name: h}
spec: {tier: 1, members: [{type: HyperNode, selector: {labelMatch: {matchLabels: {a: b}}}}]}""",
        "labelMatch selects nodes only",
    ),
    (
        """
apiVersion: topology.volcano.sh/v1alpha1
kind: HyperNode
metadata: {name: h}
spec: {tier: 1, members: [{type: Node, selector: {regexMatch: {pattern: "("}}}]}""",
        "regexMatch.pattern: not a regular expression",
    ),
    (
        """
apiVersion: topology.volcano.sh/v1alpha1
kind: HyperNode
metadata: {name: h, annotations: {shoal.io/arrive-at: "5"}}
spec: {tier: 1, members: [{type: Node, selector: {exactMatch: {name: n}}}]}""",
        "topology is read before the run starts",
    ),
    (
        """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
topology: {levels: [{nodeLabel: example.com/rack}]}
---"""
        + KUEUE,
        "declare it once",
    ),
]


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_bad_topology_is_refused_naming_the_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InputError) as error:
        load(tmp_path, text)
    assert message in str(error.value)


def test_configuration_levels_by_labels_or_hypernodes_not_both() -> None:
    raw = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "topology": {
            "levels": [{"nodeLabel": "r"}],
            "hyperNodes": [{"name": "h", "tier": 1, "members": []}],
        },
    }
    with pytest.raises(InputError, match="not both"):
        parse_config(raw, "")


def test_a_topology_annotation_on_a_pod_is_a_warning(tmp_path: Path) -> None:
    text = """
apiVersion: v1
kind: Pod
metadata: {name: p, annotations: {kueue.x-k8s.io/podset-required-topology: rack}}
spec: {containers: [{name: c}]}"""
    (warning,) = load(tmp_path, text).warnings
    assert "(Pod p): metadata.annotations" in warning
    assert "set it on the pod's PodGroup" in warning
