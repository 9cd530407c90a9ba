"""``shoal extender``: the command line of :mod:`shards.extenders.server` (and of its
``--verify``)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
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
from shards.extenders.access import Access, check_exposure, read_token, server_context
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
    parser.add_argument(
        "--max-body", type=int, default=MAX_BODY, help=f"largest request, bytes ({MAX_BODY})"
    )
    parser.add_argument(
        "--tls-cert", help="serve HTTPS with this certificate (PEM; with --tls-key)"
    )
    parser.add_argument("--tls-key", help="the private key of --tls-cert (PEM)")
    parser.add_argument(
        "--client-ca",
        help="CA bundle (PEM): callers must present a client certificate it signed (mTLS)",
    )
    parser.add_argument(
        "--token-file", help="callers must send 'Authorization: Bearer <the file's token>'"
    )
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve a non-loopback --listen address without --client-ca or --token-file",
    )
    parser.add_argument(
        "--verify", metavar="LOG", help="derive every answer in LOG again and compare; exit"
    )


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"must be HOST:PORT, got {text!r}", location="--listen")
    return host, int(port)


def _access(args: argparse.Namespace, host: str) -> tuple[Access, ssl.SSLContext | None]:
    """Who may call the verbs, and the TLS of the socket (:mod:`shards.extenders.access`)."""
    if args.max_body < 1:
        raise InputError(
            f"must be a positive number of bytes, got {args.max_body}", location="--max-body"
        )
    if bool(args.tls_cert) != bool(args.tls_key):
        raise InputError("--tls-cert and --tls-key go together", location="--tls-cert")
    if args.client_ca and not args.tls_cert:
        raise InputError(
            "client certificates need TLS: give --tls-cert and --tls-key", location="--client-ca"
        )
    tls = server_context(args.tls_cert, args.tls_key, args.client_ca) if args.tls_cert else None
    token = read_token(args.token_file) if args.token_file else b""
    access = Access(token=token, client_certs=bool(args.client_ca))
    warning = check_exposure(host, access, tls is not None, args.allow_unauthenticated)
    if warning:
        print(f"shoal: warning: {warning}", file=sys.stderr)
    return access, tls


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
    access, tls = _access(args, host)
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
    server = ExtenderServer(
        core, log, binder=binder, gang_wait=args.gang_wait, access=access, max_body=args.max_body
    )
    records = core.take()
    if records:
        await log.append(records)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, host, port, ssl_context=tls)
        await site.start()
        scheme = "https" if tls is not None else "http"
        print(f"shoal extender listening on {scheme}://{host}:{port}", file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()
        await server.close()
        if api is not None:
            await api.close()
        await log.close()
    return 0


__all__ = ["HELP", "NAME", "Envelope", "add_arguments", "run"]
