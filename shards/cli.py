"""The ``shoal`` command line: its own commands (``simulate``, ``replay``, ``serve``,
``worker``, ``kafka init``) and those that other packages add.

Adding a command: a distribution names a :class:`shards.commands.Command` (its name, a
line of help, a function that adds its arguments to the parser ``shoal`` makes for it,
and its async runner) in the entry-point group ``shoal.commands``, as ``pyproject.toml``
does for ``shoal loadtest``::

    [project.entry-points."shoal.commands"]
    loadtest = "loadtest.command:COMMAND"

``shoal`` reads the group when it builds its parser (once per process; an entry point is
registered when its distribution is installed, ``pip install -e .`` here), lists those
commands after ``replay`` and runs them as its own: in its event loop, a ``ShoalError``
becoming one line and exit status 2. Nothing under ``shards/`` imports them.

Exit status: 0 success; 1 ``replay --verify`` found a difference, or a run stopped making
progress (a protocol loop that does not end: a bug, named); 2 bad input (one line
naming file, document and field, or the log offset; never a traceback), a plugin a
configuration names that no installed package publishes, or ``replay --verify`` of a
run whose user plugins are not installed here at the versions it recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import logging
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path
from typing import NoReturn

from engine.config import SchedulerConfig
from engine.framework.sample import per_shard_warnings
from engine.model.pools import Sharding
from events.errors import (
    InputError,
    LogError,
    ShoalError,
    StuckError,
    cause,
)
from shards import dryruncmd, logserve, render, wouldrun
from shards import extendercmd as extender_command
from shards.bus import check_new_log, open_bus
from shards.commands import (
    EXIT_MISMATCH,
    GROUP,
    Command,
    emit_json,
    non_negative,
    positive,
    sharding_for,
    snapshot_option,
    snapshots,
)
from shards.inputs.progress import ProgressLines
from shards.inputs.scenario import check_topology, load_config, load_scenario, load_sharding
from shards.inputs.topology import with_topology
from shards.simulate import simulate

EXIT_INPUT = 2


def _configure_logging(verbose: int) -> None:
    """Quiet by default (errors reach the user as one line); ``-v``/``-vv`` open up."""
    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # third-party clients log connection trouble that shoal reports itself
    for name in ("aiokafka", "kafka"):
        logging.getLogger(name).setLevel(logging.DEBUG if verbose > 1 else logging.CRITICAL)


def _version() -> str:
    """The installed distribution's version (``pip install -e .`` counts)."""
    try:
        return version("shoal")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _fail(message: str) -> NoReturn:
    print(f"shoal: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_INPUT)


def _config(path: str | None) -> SchedulerConfig | None:
    if path is None:
        return None
    return load_config(path)


# --------------------------------------------------------------------------- simulate


async def _simulate(args: argparse.Namespace) -> int:
    config = _config(args.config)
    scenario = load_scenario(args.scenario, None if args.quiet else ProgressLines())
    if config is not None:
        scenario.warnings[:0] = [f"{args.config}: {w}" for w in config.warnings]
        config = with_topology(config, scenario.topology)
    check_topology(config or scenario.config, scenario)
    scenario.warnings += per_shard_warnings(config or scenario.config, args.shards)
    for warning in scenario.warnings:
        print(f"shoal: warning: {warning}", file=sys.stderr)
    sharding = sharding_for(args.shards, scenario.sharding)
    partitions = args.shards + 1 if sharding is not None else 1
    bus = args.bus
    copy_to: str | None = None
    if args.log is not None:
        if bus == "memory":
            bus = f"file:{args.log}"
        elif bus != f"file:{args.log}":
            copy_to = args.log
            check_new_log(Path(copy_to), overwrite=args.overwrite)  # fail before running
    log = await open_bus(bus, partitions=partitions, overwrite=args.overwrite)
    try:
        progress = render.progress_printer(args.quiet)
        result = await simulate(
            scenario,
            log,
            config,
            progress=progress,
            sharding=sharding,
            snapshot_every=args.snapshot_every,
        )
        if copy_to is not None:
            target = await open_bus(f"file:{copy_to}", partitions=log.partitions, overwrite=True)
            for partition in range(log.partitions):
                await target.append(await log.read(partition, 0), partition)
            await target.close()
    finally:
        await log.close()
    summary = {"wall_seconds": round(result.wall_seconds, 6), "attempts": result.stats["attempts"]}
    for key in ("extender_calls", "extender_failures", "extender_timeouts"):
        if key in result.stats:
            summary[key] = result.stats[key]
    engine = wouldrun.whole_engine(
        result.engines, result.control.engine if result.control is not None else None
    )
    found = wouldrun.find(engine, wouldrun.pending(result.report))
    if args.json:
        data = {**result.report.to_json(**summary), "warnings": scenario.warnings}
        wouldrun.add_to_json(data, found)
        emit_json(data)
    else:
        render.report_table(result.report, summary)
        for line in wouldrun.lines(found):
            print(line)
    return 0


# --------------------------------------------------------------------------- replay


async def _replay(args: argparse.Namespace) -> int:
    from shards.replaycmd import run_replay

    return await run_replay(args, _config(args.config))


# --------------------------------------------------------------------------- main


def ui_token_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ui-token-file",
        metavar="FILE",
        help="the live view (/ui/, /api/) asks for the token in FILE (default: no token; "
        "keep --listen on 127.0.0.1 or behind a proxy)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shoal", description="Event-sourced batch scheduler for Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"shoal {_version()}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log to stderr (-v: info, -vv: debug, including the Kafka client's)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim = sub.add_parser("simulate", help="run scenarios on a simulated cluster and clock")
    sim.add_argument("scenario", nargs="+", metavar="SCENARIO.yaml")
    sim.add_argument("--config", help="KubeSchedulerConfiguration file")
    sim.add_argument("--shards", type=positive, default=1)
    sim.add_argument("--bus", default="memory", help="memory (default) or file:PATH")
    sim.add_argument("--log", help="record the run in this file (for shoal replay)")
    sim.add_argument("--overwrite", action="store_true", help="replace an existing log file")
    sim.add_argument("--json", action="store_true", help="print one JSON object")
    sim.add_argument("--quiet", action="store_true", help="no progress on stderr")
    sim.add_argument(
        "--snapshot-every",
        type=non_negative,
        default=0,
        metavar="RECORDS",
        help="write each shard's state into the log every RECORDS records (0: never); "
        "replay --verify checks them",
    )

    rep = sub.add_parser("replay", help="replay, verify or explain a recorded run")
    rep.add_argument("log", metavar="LOG", help="a log file, or kafka://HOST:PORT?topic=...")
    rep.add_argument("--verify", action="store_true", help="re-derive every decision and compare")
    rep.add_argument("--explain", metavar="NAMESPACE/NAME", help="why a pod went where it went")
    rep.add_argument("--until", type=non_negative, metavar="OFFSET", help="stop after this offset")
    rep.add_argument(
        "--config",
        help="what-if: run the recorded inputs again under this configuration and print "
        "how the decisions differ (--explain: explain under it)",
    )
    rep.add_argument("--json", action="store_true", help="print one JSON object")
    rep.add_argument(
        "--serve",
        action="store_true",
        help="serve the live view of the log (a web page, /ui/) until Ctrl-C",
    )
    rep.add_argument(
        "--listen", help="the live view's address (with --serve; default 127.0.0.1:8090)"
    )
    ui_token_option(rep)

    for command in added_commands().values():  # after replay, where loadtest always was
        command.add_arguments(sub.add_parser(command.name, help=command.help))

    srv = sub.add_parser("serve", help="run shoal against a Kubernetes cluster")
    srv.add_argument(
        "--role", default="all", choices=("ingest", "shard", "coordinator", "binder", "all")
    )
    srv.add_argument(
        "--bus", default="memory", help="memory (--role all only), file:PATH, kafka://..."
    )
    srv.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: $KUBECONFIG, else the in-cluster service account, "
        "else ~/.kube/config)",
    )
    srv.add_argument("--host", help="API server URL (instead of a kubeconfig)")
    srv.add_argument("--token", help="bearer token for --host (or $SHOAL_KUBE_TOKEN)")
    srv.add_argument("--shard-id", type=non_negative, help="default: the StatefulSet ordinal")
    srv.add_argument(
        "--shards",
        type=positive,
        help="shards in the deployment (default: $SHOAL_SHARDS, else 1); with N > 1 the "
        "log has N + 1 partitions and a coordinator routes between the shards",
    )
    srv.add_argument(
        "--sharding", help="ShardingConfiguration file: pools, their shards, tenants' pools"
    )
    srv.add_argument("--config", help="KubeSchedulerConfiguration file (profiles)")
    srv.add_argument(
        "--listen", default="127.0.0.1:9090", help="health, metrics and live view address"
    )
    ui_token_option(srv)
    srv.add_argument("--namespace", default="shoal", help="namespace of the leader-election Leases")
    srv.add_argument("--identity", help="leader-election identity (default: the host name)")
    snapshot_option(srv)
    srv.add_argument("--watch-seconds", type=positive, default=30)
    srv.add_argument("--lease-seconds", type=positive, default=15)
    srv.add_argument(
        "--renew-deadline",
        type=float,
        metavar="SECONDS",
        help="a leader that has not renewed its Lease within this steps down (2/3 of the lease)",
    )
    srv.add_argument(
        "--retry-period",
        type=float,
        metavar="SECONDS",
        help="seconds between leader-election rounds (2/15 of the lease)",
    )
    srv.add_argument(
        "--bind-in-flight",
        type=positive,
        default=16,
        metavar="N",
        help="bindings the binder sends at once, at most (16)",
    )
    srv.add_argument(
        "--kube-qps",
        type=non_negative,
        default=0,
        metavar="N",
        help="the binder's API requests a second, on average (0, the default: no limit)",
    )
    srv.add_argument(
        "--kube-burst",
        type=positive,
        default=100,
        metavar="N",
        help="and at once, past that average (100)",
    )
    srv.add_argument(
        "--stuck-after",
        type=positive,
        default=120,
        metavar="SECONDS",
        help="/healthz fails once a running role has made no progress this long (120)",
    )

    work = sub.add_parser(
        "worker",
        help="run one shard, the coordinator, or the simulated binder as a process",
        description="One component of a run with several shards, over a shared bus "
        "(tcp://HOST:PORT of a log server, or kafka://). It rebuilds its state from the "
        "log when it starts, so it can be killed and started again at any time.",
    )
    work.add_argument(
        "role",
        choices=["shard", "coordinator", "binder"],
        help="binder: applies decisions to the simulated cluster, in wall time",
    )
    work.add_argument("--bus", required=True, help="tcp://HOST:PORT or kafka://HOST:PORT")
    work.add_argument(
        "--token-file",
        metavar="PATH",
        help="the log server's token (default: the file $SHOAL_LOG_TOKEN_FILE names)",
    )
    work.add_argument("--shard-id", type=non_negative)
    work.add_argument("--config", help="KubeSchedulerConfiguration YAML (shards)")
    snapshot_option(work)
    logserve.add_arguments(sub.add_parser(logserve.NAME, help=logserve.HELP))
    dryruncmd.add_arguments(sub.add_parser(dryruncmd.NAME, help=dryruncmd.HELP))
    extender_command.add_arguments(
        sub.add_parser(extender_command.NAME, help=extender_command.HELP)
    )

    kafka = sub.add_parser("kafka", help="manage the Kafka topics shoal uses")
    kafka_sub = kafka.add_subparsers(dest="kafka_command", required=True, metavar="ACTION")
    init = kafka_sub.add_parser("init", help="create the event topic")
    init.add_argument("--bus", required=True, metavar="kafka://HOST:PORT[?topic=...]")
    init.add_argument(
        "--partitions", type=positive, help="partitions (default: from the URL, or 1)"
    )
    init.add_argument(
        "--retention-ms", type=positive, help="topic retention (default: the broker's)"
    )
    return parser


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise InputError(f"expected a positive whole number, got {raw!r}", location=f"${name}")
    return int(raw)


def _serve_sharding(shards: int, path: str | None) -> Sharding | None:
    if path is None:
        return None
    if shards == 1:
        raise InputError("a sharding configuration needs --shards N (N > 1)", location="--sharding")
    return sharding_for(shards, load_sharding(path))


async def _serve(args: argparse.Namespace) -> int:
    from shards.serve import ServeOptions, serve
    from shards.web.standalone import read_token

    shards = args.shards if args.shards is not None else _env_int("SHOAL_SHARDS", 1)
    every, per_pod = snapshots(args)
    config = _config(args.config)
    for warning in per_shard_warnings(config, shards):
        logging.getLogger("shoal.serve").warning("%s", warning)
    options = ServeOptions(
        role=args.role,
        bus=args.bus,
        kubeconfig=args.kubeconfig,
        host=args.host,
        token=args.token or os.environ.get("SHOAL_KUBE_TOKEN"),
        shard_id=args.shard_id,
        shards=shards,
        sharding=_serve_sharding(shards, args.sharding),
        snapshot_every=every,
        snapshot_per_pod=per_pod,
        config=config,
        listen=args.listen,
        ui_token=read_token(args.ui_token_file, "--ui-token-file"),
        namespace=args.namespace,
        watch_seconds=args.watch_seconds,
        lease_seconds=args.lease_seconds,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        stuck_after=args.stuck_after,
        bind_in_flight=args.bind_in_flight,
        kube_qps=args.kube_qps,
        kube_burst=args.kube_burst,
        **({"identity": args.identity} if args.identity else {}),
    )
    return await serve(options)


async def _worker(args: argparse.Namespace) -> int:
    from shards.processes import run_worker

    _tune_gc(args.role)
    every, per_pod = snapshots(args)
    await run_worker(
        args.role,
        lambda: open_bus(args.bus, partitions=2, token_file=args.token_file),
        shard_id=args.shard_id,
        config=_config(args.config) if args.role == "shard" else None,
        snapshot_every=every,
        snapshot_per_pod=per_pod,
    )
    return 0


async def _kafka_init(args: argparse.Namespace) -> int:
    from events.kafka import KafkaSettings, create_topic

    settings = KafkaSettings.from_url(args.bus)
    if args.partitions is not None:
        settings = KafkaSettings(**{**settings.__dict__, "partitions": args.partitions})
    created = await create_topic(settings, retention_ms=args.retention_ms)
    verb = "created" if created else "already exists:"
    print(
        f"{verb} topic {settings.topic} ({settings.partitions} partitions) on {settings.bootstrap}"
    )
    return 0


_COMMANDS = {
    "simulate": _simulate,
    "replay": _replay,
    "kafka-init": _kafka_init,
    "serve": _serve,
    "worker": _worker,
    logserve.NAME: logserve.run,
    dryruncmd.NAME: dryruncmd.run,
    extender_command.NAME: extender_command.run,
}
BUILT_IN = (
    "simulate",
    "replay",
    "serve",
    "worker",
    logserve.NAME,
    dryruncmd.NAME,
    "kafka",
    extender_command.NAME,
)


@functools.cache
def added_commands() -> dict[str, Command]:
    """The commands that installed distributions add (entry-point group
    ``shoal.commands``), by name in order; an entry point that is not a ``Command`` of
    its own name, or that takes a name already taken, is an error."""
    found: dict[str, Command] = {}
    for entry in entry_points(group=GROUP):
        command = entry.load()
        if not isinstance(command, Command) or command.name != entry.name:
            raise TypeError(
                f"entry point {entry.name} = {entry.value} in {GROUP}: expected a "
                f"shards.commands.Command named {entry.name!r}, got {command!r}"
            )
        if entry.name in BUILT_IN or found.get(entry.name, command) is not command:
            raise ValueError(f"entry point {entry.name} = {entry.value} in {GROUP}: name taken")
        found[entry.name] = command
    return dict(sorted(found.items()))


GC_THRESHOLDS = (50_000, 10, 10)
"""The cyclic collector's thresholds in ``shoal`` processes. The engine allocates and
frees a few objects per pod, almost none in cycles (reference counting frees them);
with the default first threshold (700) the collector runs every few dozen pods and
rescans the survivors, about a tenth of a shard's time under load. The older
generations keep their default ratios, so a long-running service still collects them
(after some five million objects more allocated than freed)."""

COORDINATOR_GC_THRESHOLDS = (500_000, 10, 10)
"""The coordinator's: it keeps more of what it allocates (its view of every shard's
nodes and pods, what it asked of them), and a young collection costs the objects still
alive, not those freed meanwhile. The coordinator of ``shoal loadtest scale --nodes
130000 --shards 8 --preemption-wave 39000`` spent 0.9 s of its 16 s of CPU collecting
at 50,000, 0.3 s at 500,000. A shard or one process at 500,000 was slower (5,000
nodes, one template: 44 to 45 µs per pod against 42 to 43), its p99 latency doubled and its
peak memory grew by a fifth, so they keep :data:`GC_THRESHOLDS`."""


def _tune_gc(role: str = "") -> None:
    """Leave what was built at start-up (modules, the parser) out of every collection
    and collect less often (:data:`GC_THRESHOLDS`; ``role`` ``coordinator``: a
    coordinator worker's, :data:`COORDINATOR_GC_THRESHOLDS`)."""
    gc.freeze()
    gc.set_threshold(*(COORDINATOR_GC_THRESHOLDS if role == "coordinator" else GC_THRESHOLDS))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    command = args.command + ("-" + args.kafka_command if args.command == "kafka" else "")
    added = added_commands()
    runner = added[command].run if command in added else _COMMANDS[command]
    try:
        try:
            import uvloop

            return uvloop.run(runner(args))
        except ImportError:  # pragma: no cover - uvloop is a dependency
            return asyncio.run(runner(args))
    except InputError as exc:
        _fail(str(exc))
    except LogError as exc:
        _fail(str(exc))
    except StuckError as exc:
        print(f"shoal: error: {exc}", file=sys.stderr)
        return EXIT_MISMATCH
    except ShoalError as exc:
        _fail(str(exc))
    except BaseExceptionGroup as group:
        # a task group of a service (serve's roles) failed: say what failed in it
        _, rest = group.split(ShoalError)
        if rest is not None:
            raise
        _fail(cause(group))
    except KeyboardInterrupt:
        print("shoal: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def entry() -> int:
    """The ``shoal`` program (console script and ``python -m shards.cli``): :func:`main`
    in a process of its own, with the collector tuned for it."""
    _tune_gc()
    return main()


if __name__ == "__main__":
    sys.exit(entry())
