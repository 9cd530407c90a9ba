"""Workload objects run end to end through ``shoal simulate`` at one and two shards,
replayed with ``--verify``: seed 003's YAML as its authors pasted it, a DaemonSet and
a Job whose completions outnumber its parallelism."""

from __future__ import annotations

from pathlib import Path

import pytest

from events.types import PodBound, PodSucceeded
from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import node

SEED_003 = Path(__file__).parent.parent / "fixtures" / "seeds" / "sts-group-valid-race.yaml"
"""The example of the Tencent batch-scheduler's README (seed 003), verbatim."""


def occupied(node_name: str, cpu: str) -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: system-{node_name}, namespace: kube-system}}
spec:
  nodeName: {node_name}
  containers: [{{name: c, resources: {{requests: {{cpu: {cpu}, memory: 140Mi}}}}}}]
---"""


@pytest.mark.parametrize("shards", [1, 2])
def test_seed_003_two_statefulset_gangs_one_runs_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """ "Only 8 cpu exist in the cluster, and 0.9 has been occupied": two groups of five
    one-CPU pods, made by two StatefulSets; exactly one runs whole, the other none."""
    cluster = node("cwd-dev-1", cpu=4) + node("cwd-dev-2", cpu=4) + occupied("cwd-dev-1", "900m")
    data, _ = shoal(tmp_path, capsys, cluster + "\n" + SEED_003.read_text(), shards)
    bound = {
        sts: sum(data["pods"][f"default/{sts}-{i}"]["phase"] == "Bound" for i in range(5))
        for sts in ("web-group-race1", "web-group-race2")
    }
    assert sorted(bound.values()) == [0, 5], bound
    phases = sorted(data["groups"][f"default/group{i}"]["phase"] for i in (1, 2))
    assert phases == ["Pending", "Scheduled"]
    assert data["warnings"] == []  # Parallel, as pasted: nothing approximated


def daemonset() -> str:
    return """
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: ops}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      nodeSelector: {agent: wanted}
      containers: [{name: c, resources: {requests: {cpu: 500m}}}]
---"""


@pytest.mark.parametrize("shards", [1, 2])
def test_daemonset_pods_land_on_their_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    nodes = "".join(
        node(f"n{i}", cpu=2, labels={"agent": "wanted" if i % 2 else "unwanted"}) for i in range(4)
    )
    data, _ = shoal(tmp_path, capsys, nodes + daemonset(), shards)
    placed = sorted(v["node"] for k, v in data["pods"].items() if k.startswith("ops/agent-"))
    assert placed == ["n1", "n3"]


def job(completions: int, parallelism: int, runtime: float) -> str:
    return f"""
apiVersion: batch/v1
kind: Job
metadata: {{name: train}}
spec:
  completions: {completions}
  parallelism: {parallelism}
  completionMode: Indexed
  template:
    metadata: {{annotations: {{shoal.io/runtime: "{runtime:g}"}}}}
    spec:
      restartPolicy: Never
      containers: [{{name: c, resources: {{requests: {{cpu: "1"}}}}}}]
---"""


@pytest.mark.parametrize("shards", [1, 2])
def test_a_job_runs_parallelism_pods_at_a_time_until_all_complete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Room for eight, parallelism 2, completions 5: never more than two running, and
    all five succeed."""
    text = node("a", cpu=4) + node("b", cpu=4) + job(5, 2, 10)
    data, parts = shoal(tmp_path, capsys, text, shards)
    train = {k: v for k, v in data["pods"].items() if k.startswith("default/train-")}
    assert len(train) == 5
    assert all(v["phase"] == "Succeeded" for v in train.values()), train
    bound: dict[str, int] = {}
    done: dict[str, int] = {}
    for envelope in (e for part in parts for e in part):
        event = envelope.event
        if isinstance(event, PodBound):
            bound.setdefault(event.pod, envelope.time)
        elif isinstance(event, PodSucceeded):
            done.setdefault(event.pod, envelope.time)
    assert sorted(bound) == sorted(done) == sorted(train)
    for t in sorted(bound.values()):  # at each start: how many have started, not ended
        assert sum(bound[p] <= t < done[p] for p in bound) <= 2


EXAMPLE = Path(__file__).parent.parent.parent / "examples" / "workloads.yaml"


@pytest.mark.parametrize("shards", [1, 2])
def test_the_workloads_example(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    data, _ = shoal(tmp_path, capsys, EXAMPLE.read_text(), shards)
    pods = data["pods"]
    agents = sorted(v["node"] for k, v in pods.items() if k.startswith("ops/log-agent-"))
    assert agents == ["node-a", "node-b"]
    assert sum(k.startswith("default/web-") and v["phase"] == "Bound" for k, v in pods.items()) == 3
    assert [pods[f"default/trainer-{i}"]["phase"] for i in range(4)] == ["Bound"] * 4
    assert data["groups"]["default/trainer"]["source"] == "kubernetes"
    sweep = [v["phase"] for k, v in pods.items() if k.startswith("default/sweep-")]
    assert sweep == ["Succeeded"] * 6
    assert data["summary"]["simulated_seconds"] == 180  # three rounds of two, 60 s each
