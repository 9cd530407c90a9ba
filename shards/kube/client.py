"""Building a kubernetes-asyncio API client, and the adapter's error type."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException

from events.errors import ShoalError

log = logging.getLogger(__name__)


class KubeError(ShoalError):
    """The Kubernetes API could not be reached, or answered something unusable."""


IN_CLUSTER = "in-cluster service account"
IN_CLUSTER_ENVIRONMENT = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
"""What the kubelet sets in every pod; with them set, the service account is tried."""
HOME_KUBECONFIG = "~/.kube/config"


async def api_client(
    *, host: str | None = None, kubeconfig: str | None = None, token: str | None = None
) -> ApiClient:
    """A client for the cluster, configured from the first of (controller-runtime's
    order, which kubectl shares but for the service account):

    1. ``host`` (``--host``), with an optional bearer token;
    2. ``kubeconfig`` (``--kubeconfig``);
    3. ``$KUBECONFIG`` (one file or several, ``:``-separated, merged as kubectl does);
    4. the in-cluster service account, where ``KUBERNETES_SERVICE_HOST`` and
       ``KUBERNETES_SERVICE_PORT`` are set (in a pod);
    5. ``~/.kube/config``.

    The service account comes before ``~/.kube/config`` so that a stray file in an image
    never wins over the pod's own identity. Which one was used is logged (INFO);
    none at all is a :class:`KubeError` that names all five."""
    configuration = Configuration()
    source = await _configure(configuration, host, kubeconfig, token)
    log.info("kubernetes client configured from=%s host=%s", source, configuration.host)
    # The generated models reject some valid server answers (a Binding's Status):
    # validate on the server, not in the client.
    configuration.client_side_validation = False
    api = client.ApiClient(configuration)
    if not any(os.environ.get(name) for name in ENVIRONMENT_SETTINGS):
        await _without_environment(api, configuration)
    return api


async def _configure(
    configuration: Configuration, host: str | None, kubeconfig: str | None, token: str | None
) -> str:
    """Fill ``configuration`` from the first source :func:`api_client` lists; return
    which, in words."""
    if host is not None:
        configuration.host = host
        if token:
            # the only spelling the client honours; any other key sends no header
            configuration.api_key = {"BearerToken": token}
            configuration.api_key_prefix = {"BearerToken": "Bearer"}
        return "--host"
    if kubeconfig is not None:
        return await _kubeconfig(configuration, kubeconfig, "--kubeconfig")
    if os.environ.get("KUBECONFIG"):
        return await _kubeconfig(configuration, os.environ["KUBECONFIG"], "$KUBECONFIG")
    in_cluster = "not in a pod: KUBERNETES_SERVICE_HOST/PORT unset"
    if all(os.environ.get(name) for name in IN_CLUSTER_ENVIRONMENT):
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException as exc:
            in_cluster = str(exc)
        else:
            return IN_CLUSTER
    home = os.path.expanduser(HOME_KUBECONFIG)
    if os.path.exists(home):
        return await _kubeconfig(configuration, home, HOME_KUBECONFIG)
    raise KubeError(
        "no cluster configuration: no --host, no --kubeconfig, no $KUBECONFIG, no service "
        f"account ({in_cluster}) and no {HOME_KUBECONFIG}"
    )


async def _kubeconfig(configuration: Configuration, paths: str, given_by: str) -> str:
    found = [p for p in paths.split(os.pathsep) if p and os.path.exists(os.path.expanduser(p))]
    if not found:
        raise KubeError(f"kubeconfig {paths} ({given_by}): no such file")
    try:
        await config.load_kube_config(config_file=paths, client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError) as exc:
        raise KubeError(f"kubeconfig {paths} ({given_by}): {exc}") from None
    return f"{given_by} {paths}" if given_by != HOME_KUBECONFIG else HOME_KUBECONFIG


ENVIRONMENT_SETTINGS = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NETRC",
)
"""What kubernetes-asyncio's session reads from the environment: with one of these set,
its session is kept as it is."""


async def _without_environment(api: ApiClient, configuration: Configuration) -> None:
    """Give ``api`` a session that does not read the environment at each request.

    kubernetes-asyncio's session trusts the environment, so before every request aiohttp
    looks for a ``~/.netrc`` in a worker thread: a thread hop and a file lookup per
    request, a sixth of a busy scheduler's CPU. The new session is built as the
    client builds its own (the same TLS settings and connection limit), minus that;
    the client's unused one is closed."""
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.disable_strict_ssl_verification:
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    rest = api.rest_client
    unused = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=configuration.connection_pool_maxsize, ssl=context),
        trust_env=False,
        read_bufsize=2**21,  # as the client's: a watch event can be large
    )
    await unused.close()


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


def api_message(exc: ApiException) -> str:
    """The ``message`` of an API error's Status body ("" when there is none)."""
    body = getattr(exc, "body", None)
    if isinstance(body, bytes | str):
        try:
            data = json.loads(body)
            return str(data.get("message", ""))
        except (ValueError, AttributeError):
            return ""
    return ""
