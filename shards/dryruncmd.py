"""``shoal whatif JOB.yaml --log LOG``: dry-run a job against a recorded run (a file,
or a Kafka topic) at one of its offsets, a time, or its end (:mod:`shards.dryrun`).

Against a running ``shoal serve``: its log is a real cluster's, which a dry run refuses
(:mod:`shards.whatif`); there is no ``--serve URL``."""

from __future__ import annotations

import argparse
import sys

from events.filelog import FileLog
from events.log import EventLog, read_quarantined
from events.types import Envelope
from shards import dryrun
from shards.bus import open_bus
from shards.commands import emit_json, non_negative
from shards.inputs.progress import ProgressLines
from shards.inputs.scenario import check_topology, load_scenario
from shards.replay import recorded_config

NAME = "whatif"
HELP = "dry-run a job against a recorded run: where, when, whom it preempts, why not"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "job", nargs="+", metavar="JOB.yaml", help="the job's objects (Pods, workloads, groups)"
    )
    parser.add_argument(
        "--log", required=True, help="the recorded run: a file, or kafka://HOST:PORT?topic=..."
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--at",
        type=non_negative,
        metavar="OFFSET",
        help="submit after this offset of the inputs partition (the last one)",
    )
    where.add_argument(
        "--at-time",
        type=float,
        metavar="SECONDS",
        help="submit at this simulated time (default: the log's last record)",
    )
    parser.add_argument(
        "--with-later",
        action="store_true",
        help="feed the inputs recorded after that point too (hindsight), not only those known then",
    )
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress while reading")


async def _read(log: EventLog) -> list[list[Envelope]]:
    return [(await read_quarantined(log, p))[0] for p in range(log.partitions)]


async def _parts(where: str) -> list[list[Envelope]]:
    if where.startswith("kafka://"):
        bus = await open_bus(where)
        try:
            return await _read(bus)
        finally:
            await bus.close()
    log = FileLog(where, readonly=True)
    try:
        return await _read(log)
    finally:
        await log.close()


async def run(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.job, None if args.quiet else ProgressLines())
    job = dryrun.job_of(scenario, ", ".join(args.job))
    parts = await _parts(args.log)
    config = recorded_config(parts[-1])
    check_topology(config, scenario)
    for warning in scenario.warnings:
        print(f"shoal: warning: {warning}", file=sys.stderr)
    point = dryrun.point_of(parts, args.at, args.at_time)
    answer = await dryrun.dry_run(parts, job, config, point, later=args.with_later, where=args.log)
    if args.json:
        emit_json({"log": args.log, "job": args.job, **answer.to_json()})
    else:
        print(f"dry run of {', '.join(args.job)} against {args.log}")
        for line in answer.table():
            print(line)
    return 0
