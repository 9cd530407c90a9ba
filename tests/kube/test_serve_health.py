"""shoal serve when the API server is not there, or its Lease namespace is missing: each
failure logged once with its cause, /readyz 503 saying why, /healthz still 200, and
``recovered`` once the cause is gone (issue #28, item 11)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from shards.kube.apihealth import ApiHealth
from shards.kube.lease import LeaderElector
from shards.serve import ServeOptions, Service, serve
from tests.kube.apiserver import FakeApiServer
from tests.kube.realkube import RealApiServer
from tests.kube.test_ingest import eventually, node, pod
from tests.kube.test_serve import get


def _options(**changes: Any) -> ServeOptions:
    return ServeOptions(
        role="all",
        bus="memory",
        listen="127.0.0.1:0",
        identity="test-0",
        watch_seconds=1,
        lease_seconds=2,  # a Lease round every 0.67 s
        poll_interval=0.02,
        **changes,
    )


def _against(apiserver: FakeApiServer | RealApiServer) -> dict[str, Any]:
    if isinstance(apiserver, RealApiServer):
        return {"kubeconfig": apiserver.kubeconfig}
    return {"host": apiserver.url, "token": "t"}


@contextlib.asynccontextmanager
async def serving(options: ServeOptions) -> AsyncIterator[Service]:
    services: list[Service] = []
    task = asyncio.create_task(serve(options, ready=services.append))
    try:
        await eventually(lambda: bool(services) or task.done())
        if task.done():
            task.result()
        yield services[0]
    finally:
        if services:
            services[0].stop.set()
        assert await asyncio.wait_for(task, 15) == 0


async def _rounds(service: Service, at_least: int) -> None:
    """Until every Lease loop has had ``at_least`` rounds."""
    await eventually(
        lambda: (
            len(service.leaders) == 2  # ingest and binder
            and all(e.rounds >= at_least for e in service.leaders.values())
        ),
        timeout=30,
    )


async def _readyz(service: Service, status: int) -> str:
    """Poll /readyz until it answers ``status``; returns its text."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while True:
        got, text = await get(f"{service.url}/readyz")
        if got == status:
            return text
        if loop.time() > deadline:
            raise AssertionError(f"/readyz still {got}: {text}")
        await asyncio.sleep(0.05)


def _logged(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == level and text in r.getMessage() and r.name == "shards.kube.apihealth"
    ]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: connections to it are refused


async def test_an_unreachable_api_server_is_logged_once_and_not_ready_until_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    port = _closed_port()
    apiserver = FakeApiServer()
    try:
        async with serving(_options(host=f"http://127.0.0.1:{port}", token="t")) as service:
            await _rounds(service, 2)
            why = await _readyz(service, 503)
            assert "cannot reach the API server at http://127.0.0.1:" in why, why
            assert (await get(f"{service.url}/healthz"))[0] == 200, "an API outage is no crash"
            (line,) = _logged(caplog, logging.ERROR, "cannot reach the API server")
            assert "kind=unreachable" in line and "Cannot connect" in line, line

            await apiserver.start(port)  # the server comes up where it was expected
            apiserver.put("Node", node("n1"))
            apiserver.put("Pod", pod("p0"))
            assert await _readyz(service, 200) == "ok\n"
            await eventually(
                lambda: bool(apiserver.get("Pod", "p0", "default")["spec"].get("nodeName")),
                timeout=30,
            )
    finally:
        await apiserver.stop()
    assert len(_logged(caplog, logging.ERROR, "cannot reach the API server")) == 1
    assert _logged(caplog, logging.INFO, "recovered kind=unreachable") == [
        "recovered kind=unreachable"
    ]


@pytest.mark.real_kube
async def test_a_missing_lease_namespace_is_logged_once_and_not_ready_until_it_exists(
    apiserver: FakeApiServer | RealApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    if isinstance(apiserver, FakeApiServer):
        apiserver.check_namespaces = True  # as the real server's admission does
    namespace = f"shoal-leases-{uuid.uuid4().hex[:8]}"
    apiserver.put("Node", node("n1"))
    apiserver.put("Pod", pod("p0"))
    options = _options(namespace=namespace, **_against(apiserver))
    async with serving(options) as service:
        await _rounds(service, 2)
        why = await _readyz(service, 503)
        assert f"create namespace {namespace} or pass --namespace" in why, why
        assert f'namespaces "{namespace}" not found' in why, why
        assert (await get(f"{service.url}/healthz"))[0] == 200
        (line,) = _logged(caplog, logging.ERROR, "create namespace")
        assert "kind=lease-namespace-missing" in line, line
        assert not apiserver.get("Pod", "p0", "default")["spec"].get("nodeName")

        apiserver.namespace(namespace)
        assert await _readyz(service, 200) == "ok\n"
        await eventually(
            lambda: bool(apiserver.get("Pod", "p0", "default")["spec"].get("nodeName")),
            timeout=30,
        )
    assert len(_logged(caplog, logging.ERROR, "create namespace")) == 1
    assert len(_logged(caplog, logging.INFO, "recovered kind=lease-namespace-missing")) == 1


def test_each_kind_of_failure_is_logged_once_until_no_source_has_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="shards.kube.apihealth")
    now = [0.0]
    health = ApiHealth(clock=lambda: now[0])
    assert health.problem(within=10) == "the API server has not answered yet"
    for _ in range(3):
        for lease in ("shoal-ingest", "shoal-binder"):
            health.failed(lease, "unreachable", f"cannot reach ({lease})", answered=False)
    assert health.problem(within=10) == "cannot reach (shoal-binder)"
    health.ok("shoal-ingest")
    assert health.problem(within=10) == "cannot reach (shoal-binder)", "one still failing"
    health.failed("shoal-ingest", "forbidden", "refused", answered=True)
    health.ok("shoal-binder")
    health.ok("shoal-ingest")
    assert health.problem(within=10) is None
    now[0] = 11.0
    assert health.problem(within=10) == "the API server has not answered for over 10s"
    health.failed("shoal-ingest", "unreachable", "cannot reach again", answered=False)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "cannot reach (shoal-ingest) kind=unreachable"),
        ("ERROR", "refused kind=forbidden"),
        ("INFO", "recovered kind=unreachable"),
        ("INFO", "recovered kind=forbidden"),
        ("ERROR", "cannot reach again kind=unreachable"),
    ]


async def test_a_refused_lease_is_reported_as_forbidden_with_the_rbac_to_grant(
    apiserver: FakeApiServer, api: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The in-repo server authorizes everything: a 403 is played here as the real
    server words it."""
    elector = LeaderElector(api, namespace="shoal", name="shoal-binder", identity="a")

    async def refused(*args: Any, **kwargs: Any) -> Any:
        exc = ApiException(status=403, reason="Forbidden")
        exc.body = (
            b'{"kind":"Status","message":"leases.coordination.k8s.io \\"shoal-binder\\" is '
            b'forbidden: User \\"x\\" cannot get resource \\"leases\\"","code":403}'
        )
        raise exc

    elector.api.read_namespaced_lease = refused  # type: ignore[method-assign]
    assert await elector.try_acquire_or_renew() is False
    assert await elector.try_acquire_or_renew() is False
    problem = elector.health.problem(within=10)
    assert problem is not None and 'cannot get resource "leases"' in problem, problem
    assert "get, create and update leases in shoal" in problem
    (line,) = _logged(caplog, logging.ERROR, "refused")
    assert line.endswith("kind=forbidden")
