"""``shoal loadtest scale``: the harness's report, its workload and its projection (no
timings are asserted: only structure, counts and arithmetic)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.types import PodGroupSubmitted, PodSubmitted
from loadtest.mixed import WAVE_KEY, mixed_batches, templates
from loadtest.scale import ScaleShape, projection, run_configuration, workload
from loadtest.scalecmd import table
from shards.cli import main


def _check_projection(result: dict[str, Any], shards: int) -> None:
    """The projection is min(1 / coordinator, 1 / busiest shard) of the rows reported
    (each per pod of the whole run)."""
    per = {row["process"]: row["cpu_us_per_pod"] for row in result["processes"]}
    shard_us = [us for name, us in per.items() if name.startswith("shard")]
    proj = result["projection"]
    assert proj["busiest_shard_us_per_pod"] == max(shard_us)
    bounds = [1e6 / max(shard_us)]
    if shards:
        assert proj["coordinator_us_per_pod"] == per["coordinator"]
        bounds.append(1e6 / per["coordinator"])
    assert proj["pods_per_second"] == pytest.approx(min(bounds), abs=0.1)
    assert proj["cores"] == shards + 1 if shards else proj["cores"] == 1


@pytest.mark.parametrize("shards", [0, 2])
async def test_a_tiny_run_counts_every_pod_and_reports_every_process(shards: int) -> None:
    """20 templates, a fifth of the pods in gangs of 4, a wave of 5 that must evict:
    every pod is decided and counted, the wave evicts one filler per pod, and each
    process has its row (the coordinator, each shard, the binder, the log and driver)."""
    shape = ScaleShape(
        nodes=100,
        pods=300,
        shards=shards,
        templates=20,
        gang_fraction=0.2,
        wave=5,
        batch=100,
        binder=shards > 0,
    )
    result = await run_configuration(shape)
    assert result["bound"] + result["unschedulable"] == 300
    assert result["bound"] == 300  # the cluster holds every pod
    assert result["shape"]["pods"] == 300 and result["shape"]["templates"] == 20
    lat = result["latency_ms"]
    assert 0 <= lat["p50"] <= lat["p99"] <= lat["max"]
    names = [row["process"] for row in result["processes"]]
    if shards:
        assert names == ["coordinator", "shard 0", "shard 1", "binder", "log"]
    else:
        assert len(names) == 1 and names[0].startswith("shard")
    for row in result["processes"]:
        assert row["cpu_seconds"] >= 0 and row["peak_rss_mb"] > 0
    _check_projection(result, shards)
    wave = result["wave"]
    assert wave["pods"] == wave["bound"] == wave["evicted"] == 5
    engine = [
        row["cpu_seconds"]
        for row in wave["processes"]
        if row["process"] == "coordinator" or row["process"].startswith("shard")
    ]
    assert len(engine) == max(shards, 1) + (1 if shards else 0)
    assert wave["engine_cpu_seconds"] == pytest.approx(sum(engine), abs=0.002)
    assert f"| 100 | 20 | {shape.label} |" in table([result])
    assert f"engine CPU {wave['engine_cpu_seconds']:.2f} s" in table([result])


def test_the_workload_is_seeded_and_honours_its_options() -> None:
    shape = ScaleShape(nodes=100, pods=1000, shards=1, templates=20, gang_fraction=0.4, wave=5)
    load = workload(shape)
    assert load == workload(shape)
    assert load.pods == 1000
    gangs = [e for b in load.batches for e in b if isinstance(e, PodGroupSubmitted)]
    assert len(gangs) == 1000 * 4 // 10 // 4
    assert (
        len({p.pod.labels["app"] for b in load.batches for p in b if isinstance(p, PodSubmitted)})
        > 10
    )
    assert sum(WAVE_KEY in n.labels for n in load.nodes) == len(load.fillers) == len(load.wave) == 5
    assert all(w.priority > f.priority for w, f in zip(load.wave, load.fillers, strict=True))
    # a batch is full up to one gang
    assert all(sum(isinstance(e, PodSubmitted) for e in b) <= shape.batch for b in load.batches)


@settings(max_examples=30, deadline=None)
@given(
    pods=st.integers(1, 400),
    fraction=st.sampled_from([0.0, 0.25, 1.0]),
    size=st.integers(2, 6),
    batch=st.integers(1, 50),
)
def test_gangs_are_never_split_and_every_pod_is_made_once(
    pods: int, fraction: float, size: int, batch: int
) -> None:
    shapes = templates(20, random.Random(1))
    batches = mixed_batches(
        pods, shapes, random.Random(2), batch=batch, gang_fraction=fraction, gang_size=size
    )
    keys = [e.pod.key for b in batches for e in b if isinstance(e, PodSubmitted)]
    assert len(keys) == len(set(keys)) == pods
    for chunk in batches:
        for group in (e.group for e in chunk if isinstance(e, PodGroupSubmitted)):
            members = [e for e in chunk if isinstance(e, PodSubmitted) and e.pod.group == group.key]
            assert len(members) == group.min_member == size
            assert len({m.pod.requests["cpu"] for m in members}) == 1  # one template per gang


@settings(max_examples=50, deadline=None)
@given(
    shards=st.integers(1, 8),
    coordinator=st.floats(1, 1000),
    shard=st.floats(1, 1000),
)
def test_the_projection_is_the_slowest_stage(shards: int, coordinator: float, shard: float) -> None:
    """Each process's CPU per pod is over every pod of the run, so at the projected rate
    no process needs more than its own core, and the slowest one needs all of it."""
    proj = projection(shards, coordinator, shard)
    rate = proj["pods_per_second"]
    busy = [rate * coordinator / 1e6, rate * shard / 1e6]  # cores each one keeps busy
    assert max(busy) == pytest.approx(1, rel=1e-3)
    assert proj["cores"] == shards + 1


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--shards", "1,x"], "--shards"),
        (["--nodes", "0"], "--nodes"),
        (["--templates", ""], "--templates"),
        (["--nodes", "100", "--preemption-wave", "60"], "--preemption-wave"),
    ],
)
def test_bad_options_exit_2_naming_the_option(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["loadtest", "scale", "--pods", "10", *argv])
    assert refused.value.code == 2
    assert flag in capsys.readouterr().err


def test_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["loadtest", "scale", "--nodes", "50", "--shards", "0", "--templates", "1,20"]
    assert main([*argv, "--pods", "200", "--batch", "50", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["configurations"]
    assert [(r["shape"]["templates"], r["bound"]) for r in rows] == [(1, 200), (20, 200)]
