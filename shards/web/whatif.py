"""``POST /api/whatif``: a running ``shoal serve`` dry-runs a job on a copy of its
current state (:mod:`shards.dryrunserve`); ``shoal whatif JOB.yaml --serve URL`` asks.

The body is the job's YAML or JSON documents, as its files hold them (at most
:data:`~shards.dryrunserve.MAX_JOB_BYTES`: 413 past it). The answer is the JSON the
``--log`` form prints (:class:`shards.dryrun.DryRun`), with ``source: "live"`` and a
``note`` on what "when" means against a real cluster. Refusals are one line of text:

- 401: the live view's token (``--ui-token-file``) is missing or wrong;
- 400: the job cannot be read or dry-run as given (names its document and field);
- 409: this process does not hold the whole cluster's view (it says which role does);
- 413: the job is too large; 429: a dry run is already running (one at a time);
- 503: the bus is not open yet, or the log cannot be read; 500: the dry run failed.

The dry run runs in a thread with its own event loop, so the service's roles go on;
only reading the log happens on the service's loop, in chunks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from events.errors import InputError, LogError, ShoalError
from events.log import EventLog
from shards import dryrunserve
from shards.web.app import authorized

PATH = "/api/whatif"


class Holder(Protocol):
    """The running service, as the endpoint sees it."""

    bus: EventLog | None
    clock: Callable[[], int]

    def whatif_refusal(self) -> str | None:
        """Why this process cannot dry-run a job (it does not hold the whole cluster's
        view: which role to ask instead), or None."""
        ...


async def _body(request: web.Request) -> bytes:
    limit = dryrunserve.MAX_JOB_BYTES
    too_large = web.HTTPRequestEntityTooLarge(
        max_size=limit,
        actual_size=request.content_length or limit + 1,
        text=f"the job is larger than {limit // (1024 * 1024)} MiB\n",
    )
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.content.iter_chunked(64 * 1024):
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


def add_whatif(app: web.Application, holder: Holder, token: str | None) -> None:
    """Add ``POST /api/whatif`` to ``app`` (before it starts)."""
    busy = asyncio.Lock()

    async def whatif(request: web.Request) -> web.Response:
        if not authorized(request, token):
            raise web.HTTPUnauthorized(
                text="a token is required (Authorization: Bearer TOKEN, or ?token=TOKEN)\n"
            )
        refusal = holder.whatif_refusal()
        if refusal is not None:
            raise web.HTTPConflict(text=refusal + "\n")
        if busy.locked():
            raise web.HTTPTooManyRequests(text="a dry run is running; ask again when it is done\n")
        async with busy:
            body = await _body(request)
            bus = holder.bus
            if bus is None:
                raise web.HTTPServiceUnavailable(text="the bus is not open yet\n")
            try:
                job = await asyncio.to_thread(dryrunserve.load_job, body)
                now = holder.clock()
                parts = await dryrunserve.read_live(bus)
                answer = await asyncio.to_thread(dryrunserve.answer, parts, job, now)
            except InputError as exc:
                raise web.HTTPBadRequest(text=f"{exc}\n") from None
            except LogError as exc:
                raise web.HTTPServiceUnavailable(text=f"the log cannot be read: {exc}\n") from None
            except ShoalError as exc:  # a dry run that does not settle (StuckError), say
                raise web.HTTPInternalServerError(text=f"the dry run failed: {exc}\n") from None
        return web.json_response(answer)

    app.router.add_post(PATH, whatif)
