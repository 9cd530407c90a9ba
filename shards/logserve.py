"""``shoal log-server``: the in-memory log served on its own, for workers on other hosts.

It prints ``serving tcp://HOST:PORT`` once it listens (``--listen HOST:0`` picks a free
port) and runs until SIGTERM or SIGINT; the log is lost when it stops. With a token
(``--token-file PATH``, else the file ``$SHOAL_LOG_TOKEN_FILE`` names) clients must
send the same token; without one it listens only on a loopback address and warns that
it is unauthenticated, and any other address is refused (exit 2 naming
``--token-file``). The memory bound and limits are :class:`~events.limits.ServerLimits`.
"""

from __future__ import annotations

import argparse
import asyncio

from events.errors import InputError
from events.limits import ServerLimits
from events.logserver import LogServer
from events.wire import load_token
from shards.commands import positive

NAME = "log-server"
HELP = "serve an in-memory log to workers (tcp://HOST:PORT buses)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ServerLimits()
    parser.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT")
    parser.add_argument("--partitions", type=positive, required=True, help="shards + 1")
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        help="file holding the shared token (default: the file $SHOAL_LOG_TOKEN_FILE names)",
    )
    parser.add_argument(
        "--max-buffered-mib",
        type=positive,
        default=defaults.max_buffered >> 20,
        help="MiB of frames held across all connections before reading pauses",
    )
    parser.add_argument(
        "--max-frame-mib",
        type=positive,
        default=defaults.max_frame >> 20,
        help="MiB in one request or answer",
    )
    parser.add_argument(
        "--max-connections",
        type=positive,
        default=defaults.max_connections,
        help="authenticated clients served at once",
    )
    parser.add_argument(
        "--max-pending",
        type=positive,
        default=defaults.max_pending,
        help="connections kept while they have not said hello (the longest-waiting makes "
        "room for a new one)",
    )


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InputError(f"expected HOST:PORT, got {text!r}", location="--listen")
    return host.strip("[]"), int(port)


async def run(args: argparse.Namespace) -> int:
    from shards.processes import install_stop_signals

    host, port = _listen(args.listen)
    limits = ServerLimits(
        max_buffered=args.max_buffered_mib << 20,
        max_frame=args.max_frame_mib << 20,
        max_connections=args.max_connections,
        max_pending=args.max_pending,
    )
    server = LogServer(
        args.partitions, host, port, token=load_token(args.token_file), limits=limits
    )
    stop = asyncio.Event()
    try:
        await server.start()
    except OSError as exc:
        raise InputError(
            f"cannot listen on {host}:{port}: {exc.strerror}", location="--listen"
        ) from None
    try:
        install_stop_signals(stop)
        print(f"serving {server.url} ({server.partitions} partitions)", flush=True)
        await stop.wait()
    finally:
        await server.close()
    return 0
