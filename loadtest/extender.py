"""A trivial kube-scheduler extender for the load test: the cost of asking one.

Run as its own process (``python -m loadtest.extender PORT``, or started by ``shoal
loadtest --extender builtin``), it answers ``filter`` by letting every node through
and ``prioritize`` with a score per node (0..10, from a hash of its name), so what a run
with it measures is the protocol: the request documents (the pod and up to every node),
the round trip, and the answers recorded in the log and read back.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import zlib
from typing import Any

import orjson
from aiohttp import web

from shards.extenders.wire import get, node_names


def _names(body: Any) -> list[str]:
    names = node_names(body) if isinstance(body, dict) else None
    return names or []


async def _filter(request: web.Request) -> web.Response:
    body = orjson.loads(await request.read())
    names = _names(body)
    result: dict[str, Any] = {"FailedNodes": {}, "Error": ""}
    if get(body, "NodeNames") is not None:
        result["NodeNames"] = names
    else:
        result["Nodes"] = get(body, "Nodes")
    return web.Response(body=orjson.dumps(result), content_type="application/json")


async def _prioritize(request: web.Request) -> web.Response:
    body = orjson.loads(await request.read())
    scores = [{"Host": n, "Score": zlib.crc32(n.encode()) % 11} for n in _names(body)]
    return web.Response(body=orjson.dumps(scores), content_type="application/json")


def app() -> web.Application:
    application = web.Application(client_max_size=256 << 20)
    application.router.add_post("/filter", _filter)
    application.router.add_post("/prioritize", _prioritize)
    return application


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start(port: int) -> subprocess.Popen[bytes]:
    """The extender in a process of its own, once it accepts connections."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadtest.extender", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the load test's extender did not start")


def main() -> None:
    port = int(sys.argv[1])
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    asyncio.run(_serve(port))


async def _serve(port: int) -> None:
    runner = web.AppRunner(app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    main()
