"""kube-scheduler parity, as a user sees it: manifests pasted from a real cluster are
admitted and scheduled as Kubernetes would, at 1 and 2 shards alike (each run is
replayed with ``--verify``).

Native sidecars count as the API server counts them; a PriorityClass's
``preemptionPolicy`` and ``globalDefault`` reach its pods; selectors on the labels a
kubelet sets match simulated nodes; host ports conflict as kube-scheduler's NodePorts
decides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from events.types import PodHandedBack
from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import node, pod, pod_group

SHARDS = (1, 2)


def simulate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, shards: int
) -> dict[str, Any]:
    data, _ = shoal(tmp_path, capsys, text, shards)
    return data


def phases(data: dict[str, Any]) -> dict[str, str]:
    return {key.split("/", 1)[1]: view["phase"] for key, view in data["pods"].items()}


def preempted(data: dict[str, Any]) -> set[str]:
    return {p["pod"].split("/", 1)[1] for p in data["preemptions"]}


def priority_class(name: str, value: int, *, never: bool = False, default: bool = False) -> str:
    policy = "\npreemptionPolicy: Never" if never else ""
    return f"""
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {{name: {name}}}
value: {value}
globalDefault: {"true" if default else "false"}{policy}
---"""


def raw_pod(name: str, spec: str, *, at: float = 0) -> str:
    """A pod with ``spec`` as written (indented two spaces under ``spec:``)."""
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations: {{shoal.io/arrive-at: "{at:g}"}}
spec:
{spec}
---"""


# ------------------------------------------------------------------ native sidecars


def sidecar_pod(name: str) -> str:
    return raw_pod(
        name,
        """  initContainers:
  - name: proxy
    restartPolicy: Always
    resources: {requests: {cpu: "1"}}
  - name: migrate
    resources: {requests: {cpu: "1"}}
  containers:
  - name: app
    resources: {requests: {cpu: "1"}}""",
    )


@pytest.mark.parametrize("shards", SHARDS)
def test_two_pods_with_a_native_sidecar_do_not_both_fit_a_three_cpu_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    # each pod: max(app 1 + proxy 1, migrate 1 + proxy 1) = 2 cpu; 2 + 2 > 3
    text = node("a", cpu=3) + sidecar_pod("p1") + sidecar_pod("p2")
    data = simulate(tmp_path, capsys, text, shards)
    assert sorted(phases(data).values()) == ["Bound", "Pending"]
    (waiting,) = [k for k, v in data["pods"].items() if v["phase"] == "Pending"]
    assert "Insufficient cpu" in data["pods"][waiting]["reason"]


# ------------------------------------------------------------------ priority classes


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("by_default", [False, True])
def test_a_never_class_makes_its_pods_non_preempting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, by_default: bool
) -> None:
    text = priority_class("polite", 1000, never=True, default=by_default)
    text += node("a", cpu=4) + node("b", cpu=4)
    text += pod("low-0", cpu="4", priority=0) + pod("low-1", cpu="4", priority=0, at=1)
    if by_default:  # no class named: the global default's value and policy
        text += pod("late", cpu="4", at=5)
    else:
        text += raw_pod(
            "late",
            """  priorityClassName: polite
  containers:
  - name: c
    resources: {requests: {cpu: "4"}}""",
            at=5,
        )
    data = simulate(tmp_path, capsys, text, shards)
    assert phases(data)["late"] == "Pending"
    assert preempted(data) == set()


@pytest.mark.parametrize("shards", SHARDS)
def test_a_class_that_may_preempt_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """The control: the same cluster, a class without ``Never``."""
    text = priority_class("urgent", 1000) + node("a", cpu=4) + node("b", cpu=4)
    text += pod("low-0", cpu="4", priority=0) + pod("low-1", cpu="4", priority=0, at=1)
    text += raw_pod(
        "late",
        """  priorityClassName: urgent
  containers:
  - name: c
    resources: {requests: {cpu: "4"}}""",
        at=5,
    )
    data = simulate(tmp_path, capsys, text, shards)
    assert phases(data)["late"] == "Bound"
    assert len(preempted(data)) == 1


# ------------------------------------------------------------------ well-known labels


@pytest.mark.parametrize("shards", SHARDS)
def test_a_selector_on_the_kubelets_labels_matches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    text = node("a") + node("b") + node("c", labels={"kubernetes.io/arch": "arm64"})
    text += pod("on-b", selector={"kubernetes.io/hostname": "b"})
    text += pod("linux", selector={"kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64"})
    text += pod("windows", selector={"kubernetes.io/os": "windows"})
    data = simulate(tmp_path, capsys, text, shards)
    assert data["pods"]["default/on-b"]["node"] == "b"
    assert data["pods"]["default/linux"]["node"] == "c"
    assert phases(data)["windows"] == "Pending"


# ------------------------------------------------------------------ host ports


def web_pod(name: str, *, port: int = 80, at: float = 0, runtime: float | None = None) -> str:
    annotations = f'shoal.io/arrive-at: "{at:g}"'
    if runtime is not None:
        annotations += f', shoal.io/runtime: "{runtime:g}"'
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations: {{{annotations}}}
spec:
  containers:
  - name: web
    ports: [{{containerPort: 8080, hostPort: {port}}}]
    resources: {{requests: {{cpu: "1"}}}}
---"""


@pytest.mark.parametrize("shards", SHARDS)
def test_pods_on_one_host_port_take_a_node_each_across_shards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Four nodes, six pods binding port 80: four run, one waits for a node whose pod
    ends, one waits to the end; the coordinator hands no pod to a shard whose nodes
    all bind the port already (no shard hands one back)."""
    text = "".join(node(f"n{i}") for i in range(4))
    text += web_pod("web-0", runtime=10)
    text += "".join(web_pod(f"web-{i}", at=i) for i in range(1, 6))
    text += web_pod("api", port=8080, at=6)
    data, parts = shoal(tmp_path, capsys, text, shards)
    assert phases(data) == {
        "web-0": "Succeeded",
        **{f"web-{i}": "Bound" for i in range(1, 5)},
        "web-5": "Pending",
        "api": "Bound",
    }
    assert "free ports" in data["pods"]["default/web-5"]["reason"]
    running = [v["node"] for k, v in data["pods"].items() if v["phase"] == "Bound" and "web" in k]
    assert sorted(running) == ["n0", "n1", "n2", "n3"]
    assert not any(isinstance(e.event, PodHandedBack) for part in parts for e in part)


def gang_member(name: str, group: str, port: int) -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{scheduling.x-k8s.io/pod-group: {group}}}
spec:
  containers:
  - name: worker
    ports: [{{containerPort: {port}, hostPort: {port}}}]
    resources: {{requests: {{cpu: "1"}}}}
---"""


@pytest.mark.parametrize("shards", SHARDS)
def test_a_gang_on_one_host_port_takes_a_node_per_member_or_waits_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Four nodes: a gang of four on one port runs one member per node (across shards
    when there are two); a second such gang cannot run beside it and holds nothing."""
    text = "".join(node(f"n{i}") for i in range(4))
    text += pod_group("ring", 4) + "".join(
        gang_member(f"ring-{i}", "ring", 29500) for i in range(4)
    )
    text += pod_group("late", 2) + "".join(
        gang_member(f"late-{i}", "late", 29500) for i in range(2)
    )
    data = simulate(tmp_path, capsys, text, shards)
    ring = [data["pods"][f"default/ring-{i}"] for i in range(4)]
    assert sorted(p["node"] for p in ring) == ["n0", "n1", "n2", "n3"]
    assert {phases(data)[f"late-{i}"] for i in range(2)} == {"Pending"}
