"""``shoal loadtest``: throughput and latency on a synthetic cluster, scaling over shards,
recovery from snapshots.

``shoal`` finds this command through the ``shoal.commands`` entry point in
``pyproject.toml`` (:data:`COMMAND`); nothing in ``shards/`` imports this package. The
drivers are imported when a run starts, so other ``shoal`` commands never load them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from typing import TYPE_CHECKING, Any

from events.errors import InputError
from loadtest import render
from loadtest.perfshapes import WORKLOADS
from shards.bus import open_bus
from shards.commands import (
    Command,
    emit_json,
    non_negative,
    positive,
    sharding_for,
    snapshot_option,
    snapshots,
)

if TYPE_CHECKING:
    from loadtest.driver import LoadShape


def add_arguments(load: argparse.ArgumentParser) -> None:
    load.add_argument("--nodes", type=positive, default=5000)
    load.add_argument("--pods", type=positive, default=20000)
    load.add_argument("--shards", type=positive, default=1)
    load.add_argument("--bus", default="memory")
    load.add_argument("--overwrite", action="store_true")
    load.add_argument("--seed", type=non_negative, default=0)
    load.add_argument("--batch", type=positive, default=1000, help="pods per ingest batch")
    load.add_argument(
        "--window",
        type=non_negative,
        default=1,
        help="at most this many batches submitted and not yet decided (default 1: each "
        "batch waits for the one before, so latency is a batch's time through the system; "
        "0: every batch at once, as fast as the log takes them)",
    )
    load.add_argument(
        "--gang-size",
        type=non_negative,
        default=0,
        metavar="N",
        help="put the pods in gangs of N (minMember N); 0 for independent pods",
    )
    load.add_argument(
        "--routed",
        action="store_true",
        help="with one shard too, run the coordinator and a shard process (the harness of "
        "--shards N), for comparisons at equal cost",
    )
    load.add_argument(
        "--direct",
        action="store_true",
        help="with --shards N (or 1), append the pods straight to the shards' partitions, "
        "dealt out in turn, instead of through the coordinator: what the shards and the log "
        "give without it, the ceiling the coordinator's cost lowers (plain pods only)",
    )
    load.add_argument(
        "--spanning-gangs",
        type=non_negative,
        default=0,
        help="add this many gangs too big for one shard (placed across shards by the "
        "coordinator; reports commit latency)",
    )
    load.add_argument(
        "--recovery",
        action="store_true",
        help="measure how long a restarted shard takes to recover, from its newest "
        "snapshot and from the start (a churn workload on one shard)",
    )
    load.add_argument(
        "--churn",
        action="store_true",
        help="a long run on one shard: pods arrive and finish without end, about --live "
        "held at a time, until --pods have finished; reports the engine's memory, its "
        "snapshot and the time per pod every --every finished pods (with --gang-size N, "
        "in gangs of N with a time-out each)",
    )
    load.add_argument(
        "--live", type=positive, default=3000, help="pods held at a time in --churn (3000)"
    )
    load.add_argument(
        "--every",
        type=positive,
        default=100_000,
        metavar="PODS",
        help="--churn reports every PODS finished pods (100,000)",
    )
    load.add_argument(
        "--scaling",
        action="store_true",
        help="compare one shard, one shard behind the coordinator (--routed), --shards N "
        "(N at least 2; 2 unless given) and --shards N --direct in turn, --rounds times, "
        "and report medians and ratios (on a noisy machine, only runs made together "
        "compare)",
    )
    load.add_argument(
        "--extender",
        metavar="URL",
        default="",
        help="ask this kube-scheduler extender (filter and prioritize verbs) about every pod; "
        "'builtin': a trivial one shoal starts on 127.0.0.1 in a process of its own (lets "
        "every node through, scores by name), so the run measures the protocol's cost",
    )
    load.add_argument(
        "--extender-node-names",
        action="store_true",
        help="the extender is nodeCacheCapable: it is sent node names, not whole nodes",
    )
    load.add_argument(
        "--extender-compare",
        action="store_true",
        help="alternate runs without and with --extender, --rounds times, and report "
        "medians and the ratio (one shard)",
    )
    load.add_argument("--rounds", type=positive, default=3, help="rounds of --scaling (default 3)")
    load.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="",
        help="a workload of kube-scheduler's scheduler_perf on its nodes (4 CPU, 32Gi, "
        "110 pods): 1,000 init pods, then --pods measured ones (one shard)",
    )
    snapshot_option(load)
    load.add_argument("--json", action="store_true")
    modes = load.add_subparsers(dest="loadtest_mode", metavar="MODE")
    from loadtest.fragreport import add_arguments as fragmentation_arguments
    from loadtest.kube import add_arguments as kube_arguments

    kube = modes.add_parser(
        "kube",
        help="scheduler_perf's SchedulingBasic through an API server, for shoal or any "
        "scheduler (--scheduler-name)",
    )
    kube_arguments(kube)
    kube.add_argument("--json", action="store_true")
    from loadtest.defragbench import add_arguments as defrag_arguments
    from loadtest.scalecmd import HELP as SCALE_HELP
    from loadtest.scalecmd import NAME as SCALE
    from loadtest.scalecmd import add_arguments as scale_arguments

    scale_arguments(modes.add_parser(SCALE, help=SCALE_HELP))

    defrag_arguments(
        modes.add_parser(
            "defrag",
            help="the Alibaba GPU trace with departures, with and without defragmentation",
        )
    )
    fragmentation_arguments(
        modes.add_parser(
            "fragmentation",
            help="FGD's GPU fragmentation benchmark on the Alibaba GPU trace (PROTOCOL.md)",
        )
    )


async def run(args: argparse.Namespace) -> int:
    if getattr(args, "loadtest_mode", None) == "kube" and args.realkube:
        from loadtest import kubepeer

        return await kubepeer.run(args)
    if getattr(args, "loadtest_mode", None) == "kube":
        from loadtest import kube

        return await kube.run(args)
    if getattr(args, "loadtest_mode", None) == "scale":
        from loadtest.scalecmd import run as scale

        return await scale(args)
    if getattr(args, "loadtest_mode", None) == "defrag":
        from loadtest.defragbench import run as defrag

        return defrag(args)
    if getattr(args, "loadtest_mode", None) == "fragmentation":
        from loadtest.fragreport import run as fragmentation

        return fragmentation(args)
    from loadtest.driver import LoadShape, run_loadtest

    sharding_for(args.shards)
    if args.recovery:
        return await _recovery(args)
    if args.churn:
        return await _churn(args)
    if args.gang_size and args.gang_size > args.pods:
        raise InputError(
            f"a gang of {args.gang_size} needs at least that many pods", location="--gang-size"
        )
    shape = LoadShape(
        nodes=args.nodes,
        pods=args.pods,
        seed=args.seed,
        batch=args.batch,
        gang_size=args.gang_size,
        window=args.window,
        workload=args.workload,
    )
    if args.workload and (args.shards > 1 or args.routed or args.direct or args.scaling):
        raise InputError("runs on one shard", location="--workload")
    if args.workload and args.gang_size:
        raise InputError("a workload's pods are its own: drop --gang-size", location="--workload")
    if args.scaling:
        return await _scaling(args, shape)
    if args.extender:
        return await _with_extender(args, shape)
    if args.spanning_gangs and args.shards < 2:
        raise InputError("gangs across shards need --shards 2 or more", location="--spanning-gangs")
    shape = dataclasses.replace(shape, shards=args.shards)
    progress = None if args.json else render.LoadtestProgress()
    if args.shards > 1 or args.routed or args.direct:
        from loadtest.sharded import run_sharded_loadtest

        result = await run_sharded_loadtest(
            shape,
            spanning_gangs=args.spanning_gangs,
            progress=progress,
            bus=args.bus,
            direct=args.direct,
        )
    else:
        log = await open_bus(args.bus, overwrite=args.overwrite)
        try:
            result = await run_loadtest(shape, log, progress=progress, bus=args.bus)
        finally:
            await log.close()
    if args.json:
        emit_json(result)
    else:
        render.loadtest_table(result)
    return 0


async def _scaling(args: argparse.Namespace, shape: LoadShape) -> int:
    from loadtest.scaling import run_scaling

    for given, flag in (
        (args.routed, "--routed"),
        (args.direct, "--direct"),
        (args.spanning_gangs, "--spanning-gangs"),
        (args.bus != "memory", "--bus"),
    ):
        if given:
            raise InputError(
                f"--scaling runs its own configurations on the memory log: drop {flag}",
                location="--scaling",
            )
    shards = args.shards if args.shards > 1 else 2

    def report(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr)

    result = await run_scaling(shape, shards, args.rounds, report)
    if args.json:
        emit_json(result)
    else:
        render.scaling_table(result)
    return 0


async def _recovery(args: argparse.Namespace) -> int:
    from loadtest.recovery import run_recovery

    if args.shards != 1 or args.bus != "memory":
        raise InputError("measures one shard on the memory log", location="--recovery")
    every, _ = snapshots(args)  # a churn run: a snapshot every so many records
    if every < 1:
        raise InputError("needs snapshots: --snapshot-every N, N > 0", location="--recovery")
    progress = None if args.json else (lambda step: print(f"... {step}", file=sys.stderr))
    result = await run_recovery(
        args.nodes,
        args.pods,
        snapshot_every=every,
        seed=args.seed + 1,
        progress=progress,
    )
    if args.json:
        emit_json(result)
    else:
        seconds = result["recover_seconds"]
        print(
            f"{result['records']} records, {result['snapshots']} snapshots of "
            f"{result['snapshot_bytes'] / 1e6:.2f} MB "
            f"(written in {result['snapshot_write_seconds']:.2f} s on average)\n"
            f"recovery: {seconds['from_snapshot']:.2f} s from the newest snapshot "
            f"({result['records_replayed_after_snapshot']} records after it), "
            f"{seconds['from_start']:.2f} s from the start: {result['speedup']:.1f}x"
        )
        process = result["process_start"]
        ended = process["phase_ended_seconds"]
        print(
            f"a shard process, from exec (median of {process['starts']} starts): started "
            f"{ended['started']:.2f} s, recovered {ended['recovered']:.2f} s, first decision "
            f"{process['first_decision_seconds']:.2f} s"
        )
    return 0


async def _churn(args: argparse.Namespace) -> int:
    from loadtest.churn import ChurnShape, TailLog, run_churn

    if args.shards != 1:
        raise InputError("measures one shard", location="--churn")
    for given, flag in ((args.routed, "--routed"), (args.direct, "--direct")):
        if given:
            raise InputError(f"runs one shard in this process: drop {flag}", location="--churn")
    shape = ChurnShape(
        nodes=args.nodes,
        pods=args.pods,
        live=args.live,
        every=min(args.every, args.pods),
        gang_size=args.gang_size,
        seed=args.seed,
    )
    every = int(args.snapshot_every or 0)  # snapshots in the log only when asked for
    log = TailLog() if args.bus == "memory" else await open_bus(args.bus, overwrite=args.overwrite)
    try:
        result = await run_churn(
            shape, log, progress=render.churn_progress, bus=args.bus, snapshot_every=every
        )
    finally:
        await log.close()
    if args.json:
        emit_json(result)
    else:
        render.churn_table(result)
    return 0


COMMAND = Command(
    name="loadtest",
    help="measure scheduling throughput on a synthetic cluster",
    add_arguments=add_arguments,
    run=run,
)


async def _with_extender(args: argparse.Namespace, shape: LoadShape) -> int:
    """One shard asking an extender about every pod (``--extender-compare``: alternated
    with runs without it, ``--rounds`` times)."""
    from loadtest import extender
    from loadtest.driver import run_loadtest

    if args.shards > 1 or args.routed or args.direct or args.bus != "memory":
        raise InputError("--extender runs one shard on the memory log", location="--extender")
    proc = None
    url = args.extender
    if url == "builtin":
        port = extender.free_port()
        proc = extender.start(port)
        url = f"http://127.0.0.1:{port}"
    with_it = dataclasses.replace(shape, extender=url, node_names=args.extender_node_names)
    runs: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
    try:
        for _ in range(args.rounds if args.extender_compare else 1):
            plan = (
                [("without", shape), ("with", with_it)]
                if args.extender_compare
                else [("with", with_it)]
            )
            for label, run_shape in plan:
                log = await open_bus("memory")
                try:
                    runs[label].append(await run_loadtest(run_shape, log))
                finally:
                    await log.close()
                if not args.json:
                    print(
                        f"{label:>7} extender: {runs[label][-1]['pods_per_second']:.0f} pods/s",
                        file=sys.stderr,
                    )
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
    if not args.extender_compare:
        result = runs["with"][0]
    else:
        med = {k: statistics.median(r["pods_per_second"] for r in v) for k, v in runs.items()}
        p99 = {k: statistics.median(r["latency_ms"]["p99"] for r in v) for k, v in runs.items()}
        result = {
            "shape": runs["with"][0]["shape"],
            "rounds": args.rounds,
            "pods_per_second": med,
            "latency_ms_p99": p99,
            "with_over_without": round(med["with"] / med["without"], 3) if med["without"] else 0,
            "extender": runs["with"][-1].get("extender", {}),
            "runs": runs,
        }
    if args.json:
        emit_json(result)
    elif args.extender_compare:
        print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    else:
        render.loadtest_table(result)
    return 0
