"""``shoal replay LOG --serve``: the live view of a recorded log on its own HTTP server,
until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import signal
import sys
from pathlib import Path

from aiohttp import web

from events.errors import InputError
from shards.web.app import Source, add_routes


def read_token(path: str | None, location: str) -> str | None:
    """The token in file ``path`` (stripped; None without a path). Exit 2 for a file
    that cannot be read or is empty."""
    if path is None:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}", location=location) from None
    if not token:
        raise InputError(f"{path} is empty", location=location)
    return token


def check_listen(listen: str, token: str | None) -> tuple[str, int]:
    """HOST and PORT of ``listen``; warns (stderr) when it is reachable from other
    machines with no token."""
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InputError(f"expected HOST:PORT, got {listen!r}", location="--listen")
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and token is None:
        print(
            f"shoal: warning: --listen {listen} serves the view to other machines with no "
            "token (give --ui-token-file, or keep 127.0.0.1)",
            file=sys.stderr,
        )
    return host.strip("[]"), int(port)


async def serve_view(source: Source, listen: str, token: str | None, what: str) -> int:
    """Serve ``source`` on ``listen`` until SIGINT or SIGTERM; the address it bound
    (a port 0 picks a free one) is printed on stderr as ``serving ... at URL``."""
    host, port = check_listen(listen, token)
    app = web.Application()
    add_routes(app, source, token)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise InputError(
            f"cannot listen on {listen}: {exc.strerror or exc}", location="--listen"
        ) from None
    bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
    url = f"http://{bound[0]}:{bound[1]}/ui/"
    print(f"shoal: serving the live view of {what} at {url} (Ctrl-C stops)", file=sys.stderr)
    sys.stderr.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        await runner.cleanup()
    return 0
