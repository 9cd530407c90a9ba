"""``shoal loadtest``'s human output: the progress line and the result tables."""

from __future__ import annotations

import sys
from typing import Any

from shards.render import make_console


def loadtest_progress(done: int, total: int, elapsed: float) -> None:
    print(f"\rscheduled {done}/{total} pods in {elapsed:.1f}s", end="", file=sys.stderr)
    if done >= total:
        print(file=sys.stderr)


def scaling_table(result: dict[str, Any]) -> None:
    console = make_console()
    shape = result["shape"]
    console.print(
        f"[bold]scaling[/] — {shape['pods']} pods on {shape['nodes']} nodes, "
        f"{result['rounds']} round(s), medians (range)"
    )
    for name, summary in result["configurations"].items():
        speed = summary["pods_per_second"]
        cpu = summary.get("cpu_microseconds_per_pod")
        per_pod = f", {cpu:.0f} µs CPU per pod" if cpu is not None else ""
        console.print(
            f"  {name:>16}: {speed['median']:>9,.0f} pods/s "
            f"({speed['min']:,.0f} to {speed['max']:,.0f}), "
            f"p50 {summary['latency_p50_ms']:.0f} ms{per_pod}"
        )
    for name, ratio in result["ratios"].items():
        rounds = ", ".join(f"{r:.2f}" for r in ratio["per_round"])
        console.print(f"  {name}: {ratio['of_medians']:.2f} (per round: {rounds})")


def loadtest_table(result: dict[str, Any]) -> None:
    console = make_console()
    shape = result["shape"]
    gangs = f" in gangs of {shape['gang_size']}" if shape.get("gang_size") else ""
    console.print(
        f"[bold]{result['pods_per_second']:,.0f} pods/s[/] — {shape['pods']} pods{gangs} on "
        f"{shape['nodes']} nodes, {shape['shards']} shard(s), bus {shape['bus']}"
    )
    latency = result["latency_ms"]
    console.print(
        "submit→decision latency ms: " + ", ".join(f"{k} {v:.2f}" for k, v in latency.items())
    )
    if "engine_seconds" in result:  # one shard in this process
        console.print(
            f"bound {result['bound']}, unschedulable {result['unschedulable']}, "
            f"wall {result['wall_seconds']:.2f}s (engine {result['engine_seconds']:.2f}s)"
        )
        return
    if shape.get("direct"):
        console.print("pods given to the shards directly, dealt out in turn: no routing")
    console.print(
        f"bound {result['bound']}, hand-backs {result['handbacks']}, "
        f"wall {result['wall_seconds']:.2f}s"
    )
    cpu = result.get("cpu_seconds")
    if cpu is not None:
        shards = ", ".join(f"{s:.2f}s" for s in cpu["shards"])
        console.print(
            f"CPU: parent {cpu['parent']:.2f}s (ingest, coordinator, this harness; the log "
            f"server on memory), shards {shards}; "
            f"{result['cpu_microseconds_per_pod']:.0f} µs per pod in all"
        )
    wide = result.get("cross_shard_gangs")
    if wide is not None:
        commit = wide["commit_latency_ms"] or {}
        console.print(
            f"cross-shard gangs: {wide['committed']} of {wide['gangs']} committed "
            f"(gangs of {wide['size']}), {wide['aborted']} aborted; commit latency ms: "
            + ", ".join(f"{k} {v:.2f}" for k, v in commit.items())
        )
