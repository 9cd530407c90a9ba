"""How throughput scales with shards, measured in one run (``loadtest --scaling``).

On a shared, noisy machine, throughput measured minutes apart is not comparable: the
host's speed drifts by half or more. So the comparison runs its configurations in turn,
round after round, and reports each one's median and range and the ratios of medians
(and, per round, the ratios of neighbouring runs):

- ``one shard``: the engine in this process, on the in-memory log (``--shards 1``);
- ``routed``: the harness of ``--shards N`` with one shard process behind the
  coordinator (``--routed``): the same costs as N shards, one shard doing the work;
- ``N shards``: ``--shards N``;
- ``N shards direct``: ``--shards N --direct``, the pods given to the shards without the
  coordinator: the most the shards and the log give, so ``N shards direct / one shard`` is
  the ceiling of ``N shards / one shard`` that no coordinator could beat.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from typing import Any

from events.memory import MemoryLog
from loadtest.driver import LoadShape, run_loadtest
from loadtest.sharded import run_sharded_loadtest

Report = Callable[[str], None]


async def run_scaling(
    shape: LoadShape, shards: int, rounds: int, report: Report | None = None
) -> dict[str, Any]:
    """``rounds`` rounds of one shard, routed and ``shards`` shards on ``shape``."""
    one = "one shard"
    routed = "routed"
    many = f"{shards} shards"
    direct = f"{shards} shards direct"
    runs: dict[str, list[dict[str, Any]]] = {one: [], routed: [], many: [], direct: []}
    for round_ in range(1, rounds + 1):
        for name, results in runs.items():
            if name == one:
                log = MemoryLog()
                try:
                    result = await run_loadtest(dataclasses.replace(shape, shards=1), log)
                finally:
                    await log.close()
            else:
                count = 1 if name == routed else shards
                result = await run_sharded_loadtest(
                    dataclasses.replace(shape, shards=count), direct=name == direct
                )
            results.append(result)
            if report is not None:
                report(f"round {round_}/{rounds}: {name}: {result['pods_per_second']:,.0f} pods/s")
    configurations = {name: _summary(results) for name, results in runs.items()}
    return {
        "shape": {**dataclasses.asdict(shape), "shards": shards},
        "rounds": rounds,
        "configurations": configurations,
        "ratios": {
            f"{top} / {base}": _ratio(configurations[top], configurations[base])
            for top, base in ((many, one), (many, routed), (direct, one), (many, direct))
        },
    }


def _summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    speeds = [r["pods_per_second"] for r in results]
    summary: dict[str, Any] = {
        "pods_per_second": {
            "median": statistics.median(speeds),
            "min": min(speeds),
            "max": max(speeds),
            "runs": speeds,
        },
        "latency_p50_ms": statistics.median(r["latency_ms"]["p50"] for r in results),
        "bound": [r["bound"] for r in results],
    }
    per_pod = [r["cpu_microseconds_per_pod"] for r in results if "cpu_microseconds_per_pod" in r]
    if per_pod:
        summary["cpu_microseconds_per_pod"] = statistics.median(per_pod)
    return summary


def _ratio(top: dict[str, Any], bottom: dict[str, Any]) -> dict[str, Any]:
    """Of two configurations' summaries: the ratio of the medians, and each round's
    ratio (the two runs of a round ran within seconds of each other: the host's speed
    changed least between them)."""
    tops, bottoms = top["pods_per_second"]["runs"], bottom["pods_per_second"]["runs"]
    rounds = [t / b for t, b in zip(tops, bottoms, strict=True) if b > 0]
    high, low = top["pods_per_second"]["median"], bottom["pods_per_second"]["median"]
    return {
        "of_medians": high / low if low > 0 else 0.0,
        "per_round": rounds,
        "per_round_median": statistics.median(rounds) if rounds else 0.0,
    }
