from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shards.kube.client import api_client
from tests.kube.apiserver import FakeApiServer


@pytest.fixture
async def apiserver() -> AsyncIterator[FakeApiServer]:
    server = FakeApiServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def api(apiserver: FakeApiServer) -> AsyncIterator[object]:
    client = await api_client(host=apiserver.url, token="test-token")
    yield client
    await client.close()
