"""Scenario input: what is read, and every way it can be wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from events.errors import InputError
from events.types import SECOND, NodeAdded, PodSubmitted
from shards.inputs.scenario import load_config, load_scenario

NODE = """
apiVersion: v1
kind: Node
metadata: {name: n1}
status: {allocatable: {cpu: "4", memory: 8Gi}}
"""


def pod(body: str = "", meta: str = "", name: str = "p") -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}{meta}}}
spec:
  containers:
  - name: c
    resources: {{requests: {{cpu: "1"}}}}
{body}
"""


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_reads_nodes_pods_and_times(tmp_path: Path) -> None:
    text = (
        NODE
        + "---\n"
        + pod(meta=', annotations: {shoal.io/arrive-at: "2.5", shoal.io/runtime: "10"}')
    )
    scenario = load_scenario([write(tmp_path, text)])
    assert [type(e.event) for e in scenario.events] == [NodeAdded, PodSubmitted]
    node_event, pod_event = scenario.events
    assert isinstance(node_event.event, NodeAdded)
    assert node_event.event.node.allocatable == {"cpu": 4000, "memory": 8 << 30, "pods": 110}
    assert pod_event.time == 2500 * SECOND // 1000
    assert isinstance(pod_event.event, PodSubmitted)
    assert pod_event.event.pod.runtime == 10 * SECOND
    assert pod_event.event.pod.requests == {"cpu": 1000}


def test_effective_requests_follow_kubernetes(tmp_path: Path) -> None:
    text = """
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ml}
spec:
  overhead: {cpu: 100m}
  initContainers:
  - name: init
    resources: {requests: {cpu: "3", memory: 1Gi}}
  containers:
  - name: a
    resources: {requests: {cpu: "1"}, limits: {memory: 2Gi, nvidia.com/gpu: "2"}}
  - name: b
    resources: {requests: {cpu: 500m, memory: 1Gi}}
"""
    (event,) = load_scenario([write(tmp_path, text)]).events
    assert isinstance(event.event, PodSubmitted)
    spec = event.event.pod
    assert spec.key == "ml/p"
    # cpu: max(1 + 0.5, 3) + 0.1; memory: max(2Gi + 1Gi, 1Gi); gpu from its limit
    assert spec.requests == {"cpu": 3100, "memory": 3 << 30, "nvidia.com/gpu": 2}


def test_priority_classes_and_global_default(tmp_path: Path) -> None:
    text = (
        """
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high}
value: 1000
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: normal}
value: 10
globalDefault: true
"""
        + "---"
        + pod("  priorityClassName: high", name="a")
        + "---"
        + pod(name="b")
    )
    events = load_scenario([write(tmp_path, text)]).events
    priorities = {
        e.event.pod.name: e.event.pod.priority for e in events if isinstance(e.event, PodSubmitted)
    }
    assert priorities == {"a": 1000, "b": 10}


def test_list_kind_and_multiple_files_keep_order(tmp_path: Path) -> None:
    listing = """
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Node, metadata: {name: x}, status: {allocatable: {cpu: "1"}}}
"""
    first = write(tmp_path, listing, "a.yaml")
    second = write(tmp_path, pod(), "b.yaml")
    names = [
        getattr(e.event, "node", None) or e.event.pod for e in load_scenario([first, second]).events
    ]  # type: ignore[attr-defined]
    assert [n.name for n in names] == ["x", "p"]


def test_config_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
        "profiles: [{schedulerName: a}]\n",
    )
    assert load_config(path).profiles[0].scheduler_name == "a"


BAD = [
    # (scenario text, message, location)
    ("kind: Pod\n  bad: [", "malformed YAML: line", "document 1"),
    ("- a\n- b\n", "must be a Kubernetes object", "document 1"),
    (
        "apiVersion: apps/v1\nkind: Deploymnet\nmetadata: {name: d}\n",
        "unknown kind 'Deploymnet' with apiVersion 'apps/v1': did you mean apps/v1 Deployment?",
        "document 1 (Deploymnet d)",
    ),
    (
        "kind: Pod\nmetadata: {name: p}\n",
        "not a Kubernetes object: needs an apiVersion (v1, GROUP/VERSION) and a kind",
        "document 1",
    ),
    (
        NODE.replace('status: {allocatable: {cpu: "4", memory: 8Gi}}', ""),
        "missing",
        "(Node n1): status",
    ),
    (NODE.replace('"4"', '"-4"'), "negative quantity", "status.allocatable.cpu"),
    (NODE.replace('"4"', "lots"), "invalid quantity 'lots'", "status.allocatable.cpu"),
    (NODE.replace('"4"', "null"), "missing quantity", "status.allocatable.cpu"),
    (
        NODE.replace(
            "metadata: {name: n1}",
            "metadata: {name: n1}\nspec: {taints: [{key: a, effect: Sometimes}]}",
        ),
        "unknown effect",
        "spec.taints[0].effect",
    ),
    (NODE.replace("{name: n1}", "{}"), "missing", "metadata.name"),
    (NODE.replace("{name: n1}", '{name: "a/b"}'), "invalid name", "metadata.name"),
    (NODE + "---" + NODE, "duplicate node 'n1'", "document 2 (Node n1)"),
    (
        pod().replace('cpu: "1"', 'cpu: "-1"'),
        "negative quantity",
        "spec.containers[0].resources.requests.cpu",
    ),
    (
        pod().replace('cpu: "1"', "cpu: null"),
        "missing quantity",
        "spec.containers[0].resources.requests.cpu",
    ),
    (
        pod().replace(
            'resources: {requests: {cpu: "1"}}',
            'resources: {requests: {cpu: "2"}, limits: {cpu: "1"}}',
        ),
        "exceeds its limit",
        "requests.cpu",
    ),
    (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n",
        "at least one container",
        "spec.containers",
    ),
    (
        pod("  priorityClassName: gold"),
        "unknown priority class 'gold'",
        "(Pod p): spec.priorityClassName",
    ),
    (pod("  priority: high"), "must be an integer", "spec.priority"),
    (pod("  preemptionPolicy: Sometimes"), "unknown preemption policy", "spec.preemptionPolicy"),
    (
        pod(meta=', annotations: {shoal.io/arrive-at: "soon"}'),
        "number of seconds",
        'annotations["shoal.io/arrive-at"]',
    ),
    (pod(meta=', annotations: {shoal.io/arrive-at: "-3"}'), "non-negative", "arrive-at"),
    (
        pod(meta=', annotations: {shoal.io/runtime: "0"}'),
        "positive",
        'annotations["shoal.io/runtime"]',
    ),
    (pod(meta=', annotations: {shoal.io/runtime: "nan"}'), "positive", "shoal.io/runtime"),
    (pod(meta=", labels: {a: {b: c}}"), "value must be a string", "metadata.labels.a"),
    (pod("  nodeSelector: [a]"), "must be a mapping", "spec.nodeSelector"),
    (
        pod("  tolerations: [{key: a, operator: Maybe}]"),
        "unknown operator 'Maybe'",
        "spec.tolerations[0].operator",
    ),
    (
        pod("  tolerations: [{operator: Equal, value: x}]"),
        "empty key needs operator Exists",
        "spec.tolerations[0]",
    ),
    (
        pod(
            "  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: a, operator: Near, values: [b]}]}]}}}"
        ),
        "unknown operator 'Near'",
        "nodeSelectorTerms[0].matchExpressions[0].operator",
    ),
    (
        pod(
            "  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: a, operator: Gt, values: [big]}]}]}}}"
        ),
        "Gt needs an integer",
        "matchExpressions[0].values",
    ),
    (
        pod(
            "  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: []}}}"
        ),
        "at least one term",
        "nodeSelectorTerms",
    ),
    (
        pod(
            "  affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 0, preference: {}}]}}"
        ),
        "weight must be an integer 1..100",
        "preferredDuringSchedulingIgnoredDuringExecution[0].weight",
    ),
    (pod() + "---" + pod(), "duplicate pod 'default/p'", "document 2 (Pod p)"),
    ("!!python/object/apply:os.system ['true']\n", "malformed YAML", "document 1"),
    ("[" * 5000 + "]" * 5000, "", "document 1"),
    ("apiVersion: v1\nkind: List\nitems: 3\n", "must be a list", "items"),
    (
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles: [{schedulerName: a, bogus: 1}]\n",
        "unknown field 'bogus'",
        "(KubeSchedulerConfiguration): profiles[0]",
    ),
]


@pytest.mark.parametrize(
    ("text", "message", "location"), BAD, ids=[f"bad{i}" for i in range(len(BAD))]
)
def test_bad_input_names_file_document_and_field(
    tmp_path: Path, text: str, message: str, location: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_scenario([path])
    text_of_error = str(info.value)
    assert text_of_error.startswith(path)
    assert message in text_of_error
    assert location in text_of_error
    assert "\n" not in text_of_error


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        load_scenario([str(tmp_path / "missing.yaml")])
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputError, match="not UTF-8"):
        load_scenario([str(binary)])
    with pytest.raises(InputError, match="cannot read"):
        load_scenario([str(tmp_path)])


def test_config_file_must_hold_one_configuration(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="exactly one KubeSchedulerConfiguration"):
        load_config(write(tmp_path, NODE))
