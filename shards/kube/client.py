"""Building a kubernetes-asyncio API client, and the adapter's error type."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException

from events.errors import ShoalError


class KubeError(ShoalError):
    """The Kubernetes API could not be reached, or answered something unusable."""


async def api_client(
    *, host: str | None = None, kubeconfig: str | None = None, token: str | None = None
) -> ApiClient:
    """A client for ``host`` (with an optional bearer token), a kubeconfig file, or the
    in-cluster service account, in that order of preference."""
    configuration = Configuration()
    if host is not None:
        configuration.host = host
        if token:
            # the only spelling the client honours; any other key sends no header
            configuration.api_key = {"BearerToken": token}
            configuration.api_key_prefix = {"BearerToken": "Bearer"}
    elif kubeconfig is not None or os.environ.get("KUBECONFIG"):
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException as exc:
            raise KubeError(f"no cluster configuration: {exc}") from None
    # The generated models reject some valid server answers (a Binding's Status):
    # validate on the server, not in the client.
    configuration.client_side_validation = False
    return client.ApiClient(configuration)


async def checked(response: Any) -> Any:
    """A raw (``_preload_content=False``) response, or ``ApiException`` if it is not 2xx.

    The client skips its status check for raw responses; this puts it back, keeping
    the server's ``Status`` body on the exception."""
    if not 200 <= response.status <= 299:
        body = await response.read()
        exc = ApiException(status=response.status, reason=response.reason)
        exc.body = body
        raise exc
    return response


class RateLimit:
    """A token bucket, as client-go's: at most ``qps`` requests a second on average and
    ``burst`` at once. ``qps`` 0: no limit (the default; kube-scheduler's own is 50, with
    a burst of 100). ``clock`` and ``sleep`` are the wall clock's unless a test gives its
    own."""

    def __init__(
        self,
        qps: float = 0.0,
        burst: int = 100,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if qps < 0 or burst < 1:
            raise ValueError("qps must be at least 0 and burst at least 1")
        self.qps = qps
        self.burst = burst
        self.tokens = float(burst)
        self._clock = clock
        self._sleep = sleep
        self._at = clock()
        self.waited = 0.0
        """Seconds callers spent waiting for a token."""

    async def acquire(self) -> None:
        """Take a token: at once while the bucket holds one, else after the wait for it
        (a reservation: the bucket goes below zero, so callers that come meanwhile wait
        their turn after it, and nobody polls)."""
        if self.qps == 0:
            return
        now = self._clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self._at) * self.qps)
        self._at = now
        self.tokens -= 1
        if self.tokens < 0:
            wait = -self.tokens / self.qps
            self.waited += wait
            await self._sleep(wait)
