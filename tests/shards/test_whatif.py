"""``shoal replay LOG --config OTHER``: the recorded inputs run again under OTHER, and
the difference in decisions; ``--verify`` refuses any configuration but the recorded
one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import parse_config
from engine.model.pools import Sharding
from events.errors import InputError
from events.memory import MemoryLog
from events.types import (
    SECOND,
    Envelope,
    NodeAdded,
    NodeSpec,
    Placement,
    PodAdopted,
    PodSpec,
    is_decision,
)
from shards.cli import main
from shards.inputs.scenario import Scenario, TimedEvent
from shards.simulate import simulate
from shards.whatif import inputs_of, rerun, what_if
from tests.builders import make_node, make_pod
from tests.shards.scenario_text import gpu_node, gpu_pod

SHARDS = (1, 2)


def profile(strategy: str) -> str:
    return f"""
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: {strategy}
        resources: [{{name: nvidia.com/gpu, weight: 1}}]
"""


# Two nodes of four cards; two one-card pods that stay where they are put, then one that
# needs a whole node. Packed (MostAllocated), the small pods share a node and the big one
# gets the other; spread (LeastAllocated), they take one node each and the big one waits.
SCENARIO = (
    gpu_node("n0", 4)
    + gpu_node("n1", 4)
    + gpu_pod("small-0", cards=1, at=0, migratable=False)
    + gpu_pod("small-1", cards=1, at=1, migratable=False)
    + gpu_pod("big", cards=4, at=10)
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, scenario: str = SCENARIO
) -> dict[str, str]:
    """``scenario`` recorded under LeastAllocated; the paths of the log and configs."""
    paths = {
        "scenario": tmp_path / "scenario.yaml",
        "least": tmp_path / "least.yaml",
        "most": tmp_path / "most.yaml",
        "log": tmp_path / "run.log",
    }
    paths["scenario"].write_text(scenario)
    paths["least"].write_text(profile("LeastAllocated"))
    paths["most"].write_text(profile("MostAllocated"))
    code, _, err = run(
        capsys,
        "simulate",
        str(paths["scenario"]),
        "--config",
        str(paths["least"]),
        "--shards",
        str(shards),
        "--log",
        str(paths["log"]),
        "--quiet",
    )
    assert code == 0, err
    return {k: str(v) for k, v in paths.items()}


@pytest.mark.parametrize("shards", SHARDS)
def test_most_allocated_against_least_allocated_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    paths = record(tmp_path, capsys, shards)
    code, out, err = run(capsys, "replay", paths["log"], "--config", paths["most"])
    assert code == 0, err
    assert out.splitlines() == [
        f"replayed the inputs of {paths['log']} under {paths['most']}",
        f"2 of 3 pods differ ({shards} shard{'s' if shards > 1 else ''})",
        "POD              RECORDED  OTHER  CHANGE",
        "default/big      pending   n1     placed",
        "default/small-1  n1        n0     elsewhere",
        "MEASURE                  RECORDED  OTHER  CHANGE",
        "pods placed              2         3      +1",
        "pods pending at end      1         0      -1",
        "preemptions              0         0      +0",
        "moves                    0         0      +0",
        "GPU idle at end          6         2      -4",
        "GPU idle, time-average   6.1       6.1    +0",
        "queueing delay mean (s)  0         0      +0",
        "queueing delay p99 (s)   0         0      +0",
        "last event (s)           10        10     +0",
    ]


# small-1 runs 30 s: spread, the big pod waits for its node until then; packed, it starts
# at once. It ends up on n1 either way, so only small-1 is placed elsewhere.
QUEUEING = (
    gpu_node("n0", 4)
    + gpu_node("n1", 4)
    + gpu_pod("small-0", cards=1, at=0, migratable=False)
    + gpu_pod("small-1", cards=1, at=1, migratable=False, runtime=30)
    + gpu_pod("big", cards=4, at=10)
)


@pytest.mark.parametrize("shards", SHARDS)
def test_what_if_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int) -> None:
    paths = record(tmp_path, capsys, shards, QUEUEING)
    code, out, err = run(capsys, "replay", paths["log"], "--config", paths["most"], "--json")
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    assert data["config"] == paths["most"] and data["shards"] == shards
    assert data["pods"] == [
        {
            "pod": "default/small-1",
            "recorded": "n1, succeeded",
            "other": "n0, succeeded",
            "change": "elsewhere",
        }
    ]
    assert data["preemptions"] == {"added": [], "removed": []}
    assert data["moves"] == {"added": [], "removed": []}
    measures = {k: (v["recorded"], v["other"]) for k, v in data["measures"].items()}
    assert measures == {
        "pods_placed": (3, 3),
        "pods_pending": (0, 0),
        "preemptions": (0, 0),
        "moves": (0, 0),
        "gpu_idle_end": (3, 3),
        # 7 cards idle for 1 s, then 6 (spread: until big starts at 31 s; packed: until
        # big starts at 10 s, then 2)
        "gpu_idle_average": (round(187 / 31, 6), round(103 / 31, 6)),
        "queueing_mean_seconds": (7, 0),
        "queueing_p99_seconds": (21, 0),
        "end_seconds": (31, 31),
    }
    assert data["measures"]["queueing_mean_seconds"]["change"] == -7
    assert data["measures"]["pods_placed"] == {"recorded": 3, "other": 3, "change": 0}


def test_moves_removed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Spread, small-1 is moved to make room for the big pod; packed, it never needs to
    be: the move is a removed one."""
    text = SCENARIO.replace('shoal.io/migratable: "false"', 'shoal.io/migratable: "true"')
    paths = record(tmp_path, capsys, 1, text)
    code, out, err = run(capsys, "replay", paths["log"], "--config", paths["most"])
    assert code == 0, err
    lines = out.splitlines()
    assert "default/small-1  n1 → n0   n0     elsewhere" in lines
    assert "- move: default/small-1 n1 → n0 by default/big" in lines
    assert "moves                    1         0      -1" in lines


@pytest.mark.parametrize("shards", SHARDS)
def test_verify_refuses_another_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    paths = record(tmp_path, capsys, shards)
    code, out, err = run(capsys, "replay", paths["log"], "--verify", "--config", paths["most"])
    assert code == 2
    assert "verified" not in out
    assert len(err.strip().splitlines()) == 1
    assert f"--config {paths['most']}: differs from the configuration the log recorded" in err


@pytest.mark.parametrize("shards", SHARDS)
def test_the_recorded_configuration_verifies_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    paths = record(tmp_path, capsys, shards)
    code, out, err = run(capsys, "replay", paths["log"], "--verify", "--config", paths["least"])
    assert code == 0, err
    assert out.splitlines()[-1].startswith("verified: ")
    code, out, err = run(capsys, "replay", paths["log"], "--config", paths["least"], "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["pods"] == []
    assert data["moves"] == data["preemptions"] == {"added": [], "removed": []}
    assert all(m["change"] == 0 for m in data["measures"].values())


def test_explain_under_another_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = record(tmp_path, capsys, 1)
    code, out, err = run(capsys, "replay", paths["log"], "--explain", "default/big", "--json")
    assert code == 0, err
    assert json.loads(out)["final"]["phase"] == "Pending"
    argv = ("replay", paths["log"], "--explain", "default/big", "--config", paths["most"])
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["final"]["node"] == "n1" and data["what_if_config"] == paths["most"]
    assert f"explaining under {paths['most']}" in err


def test_until_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = record(tmp_path, capsys, 1)
    code, _, err = run(capsys, "replay", paths["log"], "--config", paths["most"], "--until", "3")
    assert code == 2 and "--until: a what-if replay" in err


def test_a_log_of_a_real_cluster_is_refused() -> None:
    """Completions and adoptions observed on a real cluster follow the recorded
    placements: they are no inputs to run again under another configuration."""
    node = NodeSpec(name="n0", allocatable={"cpu": 1000})
    pod = PodSpec(namespace="default", name="p")
    adopted = PodAdopted(placement=Placement(pod=pod, node="n0", decision_id="d"))
    log = [
        Envelope(event=NodeAdded(node=node), producer="ingest", offset=0),
        Envelope(event=adopted, producer="ingest", offset=1),
    ]
    assert [e.event for e in inputs_of([log[:1]], "x.log").events] == [log[0].event]
    with pytest.raises(InputError, match=r"x\.log: recorded against a real cluster"):
        inputs_of([log], "x.log")


@st.composite
def gpu_scenario(draw: Any) -> Scenario:
    """A few GPU nodes; pods of one to four cards, of two priorities, arriving over
    20 s, most of them running a while (some preempt, some wait, some are moved)."""
    events = [
        TimedEvent(0, i, make_node(f"n{i}").cpu("16").gpu(draw(st.sampled_from([2, 4]))).added())
        for i in range(draw(st.integers(2, 4)))
    ]
    arrivals = []
    for p in range(draw(st.integers(2, 10))):
        pod = make_pod(f"p{p}").cpu("1").gpu(draw(st.integers(1, 4)))
        pod = pod.priority(draw(st.sampled_from([0, 100])))
        if draw(st.booleans()):
            pod = pod.runtime(draw(st.integers(1, 30)))
        arrivals.append((draw(st.integers(0, 20)) * SECOND, pod.submitted()))
    arrivals.sort(key=lambda a: a[0])
    events += [TimedEvent(t, len(events) + i, e) for i, (t, e) in enumerate(arrivals)]
    return Scenario(events=events)


@settings(max_examples=10, deadline=None)
@given(gpu_scenario(), st.sampled_from([1, 2]), st.sampled_from(["Least", "Most"]))
async def test_the_recorded_configuration_derives_the_recorded_decisions(
    scenario: Scenario, shards: int, strategy: str
) -> None:
    """The inputs of a simulated run, run again under the configuration it recorded,
    derive every recorded decision again, in order, in each partition: the what-if
    replay compares like with like, and a difference is OTHER's."""
    config = parse_config(yaml.safe_load(profile(f"{strategy}Allocated")), "")
    sharding = Sharding(shards=shards) if shards > 1 else None
    log = MemoryLog(shards + 1 if sharding is not None else 1)
    await simulate(scenario, log, config, sharding=sharding)
    parts = [await log.read(p, 0) for p in range(log.partitions)]
    again = await rerun(parts, config, "run.log")

    def decisions(records: list[Envelope]) -> list[tuple[str, Any]]:
        return [(e.producer, e.event) for e in records if is_decision(e.event)]

    assert [decisions(p) for p in again] == [decisions(p) for p in parts]
    diff = what_if(parts, again).to_json()
    assert diff["pods"] == []
    assert all(m["change"] == 0 for m in diff["measures"].values())


@pytest.mark.parametrize("shards", SHARDS)
def test_preemptions_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """The big pod outranks the small ones: spread, it preempts one of them; packed, it
    needs none."""
    text = SCENARIO.replace(
        gpu_pod("big", cards=4, at=10), gpu_pod("big", cards=4, at=10, priority=100)
    )
    paths = record(tmp_path, capsys, shards, text)
    code, out, err = run(capsys, "replay", paths["log"], "--config", paths["most"])
    assert code == 0, err
    assert out.splitlines()[1:5] == [
        f"1 of 3 pods differ ({shards} shard{'s' if shards > 1 else ''})",
        "POD              RECORDED       OTHER  CHANGE",
        "default/small-1  n1, preempted  n0     elsewhere",
        "- preemption: default/small-1 on n1 by default/big",
    ]
    assert "preemptions              1         0      -1" in out.splitlines()
