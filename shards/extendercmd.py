"""``shoal extender``: the command line of :mod:`shards.extenders.server` (and of its
``--verify``)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from aiohttp import web

from engine.config import SchedulerConfig
from events.errors import InputError
from events.filelog import FileLog
from events.types import (
    Envelope,
    ExtenderAnswered,
    NodeAdded,
    PodGroupSubmitted,
    PodSubmitted,
    QuotaDefined,
)
from shards.bus import open_bus
from shards.commands import EXIT_MISMATCH
from shards.extenders.core import ExtenderCore, verify
from shards.extenders.server import GANG_WAIT, MAX_BODY, Binder, ExtenderServer, record_only
from shards.inputs.scenario import load_config, load_scenario

NAME = "extender"
HELP = "serve shoal's placement to kube-scheduler as an HTTP extender"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="KubeSchedulerConfiguration file (profiles)")
    parser.add_argument(
        "--listen", default="127.0.0.1:8888", help="HOST:PORT to serve (127.0.0.1:8888)"
    )
    parser.add_argument("--log", help="file log of every fact and answer (default: memory)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --log")
    parser.add_argument(
        "--objects",
        action="append",
        default=[],
        metavar="FILE",
        help="YAML with PodGroups and ElasticQuotas (and Nodes) the extender starts with",
    )
    parser.add_argument("--kubeconfig", help="bind through this cluster (default: record only)")
    parser.add_argument("--host", help="API server URL (instead of a kubeconfig)")
    parser.add_argument(
        "--gang-wait",
        type=float,
        default=GANG_WAIT,
        help=f"seconds a gang member's bind waits for the rest of its gang ({GANG_WAIT:g})",
    )
    parser.add_argument("--max-body", type=int, default=MAX_BODY, help="largest request, bytes")
    parser.add_argument(
        "--verify", metavar="LOG", help="derive every answer in LOG again and compare; exit"
    )


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"must be HOST:PORT, got {text!r}", location="--listen")
    return host, int(port)


async def run(args: argparse.Namespace) -> int:
    config: SchedulerConfig | None = load_config(args.config) if args.config else None
    if args.verify:
        source = FileLog(args.verify, readonly=True)
        try:
            records = await source.read(0, 0)
        finally:
            await source.close()
        mismatch = verify(records, config)
        if mismatch is not None:
            print(f"shoal: extender log differs at {mismatch}", file=sys.stderr)
            return EXIT_MISMATCH
        answers = sum(1 for e in records if isinstance(e.event, ExtenderAnswered))
        print(f"verified: {answers} answers match the log")
        return 0
    host, port = _listen(args.listen)
    core = ExtenderCore(config)
    if args.objects:
        scenario = load_scenario(args.objects)
        for warning in scenario.warnings:
            print(f"shoal: warning: {warning}", file=sys.stderr)
        kinds = (NodeAdded, PodGroupSubmitted, QuotaDefined)
        core.learn([t.event for t in scenario.events if isinstance(t.event, kinds)], 0)
        if any(isinstance(t.event, PodSubmitted) for t in scenario.events):
            print(
                "shoal: warning: --objects: pods are not read (kube-scheduler sends them)",
                file=sys.stderr,
            )
    log = await open_bus(f"file:{args.log}" if args.log else "memory", overwrite=args.overwrite)
    api = None
    binder: Binder = record_only
    if args.kubeconfig or args.host:
        from kubernetes_asyncio import client as kube

        from shards.extenders.server import kube_binder
        from shards.kube.client import api_client

        api = await api_client(host=args.host, kubeconfig=args.kubeconfig)
        binder = kube_binder(kube.CoreV1Api(api))
    server = ExtenderServer(core, log, binder=binder, gang_wait=args.gang_wait)
    records = core.take()
    if records:
        await log.append(records)
    runner = web.AppRunner(server.app(args.max_body), access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        print(f"shoal extender listening on {host}:{port}", file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()
        if api is not None:
            await api.close()
        await log.close()
    return 0


__all__ = ["HELP", "NAME", "Envelope", "add_arguments", "run"]
