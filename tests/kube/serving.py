"""``shoal serve --role all`` over the memory bus against a test API server (the in-repo
one or a real one), for as long as a test needs it; stopped cleanly at the end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from engine.config import SchedulerConfig
from shards.serve import ServeOptions, Service, serve
from tests.kube.realkube import RealApiServer
from tests.kube.test_ingest import eventually


@contextlib.asynccontextmanager
async def serving(
    apiserver: Any, shards: int, config: SchedulerConfig | None = None
) -> AsyncIterator[Service]:
    real = isinstance(apiserver, RealApiServer)
    if real:
        apiserver.namespace("shoal")  # the Leases' namespace
    services: list[Service] = []
    options = ServeOptions(
        role="all",
        bus="memory",
        host=None if real else apiserver.url,
        token=None if real else "t",
        kubeconfig=apiserver.kubeconfig if real else None,
        listen="127.0.0.1:0",
        identity="test-0",
        shards=shards,
        config=config,
        watch_seconds=1,
        lease_seconds=3,
        poll_interval=0.02,
    )
    task = asyncio.create_task(serve(options, ready=services.append))
    try:
        await eventually(lambda: bool(services), timeout=30)
        yield services[0]
    finally:
        if services:
            services[0].stop.set()
        assert await asyncio.wait_for(task, 30) == 0
