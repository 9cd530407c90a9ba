"""Calling HTTP extenders for an engine's asks, and recording their answers.

After a pass, the component that runs an engine (a shard, or the coordinator) takes the
asks the pass made (:mod:`engine.model.extenders`) and hands them to
:func:`answer_asks`, which calls the extenders and returns one ``ExtenderAnswered`` per
(pods, extender) for the component to append to its partition; the next pass reads
them. Asks of pods whose documents differ only in their name and uid, on the same nodes,
are sent once (their answer cannot differ but for the name). Calls run concurrently, at
most :data:`CONCURRENCY` at a time, each within its extender's ``httpTimeout``.

As kube-scheduler: the filter verbs are called in configuration order, each on the nodes
the previous one let through; then the prioritize verbs on what is left. A connection
that cannot be made is tried again once (:data:`RETRIES`); a time-out, an HTTP status
other than 200, an answer that is not the API's JSON or that carries an ``Error``, is a
failure, recorded as such (the engine skips an ``ignorable`` extender, and fails the
attempt otherwise).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import orjson

from engine.extenders import ExtenderConfig
from engine.model.extenders import Ask
from engine.model.state import ClusterState
from events.errors import cause
from events.types import ExtenderAnswered, PodSpec
from shards.extenders.wire import (
    MAX_ANSWER_BYTES,
    NodeListCache,
    NodeRenderer,
    WireError,
    args_bytes,
    filter_result,
    pod_json,
    priority_list,
)

logger = logging.getLogger(__name__)

CONCURRENCY: Final = 32
"""Calls in flight at once, over all extenders."""
RETRIES: Final = 1
"""Further tries of a call whose connection could not be made."""
RETRY_DELAY: Final = 0.05


@dataclass
class ExtenderStats:
    calls: int = 0
    failures: int = 0
    timeouts: int = 0
    seconds: float = 0.0
    by_extender: dict[str, dict[str, int]] = field(default_factory=dict)

    def count(self, url: str, what: str) -> None:
        entry = self.by_extender.setdefault(url, {"calls": 0, "failures": 0, "timeouts": 0})
        entry[what] += 1

    def as_dict(self) -> dict[str, float]:
        return {
            "extender_calls": self.calls,
            "extender_failures": self.failures,
            "extender_timeouts": self.timeouts,
            "extender_seconds": round(self.seconds, 6),
        }


class CallFailed(Exception):
    def __init__(self, message: str, *, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


def ssl_context(ext: ExtenderConfig) -> ssl.SSLContext | bool:
    """The TLS settings of ``tlsConfig`` (True: the system's defaults)."""
    if not ext.https and not ext.url_prefix.startswith("https://"):
        return True
    tls = ext.tls
    if tls is None:
        return True
    ctx = ssl.create_default_context(cafile=tls.ca_file or None, cadata=tls.ca_data or None)
    if tls.cert_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file or None)
    if tls.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class ExtenderClient:
    """Sends asks; keeps what it takes to render nodes and the counts for metrics."""

    def __init__(self, concurrency: int = CONCURRENCY) -> None:
        self.stats = ExtenderStats()
        self.nodes = NodeRenderer()
        self.lists = NodeListCache(self.nodes)
        self._limit = asyncio.Semaphore(concurrency)
        self._ssl: dict[str, ssl.SSLContext | bool] = {}

    def __repr__(self) -> str:
        return f"ExtenderClient(calls={self.stats.calls}, failures={self.stats.failures})"

    async def _post(
        self, session: aiohttp.ClientSession, ext: ExtenderConfig, verb: str, body: bytes
    ) -> Any:
        url = ext.url(verb)
        if ext.url_prefix not in self._ssl:
            self._ssl[ext.url_prefix] = ssl_context(ext)
        tls = self._ssl[ext.url_prefix]
        timeout = aiohttp.ClientTimeout(total=ext.timeout_ns / 1e9)
        for attempt in range(RETRIES + 1):
            async with self._limit:
                self.stats.calls += 1
                self.stats.count(ext.url_prefix, "calls")
                started = time.perf_counter()
                try:
                    async with session.post(
                        url,
                        data=body,
                        headers={"Content-Type": "application/json"},
                        timeout=timeout,
                        ssl=tls,
                    ) as response:
                        if response.status != 200:
                            raise CallFailed(f"{verb}: HTTP {response.status}")
                        raw = await _read_body(response, verb)
                        try:
                            return orjson.loads(raw)
                        except orjson.JSONDecodeError as exc:
                            raise CallFailed(f"{verb}: answer is not JSON: {exc}") from None
                except TimeoutError:
                    raise CallFailed(
                        f"{verb}: no answer within {ext.timeout_ns / 1e9:g}s", timeout=True
                    ) from None
                except aiohttp.ClientConnectionError as exc:
                    if attempt >= RETRIES:
                        raise CallFailed(f"{verb}: {cause(exc)}") from None
                except aiohttp.ClientError as exc:
                    raise CallFailed(f"{verb}: {cause(exc)}") from None
                finally:
                    self.stats.seconds += time.perf_counter() - started
            await asyncio.sleep(RETRY_DELAY)
        raise AssertionError("unreachable")

    def _failed(self, ext: ExtenderConfig, exc: CallFailed) -> str:
        self.stats.failures += 1
        self.stats.count(ext.url_prefix, "failures")
        if exc.timeout:
            self.stats.timeouts += 1
            self.stats.count(ext.url_prefix, "timeouts")
        logger.warning("extender call failed extender=%s error=%s", ext.url_prefix, exc)
        return str(exc)

    async def _one(
        self,
        session: aiohttp.ClientSession,
        extenders: list[ExtenderConfig],
        spec: PodSpec,
        nodes: tuple[str, ...],
        state: ClusterState,
    ) -> dict[str, tuple[tuple[str, ...], ExtenderAnswered]]:
        """Ask ``extenders`` about one pod on ``nodes``; per extender, the answer (with
        ``pods`` and ``asked`` left for the caller)."""
        pod = orjson.dumps(pod_json(spec))
        out: dict[str, tuple[tuple[str, ...], ExtenderAnswered]] = {}
        current = nodes
        stop = ""

        def args(ext: ExtenderConfig, names: tuple[str, ...]) -> bytes:
            items = None if ext.node_cache_capable else self.lists.items(state, names)
            return args_bytes(pod, names, items)

        for ext in extenders:
            if not ext.filter_verb:
                continue
            if stop or not current:
                why = stop or "not asked: no node left"
                out[ext.url_prefix] = (
                    (),
                    ExtenderAnswered(
                        extender=ext.url_prefix, pods=(), passed=(), error=why if stop else ""
                    ),
                )
                continue
            sent = current
            try:
                doc = await self._post(session, ext, ext.filter_verb, args(ext, sent))
                passed, failed, unresolvable, error = filter_result(doc)
            except (CallFailed, WireError) as exc:
                if isinstance(exc, WireError):
                    exc = CallFailed(f"{ext.filter_verb}: malformed answer: {exc}")
                error = self._failed(ext, exc)
                out[ext.url_prefix] = (
                    sent,
                    ExtenderAnswered(extender=ext.url_prefix, pods=(), nodes=sent, error=error),
                )
                if not ext.ignorable:
                    stop = f"not asked: {ext.url_prefix} failed first"
                continue
            if error:
                self._failed(ext, CallFailed(error))
                out[ext.url_prefix] = (
                    sent,
                    ExtenderAnswered(extender=ext.url_prefix, pods=(), nodes=sent, error=error),
                )
                if not ext.ignorable:
                    stop = f"not asked: {ext.url_prefix} failed first"
                continue
            keep = frozenset(passed)
            current = tuple(n for n in sent if n in keep)
            out[ext.url_prefix] = (
                sent,
                ExtenderAnswered(
                    extender=ext.url_prefix,
                    pods=(),
                    nodes=sent,
                    passed=current,
                    failed={n: r for n, r in failed.items() if n in frozenset(sent)},
                    unresolvable={n: r for n, r in unresolvable.items() if n in frozenset(sent)},
                ),
            )

        async def prioritize(ext: ExtenderConfig) -> None:
            previous = out.get(ext.url_prefix)
            base = previous[1] if previous is not None else None
            if stop or not current or (base is not None and base.error):
                if base is None:
                    out[ext.url_prefix] = ((), ExtenderAnswered(extender=ext.url_prefix, pods=()))
                return
            try:
                doc = await self._post(session, ext, ext.prioritize_verb, args(ext, current))
                scores = priority_list(doc)
            except (CallFailed, WireError) as exc:
                if isinstance(exc, WireError):
                    exc = CallFailed(f"{ext.prioritize_verb}: malformed answer: {exc}")
                error = self._failed(ext, exc)
                if base is None:  # a prioritize failure is skipped by the engine
                    out[ext.url_prefix] = (
                        current,
                        ExtenderAnswered(
                            extender=ext.url_prefix, pods=(), nodes=current, error=error
                        ),
                    )
                return
            keep = frozenset(current)
            scores = {h: s for h, s in scores.items() if h in keep}
            if base is None:
                out[ext.url_prefix] = (
                    current,
                    ExtenderAnswered(
                        extender=ext.url_prefix, pods=(), nodes=current, scores=scores
                    ),
                )
            else:
                out[ext.url_prefix] = (
                    previous[0] if previous else current,
                    _with_scores(base, scores),
                )

        await asyncio.gather(*(prioritize(x) for x in extenders if x.prioritize_verb))
        return out

    async def answer(
        self,
        asks: Iterable[Ask],
        extenders: Iterable[ExtenderConfig],
        specs: dict[str, PodSpec],
        state: ClusterState,
    ) -> list[ExtenderAnswered]:
        """Answers to ``asks`` (pods by key in ``specs``), in the order of the asks."""
        by_url = {x.url_prefix: x for x in extenders}
        groups: dict[tuple[tuple[str, ...], bytes, tuple[str, ...]], list[Ask]] = {}
        for ask in asks:
            spec = specs.get(ask.pod)
            if spec is None:
                continue
            anonymous = _anonymous(spec)
            groups.setdefault((ask.extenders, anonymous, ask.nodes), []).append(ask)
        if not groups:
            return []
        connector = aiohttp.TCPConnector(limit=CONCURRENCY)
        async with aiohttp.ClientSession(connector=connector) as session:
            keys = list(groups)
            results = await asyncio.gather(
                *(
                    self._one(
                        session,
                        [by_url[u] for u in key[0] if u in by_url],
                        specs[groups[key][0].pod],
                        groups[key][0].nodes,
                        state,
                    )
                    for key in keys
                )
            )
        out = []
        for key, result in zip(keys, results, strict=True):
            members = groups[key]
            pods = tuple(a.pod for a in members)
            asked = tuple(a.seq for a in members)
            for url in key[0]:
                if url not in result:
                    result[url] = (
                        (),
                        ExtenderAnswered(extender=url, pods=(), error="not configured"),
                    )
                out.append(_for(result[url][1], pods, asked))
        return out


async def _read_body(response: aiohttp.ClientResponse, verb: str) -> bytes:
    """The whole answer, refused past :data:`MAX_ANSWER_BYTES`."""
    length = response.content_length
    if length is not None and length > MAX_ANSWER_BYTES:
        raise CallFailed(f"{verb}: answer larger than {MAX_ANSWER_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise CallFailed(f"{verb}: answer larger than {MAX_ANSWER_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _anonymous(spec: PodSpec) -> bytes:
    """What an extender sees of a pod but its name and uid."""
    import msgspec

    return msgspec.json.encode(msgspec.structs.replace(spec, name="", uid=""))


def _with_scores(answer: ExtenderAnswered, scores: dict[str, int]) -> ExtenderAnswered:
    import msgspec

    return msgspec.structs.replace(answer, scores=scores)


def _for(
    answer: ExtenderAnswered, pods: tuple[str, ...], asked: tuple[int, ...]
) -> ExtenderAnswered:
    import msgspec

    return msgspec.structs.replace(answer, pods=pods, asked=asked)
