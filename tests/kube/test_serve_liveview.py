"""shoal serve's live view (/ui/, /api/state: shards.web) from the running shard: its
nodes, and a pending pod with the answer the shard gave it."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.kube.apiserver import FakeApiServer
from tests.kube.test_ingest import node, pod
from tests.kube.test_serve import running


async def test_the_live_view_shows_the_running_shards_nodes_and_queue(
    apiserver: FakeApiServer,
) -> None:
    apiserver.put("Node", node("n1"))
    apiserver.put("Pod", pod("p0"))
    huge = pod("huge")
    huge["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1000"}}
    apiserver.put("Pod", huge)
    async with running(apiserver) as service, aiohttp.ClientSession() as session:
        state: dict[str, Any] = {}

        async def answered() -> bool:
            async with session.get(f"{service.url}/api/state") as response:
                assert response.status == 200
                state.update(await response.json())
            pending = {q["pod"]: q["reason"] for q in state["queue"]}
            return "Insufficient cpu" in pending.get("default/huge", "")

        deadline = asyncio.get_running_loop().time() + 30
        while not await answered():
            assert asyncio.get_running_loop().time() < deadline, state
            await asyncio.sleep(0.05)
        assert [n["name"] for n in state["nodes"]] == ["n1"]
        assert state["source"] == "live"
        async with session.get(f"{service.url}/ui/") as page:
            assert page.status == 200
            assert "app.js" in await page.text()
        async with session.get(f"{service.url}/api/state?offset=1") as refused:
            assert refused.status == 400
