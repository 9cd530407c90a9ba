"""A kube-scheduler extender for tests: a real HTTP server on 127.0.0.1 (a free port),
in a thread of its own, speaking ``k8s.io/kube-scheduler/extender/v1`` JSON.

Its behaviour is set per test: which nodes the filter rejects (and whether as
unresolvable), the score each node gets, a delay before answering, an HTTP status to
fail with. Every request body is kept (``calls``) for the test to look at.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Behaviour:
    reject: Callable[[str], str] = lambda node: ""
    """Node → why it fails the filter ("" passes)."""
    unresolvable: bool = False
    score: Callable[[str], int] = lambda node: 0
    delay: float = 0.0
    status: int = 200
    error: str = ""
    """An ``Error`` in every filter answer."""


@dataclass
class ExtenderServer:
    behaviour: Behaviour = field(default_factory=Behaviour)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _stopping: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def verbs(self, verb: str) -> list[dict[str, Any]]:
        return [body for v, body in self.calls if v == verb]

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        verb = request.match_info["verb"]
        body = await request.json()
        self.calls.append((verb, body))
        b = self.behaviour
        if b.delay and self._stopping is not None:
            with contextlib.suppress(TimeoutError):  # (cut short when the server stops)
                await asyncio.wait_for(self._stopping.wait(), b.delay)
        if b.status != 200:
            return web.Response(status=b.status, text="failing on purpose")
        if body.get("NodeNames") is not None:
            names = list(body["NodeNames"])
        else:
            names = [n["metadata"]["name"] for n in body["Nodes"]["items"]]
        if verb == "filter":
            passed = [n for n in names if not b.reject(n)]
            failed = {n: b.reject(n) for n in names if b.reject(n)}
            result: dict[str, Any] = {
                "FailedNodes": {} if b.unresolvable else failed,
                "FailedAndUnresolvableNodes": failed if b.unresolvable else {},
                "Error": b.error,
            }
            if body.get("NodeNames") is not None:
                result["NodeNames"] = passed
                result["Nodes"] = None
            else:
                items = [n for n in body["Nodes"]["items"] if n["metadata"]["name"] in passed]
                result["Nodes"] = {"items": items}
            return web.json_response(result)
        if verb == "prioritize":
            return web.json_response([{"Host": n, "Score": b.score(n)} for n in names])
        return web.Response(status=404)

    def start(self) -> ExtenderServer:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._stopping = asyncio.Event()
            app = web.Application()
            app.router.add_post("/{verb}", self._answer)
            runner = web.AppRunner(app)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
            self._runner = runner
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the test extender did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            if self._stopping is not None:
                self._loop.call_soon_threadsafe(self._stopping.set)
            self._loop.call_soon_threadsafe(self._loop.stop)
            deadline = time.monotonic() + 30
            self._thread.join(max(deadline - time.monotonic(), 0))
