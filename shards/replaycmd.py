"""``shoal replay``: read a recorded log (a file, or a Kafka topic), fold it again, and
print its report, a pod's explanation, or the result of ``--verify``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from engine.config import SchedulerConfig
from engine.counterfactual import Counterfactual
from events.errors import InputError, UnverifiableLogError
from events.filelog import FileLog
from events.log import EventLog, quarantined_in, read_quarantined
from events.types import Envelope, RecordQuarantined
from shards import plugins, render, whatif, wouldrun
from shards.bus import open_bus
from shards.commands import EXIT_MISMATCH, emit_json
from shards.replay import recorded_config, replay, replay_routed
from shards.report import merge
from shards.web.sources import ReplaySource
from shards.web.standalone import read_token, serve_view

LISTEN = "127.0.0.1:8090"
"""Where ``replay --serve`` serves the live view unless ``--listen`` says."""


async def _read(log: EventLog, partition: int) -> list[Envelope]:
    """A partition to replay, past the records the run quarantined (said on stderr):
    those that cannot be read are left out, the others the fold refuses again."""
    records, _ = await read_quarantined(log, partition)
    skipped = sorted(quarantined_in(records))
    if skipped:
        print(
            f"shoal: note: partition {partition}: {len(skipped)} record(s) the run "
            f"quarantined are skipped (offsets {', '.join(map(str, skipped[:10]))})",
            file=sys.stderr,
        )
    return records


def _what_if(args: argparse.Namespace, diff: whatif.WhatIf) -> int:
    if args.json:
        emit_json({"log": args.log, "config": args.config, **diff.to_json()})
    else:
        print(f"replayed the inputs of {args.log} under {args.config}")
        for line in diff.table():
            print(line)
    return 0


def _check_serve(args: argparse.Namespace) -> None:
    """--serve shows the log (its timeline moves through it): refuse what it would
    ignore, and the serving options without it."""
    if not args.serve:
        for given, flag in ((args.listen, "--listen"), (args.ui_token_file, "--ui-token-file")):
            if given is not None:
                raise InputError("serves the live view: give --serve too", location=flag)
        return
    for given, flag in (
        (args.verify, "--verify"),
        (args.explain, "--explain"),
        (args.until, "--until"),
        (args.config, "--config"),
        (args.json, "--json"),
    ):
        if given not in (None, False):
            raise InputError(
                "--serve shows the recorded log (its timeline moves through the offsets); "
                f"leave {flag} out",
                location=flag,
            )


async def run_replay(args: argparse.Namespace, config: SchedulerConfig | None) -> int:
    """``shoal replay LOG``: fold a recorded log again and report, explain or verify it
    (``args`` as the command line parsed them, ``config`` the one given instead of the
    recorded one)."""
    _check_serve(args)
    if args.log.startswith("kafka://"):
        source = await open_bus(args.log)
        try:
            parts = [await _read(source, p) for p in range(source.partitions)]
        finally:
            await source.close()
    else:
        log = FileLog(args.log, readonly=True)
        try:
            parts = [await _read(log, p) for p in range(log.partitions)]
        finally:
            await log.close()
        if log.torn_bytes:
            print(
                f"shoal: note: {args.log}: ignoring a torn last append ({log.torn_bytes} bytes)",
                file=sys.stderr,
            )
    if args.explain is not None and "/" not in args.explain:
        raise InputError(f"expected NAMESPACE/NAME, got {args.explain!r}", location="--explain")
    under: str | None = None  # the configuration a what-if explanation is made under
    if config is not None:
        recorded = recorded_config(parts[-1])
        config = whatif.other_config(recorded, config)
        same = whatif.same_config(recorded, config)
        if args.verify and not same:
            raise InputError(
                "differs from the configuration the log recorded; --verify checks the "
                "recorded decisions under it (leave --config out to verify, or --verify "
                "out for a what-if replay)",
                location=f"--config {args.config}",
            )
        if not args.verify and not (same and args.explain is not None):
            if args.until is not None:
                raise InputError(
                    "a what-if replay (--config) runs the whole log again; the offsets "
                    "of the re-run are not the recorded ones",
                    location="--until",
                )
            other = await whatif.rerun(parts, config, args.log)
            if args.explain is None:
                return _what_if(args, whatif.what_if(parts, other))
            print(
                f"shoal: note: explaining under {args.config}: the attempts of the "
                "log's inputs run again under it, not the recorded ones",
                file=sys.stderr,
            )
            parts, under = other, args.config
    loaded, differ = plugins.for_replay(
        parts[-1], config or recorded_config(parts[-1]), verify=args.verify
    )
    for line in differ:
        print(f"shoal: note: {line}", file=sys.stderr)
    registry = loaded.registry
    if args.serve:
        view = ReplaySource(args.log, parts, config or recorded_config(parts[-1]), registry)
        token = read_token(args.ui_token_file, "--ui-token-file")
        return await serve_view(view, args.listen or LISTEN, token, args.log)
    if len(parts) > 1:
        if args.until is not None:
            raise InputError(
                "--until names an offset of a one-shard log; this log has "
                f"{len(parts) - 1} shards (replay it whole)",
                location="--until",
            )
        result = replay_routed(
            parts, config, verify=args.verify, explain=args.explain, registry=registry
        )
        records = merge(parts)
    else:
        records = parts[0]
        result = replay(
            records,
            config,
            verify=args.verify,
            explain=args.explain,
            until=args.until,
            registry=registry,
        )
    if args.explain is not None and args.explain not in result.report.pods:
        raise InputError(f"no pod {args.explain} in {args.log}", location="--explain")
    would_run = None
    found: dict[str, Counterfactual] = {}
    if args.explain is not None and result.report.pods[args.explain].phase == "Pending":
        would_run = wouldrun.explained(parts, result, config, registry, args.explain)
    elif args.explain is None and wouldrun.pending(result.report):
        engine = wouldrun.replayed(parts, result, config, registry)
        if engine is not None:
            found = wouldrun.find(engine, wouldrun.pending(result.report))
    if args.json:
        if args.explain is not None:
            data: dict[str, Any] = render.explanation_json(args.explain, result, would_run)
            if under is not None:
                data["what_if_config"] = under
        else:
            data = result.report.to_json()
            wouldrun.add_to_json(data, found)
            data["quarantined"] = [
                {"partition": env.partition, "offset": env.event.offset, "reason": env.event.reason}
                for part in parts
                for env in part
                if isinstance(env.event, RecordQuarantined)
            ]
            data["events"] = [
                render.envelope_json(env)
                for env in records
                if args.until is None or env.offset <= args.until
            ]
        if args.verify:
            data["verify"] = {
                "ok": result.mismatch is None,
                "decisions": result.verified,
                "passes": result.passes,
                "snapshots": result.snapshots,
                "older_snapshots": result.older_snapshots,
                "mismatch": str(result.mismatch) if result.mismatch else None,
                "unforwarded": result.unforwarded,
            }
        emit_json(data)
    elif args.explain is not None:
        render.explanation_text(args.explain, result, would_run)
    else:
        render.report_table(result.report, {})
        for line in wouldrun.lines(found):
            print(line)
    if isinstance(result.mismatch, UnverifiableLogError):
        print(f"shoal: cannot verify: {result.mismatch}", file=sys.stderr)
        return EXIT_MISMATCH
    if result.mismatch is not None:
        print(f"shoal: replay differs at {result.mismatch}", file=sys.stderr)
        return EXIT_MISMATCH
    if args.verify and not args.json:
        snapshots = f" and {result.snapshots} snapshots" if result.snapshots else ""
        print(
            f"verified: {result.verified} decisions in {result.passes} passes{snapshots} "
            "match the log"
        )
        if result.older_snapshots:
            print(
                f"note: {result.older_snapshots} snapshots written by an earlier version "
                "(another snapshot format) were not compared"
            )
        if result.unforwarded:
            print(
                f"note: {result.unforwarded} coordinator outputs at the end of the control "
                "partition were not forwarded yet (the coordinator stopped before; a "
                "restarted one appends them)"
            )
    return 0
