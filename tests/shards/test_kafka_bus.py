"""shoal over a real Kafka broker (Apache Kafka 4, tests/broker.py): the same decisions
as in memory."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.shards.test_cli import QUICKSTART, ROOT, run, run_json


def as_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    return run_json(capsys, *argv)


@pytest.mark.parametrize("scenario", [QUICKSTART, str(ROOT / "examples" / "batch.yaml")])
def test_simulate_over_kafka_equals_memory(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str], scenario: str
) -> None:
    bus = f"kafka://{kafka_bootstrap}?topic=sim-{uuid.uuid4().hex[:10]}"
    code, out, err = run(capsys, "kafka", "init", "--bus", bus)
    assert code == 0 and out.startswith("created topic sim-"), err
    over_kafka = as_json(capsys, "simulate", scenario, "--bus", bus)
    in_memory = as_json(capsys, "simulate", scenario)
    for key in ("pods", "groups", "preemptions"):
        assert over_kafka[key] == in_memory[key]
    assert over_kafka["summary"]["events"] == in_memory["summary"]["events"]
    replayed = as_json(capsys, "replay", bus, "--verify")
    assert replayed["verify"]["ok"] is True
    assert replayed["pods"] == in_memory["pods"]
    code, out, _ = run(capsys, "kafka", "init", "--bus", bus)
    assert code == 0 and out.startswith("already exists:")


def test_kafka_errors_are_one_line(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"kafka://{kafka_bootstrap}?topic=nope-{uuid.uuid4().hex[:8]}"
    for argv, message in [
        (["simulate", QUICKSTART, "--bus", missing], "create it with `shoal kafka init`"),
        (
            ["simulate", QUICKSTART, "--bus", "kafka://127.0.0.1:1?request_timeout_ms=1000"],
            "127.0.0.1:1",
        ),
        (["kafka", "init", "--bus", "kafka://h:1?bogus=1"], "unknown Kafka setting 'bogus'"),
    ]:
        code, _, err = run(capsys, *argv)
        assert code == 2, err
        assert err.startswith("shoal: error: ") and err.count("\n") == 1, err
        assert message in err


def test_several_shards_over_kafka_equal_memory(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = QUICKSTART
    bus = f"kafka://{kafka_bootstrap}?topic=shards-{uuid.uuid4().hex[:10]}&partitions=4"
    code, out, err = run(capsys, "kafka", "init", "--bus", bus)
    assert code == 0 and "(4 partitions)" in out, err
    over_kafka = as_json(capsys, "simulate", scenario, "--shards", "3", "--bus", bus)
    in_memory = as_json(capsys, "simulate", scenario, "--shards", "3")
    for key in ("pods", "groups", "preemptions"):
        assert over_kafka[key] == in_memory[key]
    placed_by = {view["shard"] for view in in_memory["pods"].values() if "shard" in view}
    assert placed_by > {0}, "every pod was placed by shard 0"
    replayed = as_json(capsys, "replay", bus, "--verify")
    assert replayed["verify"]["ok"] is True
    assert replayed["pods"] == in_memory["pods"]


def test_sharded_loadtest_through_the_broker(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bus = f"kafka://{kafka_bootstrap}?topic=load-{uuid.uuid4().hex[:10]}&partitions=3"
    code, _, err = run(capsys, "kafka", "init", "--bus", bus)
    assert code == 0, err
    result = as_json(
        capsys, "loadtest", "--shards", "2", "--nodes", "40", "--pods", "400", "--bus", bus
    )
    assert result["bound"] == 400 and result["shape"]["bus"] == bus
    code, _, err = run(
        capsys, "loadtest", "--shards", "2", "--nodes", "4", "--pods", "4", "--bus", bus
    )
    assert code == 2 and "fresh topic" in err, err  # the log now holds a run
