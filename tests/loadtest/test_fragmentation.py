"""``shoal loadtest fragmentation`` on a tiny hand-made trace (tests/fixtures/gputrace)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from loadtest.fragmentation import Run, run_one
from loadtest.gputrace import arrivals, read_nodes, read_pods, target_workload
from shards.cli import main

TRACE = Path(__file__).parent.parent / "fixtures" / "gputrace"
CAPACITY = 6000  # node-a 2 cards, node-b 4, node-c none


def test_arrivals_fill_up_to_130_percent() -> None:
    pods = read_pods(TRACE, "tiny")
    assert sum(p.gpu_milli for p in pods) == 4300  # 500 + 500 + 2000 + 0 + 1000 + 300
    sequence = arrivals(pods, CAPACITY, 42)
    total = sum(p.gpu_milli for p in sequence)
    # every pod of the file first (shuffled), then draws until the next would pass 7,800
    assert sorted(p.name for p in sequence[: len(pods)]) == sorted(p.name for p in pods)
    assert total <= 7800
    assert sequence == arrivals(pods, CAPACITY, 42)
    assert sequence != arrivals(pods, CAPACITY, 43)


def test_a_file_above_130_percent_loses_random_pods() -> None:
    pods = read_pods(TRACE, "big")  # 4000 + 4000 + 500 = 8,500 > 7,800
    sequence = arrivals(pods, CAPACITY, 1)
    assert sum(p.gpu_milli for p in sequence) <= 7800
    assert len(sequence) < len(pods)


def test_trace_rows() -> None:
    nodes = read_nodes(TRACE)
    assert [(n.name, n.gpus, n.model) for n in nodes] == [
        ("node-a", 2, "T4"),
        ("node-b", 4, "G2"),
        ("node-c", 0, ""),
    ]
    pods = {p.name: p for p in read_pods(TRACE, "tiny")}
    assert (pods["pod-2"].gpus, pods["pod-2"].milli) == (2, 1000)
    assert pods["pod-5"].models == ("G2", "V100M32")
    assert pods["pod-3"].gpu_milli == 0
    # shapes: the two identical sharing pods are the most frequent; 6 pods, 5 shapes:
    # 2/6, then 3/6, 4/6, 5/6 (83%) and 6/6: all kept to reach 95%
    workload = target_workload(list(pods.values()))
    assert workload.weights[0] == 2 and sum(workload.weights) == 6
    # ShoalGpu's copy: the same shapes and weights, each with its pods' median memory
    with_memory = target_workload(list(pods.values()), memory=True)
    assert with_memory.weights == workload.weights
    assert with_memory.shapes[0].memory == 4096 << 20  # the two sharing pods
    assert [replace(s, memory=0) for s in with_memory.shapes] == list(workload.shapes)


@pytest.mark.parametrize("policy", ["random", "bestfit", "fgd", "shoal", "gpupacking"])
def test_a_run_is_deterministic_and_accounts_every_gpu(policy: str) -> None:
    first = run_one(TRACE, Run("tiny", policy, 42))
    again = run_one(TRACE, Run("tiny", policy, 42))
    assert {k: v for k, v in first.items() if k not in ("cpu_seconds", "pods_per_second")} == {
        k: v for k, v in again.items() if k not in ("cpu_seconds", "pods_per_second")
    }
    assert 0 <= first["alloc_pct_at_130"] <= 100
    assert first["unallocated_pct_at_100"] >= 0
    curve = first["curve"]  # allocation at every whole percent of arrival, up to 130
    assert len(curve) <= 131 and curve == sorted(curve)


def test_the_command_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "loadtest", "fragmentation", "--trace", str(TRACE), "--workload", "tiny",
            "--policy", "fgd", "--seeds", "1-2", "--jobs", "1", "--json",
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0
    results = json.loads(out)["results"]
    assert [(r["policy"], r["seed"]) for r in results] == [("fgd", 1), ("fgd", 2)]
    assert set(results[0]) == {
        "workload", "policy", "seed", "unallocated_pct_at_100", "alloc_pct_at_130",
        "pods_per_second",
    }  # fmt: skip
    assert all(r["pods_per_second"] > 0 for r in results)
    assert err.count("tiny fgd seed") == 2  # a progress line per run


def test_the_table_gives_each_policys_speed(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "loadtest", "fragmentation", "--trace", str(TRACE), "--workload", "tiny",
            "--policy", "bestfit", "--seeds", "1", "--jobs", "1",
        ]
    )  # fmt: skip
    header, row = capsys.readouterr().out.splitlines()
    assert code == 0
    assert header.split()[-1] == "pods/s"
    assert row.split()[1] == "bestfit" and float(row.split()[-1]) > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy", "nope"], "--policy: unknown policy 'nope'"),
        (["--workload", "nope", "--workload", "nope"], "--workload: unknown workload 'nope'"),
        (["--seeds", "x"], "--seeds: must be A-B or A,B,C"),
    ],
)
def test_bad_input_exits_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["loadtest", "fragmentation", "--trace", str(TRACE), "--workload", "tiny", *argv])
    assert refused.value.code == 2
    assert capsys.readouterr().err.startswith(f"shoal: error: {message}")


def test_a_missing_trace_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["loadtest", "fragmentation", "--trace", str(tmp_path)])
    assert refused.value.code == 2
    assert "the Alibaba GPU trace is not there" in capsys.readouterr().err


def test_a_gpu_policy_run_replays_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ShoalGpu chooses sharing pods' cards; the log records them and replay re-derives
    every decision (examples/gpu-sharing.yaml)."""
    example = Path(__file__).parent.parent.parent / "examples" / "gpu-sharing.yaml"
    log = tmp_path / "run.events"
    assert main(["simulate", str(example), "--log", str(log), "--json"]) == 0
    pods = json.loads(capsys.readouterr().out)["pods"]
    # the shares fill one machine; the other stays whole for the 4-card pod
    assert {k: v["node"] for k, v in pods.items()} == {
        "default/share-1": "gpu-a",
        "default/share-2": "gpu-a",
        "default/share-3": "gpu-a",
        "default/whole-4": "gpu-b",
    }
    assert main(["replay", str(log), "--verify"]) == 0


@pytest.mark.parametrize(
    "policy",
    ["random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "m-minus-n", "shoal"],
)
def test_the_protocol_arithmetic_by_hand(policy: str) -> None:
    """One node of two cards (capacity 2,000 milli-GPU, 130% = 2,600) and five pods of
    600 milli (3,000): a random pod is removed, leaving four (2,400). Whatever the order
    and the policy: the first two take a card each, the other two find 400 free and fail.
    Arrival reaches 100% (2,000) at the fourth pod (1,800 before it), when 1,200 are
    allocated: 40% unallocated; at the end 60% allocated."""
    result = run_one(TRACE.parent / "gputrace-one", Run("share600", policy, 7))
    assert (result["pods"], result["bound"]) == (4, 2)
    assert result["unallocated_pct_at_100"] == 40.0
    assert result["alloc_pct_at_130"] == 60.0
    assert result["curve"][:3] == [0.0, 30.0, 30.0]  # 1% arrived: the first pod (30%) is in
