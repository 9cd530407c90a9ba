"""The live view's HTTP routes: a page of static files and two JSON endpoints, added to
an aiohttp application (``shoal serve``'s, beside ``/metrics``; ``shoal replay
--serve``'s own).

- ``GET /ui/`` — the page (``static/``: plain HTML, CSS and JavaScript, no build step);
- ``GET /api/state`` — a snapshot (``shards.web.view``); ``?offset=N``: the state
  after offset N of a replayed one-shard log;
- ``GET /api/timeline`` — the offsets a replayed log can be shown at (none for a live
  service, or a log of several shards: then ``note`` says why);
- ``GET /api/wouldrun?pod=NS/NAME`` — the counterfactual of a pending pod (its gang's,
  for a member): ``{"pod", "unit", "counterfactual": {...} | null}``, computed when
  asked (:mod:`engine.counterfactual`; ``offset`` as for the state).

Read-only: nothing here changes a run. With a token (``--ui-token-file``), the JSON
endpoints ask for it, as ``Authorization: Bearer TOKEN`` or ``?token=TOKEN`` (the page,
opened as ``/ui/?token=TOKEN``, passes it on; its own files hold no data and need
none); without, bind to 127.0.0.1 (the default) or put the port behind the proxy that
guards ``/metrics`` (``deploy/``).
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any, Final, Protocol

from aiohttp import web

STATIC: Final = Path(__file__).parent / "static"
FILES: Final = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}


class ViewError(Exception):
    """A request the source cannot answer as asked (answered 400 with the message)."""


class Source(Protocol):
    """What the page shows: a replayed log or a running service."""

    async def state(self, offset: int | None) -> dict[str, Any]:
        """The snapshot at ``offset`` (None: the latest); raises :class:`ViewError`
        for an offset it cannot show. May be called concurrently and repeatedly."""
        ...

    async def timeline(self) -> dict[str, Any]:
        """``{"offsets": [{"offset", "time_seconds", "kind"}...], "note": ...}``."""
        ...

    async def would_run(self, pod: str, offset: int | None) -> dict[str, Any]:
        """The counterfactual of pending pod ``pod`` at ``offset`` (None: the latest),
        as :func:`shards.wouldrun.unit_json` gives it; raises :class:`ViewError` where
        it cannot be asked."""
        ...


def authorized(request: web.Request, token: str | None) -> bool:
    if token is None:
        return True
    header = request.headers.get("Authorization", "")
    given = header.removeprefix("Bearer ") if header.startswith("Bearer ") else ""
    given = given or request.query.get("token", "")
    return hmac.compare_digest(given.encode(), token.encode())


def add_routes(app: web.Application, source: Source, token: str | None = None) -> None:
    """Add the page and its endpoints to ``app`` (before it starts)."""

    def guard(request: web.Request) -> None:
        if not authorized(request, token):
            raise web.HTTPUnauthorized(
                text="a token is required (Authorization: Bearer TOKEN, or ?token=TOKEN)\n"
            )

    async def page(request: web.Request) -> web.StreamResponse:
        # (the page's files hold no data: the browser fetches them without the token)
        name = request.match_info.get("name") or "index.html"
        if name not in FILES:
            raise web.HTTPNotFound()
        return web.Response(
            body=(STATIC / name).read_bytes(),
            headers={"Content-Type": f"{FILES[name]}; charset=utf-8", "Cache-Control": "no-cache"},
        )

    async def to_page(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/ui/" + (f"?{request.query_string}" if request.query_string else ""))

    async def state(request: web.Request) -> web.Response:
        guard(request)
        raw = request.query.get("offset")
        if raw is not None and not raw.isdigit():
            raise web.HTTPBadRequest(text=f"offset: expected a non-negative integer, got {raw!r}\n")
        try:
            data = await source.state(None if raw is None else int(raw))
        except ViewError as exc:
            raise web.HTTPBadRequest(text=f"{exc}\n") from None
        return web.json_response(data)

    async def timeline(request: web.Request) -> web.Response:
        guard(request)
        return web.json_response(await source.timeline())

    async def would_run(request: web.Request) -> web.Response:
        guard(request)
        pod = request.query.get("pod", "")
        raw = request.query.get("offset")
        if pod.count("/") != 1:
            raise web.HTTPBadRequest(text=f"pod: expected NAMESPACE/NAME, got {pod!r}\n")
        if raw is not None and not raw.isdigit():
            raise web.HTTPBadRequest(text=f"offset: expected a non-negative integer, got {raw!r}\n")
        try:
            data = await source.would_run(pod, None if raw is None else int(raw))
        except ViewError as exc:
            raise web.HTTPBadRequest(text=f"{exc}\n") from None
        return web.json_response(data)

    app.router.add_get("/", to_page)
    app.router.add_get("/ui", to_page)
    app.router.add_get("/ui/", page)
    app.router.add_get("/ui/{name}", page)
    app.router.add_get("/api/state", state)
    app.router.add_get("/api/timeline", timeline)
    app.router.add_get("/api/wouldrun", would_run)
