"""``shoal loadtest scale``: the scale harness's options, sweep and report.

Every combination of ``--nodes``, ``--templates`` and ``--shards`` runs in turn (nodes
outermost), each in a fresh set of processes (:mod:`loadtest.scale`); a progress line
goes to stderr as each starts and every few seconds while it runs; the table (or
``--json``) comes at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from events.errors import InputError
from loadtest.scale import ScaleShape, run_configuration
from shards.commands import emit_json, non_negative, positive

NAME = "scale"
HELP = (
    "the scale harness: cluster sizes x templates x shard counts, CPU per pod and peak "
    "memory per process, and the projection for N + 1 cores"
)


def _counts(text: str, *, zero: bool = False, flag: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v < (0 if zero else 1) for v in values):
        least = "0" if zero else "1"
        raise InputError(
            f"a comma-separated list of whole numbers, each at least {least}: {text!r}",
            location=flag,
        )
    return values


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a fraction from 0 to 1: {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", default="1000,5000,20000", help="cluster sizes, comma-separated")
    parser.add_argument(
        "--shards",
        default="0,1,2",
        help="shard processes behind a coordinator process, comma-separated; 0: one "
        "shard in this process, no coordinator (default 0,1,2)",
    )
    parser.add_argument(
        "--templates",
        default="1,20",
        help="pod templates, comma-separated: 1 is one shape and nothing else; more mix "
        "sizes, GPUs, node selectors and zone spreads (default 1,20)",
    )
    parser.add_argument("--pods", type=positive, default=20000)
    parser.add_argument(
        "--gang-fraction",
        type=_fraction,
        default=0.0,
        help="this fraction of the pods in gangs of --gang-size (default 0)",
    )
    parser.add_argument("--gang-size", type=positive, default=4)
    parser.add_argument(
        "--preemption-wave",
        type=non_negative,
        default=0,
        metavar="PODS",
        help="set PODS nodes apart, fill them with low-priority pods, then submit PODS "
        "high-priority pods that each must evict one (timed on its own)",
    )
    parser.add_argument(
        "--binder",
        action="store_true",
        help="run the simulated binder as a process too (its CPU is reported)",
    )
    parser.add_argument("--seed", type=non_negative, default=0)
    parser.add_argument("--batch", type=positive, default=1000, help="pods per ingest batch")
    parser.add_argument(
        "--window",
        type=non_negative,
        default=1,
        help="batches submitted and not yet decided, at most (0: no limit)",
    )
    parser.add_argument("--json", action="store_true")


def shapes(args: argparse.Namespace) -> list[ScaleShape]:
    """Every configuration the options ask for, in the order they run."""
    nodes = _counts(args.nodes, flag="--nodes")
    shards = _counts(args.shards, zero=True, flag="--shards")
    kinds = _counts(args.templates, flag="--templates")
    if args.gang_fraction and args.gang_size < 2:
        raise InputError("gangs have at least 2 members", location="--gang-size")
    if args.binder and shards == [0]:
        raise InputError(
            "the binder runs beside shard processes: add --shards 1 or more", location="--binder"
        )
    return [
        ScaleShape(
            nodes=n,
            pods=args.pods,
            shards=s,
            templates=t,
            gang_fraction=args.gang_fraction,
            gang_size=args.gang_size,
            wave=args.preemption_wave,
            seed=args.seed,
            batch=args.batch,
            window=args.window,
            binder=args.binder and s > 0,
        )
        for n in nodes
        for t in kinds
        for s in shards
    ]


async def run(args: argparse.Namespace) -> int:
    plan = shapes(args)
    results: list[dict[str, Any]] = []
    for index, shape in enumerate(plan, 1):
        name = (
            f"[{index}/{len(plan)}] {shape.nodes:,} nodes, {shape.templates} template(s), "
            f"{shape.label}"
        )
        _say(args, f"{name}: starting")
        result = await run_configuration(shape, progress=_Ticker(args, name))
        results.append(result)
        _say(args, f"{name}: done: {row(result)}")
    if args.json:
        emit_json({"configurations": results})
    else:
        print(table(results))
    return 0


def _say(args: argparse.Namespace, line: str) -> None:
    """Progress, on stderr (with ``--json`` too: stdout carries only the report)."""
    del args
    print(line, file=sys.stderr, flush=True)


class _Ticker:
    """A progress line every 5 seconds of a run."""

    def __init__(self, args: argparse.Namespace, name: str) -> None:
        self.args = args
        self.name = name
        self.last = time.monotonic()

    def __call__(self, done: int, total: int, elapsed: float) -> None:
        if time.monotonic() - self.last >= 5:
            self.last = time.monotonic()
            _say(self.args, f"{self.name}: {done:,}/{total:,} pods of the phase, {elapsed:.0f} s")


def row(r: dict[str, Any]) -> str:
    """One configuration's line of :func:`table`."""
    shape, proj = r["shape"], r["projection"]
    per = {p["process"]: p for p in r["processes"]}
    shard_us = [f"{p['cpu_us_per_pod']:.0f}" for k, p in per.items() if k.startswith("shard")]
    coordinator = per.get("coordinator", {}).get("cpu_us_per_pod")
    log = per.get("log", {}).get("cpu_us_per_pod")
    binder = per.get("binder", {}).get("cpu_us_per_pod")
    rss = max((p["peak_rss_mb"] or 0.0) for p in r["processes"])
    return (
        f"| {shape['nodes']:,} | {shape['templates']} | {shape['configuration']} "
        f"| {r['pods_per_second']:,.0f} | {proj['pods_per_second']:,.0f} ({proj['cores']}) "
        f"| {r['latency_ms']['p50']:.1f} | {r['latency_ms']['p99']:.1f} "
        f"| {'—' if coordinator is None else f'{coordinator:.0f}'} "
        f"| {' / '.join(shard_us)} | {'—' if binder is None else f'{binder:.0f}'} "
        f"| {'in shard' if log is None else f'{log:.0f}'} | {rss:,.0f} |"
    )


def table(results: list[dict[str, Any]]) -> str:
    """A markdown table, one row per configuration, and the wave's where there was one."""
    head = (
        "| nodes | templates | configuration | pods/s | projected pods/s (cores) | p50 ms "
        "| p99 ms | CPU µs/pod: coordinator | shards | binder | log + driver "
        "| peak RSS MB (largest) |"
    )
    lines = [head, "|" + "---|" * 12]
    waves = []
    for r in results:
        shape = r["shape"]
        lines.append(row(r))
        if "wave" in r:
            w = r["wave"]
            waves.append(
                f"wave at {shape['nodes']:,} nodes, {shape['templates']} template(s), "
                f"{shape['configuration']}: "
                f"{w['bound']}/{w['pods']} bound, {w['evicted']} evicted in "
                f"{w['seconds']:.2f} s ({w['pods_per_second']:,.0f} pods/s), "
                f"engine CPU {w['engine_cpu_seconds']:.2f} s"
            )
    lines.append("")
    lines.append(
        "projected: pods/s on N + 1 free cores ≈ min(1 / coordinator CPU per pod, "
        "1 / busiest shard's CPU per pod), each per pod of the run; in-process: "
        "1 / its CPU per pod"
    )
    if any(r["unschedulable"] for r in results):
        lines.append(
            "unschedulable: "
            + ", ".join(
                f"{r['shape']['nodes']:,}/{r['shape']['templates']}/{r['shape']['configuration']}: "
                f"{r['unschedulable']}"
                for r in results
                if r["unschedulable"]
            )
        )
    return "\n".join([*lines, *waves])
