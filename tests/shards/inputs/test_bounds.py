"""Every number a scenario states is bounded where it enters (``shards/inputs/limits.py``).

For each numeric field, hypothesis draws values inside the bound (the scenario loads,
and every event it makes encodes for the log) and outside it (one :class:`InputError`
naming file, document and field, on one line). The bounds are then shown sufficient:
a cluster at the largest totals schedules, scores and replays exactly at 1 and 2 shards.

Why one module of over 500 lines: the table of fields is the list of every number a
scenario can state; kept whole, a field missing from it is easy to see.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from engine.model.devices import CARDS_LABEL, MAX_NODE_CARDS
from events.codec import encode
from events.errors import InputError
from events.types import Envelope
from shards.inputs.limits import (
    MAX_MIN_MEMBER,
    MAX_PRIORITY,
    MAX_QUANTITY,
    MAX_SCENARIO_NANOSECONDS,
    MAX_SECONDS,
    MAX_USER_PRIORITY,
    MIN_PRIORITY,
)
from shards.inputs.scenario import Scenario, load_scenario

Doc = dict[str, Any]
SP = "scheduling.x-k8s.io/v1alpha1"


def node(name: str = "n", **allocatable: Any) -> Doc:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", **allocatable}},
    }


def pod(name: str = "p", meta: Doc | None = None, **spec: Any) -> Doc:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **(meta or {})},
        "spec": {"containers": [{"name": "c"}], **spec},
    }


def requests(**amounts: Any) -> Doc:
    return {"containers": [{"name": "c", "resources": {"requests": amounts}}]}


def group(api: str = SP, **spec: Any) -> Doc:
    return {"apiVersion": api, "kind": "PodGroup", "metadata": {"name": "g"}, "spec": spec}


def affinity(op: str, value: Any) -> Doc:
    term = {"matchExpressions": [{"key": "rank", "operator": op, "values": [value]}]}
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
    }


def config(**fields: Any) -> Doc:
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        **fields,
    }


def load(docs: list[Doc]) -> tuple[str, Scenario]:
    """Write ``docs`` to a file and load it; the path is returned for messages."""
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "s.yaml")
        Path(path).write_text(yaml.safe_dump_all(docs))
        return path, load_scenario([path])


def refused(docs: list[Doc]) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "s.yaml")
        Path(path).write_text(yaml.safe_dump_all(docs))
        with pytest.raises(InputError) as info:
            load_scenario([path])
    text = str(info.value)
    assert text.startswith(f"{path}: document ") and "\n" not in text
    return text


def encodes(scenario: Scenario) -> None:
    """What loaded goes into the log and the JSON of a run without overflow."""
    for timed in scenario.events:
        encode(Envelope(event=timed.event, time=timed.time))
    if scenario.config is not None:
        json.dumps(scenario.config.source)


@dataclass(frozen=True)
class Field:
    name: str
    make: Callable[[Any], list[Doc]]
    inside: st.SearchStrategy[Any]
    outside: st.SearchStrategy[Any]
    location: str


def ints(low: int, high: int) -> st.SearchStrategy[int]:
    """Integers in [low, high], with the ends drawn often."""
    return st.one_of(st.sampled_from([low, high]), st.integers(low, high))


def beyond(low: int | None, high: int | None) -> st.SearchStrategy[int]:
    """Integers below ``low`` or above ``high`` (the nearest drawn often), up to 190 bits:
    a YAML number of fewer than 64 characters (longer ones are refused as YAML)."""
    near: list[int] = []
    parts: list[st.SearchStrategy[int]] = []
    if low is not None:
        near.append(low - 1)
        parts.append(st.integers(-(2**190), low - 1))
    if high is not None:
        near.append(high + 1)
        parts.append(st.integers(high + 1, 2**190))
    return st.one_of(st.sampled_from(near), *parts)


def seconds_text(value: int | float) -> str:
    return str(value)


QUANTITY = ints(0, MAX_QUANTITY)
OVER = beyond(None, MAX_QUANTITY)
FIELDS = [
    Field(
        "node cpu (millicores)",
        lambda v: [node(cpu=f"{v}m")],
        QUANTITY,
        OVER,
        "status.allocatable.cpu",
    ),
    Field(
        "node cpu (cores)",
        lambda v: [node(cpu=v)],
        ints(0, MAX_QUANTITY // 1000),
        beyond(None, MAX_QUANTITY // 1000),
        "status.allocatable.cpu",
    ),
    Field("node memory", lambda v: [node(memory=v)], QUANTITY, OVER, "status.allocatable.memory"),
    Field(
        "node memory (suffix)",
        lambda v: [node(memory=f"{v}Ki")],
        ints(0, MAX_QUANTITY // 1024),
        beyond(None, MAX_QUANTITY // 1024),
        "status.allocatable.memory",
    ),
    Field("node pods", lambda v: [node(pods=v)], QUANTITY, OVER, "status.allocatable.pods"),
    Field(
        # each card is a column of the card table: a node's count is bounded by itself
        "node gpus",
        lambda v: [node(**{"nvidia.com/gpu": v})],
        ints(0, MAX_NODE_CARDS),
        beyond(None, MAX_NODE_CARDS),
        "status.allocatable.nvidia.com/gpu",
    ),
    Field(
        "node gpu-cards label",
        lambda v: [{**node(), "metadata": {"name": "n", "labels": {CARDS_LABEL: str(v)}}}],
        ints(0, MAX_NODE_CARDS),
        beyond(0, MAX_NODE_CARDS),
        f"metadata.labels.{CARDS_LABEL}",
    ),
    Field(
        "node capacity",
        lambda v: [{**node(), "status": {"capacity": {"cpu": f"{v}m"}}}],
        QUANTITY,
        OVER,
        "status.allocatable.cpu",
    ),
    Field(
        "pod cpu request",
        lambda v: [pod(**requests(cpu=f"{v}m"))],
        QUANTITY,
        OVER,
        "spec.containers[0].resources.requests.cpu",
    ),
    Field(
        "pod memory limit",
        lambda v: [
            pod(containers=[{"name": "c", "resources": {"limits": {"memory": v}}}]),
        ],
        QUANTITY,
        OVER,
        "spec.containers[0].resources.limits.memory",
    ),
    Field(
        "init container request",
        lambda v: [pod(initContainers=[{"name": "i", "resources": {"requests": {"cpu": v}}}])],
        ints(0, MAX_QUANTITY // 1000),
        beyond(None, MAX_QUANTITY // 1000),
        "spec.initContainers[0].resources.requests.cpu",
    ),
    Field(
        "pod overhead",
        lambda v: [pod(overhead={"memory": v})],
        QUANTITY,
        OVER,
        "spec.overhead.memory",
    ),
    Field(
        "pod priority",
        lambda v: [pod(priority=v)],
        ints(MIN_PRIORITY, MAX_PRIORITY),
        beyond(MIN_PRIORITY, MAX_PRIORITY),
        "spec.priority",
    ),
    Field(
        "priority class value",
        lambda v: [
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": "c"},
                "value": v,
            },
            pod(priorityClassName="c"),
        ],
        ints(MIN_PRIORITY, MAX_USER_PRIORITY),
        beyond(MIN_PRIORITY, MAX_USER_PRIORITY),
        "(PriorityClass c): value",
    ),
    Field(
        "minMember (scheduler-plugins)",
        lambda v: [group(minMember=v)],
        ints(1, MAX_MIN_MEMBER),
        beyond(1, MAX_MIN_MEMBER),
        "spec.minMember",
    ),
    Field(
        "minMember (Volcano)",
        lambda v: [group("scheduling.volcano.sh/v1beta1", minMember=v)],
        ints(1, MAX_MIN_MEMBER),
        beyond(1, MAX_MIN_MEMBER),
        "spec.minMember",
    ),
    Field(
        "min-available label",
        lambda v: [
            pod(
                meta={
                    "labels": {
                        "pod-group.scheduling.sigs.k8s.io/name": "g",
                        "pod-group.scheduling.sigs.k8s.io/min-available": str(v),
                    }
                }
            )
        ],
        ints(1, MAX_MIN_MEMBER),
        st.one_of(st.integers(-(2**100), 0), st.integers(MAX_MIN_MEMBER + 1, 10**62 - 1)),
        "min-available",
    ),
    Field(
        "scheduleTimeoutSeconds",
        lambda v: [group(minMember=1, scheduleTimeoutSeconds=v)],
        ints(1, MAX_SECONDS),
        beyond(1, MAX_SECONDS),
        "spec.scheduleTimeoutSeconds",
    ),
    Field(
        "maxScheduleTime",
        lambda v: [group("batch.scheduler.tencent.com/v1", minMember=1, maxScheduleTime=f"{v}s")],
        ints(1, MAX_SECONDS),
        st.integers(MAX_SECONDS + 1, 10**60),
        "spec.maxScheduleTime",
    ),
    Field(
        "minResources",
        lambda v: [group(minMember=1, minResources={"cpu": f"{v}m"})],
        QUANTITY,
        OVER,
        "spec.minResources.cpu",
    ),
    Field(
        "ElasticQuota max",
        lambda v: [
            {
                "apiVersion": SP,
                "kind": "ElasticQuota",
                "metadata": {"name": "q", "namespace": "t"},
                "spec": {"max": {"memory": v}},
            }
        ],
        QUANTITY,
        OVER,
        "spec.max.memory",
    ),
    Field(
        "arrive-at",
        lambda v: [pod(meta={"annotations": {"shoal.io/arrive-at": seconds_text(v)}})],
        st.one_of(ints(0, MAX_SECONDS), st.floats(0, MAX_SECONDS)),
        st.one_of(st.integers(MAX_SECONDS + 1, 10**60), st.floats(MAX_SECONDS * 1.0001, 1e300)),
        'metadata.annotations["shoal.io/arrive-at"]',
    ),
    Field(
        "runtime",
        lambda v: [pod(meta={"annotations": {"shoal.io/runtime": seconds_text(v)}})],
        st.one_of(ints(1, MAX_SECONDS), st.floats(1e-6, MAX_SECONDS)),
        st.one_of(st.integers(MAX_SECONDS + 1, 10**60), st.floats(MAX_SECONDS * 1.0001, 1e300)),
        'metadata.annotations["shoal.io/runtime"]',
    ),
    Field(
        "Gt value",
        lambda v: [pod(**affinity("Gt", v))],
        ints(-(2**63), 2**63 - 1),
        beyond(-(2**63), 2**63 - 1),
        "matchExpressions[0].values",
    ),
    Field(
        "preferred weight",
        lambda v: [
            pod(
                affinity={
                    "nodeAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": v, "preference": {}}
                        ]
                    }
                }
            )
        ],
        ints(1, 100),
        beyond(1, 100),
        "preferredDuringSchedulingIgnoredDuringExecution[0].weight",
    ),
    Field(
        "pool shard",
        lambda v: [
            {
                "apiVersion": "shoal.io/v1alpha1",
                "kind": "ShardingConfiguration",
                "pools": [{"name": "a", "shard": v}],
            }
        ],
        ints(0, 63),
        beyond(0, 63),
        "pools[0].shard",
    ),
    Field(
        "pool reassignment shard",
        lambda v: [
            {
                "apiVersion": "shoal.io/v1alpha1",
                "kind": "PoolReassignment",
                "metadata": {"name": "r"},
                "spec": {"pool": "a", "shard": v},
            }
        ],
        ints(0, 63),
        beyond(0, 63),
        "spec.shard",
    ),
    Field(
        "podMaxBackoffSeconds",
        lambda v: [config(podInitialBackoffSeconds=0, podMaxBackoffSeconds=v)],
        ints(0, MAX_SECONDS),
        beyond(0, MAX_SECONDS),
        "podMaxBackoffSeconds",
    ),
    Field(
        "podInitialBackoffSeconds",
        lambda v: [config(podInitialBackoffSeconds=v, podMaxBackoffSeconds=MAX_SECONDS)],
        ints(0, MAX_SECONDS),
        beyond(0, MAX_SECONDS),
        "podInitialBackoffSeconds",
    ),
    Field(
        "an integer in a field shoal ignores",
        lambda v: [config(parallelism=v)],
        ints(-(2**63), 2**63 - 1),
        beyond(-(2**63), 2**63 - 1),
        "parallelism",
    ),
    Field(
        "plugin weight",
        lambda v: [
            config(
                profiles=[
                    {"plugins": {"score": {"enabled": [{"name": "NodeAffinity", "weight": v}]}}}
                ]
            )
        ],
        ints(0, 100),
        beyond(0, 100),
        "profiles[0].plugins.score.enabled[0]",
    ),
]


def fit_args(**strategy: Any) -> list[Doc]:
    args = {"scoringStrategy": strategy}
    return [config(profiles=[{"pluginConfig": [{"name": "NodeResourcesFit", "args": args}]}])]


def shape(utilization: int, score: int) -> list[Doc]:
    points = [{"utilization": utilization, "score": score}]
    return fit_args(type="RequestedToCapacityRatio", requestedToCapacityRatio={"shape": points})


FIELDS += [
    Field(
        "NodeResourcesFit resource weight",
        lambda v: fit_args(resources=[{"name": "cpu", "weight": v}]),
        ints(1, 100),
        beyond(1, 100),
        "scoringStrategy.resources[0]",
    ),
    Field(
        "shape utilization",
        lambda v: shape(v, 5),
        ints(0, 100),
        beyond(0, 100),
        "requestedToCapacityRatio.shape[0]",
    ),
    Field(
        "shape score",
        lambda v: shape(50, v),
        ints(0, 10),
        beyond(0, 10),
        "requestedToCapacityRatio.shape[0]",
    ),
]


@pytest.mark.parametrize("field", FIELDS, ids=[f.name for f in FIELDS])
@given(data=st.data())
def test_values_inside_the_bounds_load_and_encode(field: Field, data: st.DataObject) -> None:
    _, scenario = load(field.make(data.draw(field.inside)))
    encodes(scenario)


@pytest.mark.parametrize("field", FIELDS, ids=[f.name for f in FIELDS])
@given(data=st.data())
def test_values_outside_the_bounds_are_refused_naming_the_field(
    field: Field, data: st.DataObject
) -> None:
    text = refused(field.make(data.draw(field.outside)))
    assert field.location in text
    assert len(text) < 1000


@given(amounts=st.lists(st.integers(MAX_QUANTITY // 2 + 1, MAX_QUANTITY), min_size=2, max_size=6))
def test_a_pods_containers_together_stay_within_the_bound(amounts: list[int]) -> None:
    containers = [
        {"name": f"c{i}", "resources": {"requests": {"memory": a}}} for i, a in enumerate(amounts)
    ]
    assert "spec.containers: the pod requests more than" in refused([pod(containers=containers)])


@given(amounts=st.lists(QUANTITY, min_size=2, max_size=6))
def test_the_nodes_together_stay_within_the_bound(amounts: list[int]) -> None:
    """A node's capacity times the node count: the sum over nodes is what the
    coordinator's per-shard columns hold."""
    docs = [node(f"n{i}", cpu=f"{a}m") for i, a in enumerate(amounts)]
    crossing = next((i for i in range(len(amounts)) if sum(amounts[: i + 1]) > MAX_QUANTITY), None)
    if crossing is None:
        encodes(load(docs)[1])
        return
    text = refused(docs)
    assert f"document {crossing + 1} (Node n{crossing}): status.allocatable.cpu" in text
    assert "adds up to more than" in text


def test_arrivals_and_runtimes_together_stay_within_the_clock() -> None:
    per_pod = MAX_SECONDS
    fit = MAX_SCENARIO_NANOSECONDS // (per_pod * 10**9)
    docs = [pod(f"p{i}", {"annotations": {"shoal.io/runtime": str(per_pod)}}) for i in range(fit)]
    encodes(load(docs)[1])
    docs.append(pod("last", {"annotations": {"shoal.io/runtime": str(per_pod)}}))
    text = refused(docs)
    assert f"document {fit + 1} (Pod last)" in text and "shoal.io/runtime" in text


def test_label_values_follow_kubernetes_length() -> None:
    encodes(load([{**node(), "metadata": {"name": "n", "labels": {"rank": "9" * 63}}}])[1])
    text = refused([{**node(), "metadata": {"name": "n", "labels": {"rank": "9" * 400}}}])
    assert "metadata.labels.rank: a label value has at most 63 characters" in text


MAX_NODE = MAX_QUANTITY // 2
LARGEST = f"""
apiVersion: v1
kind: Node
metadata: {{name: a}}
status: {{allocatable: {{cpu: {MAX_NODE}m, memory: "{MAX_NODE}", pods: "{MAX_NODE}"}}}}
---
apiVersion: v1
kind: Node
metadata: {{name: b}}
status: {{allocatable: {{cpu: {MAX_NODE}m, memory: "{MAX_NODE}", pods: "{MAX_NODE}"}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: filler}}
spec:
  priority: {MAX_PRIORITY}
  nodeName: a
  containers: [{{name: c, resources: {{requests: {{cpu: {MAX_NODE // 2}m, memory: "{MAX_NODE // 2}"}}}}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: probe, annotations: {{shoal.io/arrive-at: "{MAX_SECONDS}"}}}}
spec: {{containers: [{{name: c}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: whole, annotations: {{shoal.io/arrive-at: "{MAX_SECONDS}", shoal.io/runtime: "{MAX_SECONDS}"}}}}
spec: {{priority: {MIN_PRIORITY}, containers: [{{name: c, resources: {{requests: {{cpu: {MAX_NODE}m}}}}}}]}}
"""


@pytest.mark.parametrize("shards", [1, 2])
def test_the_largest_cluster_schedules_and_replays_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Two nodes that together hold the most a scenario may: scores are computed in
    int64 without wrapping (the probe goes to the emptier node, as LeastAllocated
    wants), the whole node's pod binds and finishes at the latest time, and the log
    replays exactly."""
    from shards.cli import main

    scenario = tmp_path / "largest.yaml"
    scenario.write_text(LARGEST)
    log = tmp_path / "run.events"
    argv = ["simulate", str(scenario), "--shards", str(shards), "--log", str(log), "--json"]
    assert main(argv) == 0
    pods = json.loads(capsys.readouterr().out)["pods"]
    assert pods["default/filler"]["node"] == "a"
    assert pods["default/probe"]["node"] == "b"
    assert pods["default/whole"]["phase"] == "Succeeded"
    assert main(["replay", str(log), "--verify"]) == 0


@pytest.mark.parametrize(
    ("docs", "location"),
    [
        ([pod(meta={"annotations": {"shoal.io/runtime": "1e-12"}})], "shoal.io/runtime"),
        (
            [group("batch.scheduler.tencent.com/v1", minMember=1, maxScheduleTime="0.0000000001s")],
            "spec.maxScheduleTime",
        ),
        (
            [
                {
                    "apiVersion": "shoal.io/v1alpha1",
                    "kind": "ShardingConfiguration",
                    "reservationTimeoutSeconds": 1e-12,
                }
            ],
            "reservationTimeoutSeconds",
        ),
    ],
    ids=["runtime", "maxScheduleTime", "reservationTimeoutSeconds"],
)
def test_a_positive_duration_is_at_least_a_nanosecond(docs: list[Doc], location: str) -> None:
    """A duration that must be positive never rounds to zero nanoseconds."""
    assert location in refused(docs)
