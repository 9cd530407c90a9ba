"""How the binder calls the API server: retried with back-off, under the client-side
rate limit (``shards.kube.binder``, ``shards.kube.telling``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from shards.kube.client import RateLimit, checked

log = logging.getLogger(__name__)
T = TypeVar("T")


class Unavailable(Exception):
    """The API could not be reached after every retry."""


class ApiRetry:
    """Calls tried again on a server error or an unreachable server (and on ``429``
    unless the caller says it is not busy), at most ``max_attempts`` times, waiting
    ``initial_backoff`` seconds and doubling; each try waits for the rate limit first."""

    def __init__(self, rate: RateLimit, max_attempts: int, initial_backoff: float) -> None:
        self.rate = rate
        self.max_attempts = max_attempts
        self.initial_backoff = initial_backoff

    def __repr__(self) -> str:
        return f"ApiRetry(max_attempts={self.max_attempts}, initial_backoff={self.initial_backoff})"

    async def __call__(self, call: Callable[[], Awaitable[T]], *, busy: bool = True) -> T:
        """``call``'s result; :class:`Unavailable` once every try failed; any other
        4xx (and an eviction's 429, ``busy`` false: a disruption budget's answer, waited
        out by the caller) is raised at once."""
        delay = self.initial_backoff
        why = "no attempt"
        for attempt in range(self.max_attempts):
            await self.rate.acquire()
            try:
                return await call()
            except ApiException as exc:
                if exc.status is not None and exc.status < 500 and (exc.status != 429 or not busy):
                    raise
                why = f"{exc.status} {exc.reason}"
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                why = f"{type(exc).__name__}: {exc}"
            if attempt + 1 < self.max_attempts:
                log.warning("API call failed; retrying in=%.2fs error=%s", delay, why)
                await asyncio.sleep(delay)
                delay *= 2
        raise Unavailable(why)


async def raw(call: Awaitable[Any]) -> Any:
    """The answer of a call made with ``_preload_content=False``, checked and released
    (the generated models fail to parse some of the server's answers)."""
    response = await checked(await call)
    response.release()
    return response


def split_key(key: str) -> tuple[str, str]:
    """``namespace/name`` → (namespace, name)."""
    namespace, name = key.split("/", 1)
    return namespace, name
