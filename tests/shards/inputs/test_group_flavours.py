"""The pod-group conventions beyond the first four: KAI-Scheduler's PodGroup and
Kubernetes' own (scheduling.k8s.io Workload and PodGroup), read into the one model,
run, and refused or warned about field by field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from events.errors import InputError
from events.types import PodGroupSubmitted, PodSubmitted
from shards.inputs.scenario import Scenario, load_scenario
from tests.shards.test_batch import node, pod, run


def kai_group(name: str, spec: str) -> str:
    return f"""
apiVersion: scheduling.run.ai/v2alpha2
kind: PodGroup
metadata: {{name: {name}}}
spec: {{{spec}}}
---"""


def kube_group(name: str, policy: str, version: str = "v1beta1", extra: str = "") -> str:
    return f"""
apiVersion: scheduling.k8s.io/{version}
kind: PodGroup
metadata: {{name: {name}}}
spec:
  schedulingPolicy: {policy}
{extra}
---"""


def kai_member(name: str, group: str) -> str:
    return pod(name, annotations=f"pod-group-name: {group}")


def kube_member(name: str, group: str) -> str:
    return pod(name, spec=f"  schedulingGroup: {{podGroupName: {group}}}")


FLAVOURS: dict[str, tuple[Callable[[str, int], str], Callable[[str, str], str]]] = {
    "kai": (lambda g, n: kai_group(g, f"minMember: {n}, queue: research"), kai_member),
    "kubernetes-v1alpha2": (
        lambda g, n: kube_group(g, f"{{gang: {{minCount: {n}}}}}", "v1alpha2"),
        kube_member,
    ),
    "kubernetes-v1beta1": (
        lambda g, n: kube_group(g, f"{{gang: {{minCount: {n}}}}}"),
        kube_member,
    ),
}


def load(tmp_path: Path, text: str) -> Scenario:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return load_scenario([str(path)])


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_two_gangs_that_fit_alone_one_runs_whole(tmp_path: Path, flavour: str) -> None:
    """6 free CPUs, two groups of 5 one-CPU pods: exactly one group runs, entirely."""
    make_group, member = FLAVOURS[flavour]
    text = node("a", cpu=3) + node("b", cpu=3)
    for g in ("g1", "g2"):
        text += make_group(g, 5)
        text += "".join(member(f"{g}-{i}", g) for i in range(5))
    data = run(tmp_path, text)
    bound = sorted(
        sum(data["pods"][f"default/{g}-{i}"]["phase"] == "Bound" for i in range(5))
        for g in ("g1", "g2")
    )
    assert bound == [0, 5]
    assert sorted(data["groups"][f"default/{g}"]["phase"] for g in ("g1", "g2")) == [
        "Pending",
        "Scheduled",
    ]


def test_basic_policy_places_each_pod_that_fits(tmp_path: Path) -> None:
    text = node("a", cpu=3) + kube_group("g", "{basic: {}}")
    text += "".join(kube_member(f"m{i}", "g") for i in range(5))
    data = run(tmp_path, text)
    assert sum(data["pods"][f"default/m{i}"]["phase"] == "Bound" for i in range(5)) == 3


def test_one_model_for_every_flavour(tmp_path: Path) -> None:
    text = (
        kai_group("k", "minMember: 3, queue: q, priorityClassName: system-node-critical")
        + kai_group("k1", "queue: q")
        + kube_group(
            "w", "{gang: {minCount: 4}}", extra="  priorityClassName: system-cluster-critical"
        )
        + kai_member("p", "k")
        + kube_member("r", "w")
    )
    scenario = load(tmp_path, text)
    groups = {
        e.event.group.name: e.event.group
        for e in scenario.events
        if isinstance(e.event, PodGroupSubmitted)
    }
    assert (groups["k"].min_member, groups["k"].queue, groups["k"].source) == (3, "q", "kai")
    assert groups["k"].priority == 2_000_001_000
    assert groups["k1"].min_member == 1  # KAI schedules max(minMember, 1)
    assert (groups["w"].min_member, groups["w"].source) == (4, "kubernetes")
    assert groups["w"].priority == 2_000_000_000
    members = {
        e.event.pod.name: e.event.pod.group
        for e in scenario.events
        if isinstance(e.event, PodSubmitted)
    }
    assert members == {"p": "default/k", "r": "default/w"}


def test_a_workload_is_checked_and_schedules_nothing(tmp_path: Path) -> None:
    text = """
apiVersion: scheduling.k8s.io/v1alpha2
kind: Workload
metadata: {name: job-1}
spec:
  podGroupTemplates:
  - name: worker
    schedulingPolicy: {gang: {minCount: 2}}
    disruptionMode: PodGroup
---""" + kube_group(
        "job-1-worker-0",
        "{gang: {minCount: 2}}",
        "v1alpha2",
        "  podGroupTemplateRef: {workload: {workloadName: job-1, podGroupTemplateName: worker}}",
    )
    scenario = load(tmp_path, text)
    assert scenario.groups == 1
    (warning,) = scenario.warnings
    assert "document 1 (Workload job-1): spec.podGroupTemplates[0].disruptionMode" in warning


WARNED = [
    (kai_group("g", "minMember: 2, subGroups: [{name: a, minMember: 1}]"), "spec.subGroups"),
    (kube_group("g", "{basic: {}}", extra="  disruptionMode: PodGroup"), "spec.disruptionMode"),
    (
        """
apiVersion: scheduling.volcano.sh/v1beta1
kind: PodGroup
metadata: {name: g}
spec: {minMember: 2, minTaskMember: {a: 1}}
""",
        "spec.minTaskMember",
    ),
    (
        """
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata: {name: g}
spec: {minMember: 2, minMemberz: 3}
""",
        "spec.minMemberz: not acted on: not a field shoal knows",
    ),
]


@pytest.mark.parametrize(("text", "field"), WARNED)
def test_a_field_not_acted_on_is_a_warning(tmp_path: Path, text: str, field: str) -> None:
    (warning,) = load(tmp_path, text).warnings
    assert f"document 1 (PodGroup g): {field}" in warning


REFUSED = [
    (kube_group("g", "{}"), "spec.schedulingPolicy: needs exactly one of basic and gang"),
    (kube_group("g", "{basic: {}, gang: {minCount: 2}}"), "needs exactly one of basic and gang"),
    (
        kube_group("g", "{gang: {minCount: 0}}"),
        "spec.schedulingPolicy.gang.minCount: must be a positive",
    ),
    (kube_group("g", "{gang: {}}"), "spec.schedulingPolicy.gang.minCount"),
    (kube_group("g", "{lenient: {}}"), "spec.schedulingPolicy.lenient: unknown policy"),
    (
        kube_group("g", "{basic: {}}", extra="  priorityClassName: gold"),
        "spec.priorityClassName: unknown priority class 'gold'",
    ),
    (
        kube_group(
            "g", "{basic: {}}", extra="  podGroupTemplateRef: {workload: {workloadName: w}}"
        ),
        "spec.podGroupTemplateRef.workload.podGroupTemplateName",
    ),
    (kai_group("g", "minMember: 0"), "spec.minMember: must be a positive integer, got 0"),
    (
        pod("p", spec="  workloadRef: {name: w, podGroup: g}"),
        "spec.workloadRef: is Kubernetes 1.35's",
    ),
    (pod("p", spec="  schedulingGroup: {podGroupName: 7}"), "spec.schedulingGroup.podGroupName"),
    (
        pod("p", annotations="pod-group-name: a", spec="  schedulingGroup: {podGroupName: b}"),
        "names different pod groups",
    ),
    (
        """
apiVersion: scheduling.k8s.io/v1beta1
kind: Workload
metadata: {name: w}
spec: {podGroupTemplates: []}
""",
        "spec.podGroupTemplates: must be a list of 1 to 8 templates",
    ),
    (
        """
apiVersion: scheduling.k8s.io/v1alpha1
kind: Workload
metadata: {name: w}
spec: {podGroups: []}
""",
        "shoal reads Workload with apiVersion scheduling.k8s.io/v1alpha2 or "
        "scheduling.k8s.io/v1beta1, not 'scheduling.k8s.io/v1alpha1'",
    ),
]


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_malformed_groups_are_refused_naming_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(InputError) as info:
        load(tmp_path, text)
    assert message in str(info.value)
    assert str(info.value).startswith(str(tmp_path / "s.yaml") + ": document 1")
