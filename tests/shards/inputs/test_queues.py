"""Volcano Jobs and queues, Kueue's ClusterQueues and LocalQueues: honoured where shoal
has the concept (a gang; a namespace's elastic quota), a warning where it has not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from events.errors import InputError
from events.types import PodGroupSubmitted, PodSubmitted, QuotaDefined
from shards.cli import main
from shards.inputs.scenario import Scenario, load_scenario

NODE = """
apiVersion: v1
kind: Node
metadata: {{name: {name}}}
status: {{allocatable: {{cpu: "{cpu}", memory: 32Gi}}}}
---"""


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, shards: int) -> Any:
    """``shoal simulate --json`` of ``text`` at ``shards`` shards, replayed and verified:
    (pods, warnings)."""
    path = tmp_path / "s.yaml"
    path.write_text(text)
    log = tmp_path / f"run-{shards}.events"
    argv = ["simulate", str(path), "--shards", str(shards), "--log", str(log), "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert main(["replay", str(log), "--verify"]) == 0
    capsys.readouterr()
    return data["pods"], [line for line in err.splitlines() if "warning" in line]


def load(tmp_path: Path, text: str) -> Scenario:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return load_scenario([str(path)])


def refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(InputError) as info:
        load(tmp_path, text)
    return str(info.value)


# --------------------------------------------------------------------------- Volcano


def volcano_job(min_available: int | None, *, extra: str = "", ps_extra: str = "") -> str:
    minimum = "" if min_available is None else f"  minAvailable: {min_available}\n"
    return f"""
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {{name: train, namespace: ml}}
spec:
{minimum}{extra}  tasks:
  - name: ps
    replicas: 1
{ps_extra}    template:
      metadata: {{labels: {{role: ps}}}}
      spec:
        restartPolicy: Never
        containers: [{{name: c, resources: {{requests: {{cpu: "1"}}}}}}]
  - name: worker
    replicas: 3
    template:
      spec:
        containers: [{{name: c, resources: {{requests: {{cpu: "1"}}}}}}]
---"""


WORKERS = ["ml/train-ps-0", "ml/train-worker-0", "ml/train-worker-1", "ml/train-worker-2"]


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_a_volcano_job_is_a_gang_of_its_tasks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Four pods, room for three: all of minAvailable (default: every replica) or none."""
    text = NODE.format(name="n1", cpu=2) + NODE.format(name="n2", cpu=1) + volcano_job(None)
    pods, _ = run(tmp_path, capsys, text, shards)
    assert sorted(pods) == WORKERS
    assert all(pod["node"] is None for pod in pods.values()), pods


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_a_volcano_job_binds_its_min_available_when_that_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    text = NODE.format(name="n1", cpu=2) + NODE.format(name="n2", cpu=1) + volcano_job(3)
    pods, _ = run(tmp_path, capsys, text, shards)
    assert sum(pod["node"] is not None for pod in pods.values()) == 3, pods


def test_a_volcano_job_makes_its_group_and_pods_as_its_controller(tmp_path: Path) -> None:
    scenario = load(tmp_path, volcano_job(2, extra="  queue: default\n"))
    groups = [t.event.group for t in scenario.events if isinstance(t.event, PodGroupSubmitted)]
    pods = [t.event.pod for t in scenario.events if isinstance(t.event, PodSubmitted)]
    assert len(groups) == 1 and groups[0].min_member == 2 and groups[0].source == "volcano"
    assert groups[0].name.startswith("train-") and groups[0].namespace == "ml"
    assert [p.key for p in pods] == WORKERS
    assert {p.group for p in pods} == {groups[0].key}
    assert pods[0].labels["role"] == "ps" and pods[0].labels["volcano.sh/task-spec"] == "ps"
    assert pods[1].annotations["volcano.sh/task-index"] == "0"
    assert not scenario.warnings  # the default queue: nothing to say


def test_what_a_volcano_job_does_not_act_on_is_reported(tmp_path: Path) -> None:
    text = volcano_job(
        None,
        extra="  queue: research\n  policies: [{event: PodEvicted, action: RestartJob}]\n",
        ps_extra="    minAvailable: 1\n",
    )
    warnings = load(tmp_path, text).warnings
    assert any("(Job train): spec.policies: not acted on" in w for w in warnings), warnings
    assert any("spec.tasks[0].minAvailable: not acted on" in w for w in warnings), warnings
    assert any(
        "its PodGroup train-" in w and "spec.queue: not acted on: Volcano and KAI queues" in w
        for w in warnings
    ), warnings


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (volcano_job(5), "spec.minAvailable: 5 is more than the tasks' 4 replicas"),
        (volcano_job(None, extra="  bogus: 1\n"), "spec.bogus: unknown field (a Volcano Job"),
        (volcano_job(None).replace("name: worker", "name: ps"), "spec.tasks[1].name: needs a"),
        (
            volcano_job(None).replace('cpu: "1"}}}]\n  - name', 'cpu: "-1"}}}]\n  - name'),
            "spec.tasks[0].template.spec.containers[0].resources.requests.cpu",
        ),
    ],
)
def test_a_wrong_volcano_job_is_refused_naming_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    assert message in refused(tmp_path, text)


def test_a_kai_or_volcano_pod_group_queue_is_reported(tmp_path: Path) -> None:
    text = """
apiVersion: scheduling.run.ai/v2alpha2
kind: PodGroup
metadata: {name: g, namespace: ml}
spec: {minMember: 1, queue: team-a}
"""
    assert any("spec.queue: not acted on" in w for w in load(tmp_path, text).warnings)


# --------------------------------------------------------------------------- Kueue


def cluster_queue(name: str, cpu: int, *, cohort: str = "all", limit: str = "") -> str:
    borrowing = f", borrowingLimit: {limit}" if limit else ""
    cohort_line = f"  cohort: {cohort}\n" if cohort else ""
    return f"""
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {{name: {name}}}
spec:
{cohort_line}  resourceGroups:
  - coveredResources: [cpu]
    flavors:
    - name: default
      resources:
      - {{name: cpu, nominalQuota: {cpu}{borrowing}}}
---"""


def local_queue(namespace: str, target: str, name: str = "q") -> str:
    return f"""
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata: {{name: {name}, namespace: {namespace}}}
spec: {{clusterQueue: {target}}}
---"""


def queued_pods(namespace: str, count: int, queue: str | None = "q", prefix: str = "") -> str:
    label = f", labels: {{kueue.x-k8s.io/queue-name: {queue}}}" if queue else ""
    return "".join(
        f"""
apiVersion: v1
kind: Pod
metadata: {{name: {prefix or namespace}{i}, namespace: {namespace}{label}}}
spec: {{containers: [{{name: c, resources: {{requests: {{cpu: "1"}}}}}}]}}
---"""
        for i in range(count)
    )


def bound(pods: dict[str, Any], namespace: str) -> int:
    return sum(1 for key, pod in pods.items() if key.startswith(f"{namespace}/") and pod["node"])


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_a_cluster_queue_is_its_namespaces_elastic_quota(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Nominal 2 plus a borrowing limit of 1: three of a's five pods run, though the
    cluster has room for all; b, within its own nominal quota, runs both."""
    text = (
        NODE.format(name="n1", cpu=8)
        + cluster_queue("team-a", 2, limit="1")
        + cluster_queue("team-b", 6)
        + local_queue("a", "team-a")
        + local_queue("b", "team-b")
        + queued_pods("a", 5)
        + queued_pods("b", 2)
    )
    pods, warnings = run(tmp_path, capsys, text, shards)
    assert bound(pods, "a") == 3 and bound(pods, "b") == 2, pods
    assert "elastic quota a: cpu would exceed its max" in pods["a/a4"]["reason"]
    assert warnings == []


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_a_cluster_queue_without_a_cohort_cannot_borrow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    text = (
        NODE.format(name="n1", cpu=8)
        + cluster_queue("team-a", 2, cohort="")
        + local_queue("a", "team-a")
        + queued_pods("a", 4)
    )
    pods, _ = run(tmp_path, capsys, text, shards)
    assert bound(pods, "a") == 2, pods


def test_a_cluster_queue_maps_onto_min_and_max(tmp_path: Path) -> None:
    text = (
        cluster_queue("limited", 2, limit="500m")
        + cluster_queue("open", 3)
        + cluster_queue("alone", 4, cohort="")
        + local_queue("a", "limited")
        + local_queue("b", "open")
        + local_queue("c", "alone")
    )
    quotas = {
        t.event.quota.namespace: t.event.quota
        for t in load(tmp_path, text).events
        if isinstance(t.event, QuotaDefined)
    }
    assert (quotas["a"].min, quotas["a"].max) == ({"cpu": 2000}, {"cpu": 2500})
    assert (quotas["b"].min, quotas["b"].max) == ({"cpu": 3000}, {})  # up to the cohort
    assert (quotas["c"].min, quotas["c"].max) == ({"cpu": 4000}, {"cpu": 4000})


def test_where_kueue_and_shoal_differ_a_warning_says_so(tmp_path: Path) -> None:
    text = (
        cluster_queue("shared", 2)
        + cluster_queue("other", 2, cohort="elsewhere")
        + local_queue("a", "shared")
        + local_queue("b", "shared")
        + local_queue("c", "missing")
        + queued_pods("a", 2, queue="nope")
        + queued_pods("a", 1, queue=None, prefix="u")
    )
    warnings = load(tmp_path, text).warnings
    expected = [
        "(LocalQueue q): spec.clusterQueue: not acted on: ClusterQueue 'shared' already "
        "serves namespace 'a'",
        "(LocalQueue q): spec.clusterQueue: not acted on: names ClusterQueue 'missing'",
        "(ClusterQueue other): spec.cohort: not acted on: cohorts are not kept apart",
        "(Pod a0): metadata.labels.kueue.x-k8s.io/queue-name: not acted on: names "
        "LocalQueue 'nope'",
        "(Pod u0): metadata.labels: a pod without the label kueue.x-k8s.io/queue-name",
    ]
    for text_ in expected:
        assert sum(text_ in w for w in warnings) == 1, (text_, warnings)
    assert not any("(Pod a1)" in w for w in warnings)  # once per namespace and queue


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            cluster_queue("x", 2).replace("cohort: all", "cohort: all\n  bogus: 1"),
            "spec.bogus: unknown field",
        ),
        (
            cluster_queue("x", 2).replace("coveredResources: [cpu]", "coveredResources: [memory]"),
            "resources[0].name: 'cpu' is not among the group's coveredResources",
        ),
        (
            cluster_queue("x", 2).replace("nominalQuota: 2", "nominalQuota: -2"),
            "resources[0].nominalQuota: negative quantity",
        ),
        (
            cluster_queue("x", 2)
            + local_queue("a", "x")
            + """
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: e, namespace: a}
spec: {min: {cpu: "1"}}
""",
            "a second quota for namespace 'a'",
        ),
    ],
)
def test_a_wrong_kueue_object_is_refused_naming_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    assert message in refused(tmp_path, text)
