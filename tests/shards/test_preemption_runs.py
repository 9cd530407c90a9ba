"""Runs of identical preemptors decided on the coordinator in one step
(:mod:`shards.coordinator.wave`): the same placements, the same victims for each
preemptor in the same order, the same answers for the pods left waiting as when each
preemption is decided and carried out one at a time (``MAX_WAVE`` 1), at 1, 2 and 4
shards, gangs and disruption budgets among the victims, gangs and other kinds of pod
among the preemptors; every run replayed with ``--verify``. And a run is carried out
with one ``PreemptionRequested`` per shard, its preemptors placed in one pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shards.coordinator.wave as wave_module
from engine.model.pools import POOL_LABEL
from events.types import Envelope, PodRouted, PreemptionRequested
from tests.shards.coordinator_kit import Parts, shoal
from tests.shards.scenario_text import fit_config, node, pod_group

SHARDS = (1, 2, 4)


def a_pod(
    name: str,
    *,
    cpu: int,
    priority: int,
    at: float = 0,
    group: str = "",
    app: str = "",
    depends_on: str = "",
    selector: str = "",
) -> str:
    labels = {**({"scheduling.x-k8s.io/pod-group": group} if group else {})}
    if app:
        labels["app"] = app
    annotations = [f'shoal.io/arrive-at: "{at:g}"']
    if depends_on:
        annotations.append(f'shoal.io/depends-on: "{depends_on}"')
    spec = [f"  priority: {priority}"]
    if selector:
        spec.append(f"  nodeSelector: {{tier: {selector}}}")
    extra = "\n".join(spec)
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
  labels: {{{", ".join(f"{k}: {v}" for k, v in labels.items())}}}
  annotations: {{{", ".join(annotations)}}}
spec:
{extra}
  containers:
  - name: c
    resources: {{requests: {{cpu: "{cpu}", memory: 1Gi}}}}
---"""


def budget(app: str, max_unavailable: int) -> str:
    return f"""
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {{name: {app}, namespace: default}}
spec: {{selector: {{matchLabels: {{app: {app}}}}}, maxUnavailable: {max_unavailable}}}
---"""


@st.composite
def scenarios(draw: st.DrawFn) -> str:
    """Nodes in four pools, filled with low-priority pods of 1 or 2 CPU (some in
    gangs, some under a budget, one maybe a dependency of another pod); then, at once,
    a run of identical urgent pods, maybe broken by a pod of another kind or followed
    by an urgent gang."""
    text = ""
    budgets = draw(st.sampled_from([False, False, False, True]))
    if budgets:
        text += budget("b", draw(st.integers(1, 2)))
    nodes = draw(st.integers(2, 6))
    room = 0
    for i in range(nodes):
        cpu = draw(st.sampled_from([4, 8]))
        room += cpu
        tier = "a" if i % 3 else "b"
        text += node(f"n{i}", cpu=cpu, labels={POOL_LABEL: f"p{i % 4}", "tier": tier})
    fillers: list[tuple[int, int, int, bool]] = []  # CPU, priority, gang (-1: none), budget's
    while room > 0:
        cpu = draw(st.sampled_from([1, 2])) if room > 1 else 1
        room -= cpu
        priority = draw(st.sampled_from([0, 10, 20]))
        gang = draw(st.sampled_from([-1, -1, -1, 0, 1]))
        fillers.append((cpu, priority, gang, budgets and draw(st.booleans())))
    for gang in (0, 1):
        members = [j for j, f in enumerate(fillers) if f[2] == gang]
        if members:
            text += pod_group(f"g{gang}", len(members))
    for j, (cpu, priority, gang, protected) in enumerate(fillers):
        text += a_pod(
            f"low-{j}",
            cpu=cpu,
            priority=priority,
            group=f"g{gang}" if gang >= 0 else "",
            app="b" if protected else "",
        )
    if draw(st.sampled_from([False, False, False, True])):
        text += a_pod("after", cpu=1, priority=500, depends_on="low-0")
    count = draw(st.integers(2, 8))
    cpu = draw(st.sampled_from([1, 2, 4]))
    selector = draw(st.sampled_from(["", "a"]))
    other = draw(st.integers(-1, 2 * count))
    for k in range(count):
        if k == other:
            text += a_pod("other", cpu=3, priority=1000, at=1)
        text += a_pod(f"urgent-{k}", cpu=cpu, priority=1000, at=1, selector=selector)
    if draw(st.booleans()):
        text += pod_group("urgent-gang", 2, at=1)
        for m in range(2):
            text += a_pod(f"urgent-gang-{m}", cpu=2, priority=1000, at=1, group="urgent-gang")
    return text


MOST_ALLOCATED = fit_config(
    "{type: MostAllocated, resources: [{name: cpu, weight: 1}, {name: memory, weight: 1}]}"
)


def decisions(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[tuple[str, str]]]]:
    """Each pod's outcome (node, phase, reason), and each preemptor's victims in the
    order they were evicted. Not how many times a pod left waiting was tried, nor the
    answer its last try composed: one at a time, the room each eviction leaves for a
    while may wake a parked pod of lower priority (it is tried again after the run, and
    fails again); a run wakes pods on the room the whole run leaves
    (:meth:`shards.coordinator.wave.Wave.flush`)."""
    victims: dict[str, list[tuple[str, str]]] = {}
    for p in data["preemptions"]:
        victims.setdefault(p["by"], []).append((p["pod"], p["node"]))
    pods = {k: (v["node"], v["phase"], v.get("reason")) for k, v in data["pods"].items()}
    return pods, victims


def run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, shards: int, *, runs: bool
) -> tuple[dict[str, Any], Parts]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    if runs:
        return shoal(tmp_path, capsys, text, shards)
    with mock.patch.object(wave_module, "MAX_WAVE", 1):
        return shoal(tmp_path, capsys, text, shards)


def requests(parts: Parts) -> list[Envelope]:
    return [env for part in parts for env in part if isinstance(env.event, PreemptionRequested)]


@pytest.mark.parametrize("shards", SHARDS)
@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=scenarios())
def test_a_run_decides_what_one_at_a_time_decides(
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    shards: int,
    text: str,
) -> None:
    base = tmp_path_factory.mktemp("run")
    together, log = run(base / "together", capsys, text, shards, runs=True)
    alone, alone_log = run(base / "alone", capsys, text, shards, runs=False)
    assert decisions(together) == decisions(alone)
    assert len(requests(log)) <= len(requests(alone_log))


def wave(count: int = 12) -> str:
    """Eight nodes of 4 CPU in four pools (two per shard at 4 shards), each running two
    low-priority pods of 2 CPU; ``count`` urgent pods of 2 CPU, each of which must
    evict one."""
    text = ""
    for i in range(8):
        text += node(f"n{i}", cpu=4, labels={POOL_LABEL: f"p{i % 4}"})
    for i in range(16):
        text += a_pod(f"low-{i}", cpu=2, priority=10 * (i % 3))
    for k in range(count):
        text += a_pod(f"urgent-{k}", cpu=2, priority=1000, at=1)
    return text


@pytest.mark.parametrize("shards", (2, 4))
def test_a_run_is_evicted_with_one_request_per_shard_and_placed_in_one_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Twelve urgent pods: every victim is asked for in one ``PreemptionRequested`` per
    shard (not one per preemptor), and every urgent pod is placed by requests of one
    pass (derived from the same record)."""
    data, parts = run(tmp_path, capsys, wave(), shards, runs=True)
    urgent = {k: v for k, v in data["pods"].items() if "/urgent-" in k}
    assert all(v["phase"] == "Bound" for v in urgent.values())
    asked = requests(parts)
    assert len(asked) == shards
    assert (
        sum(len(env.event.victims) for env in asked if isinstance(env.event, PreemptionRequested))
        == 12
    )
    # each member handed to its nominated node, all in one pass
    placed = [
        env
        for part in parts[:shards]
        for env in part
        if isinstance(env.event, PodRouted) and env.event.node and "/urgent-" in env.event.pod.key
    ]
    assert len(placed) == 12
    assert len({env.causation for env in placed}) == 1


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=scenarios())
def test_a_run_decides_at_every_shard_count_what_one_shard_decides(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    """The run is carried out in one step at several shards (evictions, then each
    preemptor handed to its node, in one pass): every pod ends where and as it ends at
    one shard, each preemptor with the same victims, evicted in the same order on each
    node, and each log replays exactly. Under MostAllocated, so that where the low-priority pods go
    first is one scheduler's answer at every shard count (under the default profile a
    pod handed to a shard may take another node among the fitting ones: "which node",
    in Sharding's known differences)."""
    text = MOST_ALLOCATED + text
    base = tmp_path_factory.mktemp("counts")
    one, _ = run(base / "one", capsys, text, 1, runs=True)
    for shards in SHARDS[1:]:
        many, _ = run(base / f"n{shards}", capsys, text, shards, runs=True)
        assert per_node(many) == per_node(one), shards


def per_node(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, list[str]]]]:
    """:func:`decisions`, each preemptor's victims kept in order per node: one shard
    evicts a node's victims in the order chosen; victims on nodes of different shards
    are evicted by each concurrently, so their reports may come in either order."""
    pods, victims = decisions(data)
    nodes: dict[str, dict[str, list[str]]] = {}
    for by, evicted in victims.items():
        for pod, on in evicted:
            nodes.setdefault(by, {}).setdefault(on, []).append(pod)
    return pods, nodes
