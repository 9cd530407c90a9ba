"""Building a kubernetes-asyncio API client, and the adapter's error type."""

from __future__ import annotations

import os
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
