"""User plugins from another package: ``examples/plugins`` installed into this venv
(``pip install -e``, once: skipped while it is installed), then ``shoal`` run in fresh
processes, as a user runs it. The same placements at 1 and 2 shards, ``replay
--verify`` passing, the plugins recorded in the log, and exit 2 with one line for a
plugin that is missing, of another version, or given bad args."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import parse_config
from engine.engine import Engine
from engine.framework.userplugins import plugin_factory
from engine.model.pools import Sharding
from engine.plugins.registry import builtin_registry
from events.filelog import FileLog
from events.remote import LogServer, RemoteLog
from events.types import (
    SECOND,
    Envelope,
    Event,
    GroupSpec,
    PluginUsed,
    PodBound,
    PodGroupSubmitted,
    PodSubmitted,
    SchedulerConfigured,
    ShardingConfigured,
)
from shards.inputs.scenario import load_scenario
from tests.builders import env, make_node, make_pod
from tests.shards.fleet import Fleet, bound_at_least

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "plugins"
CLUSTER = str(EXAMPLE / "cluster.yaml")
CONFIG = str(EXAMPLE / "config.yaml")
DIST = "shoal-example-plugins"
sys.path.insert(0, str(EXAMPLE))  # the classes themselves, for the engine-level rule
from shoal_example_plugins.leaf import LeafPod  # noqa: E402

LEAVES = {"hpc/slurm-2": "leaf-b", "hpc/slurm-3": "leaf-c", "hpc/slurm-4": "leaf-a"}


@pytest.fixture(scope="module")
def installed() -> str:
    """The example package's version, installed (editable) into this interpreter's
    environment if it is not yet (entry points are read from installed metadata)."""
    try:
        dist = distribution(DIST)
    except PackageNotFoundError:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", str(EXAMPLE)],
            check=True,
            timeout=600,
            capture_output=True,
        )
        dist = distribution(DIST)
    return dist.version


def shoal(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shards.cli", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def simulate(tmp_path: Path, shards: int, config: str = CONFIG) -> tuple[dict[str, Any], Path]:
    log = tmp_path / f"run-{shards}.events"
    proc = shoal(
        "simulate",
        CLUSTER,
        "--config",
        config,
        "--shards",
        str(shards),
        "--json",
        "--log",
        str(log),
    )
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data, log


def leaf_of(node: str) -> str:
    return f"leaf-{node[4]}" if node.startswith("gpu-") else ""


@pytest.mark.parametrize("shards", [1, 2])
def test_the_example_plugins_place_gangs_by_leaf_and_pods_by_speed(
    installed: str, tmp_path: Path, shards: int
) -> None:
    data, log = simulate(tmp_path, shards)
    pods = data["pods"]
    assert all(p["phase"] == "Bound" for p in pods.values()), pods
    for gang, leaf in LEAVES.items():
        members = [p for key, p in pods.items() if key.startswith(gang + "-")]
        assert members and {leaf_of(p["node"]) for p in members} == {leaf}, (gang, members)
    assert {pods[f"data/fetch-{i}"]["node"] for i in range(3)} == {"cpu-1"}
    verified = shoal("replay", str(log), "--verify")
    assert verified.returncode == 0, verified.stderr
    assert "verified:" in verified.stdout


def test_one_and_two_shards_place_every_pod_alike(installed: str, tmp_path: Path) -> None:
    """leaf-b straddles the two shards: summarised per shard, the gang of 2 would go
    to one shard and be split over two leaves; the coordinator decides it instead."""
    one, _ = simulate(tmp_path, 1)
    two, _ = simulate(tmp_path, 2)
    assert {k: p["node"] for k, p in one["pods"].items()} == {
        k: p["node"] for k, p in two["pods"].items()
    }


def _rewrite(source: Path, target: Path, plugins: tuple[PluginUsed, ...]) -> None:
    async def go() -> None:
        src = FileLog(str(source), readonly=True)
        records = await src.read(0, 0)
        await src.close()
        out: list[Envelope] = []
        for record in records:
            event = record.event
            if isinstance(event, SchedulerConfigured):
                event = msgspec.structs.replace(event, plugins=plugins)
            out.append(msgspec.structs.replace(record, event=event))
        dst = FileLog(str(target))
        await dst.append(out)
        await dst.close()

    asyncio.run(go())


def _recorded(path: Path) -> tuple[PluginUsed, ...]:
    async def go() -> tuple[PluginUsed, ...]:
        log = FileLog(str(path), readonly=True)
        try:
            for record in await log.read(log.partitions - 1, 0):
                if isinstance(record.event, SchedulerConfigured):
                    return record.event.plugins
            return ()
        finally:
            await log.close()

    return asyncio.run(go())


def test_the_log_records_the_plugins_and_verify_refuses_others(
    installed: str, tmp_path: Path
) -> None:
    _, log = simulate(tmp_path, 1)
    recorded = _recorded(log)
    assert recorded == (
        PluginUsed(name="LeafPod", distribution=DIST, version=installed),
        PluginUsed(name="NetworkSpeed", distribution=DIST, version=installed),
    )
    _, routed = simulate(tmp_path, 2)
    assert _recorded(routed) == recorded
    older = tmp_path / "older.events"
    other = (PluginUsed(name="LeafPod", distribution=DIST, version="0.0.1"), recorded[1])
    _rewrite(log, older, other)
    proc = shoal("replay", str(older), "--verify")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert (
        f"cannot verify: the run used plugin 'LeafPod' from {DIST} 0.0.1; installed: "
        f"{DIST} {installed}" in proc.stderr
    )
    plain = shoal("replay", str(older))  # without --verify: a note, and the report
    assert plain.returncode == 0, plain.stderr
    assert "note: the run used plugin 'LeafPod'" in plain.stderr
    gone = tmp_path / "gone.events"
    _rewrite(log, gone, (*recorded, PluginUsed(name="Gone", distribution="gone", version="1")))
    proc = shoal("replay", str(gone), "--verify")
    assert proc.returncode == 2
    assert "the run used plugin 'Gone' from gone 1, which is not installed" in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("minimumMbps: fast", "args.minimumMbps: Expected `int`, got `str`"),
        ("minimumMbps: -1", "args: minimumMbps must not be negative"),
        ("speed: 3", "args: Object contains unknown field `speed`"),
    ],
)
def test_bad_plugin_args_exit_2_naming_file_document_and_field(
    installed: str, tmp_path: Path, args: str, message: str
) -> None:
    text = Path(CONFIG).read_text().replace("minimumMbps: 10000", args)
    config = tmp_path / "config.yaml"
    config.write_text(text)
    proc = shoal("simulate", CLUSTER, "--config", str(config))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert (
        f"{config}: document 1 (KubeSchedulerConfiguration): profile 'network-scheduler': "
        f"plugin NetworkSpeed: {message}" in proc.stderr
    )


def test_a_plugin_not_installed_exits_2_naming_it(installed: str, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(Path(CONFIG).read_text().replace("LeafPod", "LeafPods"))
    proc = shoal("simulate", CLUSTER, "--config", str(config))
    assert proc.returncode == 2
    assert (
        "profiles[0].plugins.multiPoint.enabled[0].name: unknown plugin 'LeafPods'" in proc.stderr
    )


async def test_worker_processes_load_the_plugins_and_place_alike(
    installed: str, tmp_path: Path
) -> None:
    """``shoal worker`` (coordinator, two shards, binder) learns the configuration from
    the log and loads the plugins it names: the placements of ``simulate``, and a log
    that ``replay --verify`` passes."""
    expected, _ = simulate(tmp_path, 2)
    scenario = load_scenario([CLUSTER])
    config = json.dumps(yaml.safe_load(Path(CONFIG).read_text()), sort_keys=True)
    recorded = tuple(
        PluginUsed(name=name, distribution=DIST, version=installed)
        for name in ("LeafPod", "NetworkSpeed")
    )
    waves: dict[int, list[Event]] = {}
    for timed in scenario.events:
        waves.setdefault(timed.time, []).append(timed.event)
    async with LogServer(3) as server:
        log = await RemoteLog.connect(server.url)
        fleet = Fleet(server.url, logs=tmp_path)
        try:

            async def ingest(events: list[Event]) -> None:
                now = time.time_ns()
                await log.append(
                    [Envelope(event=e, time=now, producer="ingest") for e in events], 2
                )

            sharding = Sharding(shards=2, reservation_timeout=30 * SECOND)
            await ingest(
                [
                    ShardingConfigured(config=sharding.to_json()),
                    SchedulerConfigured(config=config, plugins=recorded),
                ]
            )
            for role in ("coordinator", "binder", "shard-0", "shard-1"):
                await fleet.start(role)
            total = 0
            for at in sorted(waves):  # in arrival order, each placed before the next
                await ingest(waves[at])
                total += sum(isinstance(e, PodSubmitted) for e in waves[at])
                await bound_at_least(log, total)
        finally:
            await fleet.stop()
        parts = [await log.read(p, 0) for p in range(3)]
        await log.close()
    placed = {
        e.event.pod: e.event.node for part in parts for e in part if isinstance(e.event, PodBound)
    }
    assert placed == {key: pod["node"] for key, pod in expected["pods"].items()}

    async def save() -> Path:
        path = tmp_path / "workers.events"
        out = FileLog(str(path), partitions=3)
        for p, part in enumerate(parts):
            await out.append(part, p)
        await out.close()
        return path

    path = await save()
    proc = shoal("replay", str(path), "--verify")
    assert proc.returncode == 0, proc.stderr + fleet.said("coordinator")


@settings(max_examples=100, deadline=None)
@given(
    leaves=st.lists(st.lists(st.booleans(), min_size=1, max_size=6), min_size=1, max_size=4),
    size=st.integers(1, 6),
)
def test_leaf_pod_places_a_gang_in_the_smallest_leaf_that_holds_it(
    leaves: list[list[bool]], size: int
) -> None:
    """Seed 001's rule, k = n - m: a gang of ``size`` one-node pods goes whole into a
    leaf whose free nodes ``n`` (those with room) are the fewest that still hold it."""
    registry = builtin_registry()
    registry.register("LeafPod", plugin_factory(LeafPod, "LeafPod"))
    config = parse_config(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "profiles": [{"plugins": {"score": {"enabled": [{"name": "LeafPod", "weight": 10}]}}}],
        }
    )
    engine = Engine(config, registry=registry)
    free: dict[str, int] = {}
    for i, nodes in enumerate(leaves):
        for j, has_room in enumerate(nodes):
            node = make_node(f"l{i}-n{j}").cpu("8").annotate(**{"shoal.io/leaf": f"leaf-{i}"})
            engine.apply(env(node.gpu(8 if has_room else 0).added()))
            free[f"leaf-{i}"] = free.get(f"leaf-{i}", 0) + has_room
    group = GroupSpec(namespace="default", name="g", min_member=size)
    engine.apply(env(PodGroupSubmitted(group=group)))
    for m in range(size):
        engine.apply(env(make_pod(f"w{m}").gpu(8).cpu("1").group("default/g").submitted()))
    placed = {d.pod: d.node for d in engine.schedule() if isinstance(d, PodBound)}
    holding = [n for n in free.values() if n >= size]
    if sum(free.values()) < size:
        assert placed == {}
    elif holding:
        used = {node.split("-")[0] for node in placed.values()}
        assert len(placed) == size and len(used) == 1, placed
        assert free[f"leaf-{used.pop()[1:]}"] == min(holding)
    else:
        assert len(placed) == size  # no leaf holds it: placed across leaves anyway


SEED_001 = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: false
profiles:
  - schedulerName: network-scheduler
    plugins:
      multiPoint:
        enabled:
          - name: NetworkSpeed
    pluginConfig:
      - name: NetworkSpeed
        args:
          selector:
            app.kubernetes.io/instance: network-scheduler
            app.kubernetes.io/name: blackbox-exporter
"""


def test_seed_001s_configuration_runs(installed: str, tmp_path: Path) -> None:
    """The configuration of seed 001 (its one comment line, not YAML, left out): it
    exited 2 for an unknown plugin before; its prober's args are accepted."""
    config = tmp_path / "seed-001.yaml"
    config.write_text(SEED_001)
    proc = shoal("simulate", CLUSTER, "--config", str(config), "--json")
    assert proc.returncode == 0, proc.stderr
    pods = json.loads(proc.stdout)["pods"]
    assert {pods[f"data/fetch-{i}"]["node"] for i in range(3)} == {"cpu-1"}
