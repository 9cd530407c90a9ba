"""The ``KubeSchedulerConfiguration`` files kube-scheduler and scheduler-plugins document
are accepted (``tests/fixtures/schedulerconfigs``, each naming its source); each field is
honoured or named in a warning; and the Coscheduling configuration as published
schedules gangs alike at 1, 2 and 4 shards, honouring its args, and replays verified."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.engine import Engine
from engine.foreign import KNOWN
from events.types import SECOND, PodBound, ReservationRequested
from shards.inputs.scenario import load_config
from shards.plugins import for_config
from tests.shards.coordinator_kit import Parts, found, podgroup, shoal
from tests.shards.scenario_text import node, pod

FIXTURES = Path(__file__).parent.parent / "fixtures" / "schedulerconfigs"
CONFIGS = sorted(FIXTURES.glob("*.yaml"))
COSCHEDULING = (FIXTURES / "sp-coscheduling.yaml").read_text()


def _named(raw: Any) -> list[tuple[str, str, bool]]:
    """(field, plugin name, enabled) of every plugin a configuration document names."""
    out = []
    for i, profile in enumerate(raw.get("profiles") or []):
        for point, section in ((profile or {}).get("plugins") or {}).items():
            for key in ("enabled", "disabled"):
                for j, ref in enumerate((section or {}).get(key) or []):
                    field = f"profiles[{i}].plugins.{point}.{key}[{j}]"
                    out.append((field, ref["name"], key == "enabled"))
    return out


def test_every_fixture_names_its_source() -> None:
    assert len(CONFIGS) >= 30
    for path in CONFIGS:
        assert path.read_text().startswith("# Source: "), path.name


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_a_documented_configuration_is_accepted_and_says_what_it_does_not_do(
    path: Path,
) -> None:
    config = load_config(str(path))
    Engine(config, registry=for_config(config).registry)  # every plugin it keeps exists
    raw = yaml.safe_load(path.read_text())
    for field, name, enabled in _named(raw):
        known = KNOWN.get(name)
        point = field.split(".")[2]
        if not enabled or known is None:
            continue
        acts = bool(known.at) if point == "multiPoint" else point in known.at
        if not acts or known.why:
            # named, with its field, where it has no effect (or only some)
            assert any(w.startswith(f"{field}: {name} ") for w in config.warnings), (
                field,
                config.warnings,
            )
    for warning in config.warnings:
        assert ": " in warning and not warning.startswith(" "), warning


# ------------------------------------------------------------------ Coscheduling, run

COSCHEDULING_TEXT = COSCHEDULING + "\n---"


def gang(name: str, size: int, *, cpu: int, at: float = 0, runtime: float | None = None) -> str:
    members = "".join(
        pod(f"{name}-{i}", cpu=str(cpu), group=name, at=at, runtime=runtime) for i in range(size)
    )
    return podgroup(name, size, at=at) + members


def _shard_partitions(parts: Parts) -> range:
    """The shards' partitions (one shard: the only one; else all but the control's)."""
    return range(max(len(parts) - 1, 1))


def bound_at(parts: Parts) -> dict[str, int]:
    """The time each pod was first bound (its shard's record)."""
    out: dict[str, int] = {}
    for partition in _shard_partitions(parts):
        for env, event in found(parts, PodBound, partition):
            out.setdefault(event.pod, env.time)
    return out


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_the_published_coscheduling_configuration_places_gangs_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """scheduler-plugins' manifests/coscheduling/scheduler-config.yaml, pasted into the
    scenario: gang a fills four nodes of 4 CPUs; gang b (three of 4 CPUs) cannot fit
    beside it and is held whole (no member placed alone), then placed when a ends."""
    text = (
        COSCHEDULING_TEXT
        + "".join(node(f"n{i}", cpu=4) for i in range(4))
        + gang("a", 4, cpu=4, runtime=20)
        + gang("b", 3, cpu=4, at=1)
    )
    data, parts = shoal(tmp_path, capsys, text, shards)
    phases = {key: entry["phase"] for key, entry in data["pods"].items()}
    assert phases == {
        **{f"default/a-{i}": "Succeeded" for i in range(4)},
        **{f"default/b-{i}": "Bound" for i in range(3)},
    }
    times = bound_at(parts)
    assert min(times[f"default/b-{i}"] for i in range(3)) >= 20 * SECOND


def _backoff_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, backoff: int | None
) -> int:
    """When a gang of two 4-CPU pods, which finds one 4-CPU node at 0 s and a second at
    2 s, is first bound under the Coscheduling configuration with ``backoff``."""
    text = COSCHEDULING_TEXT
    if backoff is not None:
        text = text.replace(
            "permitWaitingTimeSeconds: 10",
            f"permitWaitingTimeSeconds: 10\n      podGroupBackoffSeconds: {backoff}",
        )
    late = node("n1", cpu=4).replace(
        "metadata: {", 'metadata: {annotations: {shoal.io/arrive-at: "2"}, ', 1
    )
    text += node("n0", cpu=4) + late + gang("g", 2, cpu=4)
    data, parts = shoal(tmp_path / f"b{backoff}", capsys, text, shards)
    assert {data["pods"][f"default/g-{i}"]["phase"] for i in range(2)} == {"Bound"}
    times = bound_at(parts)
    return min(times[f"default/g-{i}"] for i in range(2))


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_pod_group_backoff_seconds_holds_a_gang_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    (tmp_path / "bNone").mkdir()
    (tmp_path / "b30").mkdir()
    assert _backoff_run(tmp_path, capsys, shards, None) < 30 * SECOND
    assert _backoff_run(tmp_path, capsys, shards, 30) >= 30 * SECOND


@pytest.mark.parametrize("shards", [2, 4])
def test_permit_waiting_time_seconds_is_the_reservation_time_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """A gang that spans shards is held by reservations that expire after Coscheduling's
    permitWaitingTimeSeconds (10 s in the published file), not the sharding's 30 s."""
    text = COSCHEDULING_TEXT + "".join(node(f"n{i}", cpu=4) for i in range(4))
    text += gang("g", 4, cpu=4)
    data, parts = shoal(tmp_path, capsys, text, shards)
    assert {data["pods"][f"default/g-{i}"]["phase"] for i in range(4)} == {"Bound"}
    requests = [
        (env, event)
        for partition in _shard_partitions(parts)
        for env, event in found(parts, ReservationRequested, partition)
    ]
    assert requests, "the gang spans shards: the coordinator reserved it"
    assert {event.expires_at - env.time for env, event in requests} == {10 * SECOND}
