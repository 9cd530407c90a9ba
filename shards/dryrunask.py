"""The client side of ``shoal whatif JOB.yaml --serve URL``: send the job to a running
``shoal serve`` (``POST /api/whatif``, :mod:`shards.web.whatif`) and take its answer.

Every way it can go wrong is one line and exit 2 (an :class:`InputError` at
``--serve``): a URL that is not ``http(s)://HOST[:PORT]``, a server that does not answer
within the time-out, a token refused, a URL that is not a ``shoal serve`` (no such
endpoint, or an answer that is not a dry run), and the service's own refusals (a bad
job, the wrong role, busy), in its words.
"""

from __future__ import annotations

import json
from typing import Any, Final

import aiohttp
from yarl import URL

from events.errors import InputError
from shards.web.whatif import PATH

WHERE: Final = "--serve"
TIMEOUT: Final = 60.0
"""Seconds to wait for the answer by default (a dry run of a large cluster takes a
while; a server that does not answer at all is found out as soon as it refuses)."""


def endpoint(url: str) -> URL:
    """The dry-run endpoint of the service at ``url``: its scheme, host and port, and
    its path as a prefix (a service behind a proxy), less a trailing ``/ui/``."""
    try:
        parsed = URL(url)
        host, port = parsed.host, parsed.port
    except ValueError as exc:
        raise InputError(f"not a URL: {url!r} ({exc})", location=WHERE) from None
    if parsed.scheme not in ("http", "https") or not host or not port:
        raise InputError(f"expected http://HOST:PORT, got {url!r}", location=WHERE)
    prefix = parsed.path.rstrip("/").removesuffix("/ui")
    return parsed.origin().with_path(prefix + PATH)


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0][:300] if lines else ""


async def ask(url: str, body: bytes, token: str | None, timeout: float = TIMEOUT) -> dict[str, Any]:
    """The service's answer to the job ``body`` (its files' documents)."""
    target = endpoint(url)
    headers = {"Content-Type": "application/yaml"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.post(target, data=body, headers=headers) as response,
        ):
            status = response.status
            text = await response.text(errors="replace")
    except TimeoutError:
        raise InputError(f"{url} did not answer within {timeout:g}s", location=WHERE) from None
    except (aiohttp.ClientError, OSError) as exc:
        raise InputError(
            f"{url} is not answering: {exc or type(exc).__name__}", location=WHERE
        ) from None
    if status == 401:
        why = "refused the token" if token is not None else "asks for a token (--token-file)"
        raise InputError(f"{url} {why}", location=WHERE)
    if status in (404, 405):
        raise InputError(
            f"{url} is not a shoal serve (HTTP {status} for POST {PATH})", location=WHERE
        )
    if status != 200:
        raise InputError(f"{url} answered HTTP {status}: {_first_line(text)}", location=WHERE)
    try:
        answer = json.loads(text)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("pods"), list):
        raise InputError(
            f"{url} is not a shoal serve (its answer is not a dry run)", location=WHERE
        )
    return answer
