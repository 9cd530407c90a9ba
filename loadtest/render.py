"""``shoal loadtest``'s human output: the progress line and the result tables."""

from __future__ import annotations

import sys
from typing import Any

from shards.render import make_console


class LoadtestProgress:
    """``scheduled N/M pods`` on stderr: on a terminal one line rewritten at most five
    times a second; into a file or pipe a line per tenth of the pods, so a log of a
    long run stays readable. The last count is always shown."""

    def __init__(self, interactive: bool | None = None) -> None:
        self.interactive = sys.stderr.isatty() if interactive is None else interactive
        self.shown = -1
        self.at = float("-inf")

    def __call__(self, done: int, total: int, elapsed: float) -> None:
        final = done >= total
        if done == self.shown:
            return
        line = f"scheduled {done}/{total} pods in {elapsed:.1f}s"
        if self.interactive:
            if not final and elapsed - self.at < 0.2:
                return
            print("\r" + line, end="\n" if final else "", file=sys.stderr)
        else:
            step = max(total // 10, 1)
            if not final and done // step <= self.shown // step:
                return
            print(line, file=sys.stderr)
        self.shown, self.at = done, elapsed


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


def churn_progress(point: dict[str, Any]) -> None:
    """One line on stderr per checkpoint of ``--churn`` (a long run shows it goes on)."""
    print(
        f"finished {point['finished']:,} pods ({point['live']:,} live): engine "
        f"{point['engine_bytes'] / 1e6:.1f} MB, snapshot "
        f"{point['snapshot_bytes'] / 1e6:.2f} MB, "
        f"{point['cpu_microseconds_per_pod']:.0f} µs CPU per pod",
        file=sys.stderr,
    )


def churn_table(result: dict[str, Any]) -> None:
    console = make_console()
    shape = result["shape"]
    gangs = f" in gangs of {shape['gang_size']}" if shape.get("gang_size") else ""
    console.print(
        f"[bold]churn[/] — {result['finished']:,} pods finished{gangs}, about "
        f"{shape['live']:,} live, on {shape['nodes']} nodes; "
        f"{result['simulated_seconds']:,.0f} simulated seconds in "
        f"{result['wall_seconds']:.0f} s"
    )
    console.print(
        f"{'finished':>10} {'live':>6} {'kept':>7} {'groups':>7} {'engine MB':>10} "
        f"{'RSS MB':>8} {'snapshot MB':>12} {'(zlib)':>7} {'CPU µs/pod':>11} {'engine µs/pod':>14}"
    )
    for p in result["checkpoints"]:
        console.print(
            f"{p['finished']:>10,} {p['live']:>6,} {p['finished_kept']:>7,} {p['groups']:>7,} "
            f"{p['engine_bytes'] / 1e6:>10.1f} {p['resident_bytes'] / 1e6:>8.0f} "
            f"{p['snapshot_bytes'] / 1e6:>12.2f} {p['snapshot_compressed_bytes'] / 1e6:>7.2f} "
            f"{p['cpu_microseconds_per_pod']:>11.0f} {p['engine_microseconds_per_pod']:>14.0f}"
        )
    latency = result["latency_ms"]
    console.print(
        "submit→decision latency ms: " + ", ".join(f"{k} {v:.2f}" for k, v in latency.items())
    )
