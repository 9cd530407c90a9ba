"""``shoal whatif JOB.yaml --log LOG``: dry-run a job against a recorded run (a file,
or a Kafka topic) at one of its offsets, a time, or its end (:mod:`shards.dryrun`).

``shoal whatif JOB.yaml --serve URL``: ask a running ``shoal serve`` to dry-run it on a
copy of its current state (:mod:`shards.dryrunask`, :mod:`shards.dryrunserve`); the
answer has the same shape."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from events.errors import InputError
from events.filelog import FileLog
from events.log import EventLog, read_quarantined
from events.types import SECOND, Envelope
from shards import dryrun, dryrunask
from shards.bus import open_bus
from shards.commands import emit_json, non_negative
from shards.inputs.progress import ProgressLines
from shards.inputs.scenario import check_topology, load_scenario
from shards.replay import recorded_config
from shards.web.standalone import read_token

NAME = "whatif"
HELP = "dry-run a job against a recorded run or a running serve: where, when, whom it preempts"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "job", nargs="+", metavar="JOB.yaml", help="the job's objects (Pods, workloads, groups)"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--log", help="the recorded run: a file, or kafka://HOST:PORT?topic=...")
    source.add_argument(
        "--serve",
        metavar="URL",
        help="a running shoal serve (its --listen address): dry-run on its current state",
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="with --serve: the live view's token (the service's --ui-token-file)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=dryrunask.TIMEOUT,
        metavar="SECONDS",
        help=f"with --serve: how long to wait for the answer (default {dryrunask.TIMEOUT:g})",
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


def _job_text(paths: list[str]) -> bytes:
    """The job's files as one stream of documents."""
    texts = []
    for path in paths:
        try:
            texts.append(Path(path).read_bytes())
        except OSError as exc:
            raise InputError(f"{path}: {exc.strerror or exc}", location=path) from None
    return b"\n---\n".join(texts)


async def _ask(args: argparse.Namespace, job: dryrun.Job) -> int:
    for flag, given in (("--at", args.at), ("--at-time", args.at_time)):
        if given is not None:
            raise InputError("a running service is asked about its state now", location=flag)
    if args.with_later:
        raise InputError("a running service knows no later inputs", location="--with-later")
    if not args.timeout > 0:
        raise InputError(f"expected seconds > 0, got {args.timeout:g}", location="--timeout")
    token = read_token(args.token_file, "--token-file")
    answer = await dryrunask.ask(args.serve, _job_text(args.job), token, args.timeout)
    if args.json:
        emit_json({"serve": args.serve, "job": args.job, **answer})
        return 0
    print(f"dry run of {', '.join(args.job)} against {args.serve}")
    try:
        point = dryrun.Point(round(answer["at_seconds"] * SECOND))
        result = dryrun.DryRun(point, answer["shards"], False, answer)
        lines = result.table()[1:]
        pods = answer["pods"]
        placed = sum(1 for row in pods if row["node"] is not None)
    except (KeyError, TypeError, ValueError):
        raise InputError(
            f"{args.serve} is not a shoal serve (its answer is not a dry run)",
            location="--serve",
        ) from None
    shards = f"{result.shards} shard{'s' if result.shards > 1 else ''}"
    print(f"submitted now, to a copy of its state, {shards}: {placed} of {len(pods)} pods placed")
    for line in lines:
        print(line)
    print(f"note: {answer.get('note', '')}")
    return 0


async def run(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.job, None if args.quiet else ProgressLines())
    job = dryrun.job_of(scenario, ", ".join(args.job))
    if args.serve is not None:
        return await _ask(args, job)
    if args.token_file is not None:
        raise InputError(
            "a recorded log needs no token (it is for --serve)", location="--token-file"
        )
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
