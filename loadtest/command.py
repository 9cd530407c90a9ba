"""``shoal loadtest``: throughput and latency on a synthetic cluster, scaling over shards,
recovery from snapshots.

``shoal`` finds this command through the ``shoal.commands`` entry point in
``pyproject.toml`` (:data:`COMMAND`); nothing in ``shards/`` imports this package. The
drivers are imported when a run starts, so other ``shoal`` commands never load them.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING

from events.errors import InputError
from loadtest import render
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
    load.add_argument("--rounds", type=positive, default=3, help="rounds of --scaling (default 3)")
    snapshot_option(load)
    load.add_argument("--json", action="store_true")
    modes = load.add_subparsers(dest="loadtest_mode", metavar="MODE")
    from loadtest.fragreport import add_arguments as fragmentation_arguments

    fragmentation_arguments(
        modes.add_parser(
            "fragmentation",
            help="FGD's GPU fragmentation benchmark on the Alibaba GPU trace (PROTOCOL.md)",
        )
    )


async def run(args: argparse.Namespace) -> int:
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
    )
    if args.scaling:
        return await _scaling(args, shape)
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
