"""The API client shoal builds: its session, and a request through it."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client

from shards.kube.client import ENVIRONMENT_SETTINGS, api_client
from tests.kube.apiserver import FakeApiServer


@pytest.fixture
def no_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENVIRONMENT_SETTINGS:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("no_proxy_settings")
async def test_the_session_does_not_read_the_environment_at_each_request(
    apiserver: FakeApiServer,
) -> None:
    """kubernetes-asyncio's own session looks for a ~/.netrc in a worker thread before
    every request (a sixth of a busy scheduler's CPU); shoal's does not, and works."""
    api = await api_client(host=apiserver.url, token="test-token")
    try:
        assert api.rest_client.pool_manager.trust_env is False
        apiserver.put("Node", {"metadata": {"name": "n1"}, "status": {}})
        nodes: Any = await client.CoreV1Api(api).list_node()
        assert [n.metadata.name for n in nodes.items] == ["n1"]
    finally:
        await api.close()


async def test_a_proxy_named_in_the_environment_is_still_honoured(
    apiserver: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ENVIRONMENT_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    api = await api_client(host=apiserver.url, token="test-token")
    try:
        assert api.rest_client.pool_manager.trust_env is True
    finally:
        await api.close()
