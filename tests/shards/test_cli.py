"""The command-line contract of DESIGN.md: output schemas and exit statuses.

Why one module of over 500 lines: the command-line contract is one document
(DESIGN.md's), and its tests follow it command by command.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import msgspec
import pytest

import loadtest.command
from events.errors import InputError
from events.filelog import RECORD_HEADER, FileLog
from events.types import Envelope, PodBound
from shards import cli
from shards.cli import main
from shards.commands import GROUP, Command

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "examples" / "quickstart.yaml")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def test_simulate_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "simulate", QUICKSTART)
    assert set(data) >= {"pods", "migrations", "preemptions", "summary"}
    assert data["migrations"] == [] and data["preemptions"] == []
    for key, pod in data["pods"].items():
        assert "/" in key
        assert pod["phase"] in {"Bound", "Pending", "Succeeded", "Failed"}
        assert pod["node"] is None or isinstance(pod["node"], str)
        if pod["phase"] == "Pending":
            assert pod["reason"]
    summary = data["summary"]
    for field in ("bound", "pending", "events", "wall_seconds", "succeeded", "decisions"):
        assert field in summary
    assert summary["pending"] == 2 and summary["succeeded"] == 5 and summary["bound"] == 1
    pods = data["pods"]
    assert pods["research/train-a100"]["node"] == "gpu-a100-0"
    assert pods["research/train-large"]["attempts"] == 2
    assert "Insufficient memory" in pods["analytics/batch-etl"]["reason"]
    assert pods["analytics/notebook"]["node"] == "cpu-1"


def test_simulate_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    first = run_json(capsys, "simulate", QUICKSTART)
    second = run_json(capsys, "simulate", QUICKSTART)
    first["summary"].pop("wall_seconds")
    second["summary"].pop("wall_seconds")
    assert first == second


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "simulate", QUICKSTART)
    assert code == 0
    assert "research/train-large" in out and "gpu-v100-0" in out
    assert "5 succeeded" in out


def test_record_replay_verify_and_explain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = str(tmp_path / "run.events")
    simulated = run_json(capsys, "simulate", QUICKSTART, "--log", log)
    code, out, err = run(capsys, "replay", log, "--verify")
    assert code == 0, err
    assert "verified: 9 decisions" in out
    replayed = run_json(capsys, "replay", log, "--verify")
    assert replayed["verify"]["ok"] is True
    assert replayed["pods"] == simulated["pods"]
    assert replayed["events"][0]["event"]["type"] == "config"
    assert len(replayed["events"]) == simulated["summary"]["events"]

    explained = run_json(capsys, "replay", log, "--explain", "research/train-large")
    first, last = explained["attempts"]
    assert first["node"] is None and "Insufficient nvidia.com/gpu" in first["message"]
    assert last["node"] == "gpu-v100-0" and last["time_seconds"] == 60
    assert last["rejected"]["NodeResourcesFit"] == 3
    assert last["top"][0]["node"] == "gpu-v100-0"
    code, out, _ = run(capsys, "replay", log, "--explain", "research/train-large")
    assert code == 0 and "bound to gpu-v100-0" in out and "NodeResourcesFit" in out

    until = run_json(capsys, "replay", log, "--until", "3")
    assert len(until["events"]) == 4


def tamper(source: str, target: str) -> int:
    """Copy a log, moving the first PodBound to another node (valid checksums)."""

    async def go() -> int:
        src = FileLog(source, readonly=True)
        records = await src.read(0, 0)
        await src.close()
        changed = -1
        out = []
        for env in records:
            if changed < 0 and isinstance(env.event, PodBound) and env.event.node == "cpu-1":
                forged = msgspec.structs.replace(env.event, node="cpu-0")
                out.append(msgspec.structs.replace(env, event=forged))
                changed = env.offset
            else:
                out.append(env)
        dst = FileLog(target)
        await dst.append(out)
        await dst.close()
        return changed

    return asyncio.run(go())


def test_tampered_decision_is_reported_not_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = str(tmp_path / "run.events")
    run(capsys, "simulate", QUICKSTART, "--log", log, "--quiet")
    forged = str(tmp_path / "forged.events")
    offset = tamper(log, forged)
    code, _, err = run(capsys, "replay", forged, "--verify")
    assert code == 1
    assert f"offset {offset}" in err and "node='cpu-0'" in err and "node='cpu-1'" in err


def test_corrupted_log_is_exit_2_naming_the_offset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run.events"
    run(capsys, "simulate", QUICKSTART, "--log", str(log), "--quiet")
    reader = FileLog(log, readonly=True)
    positions = reader._positions[0]
    asyncio.run(reader.close())
    data = bytearray(log.read_bytes())
    data[positions[7] + RECORD_HEADER.size + 2] ^= 0x40
    bad = tmp_path / "bad.events"
    bad.write_bytes(bytes(data))
    code, out, err = run(capsys, "replay", str(bad), "--verify")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "offset 7" in err and "checksum" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["replay", "{tmp}/not-a-log.events"], "not a shoal event log"),
        (["replay", "{tmp}/missing.events"], "no such event log"),
        (["simulate", "{tmp}/missing.yaml"], "cannot read"),
        (["simulate", QUICKSTART, "--bus", "carrier-pigeon"], "unknown bus"),
        (
            ["simulate", QUICKSTART, "--bus", "kafka://127.0.0.1:1?request_timeout_ms=1000"],
            "127.0.0.1:1",
        ),
        (["simulate", QUICKSTART, "--shards", "1000"], "--shards"),
        (["simulate", QUICKSTART, "--config", "{tmp}/bad-config.yaml"], "unknown plugin 'Nope'"),
        (
            ["simulate", QUICKSTART, "{tmp}/bad-config.yaml"],
            "bad-config.yaml: document 1 (KubeSchedulerConfiguration): "
            "profiles[0].plugins.filter.enabled[0].name: unknown plugin 'Nope'",
        ),
        (["replay", "{tmp}/good.events", "--explain", "nobody"], "NAMESPACE/NAME"),
        (["replay", "{tmp}/good.events", "--explain", "x/nobody"], "no pod x/nobody"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "not-a-log.events").write_text("just text\n")
    (tmp_path / "bad-config.yaml").write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
        "profiles: [{plugins: {filter: {enabled: [{name: Nope}]}}}]\n"
    )
    run(capsys, "simulate", QUICKSTART, "--log", str(tmp_path / "good.events"), "--quiet")
    code, _, err = run(capsys, *[a.format(tmp=tmp_path) for a in argv])
    assert code == 2
    assert err.startswith("shoal: error: ") and err.count("\n") == 1
    assert message in err


def test_existing_log_is_never_overwritten_unless_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run.events"
    assert run(capsys, "simulate", QUICKSTART, "--log", str(log), "--quiet")[0] == 0
    before = log.read_bytes()
    code, _, err = run(capsys, "simulate", QUICKSTART, "--log", str(log), "--quiet")
    assert code == 2 and "already exists" in err
    assert log.read_bytes() == before
    assert run(capsys, "simulate", QUICKSTART, "--log", str(log), "--overwrite", "--quiet")[0] == 0


def test_bus_file_and_log_copy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bus = tmp_path / "bus.events"
    copy = tmp_path / "copy.events"
    run(capsys, "simulate", QUICKSTART, "--bus", f"file:{bus}", "--log", str(copy), "--quiet")
    assert records_in(bus) == records_in(copy)  # the same records, appended in other batches
    assert run(capsys, "replay", str(copy), "--verify")[0] == 0


def records_in(path: Path) -> list[list[Envelope]]:
    async def read() -> list[list[Envelope]]:
        log = FileLog(path, readonly=True)
        try:
            return [await log.read(p, 0) for p in range(log.partitions)]
        finally:
            await log.close()

    return asyncio.run(read())


def test_user_errors_print_no_traceback(tmp_path: Path) -> None:
    scenario = tmp_path / "bad.yaml"
    scenario.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, resources: {requests: {cpu: '-2'}}}]}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "shards.cli", "simulate", str(scenario)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"shoal: error: {scenario}: document 1 (Pod p): "
        "spec.containers[0].resources.requests.cpu: negative quantity '-2' for cpu"
    )


def test_loadtest_json(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "loadtest", "--nodes", "50", "--pods", "300", "--batch", "100")
    assert data["shape"]["nodes"] == 50 and data["shape"]["pods"] == 300
    assert data["pods_per_second"] > 0
    assert set(data["latency_ms"]) >= {"p50", "p90", "p99"}
    assert data["bound"] == 300 and data["unschedulable"] == 0
    assert data["cpu_seconds"]["process"] > 0 and data["cpu_microseconds_per_pod"] > 0


def test_sharded_loadtest_in_processes(capsys: pytest.CaptureFixture[str]) -> None:
    """Two shard processes over the in-memory log server: every pod decided, gangs too
    wide for one shard committed across both, the CPU each process spent; the table
    says the same."""
    data = run_json(
        capsys,
        *("loadtest", "--shards", "2", "--nodes", "40", "--pods", "400"),
        *("--spanning-gangs", "2"),
    )
    assert data["bound"] == 400 and data["shape"]["shards"] == 2
    wide = data["cross_shard_gangs"]
    assert (wide["gangs"], wide["committed"], wide["aborted"]) == (2, 2, 0)
    assert wide["commit_latency_ms"]["p50"] > 0
    cpu = data["cpu_seconds"]
    assert cpu["parent"] > 0 and len(cpu["shards"]) == 2
    assert data["cpu_microseconds_per_pod"] > 0
    code, out, err = run(
        capsys, "loadtest", "--routed", "--nodes", "20", "--pods", "100", "--spanning-gangs", "0"
    )
    assert code == 0, err
    assert "1 shard(s)" in out and "bound 100, hand-backs 0" in out and "CPU: parent" in out


def test_direct_loadtest_skips_the_router(capsys: pytest.CaptureFixture[str]) -> None:
    """``--direct``: the same harness, the pods appended to the shards' partitions
    instead of through the router (which routes none of them), every one still decided;
    with one shard too; refused, with the reason, for gangs and where it cannot apply."""
    routed = run_json(capsys, "loadtest", "--shards", "2", "--nodes", "40", "--pods", "300")
    assert routed["bound"] == 300 and routed["routed_by_router"] == 300
    assert "direct" not in routed["shape"]
    direct = run_json(
        capsys, "loadtest", "--shards", "2", "--direct", "--nodes", "40", "--pods", "300"
    )
    assert direct["bound"] == 300 and direct["routed_by_router"] == 0
    assert direct["shape"]["direct"] is True and direct["handbacks"] == 0
    assert len(direct["cpu_seconds"]["shards"]) == 2
    code, out, err = run(capsys, "loadtest", "--direct", "--nodes", "20", "--pods", "100")
    assert code == 0, err
    assert "1 shard(s)" in out and "no routing" in out and "bound 100" in out
    for extra in (["--gang-size", "4"], ["--spanning-gangs", "1", "--shards", "2"]):
        code, _, err = run(capsys, "loadtest", "--direct", "--nodes", "20", "--pods", "40", *extra)
        assert code == 2 and "--direct" in err and "no gangs" in err, err


def test_loadtest_scaling_compares_in_turn(capsys: pytest.CaptureFixture[str]) -> None:
    """``--scaling``: one shard, routed, N shards and N shards given their pods
    directly, each run every round, with
    medians, ranges and ratios that follow from the runs; the table and progress say
    the same; options it cannot honour are refused with the reason."""
    data = run_json(
        capsys,
        "loadtest",
        "--scaling",
        "--rounds",
        "2",
        "--shards",
        "2",
        "--nodes",
        "30",
        "--pods",
        "200",
        "--batch",
        "50",
    )
    configs = data["configurations"]
    assert list(configs) == ["one shard", "routed", "2 shards", "2 shards direct"]
    assert data["rounds"] == 2
    for summary in configs.values():
        speed = summary["pods_per_second"]
        assert len(speed["runs"]) == 2 and summary["bound"] == [200, 200]
        assert speed["min"] <= speed["median"] <= speed["max"]
        assert speed["median"] == sum(speed["runs"]) / 2
    assert all("cpu_microseconds_per_pod" in summary for summary in configs.values())
    ratio = data["ratios"]["2 shards / routed"]
    medians = {k: v["pods_per_second"]["median"] for k, v in configs.items()}
    assert ratio["of_medians"] == pytest.approx(medians["2 shards"] / medians["routed"])
    runs = [configs[k]["pods_per_second"]["runs"] for k in ("2 shards", "routed")]
    assert ratio["per_round"] == pytest.approx([a / b for a, b in zip(*runs, strict=True)])
    ceiling = data["ratios"]["2 shards direct / one shard"]
    assert ceiling["of_medians"] == pytest.approx(medians["2 shards direct"] / medians["one shard"])
    assert set(data["ratios"]) == {
        "2 shards / one shard",
        "2 shards / routed",
        "2 shards direct / one shard",
        "2 shards / 2 shards direct",
    }
    code, out, err = run(
        capsys, "loadtest", "--scaling", "--rounds", "1", "--nodes", "20", "--pods", "60"
    )
    assert code == 0, err
    assert "2 shards / one shard" in out and "round 1/1: routed" in err
    assert "2 shards direct / one shard" in out and "round 1/1: 2 shards direct" in err
    for extra in (["--routed"], ["--direct"], ["--spanning-gangs", "1"], ["--bus", "file:x.log"]):
        code, _, err = run(capsys, "loadtest", "--scaling", *extra)
        assert code == 2 and "--scaling runs its own configurations" in err, err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["simulate"],
        ["loadtest", "--nodes", "0"],
        ["replay", "x", "--until", "-1"],
        ["bogus"],
    ):
        code, _, err = run(capsys, *argv)
        assert code == 2 and "usage:" in err


@pytest.mark.parametrize("shards", ["2", "3", "4"])
def test_batch_example_keeps_its_guarantees_over_shards(
    shards: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sharded, research's gang still gets its guaranteed GPUs back from vision's
    borrowers (its quota's ``min`` is not split where a gang cannot use it), vision keeps
    its own guaranteed four, no pod stays pending on a full shard once another has room,
    and the log replays."""
    batch = str(ROOT / "examples" / "batch.yaml")
    log = str(tmp_path / "batch.events")
    data = run_json(capsys, "simulate", batch, "--shards", shards, "--log", log)
    pods, groups = data["pods"], data["groups"]
    assert groups["research/train"]["phase"] == "Succeeded", groups["research/train"]
    assert pods["research/evaluate"]["phase"] == "Succeeded"
    assert groups["data/etl-a"]["phase"] == groups["data/etl-b"]["phase"] == "Succeeded"
    assert data["preemptions"] and all(p["pod"].startswith("vision/") for p in data["preemptions"])
    vision = {k: v["phase"] for k, v in pods.items() if k.startswith("vision/")}
    assert sum(phase == "Bound" for phase in vision.values()) >= 4, vision
    # a pod every shard refused is recalled once another shard has room for it
    assert "Pending" not in vision.values(), vision
    code, _, err = run(capsys, "replay", log, "--verify")
    assert code == 0, err


def test_batch_example_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    batch = str(ROOT / "examples" / "batch.yaml")
    log = str(tmp_path / "batch.events")
    data = run_json(capsys, "simulate", batch, "--log", log)
    pods, groups = data["pods"], data["groups"]
    assert {p["pod"] for p in data["preemptions"]} == {"vision/detect-4", "vision/detect-5"}
    assert {p["by"] for p in data["preemptions"]} <= {f"research/worker-{i}" for i in range(4)}
    assert groups["research/train"]["phase"] == "Succeeded"
    assert groups["data/etl-a"]["phase"] == groups["data/etl-b"]["phase"] == "Succeeded"
    assert groups["data/sweep"]["phase"] == "Failed"
    assert pods["research/evaluate"]["phase"] == "Succeeded"
    assert pods["data/etl-b-0"]["attempts"] > pods["data/etl-a-0"]["attempts"]
    code, _, err = run(capsys, "replay", log, "--verify")
    assert code == 0, err
    explained = run_json(capsys, "replay", log, "--explain", "research/worker-0")
    assert explained["group"]["name"] == "research/train"
    assert explained["dependencies"] == [{"name": "research/prepare", "state": "Succeeded"}]
    events = run_json(capsys, "replay", log)["events"]
    submitted = next(
        e["offset"]
        for e in events
        if e["event"]["type"] == "pod+" and e["event"]["pod"]["name"] == "evaluate"
    )
    waiting = run_json(
        capsys, "replay", log, "--explain", "research/evaluate", "--until", str(submitted)
    )
    assert waiting["dependencies"] == [{"name": "research/train", "state": "Pending"}]


def test_dependency_cycle_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cycle = tmp_path / "cycle.yaml"
    cycle.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: a, annotations: {shoal.io/depends-on: b}}\n"
        "spec: {containers: [{name: c}]}\n---\n"
        "apiVersion: v1\nkind: Pod\nmetadata: {name: b, annotations: {shoal.io/depends-on: a}}\n"
        "spec: {containers: [{name: c}]}\n"
    )
    code, _, err = run(capsys, "simulate", str(cycle))
    assert code == 2 and err.count("\n") == 1
    assert "dependency cycle: default/a -> default/b -> default/a" in err


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--sharding", "{sharding}"], {}, "needs --shards N"),
        (["--shards", "2", "--sharding", "{missing}"], {}, "cannot read"),
        (["--shards", "2", "--sharding", "{config}"], {}, "exactly one ShardingConfiguration"),
        (["--shards", "2", "--sharding", "{pinned}"], {}, "assigned to shard 3"),
        ([], {"SHOAL_SHARDS": "two"}, "$SHOAL_SHARDS: expected a positive whole number"),
        ([], {"SHOAL_SHARDS": "0"}, "$SHOAL_SHARDS: expected a positive whole number"),
        (["--shards", "65"], {}, "1 to 64 shards"),
        (["--role", "coordinator", "--bus", "tcp://127.0.0.1:1"], {}, "give --shards N"),
    ],
)
def test_serve_sharding_options_are_checked(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    env: dict[str, str],
    message: str,
) -> None:
    files = {
        "sharding": "apiVersion: shoal.io/v1alpha1\nkind: ShardingConfiguration\npools: []\n",
        "config": "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n",
        "pinned": "apiVersion: shoal.io/v1alpha1\nkind: ShardingConfiguration\n"
        "pools: [{name: a, shard: 3}]\n",
    }
    paths = {"missing": str(tmp_path / "missing.yaml")}
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        paths[name] = str(tmp_path / f"{name}.yaml")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, _, err = run(capsys, "serve", *(a.format(**paths) for a in argv))
    assert code == 2, err
    assert message in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shards", "2"], "--recovery: measures one shard on the memory log"),
        (["--snapshot-every", "0"], "--recovery: needs snapshots"),
    ],
)
def test_loadtest_recovery_options_are_checked(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run(capsys, "loadtest", "--recovery", *argv)
    assert code == 2 and message in err


def _python(code: str) -> str:
    """What ``code`` prints, run by a fresh interpreter in the checkout."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return out.stdout


def test_the_program_collects_cycles_less_often() -> None:
    """``shoal`` as a program (not ``main`` called in-process, as these tests do) leaves
    its start-up objects out of collections and raises the collector's thresholds."""
    printed = _python(
        "import gc, shards.cli as cli\n"
        "cli.main = lambda: print(gc.get_threshold(), gc.get_freeze_count() > 0) or 0\n"
        "raise SystemExit(cli.entry())\n"
    )
    assert printed.split() == ["(50000,", "10,", "10)", "True"]


def test_a_coordinator_worker_collects_cycles_less_often_still() -> None:
    """The coordinator keeps more of what it allocates: its collector's first threshold
    is ten times a shard's."""
    printed = _python(
        "import gc, shards.cli as cli\n"
        "cli._tune_gc('shard'); print(gc.get_threshold())\n"
        "cli._tune_gc('coordinator'); print(gc.get_threshold())\n"
    )
    assert printed.splitlines() == ["(50000, 10, 10)", "(500000, 10, 10)"]


# --------------------------------------------------------------------------- added commands


async def _hello(args: argparse.Namespace) -> int:
    if args.who == "nobody":
        raise InputError("nobody to greet", location="--who")
    print(f"hello {args.who}")
    return 3


HELLO = Command(
    name="hello",
    help="greet someone",
    add_arguments=lambda parser: parser.add_argument("--who", default="world"),
    run=_hello,
)


REPLAY = dataclasses.replace(HELLO, name="replay")


@pytest.fixture
def added(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Stands in for the installed entry points of ``shoal.commands``."""

    def install(**entries: str) -> None:
        found = [EntryPoint(name, value, GROUP) for name, value in entries.items()]
        monkeypatch.setattr(cli, "entry_points", lambda group: found if group == GROUP else [])
        cli.added_commands.cache_clear()

    yield install
    cli.added_commands.cache_clear()


def test_loadtest_is_added_through_its_entry_point_and_shards_never_imports_it() -> None:
    assert cli.added_commands() == {"loadtest": loadtest.command.COMMAND}
    for path in (ROOT / "shards").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not [n for n in names if n.split(".")[0] == "loadtest"], path


def test_an_added_command_runs_as_a_built_in_one(
    added: Callable[..., None], capsys: pytest.CaptureFixture[str]
) -> None:
    added(hello="tests.shards.test_cli:HELLO")
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "hello" in out and "greet someone" in out and "loadtest" not in out
    assert run(capsys, "hello", "--who", "you") == (3, "hello you\n", "")
    assert run(capsys, "hello", "--who", "nobody") == (
        2,
        "",
        "shoal: error: --who: nobody to greet\n",
    )
    code, _, err = run(capsys, "loadtest")
    assert code == 2 and "invalid choice: 'loadtest'" in err


@pytest.mark.parametrize(
    ("entries", "error"),
    [
        ({"hello": "tests.shards.test_cli:QUICKSTART"}, TypeError),
        ({"bye": "tests.shards.test_cli:HELLO"}, TypeError),
        ({"replay": "tests.shards.test_cli:REPLAY"}, ValueError),
    ],
)
def test_an_entry_point_that_is_not_a_command_of_its_name_is_refused(
    added: Callable[..., None], entries: dict[str, str], error: type[Exception]
) -> None:
    added(**entries)
    with pytest.raises(error, match=r"in shoal\.commands"):
        cli.build_parser()
