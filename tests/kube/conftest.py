"""The API server the Kubernetes adapter's tests talk to: the in-repo one, and for the
tests marked ``real_kube`` a real kube-apiserver as well (``tests/kube/realkube.py``:
skipped when none is built, unless ``SHOAL_REAL_KUBE=1`` demands it)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from shards.kube.client import api_client
from tests.deploy.test_manifests import DEPLOY, render
from tests.kube.apiserver import FakeApiServer
from tests.kube.realkube import RealApiServer, missing

RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "apiserver" in metafunc.fixturenames and metafunc.definition.get_closest_marker("real_kube"):
        metafunc.parametrize("apiserver", ["in-repo", "real"], indirect=True)


@pytest.fixture(scope="session")
def real_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealApiServer]:
    why = missing()
    if why is not None:
        if os.environ.get("SHOAL_REAL_KUBE") == "1":
            pytest.fail(f"SHOAL_REAL_KUBE=1 but {why}")
        pytest.skip(why)
    server = RealApiServer(tmp_path_factory.mktemp("realkube"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def rbac_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealApiServer]:
    """A second real server, with ``--authorization-mode=RBAC`` and deploy/'s roles
    applied (one for the session: test_rbac_real.py and test_dra_real.py share it)."""
    why = missing()
    if why is not None:
        if os.environ.get("SHOAL_REAL_KUBE") == "1":
            pytest.fail(f"SHOAL_REAL_KUBE=1 but {why}")
        pytest.skip(why)
    server = RealApiServer(tmp_path_factory.mktemp("realkube-rbac"), authorization="RBAC")
    server.start()
    try:
        for doc in render(DEPLOY):
            if doc["kind"] in RBAC_KINDS:
                server.apply(doc)
        yield server
    finally:
        server.stop()


@pytest.fixture
async def apiserver(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    if getattr(request, "param", "in-repo") == "real":
        real: RealApiServer = request.getfixturevalue("real_apiserver")
        real.empty()
        yield real
        return
    server = FakeApiServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def api(apiserver: Any) -> AsyncIterator[object]:
    if isinstance(apiserver, RealApiServer):
        client = await api_client(kubeconfig=apiserver.kubeconfig)
    else:
        client = await api_client(host=apiserver.url, token="test-token")
    yield client
    await client.close()
