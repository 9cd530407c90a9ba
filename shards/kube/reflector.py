"""A *reflector*: list one kind, then watch it from the list's ``resourceVersion``,
forever (``shards.kube.ingest`` runs one per kind):

- a watch that ends (its ``timeoutSeconds``, a dropped connection) resumes from the
  last version seen, bookmarks included;
- ``410 Gone`` (the version was compacted away) relists, and the relist is handed to
  ``on_relist`` to be reconciled with what was already known;
- anything else (the API unreachable, an answer that is not JSON) backs off
  exponentially (capped) and resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import orjson
from kubernetes_asyncio.client.exceptions import ApiException

from shards.kube.client import KubeError, checked

log = logging.getLogger("shards.kube.ingest")

JSON = dict[str, Any]
Handler = Callable[[str, JSON], Awaitable[None]]
MAX_EVENT_BYTES: Final = 16 << 20
"""The longest watch event read (an object is at most about 1.5 MB in etcd)."""
WATCH_BATCH: Final = 128
"""Watch events handled together (and appended as one batch) at most."""


class _Lines:
    """The lines of a watch stream, from chunks as they arrive."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.buffer = b""
        self.ended = False

    def feed(self, chunk: bytes) -> None:
        """Add what arrived (``b""``: the stream ended; an unfinished last line is then
        a line of its own, as ``readline`` gives it)."""
        if not chunk:
            self.ended = True
            if self.buffer.strip():
                self.buffer += b"\n"
            return
        self.buffer += chunk
        if len(self.buffer) > MAX_EVENT_BYTES and b"\n" not in self.buffer:
            raise KubeError(f"{self.name}: a watch event over {MAX_EVENT_BYTES} bytes")

    def take(self, most: int) -> list[bytes]:
        """Up to ``most`` complete, non-blank lines received so far."""
        out: list[bytes] = []
        start, buffer = 0, self.buffer
        while len(out) < most:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            if end - start > MAX_EVENT_BYTES:
                raise KubeError(f"{self.name}: a watch event over {MAX_EVENT_BYTES} bytes")
            line = buffer[start:end]
            start = end + 1
            if line.strip():
                out.append(line)
        self.buffer = buffer[start:]
        return out


@dataclass
class Reflector:
    """List-then-watch one kind, forever, resilient to the failures above."""

    name: str
    call: Callable[..., Awaitable[Any]]
    on_event: Handler
    on_relist: Callable[[list[JSON]], Awaitable[None]]
    watch_seconds: int = 30
    batch: Callable[[], contextlib.AbstractAsyncContextManager[None]] = contextlib.nullcontext
    """Entered around each batch of watch events handled together."""
    initial_backoff: float = 0.05
    max_backoff: float = 5.0
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    counters: dict[str, int] = field(
        default_factory=lambda: {
            "lists": 0,
            "relists_410": 0,
            "watches": 0,
            "errors": 0,
            "events": 0,
        }
    )

    def __repr__(self) -> str:
        return f"Reflector({self.name}, {self.counters})"

    async def _list(self) -> tuple[list[JSON], str]:
        response = await checked(await self.call(_preload_content=False))
        body = await response.read()
        try:
            data = orjson.loads(body)
            items, version = data["items"], data["metadata"]["resourceVersion"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise KubeError(f"{self.name}: list answered something that is not a list") from None
        self.counters["lists"] += 1
        return list(items or []), str(version)

    async def run(self, stop: asyncio.Event) -> None:
        version: str | None = None
        backoff = self.initial_backoff
        while not stop.is_set():
            try:
                if version is None:
                    items, version = await self._list()
                    await self.on_relist(items)
                    self.synced.set()
                self.counters["watches"] += 1
                version = await self._watch(version, stop)
                backoff = self.initial_backoff
            except ApiException as exc:
                if exc.status == 410:
                    self.counters["relists_410"] += 1
                    log.info("watch expired; relisting kind=%s", self.name)
                    version = None
                    continue
                backoff = await self._back_off(
                    f"API error {exc.status} {exc.reason}", backoff, stop
                )
            except (aiohttp.ClientError, TimeoutError, KubeError, ValueError, OSError) as exc:
                backoff = await self._back_off(f"{type(exc).__name__}: {exc}", backoff, stop)

    async def _watch(self, version: str, stop: asyncio.Event) -> str:
        """One watch from ``version`` until the server ends it; the version reached.

        The stream is read raw: each line is one JSON event decoded straight into plain
        dicts (orjson), the only form ingest reads. (kubernetes-asyncio's ``Watch``
        builds typed models of every object first: half the CPU of a busy ingest, and
        its date parsing a fifth.) The events already received are handled together,
        up to ``WATCH_BATCH`` at a time inside ``batch`` (ingest appends them as one
        record batch: on a busy stream, far fewer appends and fewer batches in the log
        for every reader to go through), and the loop yields to the event loop between
        batches, so a stream that always has data buffered never starves the other
        tasks of the process (the binder, the shards)."""
        response = await checked(
            await self.call(
                watch=True,
                resource_version=version,
                timeout_seconds=self.watch_seconds,
                allow_watch_bookmarks=True,
                _preload_content=False,
                # the server ends the watch after timeout_seconds; a connection that
                # goes silent for much longer than that is dead
                _request_timeout=aiohttp.ClientTimeout(
                    total=None, sock_read=self.watch_seconds * 2 + 10
                ),
            )
        )
        try:
            lines = _Lines(self.name)
            while not stop.is_set():
                batch = lines.take(WATCH_BATCH)
                if not batch:
                    if lines.ended:
                        return version  # the server ended the watch
                    lines.feed(await response.content.readany())
                    continue
                async with self.batch():
                    for line in batch:
                        version = await self._event(line, version)
                await asyncio.sleep(0)
            return version
        finally:
            response.release()

    async def _event(self, line: bytes, version: str) -> str:
        try:
            event = orjson.loads(line)
            kind, raw = event["type"], event["object"]
            if not isinstance(kind, str) or not isinstance(raw, dict):
                raise TypeError
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise KubeError(f"{self.name}: watch sent something that is not an event") from None
        if kind == "ERROR":
            status = raw.get("code")
            if status == 410:
                raise ApiException(status=410, reason=str(raw.get("reason") or "Gone"))
            raise KubeError(f"{self.name}: the watch failed: {str(raw.get('message'))[:300]}")
        new_version = str((raw.get("metadata") or {}).get("resourceVersion") or version)
        if kind != "BOOKMARK":
            self.counters["events"] += 1
            await self.on_event(kind, raw)
        return new_version

    async def _back_off(self, why: str, delay: float, stop: asyncio.Event) -> float:
        self.counters["errors"] += 1
        log.warning("watch failed; retrying kind=%s in=%.2fs error=%s", self.name, delay, why)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        return min(delay * 2, self.max_backoff)
