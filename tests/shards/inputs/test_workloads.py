"""Workload objects in scenarios: the pods each controller would create, their names,
labels and owners, and every way such an object can be wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.errors import InputError
from events.types import NodeSpec, PodSpec, PodSubmitted, Taint
from shards.cli import main
from shards.inputs.controllers import ALPHABET, NodeArrival, generated_suffix
from shards.inputs.limits import MAX_OBJECTS
from shards.inputs.scenario import Scenario, load_scenario
from shards.inputs.workloads import expand

CONTAINER = "containers: [{name: c, resources: {requests: {cpu: 100m}}}]"


def workload(kind: str, name: str, spec: str, *, template: str = "", api: str = "") -> str:
    api = api or ("batch/v1" if kind == "Job" else "apps/v1")
    return f"""
apiVersion: {api}
kind: {kind}
metadata: {{name: {name}, namespace: team}}
spec:
{spec}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      {CONTAINER}
{template}
---"""


def selector(name: str) -> str:
    return f"  selector: {{matchLabels: {{app: {name}}}}}"


def node(name: str, labels: str = "", extra: str = "", at: float = 0) -> str:
    return f"""
apiVersion: v1
kind: Node
metadata: {{name: {name}, labels: {{{labels}}}, annotations: {{shoal.io/arrive-at: "{at:g}"}}}}
spec: {{{extra}}}
status: {{allocatable: {{cpu: "4", memory: 8Gi}}}}
---"""


def load(tmp_path: Path, text: str) -> Scenario:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return load_scenario([str(path)])


def pods(scenario: Scenario) -> list[tuple[int, PodSpec]]:
    return [(t.time, t.event.pod) for t in scenario.events if isinstance(t.event, PodSubmitted)]


def test_a_deployment_makes_a_replicaset_whose_pods_carry_its_hash(tmp_path: Path) -> None:
    text = workload("Deployment", "web", f"  replicas: 3\n{selector('web')}")
    made = pods(load(tmp_path, text))
    assert len(made) == 3
    hashes = {p.labels["pod-template-hash"] for _, p in made}
    assert len(hashes) == 1
    digest = hashes.pop()
    assert set(digest) <= set(ALPHABET)
    for _, pod in made:
        prefix, suffix = pod.name.rsplit("-", 1)
        assert prefix == f"web-{digest}" and len(suffix) == 5 and set(suffix) <= set(ALPHABET)
        assert pod.namespace == "team" and pod.labels["app"] == "web"
    assert len({p.name for _, p in made}) == 3
    # the same file names the same pods: runs and replays are exact
    again = pods(load(tmp_path, text))
    assert [p.name for _, p in again] == [p.name for _, p in made]


def test_a_changed_template_is_another_replicaset(tmp_path: Path) -> None:
    one = pods(load(tmp_path, workload("Deployment", "web", selector("web"))))
    other = workload("Deployment", "web", selector("web"), template="      priority: 5")
    two = pods(load(tmp_path, other))
    assert one[0][1].labels["pod-template-hash"] != two[0][1].labels["pod-template-hash"]


def test_pods_are_owned_by_their_controller() -> None:
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "uid": "u-1"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "w"}},
            "template": {"metadata": {"labels": {"app": "w"}}, "spec": {"containers": [{}]}},
        },
    }
    ((pod, _),) = expand(obj, 0, {}, [], 10).pods
    (owner,) = pod["metadata"]["ownerReferences"]
    digest = pod["metadata"]["labels"]["pod-template-hash"]
    assert owner == {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": f"web-{digest}",
        "uid": "u-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert pod["metadata"]["generateName"] == f"web-{digest}-"


def test_a_statefulset_numbers_its_pods(tmp_path: Path) -> None:
    spec = f"  replicas: 3\n  serviceName: db\n  podManagementPolicy: Parallel\n{selector('db')}"
    made = pods(load(tmp_path, workload("StatefulSet", "db", spec)))
    assert [p.name for _, p in made] == ["db-0", "db-1", "db-2"]
    for i, (_, pod) in enumerate(made):
        assert pod.labels["statefulset.kubernetes.io/pod-name"] == f"db-{i}"
        assert pod.labels["apps.kubernetes.io/pod-index"] == str(i)
        assert pod.labels["controller-revision-hash"].startswith("db-")


def test_statefulset_ordinals_start_and_identity() -> None:
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db"},
        "spec": {
            "replicas": 2,
            "ordinals": {"start": 5},
            "serviceName": "dbs",
            "podManagementPolicy": "Parallel",
            "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["d"]}]},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{}]}},
        },
    }
    made = expand(obj, 7, {}, [], 10)
    assert [(p["metadata"]["name"], at) for p, at in made.pods] == [("db-5", 7), ("db-6", 7)]
    assert made.pods[0][0]["spec"]["hostname"] == "db-5"
    assert made.pods[0][0]["spec"]["subdomain"] == "dbs"
    assert made.warnings == []


def test_ordered_ready_is_a_warning_on_stderr_and_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(node("n") + workload("StatefulSet", "db", f"  replicas: 2\n{selector('db')}"))
    assert main(["simulate", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    (warning,) = data["warnings"]
    assert warning.startswith(f"{path}: document 2 (StatefulSet db): spec.podManagementPolicy:")
    assert "OrderedReady" in warning
    assert f"shoal: warning: {warning}" in captured.err
    assert data["pods"]["team/db-1"]["phase"] == "Bound"


def test_a_daemonset_runs_one_pod_per_node_it_may_run_on(tmp_path: Path) -> None:
    text = (
        node("a", "role: worker")
        + node("b", "role: worker", "taints: [{key: gpu, effect: NoSchedule}]")
        + node("c", "role: infra")
        + node("d", "role: worker", "unschedulable: true", at=30)
        + workload(
            "DaemonSet",
            "agent",
            selector("agent"),
            template="      nodeSelector: {role: worker}",
        )
    )
    made = pods(load(tmp_path, text))
    pinned = {}
    for at, pod in made:
        assert pod.required_affinity is not None
        (term,) = pod.required_affinity
        (field,) = term.match_fields
        assert (field.key, field.operator) == ("metadata.name", "In")
        pinned[field.values[0]] = at
        assert pod.name.startswith("agent-") and len(pod.name) == len("agent-") + 5
    # b's taint is not tolerated, c is not selected; d (cordoned) is, when it arrives
    assert pinned == {"a": 0, "d": 30 * 10**9}


def test_a_daemonset_tolerating_a_taint_runs_there(tmp_path: Path) -> None:
    text = node("b", extra="taints: [{key: gpu, effect: NoSchedule}]") + workload(
        "DaemonSet",
        "agent",
        selector("agent"),
        template="      tolerations: [{key: gpu, operator: Exists}]",
    )
    assert len(pods(load(tmp_path, text))) == 1


def test_an_indexed_job(tmp_path: Path) -> None:
    spec = "  completions: 3\n  parallelism: 3\n  completionMode: Indexed"
    text = workload("Job", "train", spec, template="      restartPolicy: Never")
    made = pods(load(tmp_path, text))
    for i, (_, pod) in enumerate(made):
        assert pod.name.startswith(f"train-{i}-") and len(pod.name) == len(f"train-{i}-") + 5
        assert pod.annotations["batch.kubernetes.io/job-completion-index"] == str(i)
        assert pod.labels["batch.kubernetes.io/job-completion-index"] == str(i)
        assert pod.labels["batch.kubernetes.io/job-name"] == "train"
        assert pod.labels["job-name"] == "train"
        assert pod.labels["controller-uid"] == pod.labels["batch.kubernetes.io/controller-uid"]
        assert pod.depends_on == ()


def test_job_pods_beyond_parallelism_wait_for_earlier_ones(tmp_path: Path) -> None:
    spec = "  completions: 5\n  parallelism: 2"
    text = workload("Job", "train", spec, template="      restartPolicy: OnFailure")
    scenario = load(tmp_path, text)
    made = [p for _, p in pods(scenario)]
    assert len(made) == 5
    assert [p.depends_on for p in made[:2]] == [(), ()]
    for k in range(2, 5):
        assert made[k].depends_on == (f"team/{made[k - 2].name}",)
    assert any("spec.completions" in w for w in scenario.warnings)


@pytest.mark.parametrize(
    ("spec", "count"),
    [
        ("", 1),  # neither set: one pod
        ("  parallelism: 3", 3),  # a work queue of three
        ("  completions: 2", 2),  # parallelism 1: two in turn
        ("  completions: 4\n  suspend: true", 0),
        ("  completions: 4\n  parallelism: 0", 0),
    ],
)
def test_job_counts(tmp_path: Path, spec: str, count: int) -> None:
    text = workload("Job", "j", spec, template="      restartPolicy: Never")
    assert len(pods(load(tmp_path, text))) == count


@given(st.lists(st.text(max_size=20), min_size=1, max_size=60, unique=True))
def test_generated_suffixes_are_five_letters_unique_and_fixed(seeds: list[str]) -> None:
    taken: set[str] = set()
    suffixes = [generated_suffix(s, taken) for s in seeds]
    assert all(len(s) == 5 and set(s) <= set(ALPHABET) for s in suffixes)
    assert len(set(suffixes)) == len(seeds)
    assert [generated_suffix(s, set()) for s in seeds[:1]] == suffixes[:1]


WRONG = [
    (
        workload("Deployment", "web", "  selector: {matchLabels: {app: other}}"),
        "document 1 (Deployment web): spec.selector: does not match the template's labels",
    ),
    (workload("Deployment", "web", ""), "spec.selector: missing"),
    (
        workload("Deployment", "web", f"  replicas: -1\n{selector('web')}"),
        "spec.replicas: must be a non-negative integer, got -1",
    ),
    (
        workload("Deployment", "web", f"  replicas: {MAX_OBJECTS + 1}\n{selector('web')}"),
        f"past {MAX_OBJECTS} objects",
    ),
    (
        workload("StatefulSet", "db", f"  replica: 2\n{selector('db')}"),
        "document 1 (StatefulSet db): spec.replica: unknown field",
    ),
    (
        workload("StatefulSet", "db", f"  podManagementPolicy: Burst\n{selector('db')}"),
        "spec.podManagementPolicy: must be OrderedReady or Parallel",
    ),
    (workload("Job", "j", ""), "spec.template.spec.restartPolicy: a Job's pods need"),
    (
        workload("Job", "j", "  completionMode: Indexed", template="      restartPolicy: Never"),
        "spec.completions: an Indexed Job needs completions",
    ),
    (
        workload(
            "Job", "j", "  selector: {matchLabels: {a: b}}", template="      restartPolicy: Never"
        ),
        "spec.selector: a Job's selector is generated",
    ),
    (
        workload("Deployment", "web", selector("web"), template="      priorityClassName: gold"),
        "document 1 (Deployment web): spec.template.spec.priorityClassName: unknown priority",
    ),
    (
        workload(
            "Deployment",
            "web",
            selector("web"),
            template="      nodeName: n1",
        ),
        "spec.template.spec.nodeName",
    ),
    (
        workload("StatefulSet", "x" * 70, selector("x" * 70)),
        "at most 63 characters",
    ),
]


@pytest.mark.parametrize(("text", "message"), WRONG)
def test_bad_workloads_are_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    with pytest.raises(InputError) as info:
        load(tmp_path, text)
    assert message in str(info.value)
    # on the command line: exit 2, one line, no traceback
    path = tmp_path / "s.yaml"
    try:
        code = main(["simulate", str(path), "--quiet"])
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_a_field_read_but_not_acted_on_is_a_warning(tmp_path: Path) -> None:
    spec = "  completions: 1\n  backoffLimit: 4\n  activeDeadlineSeconds: 60"
    scenario = load(tmp_path, workload("Job", "j", spec, template="      restartPolicy: Never"))
    assert [w.split(": ")[2] for w in scenario.warnings] == [
        "spec.backoffLimit",
        "spec.activeDeadlineSeconds",
    ]


def test_a_generated_pod_that_clashes_names_the_workload(tmp_path: Path) -> None:
    text = workload("StatefulSet", "db", f"  podManagementPolicy: Parallel\n{selector('db')}")
    text += """
apiVersion: v1
kind: Pod
metadata: {name: db-0, namespace: team}
spec: {containers: [{name: c}]}
"""
    with pytest.raises(InputError, match=r"document 2 \(Pod db-0\).*duplicate pod 'team/db-0'"):
        load(tmp_path, text)
    reverse = text.split("---")
    with pytest.raises(
        InputError, match=r"document 2 \(StatefulSet db, its Pod db-0\).*duplicate pod"
    ):
        load(tmp_path, reverse[1] + "---" + reverse[0])


def job_object(completions: int | None, parallelism: int | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c"}]}}
    }
    if completions is not None:
        spec["completions"] = completions
    if parallelism is not None:
        spec["parallelism"] = parallelism
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": spec}


@given(
    st.one_of(st.none(), st.integers(0, 40)),
    st.one_of(st.none(), st.integers(0, 12)),
)
def test_a_job_has_completions_pods_and_at_most_parallelism_without_a_wait(
    completions: int | None, parallelism: int | None
) -> None:
    """The Job controller's counts (API defaults included), and each pod past the first
    ``parallelism`` waits for exactly the one ``parallelism`` before it."""
    made = expand(job_object(completions, parallelism), 0, {}, [], 1000).pods
    p = 1 if parallelism is None else parallelism
    c = completions if completions is not None else (p if parallelism is not None else 1)
    want = 0 if p == 0 else c
    assert len(made) == want
    names = [pod["metadata"]["name"] for pod, _ in made]
    assert len(set(names)) == len(names)
    for k, (pod, _) in enumerate(made):
        waits = pod["metadata"]["annotations"].get("shoal.io/depends-on")
        assert waits == (names[k - p] if k >= p else None)


LABEL_VALUES = st.sampled_from(["x", "y"])


@given(
    st.lists(st.tuples(LABEL_VALUES, st.booleans(), st.booleans()), min_size=0, max_size=12),
    st.booleans(),
)
def test_a_daemonset_has_a_pod_on_exactly_the_nodes_it_may_run_on(
    nodes: list[tuple[str, bool, bool]], tolerate: bool
) -> None:
    """Node i: label ``kind`` (x or y), a ``gpu:NoSchedule`` taint or not, cordoned or
    not. The DaemonSet selects ``kind: x`` and tolerates ``gpu`` or not; cordoned
    nodes always get a pod (the controller's own toleration)."""
    arrivals = [
        NodeArrival(
            NodeSpec(
                name=f"n{i}",
                allocatable={"cpu": 1000},
                labels={"kind": kind},
                taints=(Taint(key="gpu", effect="NoSchedule"),) if tainted else (),
                unschedulable=cordoned,
            ),
            i,
        )
        for i, (kind, tainted, cordoned) in enumerate(nodes)
    ]
    template: dict[str, Any] = {
        "metadata": {"labels": {"app": "a"}},
        "spec": {"nodeSelector": {"kind": "x"}, "containers": [{"name": "c"}]},
    }
    if tolerate:
        template["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
    obj = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "ds"},
        "spec": {"selector": {"matchLabels": {"app": "a"}}, "template": template},
    }
    made = expand(obj, 5, {}, arrivals, 1000).pods
    pinned = [
        pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ][0]["matchFields"][0]["values"][0]
        for pod, _ in made
    ]
    want = [
        f"n{i}"
        for i, (kind, tainted, _) in enumerate(nodes)
        if kind == "x" and (tolerate or not tainted)
    ]
    assert pinned == want
    assert [at for _, at in made] == [max(5, int(name[1:])) for name in want]
