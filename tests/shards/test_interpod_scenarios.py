"""Inter-pod rules as users paste them, at 1, 2 and 4 shards: the symptoms that were
reported (replicas with required anti-affinity on one node, a pod with required zone
affinity to its database in the other zone, a ``DoNotSchedule`` spread ending with skew
2), run through ``shoal simulate`` with zones that span shards, replayed with
``--verify``; and, as a property, pods with required rules arriving and leaving over
time end the same at 1, 2 and 4 shards and never break a rule."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.pools import POOL_LABEL, Sharding
from events.memory import MemoryLog
from events.types import (
    SECOND,
    BindFailed,
    Envelope,
    NodeAdded,
    PodBound,
    PodDeleted,
    PodEvicted,
    PodFailed,
    PodPreempted,
    PodSpec,
    PodSubmitted,
    PodSucceeded,
    PodUnbound,
)
from shards.cli import main
from shards.inputs.scenario import Scenario, TimedEvent
from shards.replay import replay, replay_routed
from shards.simulate import simulate
from tests.builders import make_node, make_pod
from tests.engine.test_interpod import HOST, ZONE, allowed
from tests.shards.coordinator_kit import shoal

SHARDS = (1, 2, 4)


def zone_node(name: str, zone: str, pool: str, cpu: int = 8) -> str:
    return f"""
apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{{ZONE}: {zone}, {POOL_LABEL}: {pool}}}
status: {{allocatable: {{cpu: "{cpu}", memory: 32Gi}}}}
---"""


def cluster() -> str:
    """Two zones, each with a node in pool p0 and one in p1 (two shards: a zone spans
    both)."""
    return "".join(zone_node(f"{zone}{i}", zone, f"p{i}") for zone in ("a", "b") for i in range(2))


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, shards: int) -> Any:
    data, _ = shoal(tmp_path, capsys, text, shards)
    return data


@pytest.mark.parametrize("shards", SHARDS)
def test_replicas_with_required_anti_affinity_land_on_different_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    deployment = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 5
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - labelSelector: {matchLabels: {app: web}}
            topologyKey: kubernetes.io/hostname
      containers: [{name: c, image: x, resources: {requests: {cpu: 100m}}}]
"""
    data = run(tmp_path, capsys, cluster() + deployment, shards)
    nodes = [p["node"] for p in data["pods"].values() if p["node"]]
    assert sorted(nodes) == ["a0", "a1", "b0", "b1"]  # one each; the fifth waits
    (waiting,) = [p for p in data["pods"].values() if not p["node"]]
    assert "didn't match pod anti-affinity rules" in waiting["reason"]


@pytest.mark.parametrize("shards", SHARDS)
def test_a_pod_with_required_zone_affinity_joins_its_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    pods = """
apiVersion: v1
kind: Pod
metadata: {name: db, labels: {app: db}}
spec:
  nodeSelector: {topology.kubernetes.io/zone: b}
  containers: [{name: c, image: x, resources: {requests: {cpu: "6"}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: api, annotations: {shoal.io/arrive-at: "1"}}
spec:
  affinity:
    podAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
      - labelSelector: {matchLabels: {app: db}}
        topologyKey: topology.kubernetes.io/zone
  containers: [{name: c, image: x, resources: {requests: {cpu: "4"}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: worker, labels: {app: worker}}
spec:
  affinity:
    podAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
      - labelSelector: {matchLabels: {app: queue}}
        topologyKey: topology.kubernetes.io/zone
  containers: [{name: c, image: x, resources: {requests: {cpu: "1"}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: queue, labels: {app: queue}, annotations: {shoal.io/arrive-at: "5"}}
spec:
  nodeSelector: {topology.kubernetes.io/zone: a}
  containers: [{name: c, image: x, resources: {requests: {cpu: "1"}}}]
"""
    data = run(tmp_path, capsys, cluster() + pods, shards)
    placed = {k.split("/")[1]: v["node"] for k, v in data["pods"].items()}
    assert placed["db"].startswith("b")
    assert placed["api"].startswith("b")  # the emptier zone a is not its zone
    # the worker arrived before its queue: it waited, and followed it when it came
    assert placed["queue"].startswith("a")
    assert placed["worker"].startswith("a")


@pytest.mark.parametrize("shards", SHARDS)
def test_do_not_schedule_spread_never_exceeds_its_skew(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    # zone a has room for many, zone b for two: a spread of maxSkew 1 places 2 + 3 and
    # keeps the rest pending rather than skew zone a
    text = (
        zone_node("a0", "a", "p0", cpu=16)
        + zone_node("a1", "a", "p1", cpu=16)
        + zone_node("b0", "b", "p0", cpu=1)
        + zone_node("b1", "b", "p1", cpu=1)
        + """
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  replicas: 7
  podManagementPolicy: Parallel
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: topology.kubernetes.io/zone
        whenUnsatisfiable: DoNotSchedule
        labelSelector: {matchLabels: {app: web}}
      containers: [{name: c, image: x, resources: {requests: {cpu: "1"}}}]
"""
    )
    data = run(tmp_path, capsys, text, shards)
    zones = [p["node"][0] for p in data["pods"].values() if p["node"]]
    assert sorted(zones) == ["a", "a", "a", "b", "b"]
    pending = [p for p in data["pods"].values() if not p["node"]]
    assert len(pending) == 2
    assert all("topology spread constraints" in p["reason"] for p in pending)


def test_explain_names_the_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (
        cluster()
        + """
apiVersion: v1
kind: Pod
metadata: {name: api}
spec:
  affinity:
    podAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
      - labelSelector: {matchLabels: {app: db}}
        topologyKey: topology.kubernetes.io/zone
  containers: [{name: c, image: x}]
"""
    )
    scenario = tmp_path / "s.yaml"
    scenario.write_text(text)
    log = tmp_path / "run.log"
    assert main(["simulate", str(scenario), "--log", str(log)]) == 0
    capsys.readouterr()
    assert main(["replay", str(log), "--explain", "default/api"]) == 0
    out = capsys.readouterr().out
    assert "InterPodAffinity" in out
    assert "4 node(s) didn't match pod affinity rules" in out


# ----------------------------------------------------------------------------- property

RULES = st.sampled_from(["anti-host", "anti-zone", "affine-zone", "spread-zone", "spread-host"])


@st.composite
def scenarios(draw: Any) -> tuple[Scenario, dict[str, dict[str, str]], dict[str, PodSpec]]:
    """Nodes in zones that span pools (so shards); every pod has a required rule, so
    every pod is decided on the whole view and the outcome is one scheduler's."""
    items: list[tuple[int, Any]] = []
    labels: dict[str, dict[str, str]] = {}
    for i in range(draw(st.integers(2, 6))):
        zone = draw(st.sampled_from(["a", "b", "c"]))
        node_labels = {HOST: f"n{i}", ZONE: zone, POOL_LABEL: f"p{i % 4}"}
        builder = make_node(f"n{i}").cpu("3")
        for key, value in node_labels.items():
            builder = builder.label(key, value)
        labels[f"n{i}"] = node_labels
        items.append((0, NodeAdded(node=builder.spec())))
    specs = {}
    for i in range(draw(st.integers(1, 10))):
        app = draw(st.sampled_from(["x", "y"]))
        target = draw(st.sampled_from(["x", "y"]))
        rule = draw(RULES)
        builder = make_pod(f"p{i}").labels(app=app).cpu("1").priority(100 - i)
        if draw(st.booleans()):
            builder = builder.runtime(draw(st.integers(1, 4)))
        if rule == "anti-host":
            builder = builder.anti(HOST, app=target)
        elif rule == "anti-zone":
            builder = builder.anti(ZONE, app=target)
        elif rule == "affine-zone":
            builder = builder.affine(ZONE, app=target)
        elif rule == "spread-zone":
            builder = builder.spread(ZONE, draw(st.integers(1, 2)), app=target)
        else:
            builder = builder.spread(HOST, 1, app=target)
        spec = builder.spec()
        specs[spec.key] = spec
        items.append((draw(st.integers(0, 5)), PodSubmitted(pod=spec)))
    events = [TimedEvent(t * SECOND, i, e) for i, (t, e) in enumerate(items)]
    events.sort(key=lambda e: (e.time, e.order))
    return Scenario(events=events), labels, specs


async def _run(
    scenario: Scenario, shards: int
) -> tuple[dict[str, tuple[str, str | None]], list[Envelope]]:
    log = MemoryLog(shards + 1 if shards > 1 else 1)
    sharding = Sharding(shards=shards) if shards > 1 else None
    result = await simulate(scenario, log, sharding=sharding)
    result.cluster.check_invariants()
    parts = [await log.read(p, 0) for p in range(log.partitions)]
    verified = replay_routed(parts, verify=True) if shards > 1 else replay(parts[0], verify=True)
    assert verified.mismatch is None, str(verified.mismatch)
    outcome = {key: (view.phase, view.node) for key, view in result.report.pods.items()}
    return outcome, parts[0]


GONE = (PodSucceeded, PodFailed, PodDeleted, PodPreempted, PodEvicted, PodUnbound, BindFailed)


def check_placements(
    records: list[Envelope], specs: dict[str, PodSpec], labels: dict[str, dict[str, str]]
) -> None:
    """Walk one scheduler's log in order: every bind keeps every required rule against
    the pods running at that moment."""
    running: dict[str, tuple[PodSpec, str]] = {}
    for env in records:
        event = env.event
        if isinstance(event, PodBound):
            spec = specs[event.pod]
            assert allowed(spec, event.node, running, labels), (event, sorted(running))
            running[event.pod] = (spec, event.node)
        elif isinstance(event, GONE):
            running.pop(event.pod, None)


@settings(max_examples=40, deadline=None)
@given(scenarios())
def test_one_two_and_four_shards_end_the_same_and_break_no_rule(
    case: tuple[Scenario, dict[str, dict[str, str]], dict[str, PodSpec]],
) -> None:
    scenario, labels, specs = case
    (one, log), (two, _), (four, _) = (asyncio.run(_run(scenario, shards)) for shards in SHARDS)
    assert two == one
    assert four == one
    check_placements(log, specs, labels)
    running = {k: (specs[k], node) for k, (phase, node) in one.items() if phase == "Bound" and node}
    for key, (spec, node) in running.items():
        # pods still running: none is where a required anti-affinity forbids (affinity
        # and spread are checked at placement: tests/engine/test_interpod.py)
        others = {k: v for k, v in running.items() if k != key}
        stripped = msgspec_replace(spec)
        assert allowed(stripped, node, others, labels), (key, node)


def msgspec_replace(spec: PodSpec) -> PodSpec:
    """``spec`` with only its anti-affinity (what holds at any moment, not only at
    placement)."""
    import msgspec

    return msgspec.structs.replace(spec, pod_affinity=(), spread_constraints=())
