"""``shoal whatif JOB.yaml --log LOG``: a job dry-run against a recorded run agrees
with what the job does when it is really submitted at that point (the base scenario's
objects and the job's arriving then, simulated), at one and two shards."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.errors import InputError
from events.memory import MemoryLog
from events.types import SECOND, Envelope, NodeAdded, NodeSpec, Placement, PodAdopted, PodSpec
from shards.cli import main
from shards.commands import sharding_for
from shards.dryrun import Point, answers, dry_run, dry_run_scenario, job_of
from shards.inputs.scenario import load_scenario
from shards.replay import recorded_config
from shards.simulate import simulate
from tests.shards.scenario_text import gpu_node, gpu_pod, pod_group, rescheduler_config

SHARDS = (1, 2)


@dataclass(frozen=True)
class Pod:
    name: str
    cards: int
    at: int
    runtime: int | None = None
    priority: int = 0
    group: str = ""
    on: str = ""
    migratable: bool = True

    def text(self, at: float | None = None) -> str:
        return gpu_pod(
            self.name,
            cards=self.cards,
            at=self.at if at is None else at,
            runtime=self.runtime,
            priority=self.priority,
            group=self.group,
            on=self.on,
            migratable=self.migratable,
        )


def base_text(nodes: int, pods: list[Pod], until: int | None = None, config: str = "") -> str:
    """``config``, nodes of four cards, and the pods arriving by ``until`` (all: None)."""
    text = config + "".join(gpu_node(f"n{i}", 4) for i in range(nodes))
    return text + "".join(p.text() for p in pods if until is None or p.at <= until)


def job_text(job: list[Pod], at: float, groups: dict[str, int]) -> str:
    """The job's pod groups (name → min member) and pods, all arriving at ``at``."""
    text = "".join(pod_group(name, size, at=at) for name, size in groups.items())
    return text + "".join(p.text(at) for p in job)


async def partitions(paths: list[str], shards: int) -> list[list[Envelope]]:
    """The log of ``shoal simulate PATHS --shards N``, its partitions."""
    sharding = sharding_for(shards)
    log = MemoryLog(shards + 1 if sharding is not None else 1)
    await simulate(load_scenario(paths), log, None, sharding=sharding)
    return [await log.read(p, 0) for p in range(log.partitions)]


async def agree(
    nodes: int,
    base: list[Pod],
    job: list[Pod],
    at: int,
    shards: int,
    *,
    later: bool = False,
    groups: dict[str, int] | None = None,
    config: str = "",
) -> dict[str, Any]:
    """The dry run of ``job`` against the recorded run of ``base`` at time ``at``, after
    checking that it equals what the job really does when submitted then: the base's
    objects known by then (all of them, ``later``) and the job's arriving at ``at``."""
    groups = groups or {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: str(Path(tmp) / f"{name}.yaml") for name in ("base", "known", "job", "then")}
        Path(paths["base"]).write_text(base_text(nodes, base, config=config))
        Path(paths["known"]).write_text(base_text(nodes, base, None if later else at, config))
        Path(paths["job"]).write_text(job_text(job, 0, groups))
        Path(paths["then"]).write_text(job_text(job, at, groups))
        recorded = await partitions([paths["base"]], shards)
        real = await partitions([paths["known"], paths["then"]], shards)
        job_spec = job_of(load_scenario([paths["job"]]), paths["job"])
    answer = await dry_run(
        recorded, job_spec, recorded_config(recorded[-1]), Point(at * SECOND), later=later
    )
    for row in answer.answer["pods"]:  # found on the dry run's end state; not a fact of it
        cf = row.pop("counterfactual", None)
        assert row["node"] is None or cf is None, row
    assert answer.answer == answers(real, job_spec)
    assert answer.shards == shards
    return answer.answer


@st.composite
def runs(draw: Any) -> tuple[int, list[Pod], list[Pod], int, bool, dict[str, int]]:
    """A few four-card nodes; base pods of one to four cards, of two priorities,
    arriving over 20 s, some finishing; a job of one to three pods (some asking more
    than a node has, some of a higher priority, maybe a gang) submitted at 0-15 s."""
    nodes = draw(st.integers(1, 2))
    base = [
        Pod(
            f"b{i}",
            draw(st.integers(1, 4)),
            draw(st.integers(0, 20)),
            draw(st.none() | st.integers(1, 30)),
            draw(st.sampled_from((0, 10))),
        )
        for i in range(draw(st.integers(0, 6)))
    ]
    gang = draw(st.booleans())
    size = draw(st.integers(1, 3))
    job = [
        Pod(
            f"j{i}",
            draw(st.sampled_from((1, 2, 4, 8))),
            0,
            draw(st.none() | st.integers(1, 30)),
            draw(st.sampled_from((0, 10, 100))),
            "gang" if gang else "",
        )
        for i in range(size)
    ]
    return (
        nodes,
        base,
        job,
        draw(st.integers(0, 15)),
        draw(st.booleans()),
        {"gang": size} if gang else {},
    )


@pytest.mark.parametrize("shards", SHARDS)
@settings(max_examples=8, deadline=None)
@given(case=runs())
async def test_dry_run_agrees_with_the_real_submission(
    shards: int, case: tuple[int, list[Pod], list[Pod], int, bool, dict[str, int]]
) -> None:
    nodes, base, job, at, later, groups = case
    await agree(nodes, base, job, at, shards, later=later, groups=groups)


@pytest.mark.parametrize("shards", SHARDS)
async def test_inputs_recorded_later_are_unknown_unless_asked_for(shards: int) -> None:
    """``early`` holds the only node until 10 s; ``later``, of a higher priority, arrives
    at 5 s. Submitted at 2 s, the job's pod gets the node when ``early`` ends, as far as
    was known at 2 s; with hindsight ``later`` takes it and the pod never runs."""
    base = [Pod("early", 4, 0, runtime=10), Pod("later", 4, 5, priority=10)]
    job = [Pod("j", 4, 0)]
    known = await agree(1, base, job, 2, shards)
    assert [(r["node"], r["wait_seconds"], r["reason"]) for r in known["pods"]] == [("n0", 8, "")]
    hindsight = await agree(1, base, job, 2, shards, later=True)
    [row] = hindsight["pods"]
    assert (row["node"], row["wait_seconds"]) == (None, None)
    assert row["reason"] == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


@pytest.mark.parametrize("shards", SHARDS)
async def test_preemption_and_a_pod_that_never_fits(shards: int) -> None:
    """``low`` runs on n0 for good and ``short``, of a higher priority than the job's,
    on n1 until 21 s; the job's ``urgent`` preempts ``low``, ``patient`` waits for
    ``short`` to end, ``huge`` never fits."""
    base = [Pod("low", 4, 0), Pod("short", 4, 1, runtime=20, priority=200)]
    job = [Pod("urgent", 4, 0, priority=100), Pod("patient", 4, 0), Pod("huge", 8, 0)]
    answer = await agree(2, base, job, 5, shards)
    assert answer["pods"] == [
        {
            "pod": "default/urgent",
            "node": "n0",
            "nodes": ["n0"],
            "wait_seconds": 0,
            "placed_at_seconds": 5,
            "preempts": [{"pod": "default/low", "node": "n0"}],
            "moves": [],
            "outcome": "n0",
            "reason": "",
        },
        {
            "pod": "default/patient",
            "node": "n1",
            "nodes": ["n1"],
            "wait_seconds": 16,
            "placed_at_seconds": 21,
            "preempts": [],
            "moves": [],
            "outcome": "n1",
            "reason": "",
        },
        {
            "pod": "default/huge",
            "node": None,
            "nodes": [],
            "wait_seconds": None,
            "placed_at_seconds": None,
            "preempts": [],
            "moves": [],
            "outcome": "pending",
            "reason": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
        },
    ]


@pytest.mark.parametrize("shards", SHARDS)
async def test_a_move_the_job_causes(shards: int) -> None:
    """n0 runs ``a`` (2 cards) and ``b`` (1), n1 runs ``d`` (3, not movable); the job's
    pod (2 cards) fits on n0 once the recorded rescheduler moves ``b`` to n1."""
    base = [
        Pod("a", 2, 0, on="n0"),
        Pod("b", 1, 0, on="n0"),
        Pod("d", 3, 0, on="n1", migratable=False),
    ]
    answer = await agree(
        2, base, [Pod("c", 2, 0)], 5, shards, config=rescheduler_config("{maxMoves: 1}")
    )
    [row] = answer["pods"]
    assert (row["node"], row["wait_seconds"], row["preempts"]) == ("n0", 0, [])
    assert row["moves"] == [{"pod": "default/b", "from": "n0", "to": "n1"}]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def record(tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int) -> dict[str, str]:
    """The base of the preemption test recorded by ``shoal simulate``, and the job."""
    paths = {name: tmp_path / f"{name}.yaml" for name in ("base", "job")}
    paths["log"] = tmp_path / "run.log"
    base = [Pod("low", 4, 0), Pod("short", 4, 1, runtime=20, priority=200)]
    paths["base"].write_text(base_text(2, base))
    job = [Pod("urgent", 4, 0, priority=100), Pod("patient", 4, 0), Pod("huge", 8, 0)]
    paths["job"].write_text(job_text(job, 0, {}))
    argv = ["simulate", str(paths["base"]), "--shards", str(shards), "--log", str(paths["log"])]
    code, _, err = run(capsys, *argv, "--quiet")
    assert code == 0, err
    return {k: str(v) for k, v in paths.items()}


@pytest.mark.parametrize("shards", SHARDS)
def test_whatif_table(tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int) -> None:
    paths = record(tmp_path, capsys, shards)
    code, out, err = run(capsys, "whatif", paths["job"], "--log", paths["log"], "--at-time", "5")
    assert code == 0, err
    plural = "s" if shards > 1 else ""
    assert out.splitlines() == [
        f"dry run of {paths['job']} against {paths['log']}",
        f"submitted at 5s, the inputs known then, {shards} shard{plural}: 2 of 3 pods placed",
        "POD              NODE  WAIT (s)  OUTCOME  WHY NOT PLACED",
        "default/urgent   n0    0         n0",
        "default/patient  n1    16        n1",
        "default/huge     -     -         pending  0/2 nodes are available: 2 Insufficient "
        "nvidia.com/gpu.",
        "default/urgent preempts default/low on n0",
    ]


def test_whatif_json_at_an_offset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """At the offset of ``short``'s submission (time 1 s), ``patient`` waits 20 s."""
    paths = record(tmp_path, capsys, 1)
    code, out, err = run(capsys, "replay", paths["log"], "--json")
    assert code == 0, err
    events = json.loads(out)["events"]
    [offset] = [
        e["offset"]
        for e in events
        if e["event"]["type"] == "pod+" and e["event"]["pod"]["name"] == "short"
    ]
    code, out, err = run(
        capsys, "whatif", paths["job"], "--log", paths["log"], "--at", str(offset), "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert (data["at_seconds"], data["at_offset"], data["shards"]) == (1, offset, 1)
    assert data["with_later"] is False
    waits = {r["pod"]: r["wait_seconds"] for r in data["pods"]}
    assert waits == {"default/urgent": 0, "default/patient": 20, "default/huge": None}


def test_whatif_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = record(tmp_path, capsys, 1)
    clash = tmp_path / "clash.yaml"
    clash.write_text(Pod("low", 1, 0).text())
    broken = tmp_path / "broken.yaml"
    broken.write_text(Pod("x", 1, 0).text().replace('gpu: "1"', 'gpu: "lots"'))
    config = tmp_path / "config.yaml"
    config.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n---"
        + Pod("x", 1, 0).text()
    )
    cases = {
        (clash, "--at", "0"): "pod default/low is already in the log (offset ",
        (broken, "--at", "0"): "document 1 (Pod x): spec.containers[0].resources",
        (config, "--at", "0"): "uses the log's recorded scheduler configuration",
        (Path(paths["job"]), "--at", "9999"): "--at: offset 9999 is past the end",
        (Path(paths["job"]), "--at-time", "-1"): "--at-time: expected seconds >= 0",
    }
    for (job, flag, value), message in cases.items():
        code, out, err = run(capsys, "whatif", str(job), "--log", paths["log"], flag, value)
        assert (code, out) == (2, ""), (job, err)
        assert len(err.splitlines()) == 1 and message in err, err


def test_a_log_of_a_real_cluster_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real cluster's placements and completions were observed there, not derived:
    the dry run cannot re-derive the state from them."""
    node = NodeSpec(name="n0", allocatable={"cpu": 1000})
    pod = PodSpec(namespace="default", name="p")
    adopted = PodAdopted(placement=Placement(pod=pod, node="n0", decision_id="d"))
    recorded = [
        [
            Envelope(event=NodeAdded(node=node), producer="ingest", offset=0),
            Envelope(event=adopted, producer="ingest", offset=1),
        ]
    ]
    job = tmp_path / "job.yaml"
    job.write_text(Pod("j", 0, 0).text())
    with pytest.raises(InputError, match=r"x\.log: recorded against a real cluster .* a dry run"):
        dry_run_scenario(
            recorded, job_of(load_scenario([str(job)]), "job"), Point(0), later=False, where="x.log"
        )
