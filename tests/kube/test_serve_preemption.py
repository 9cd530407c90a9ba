"""``shoal serve`` with two shards and the coordinator: a preemption waits, nominated,
until the victims are gone from the cluster, on the in-repo and the real API server.
With several shards ingest's report of a victim's deletion goes to the coordinator,
which does not relay it to the shard that evicted it: the binder sees it gone itself."""

from __future__ import annotations

from typing import Any

import pytest

from engine.model.pools import POOL_LABEL
from tests.kube.serving import serving
from tests.kube.test_ingest import eventually, node, pod


def _pod(apiserver: Any, name: str) -> dict[str, Any]:
    return apiserver.get("Pod", name, "default") or {}


@pytest.mark.real_kube
async def test_two_shards_a_preemptor_waits_nominated_until_its_victims_are_gone(
    apiserver: Any,
) -> None:
    apiserver.put("PriorityClass", {"metadata": {"name": "low"}, "value": 100})
    apiserver.put("PriorityClass", {"metadata": {"name": "high"}, "value": 1000})
    for i, pool in enumerate("ab"):
        item = node(f"n{i}", cpu="2")
        item["metadata"]["labels"][POOL_LABEL] = pool
        apiserver.put("Node", item)
    lows = [f"low-{i}" for i in range(4)]
    for name in lows:
        apiserver.put("Pod", pod(name, priority_class="low"))
    async with serving(apiserver, 2):
        await eventually(
            lambda: all(_pod(apiserver, n)["spec"].get("nodeName") for n in lows), timeout=60
        )
        urgent = pod("urgent", priority_class="high")
        urgent["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
        apiserver.put("Pod", urgent)

        def nominated() -> str:
            return str(
                (_pod(apiserver, "urgent").get("status") or {}).get("nominatedNodeName") or ""
            )

        await eventually(lambda: bool(nominated()), timeout=60)
        node_name = nominated()

        def terminating() -> list[str]:
            return [
                n for n in lows if _pod(apiserver, n).get("metadata", {}).get("deletionTimestamp")
            ]

        await eventually(lambda: len(terminating()) == 2, timeout=60)
        assert all(_pod(apiserver, n)["spec"]["nodeName"] == node_name for n in terminating())
        assert not _pod(apiserver, "urgent")["spec"].get("nodeName")  # held by the victims
        for name in terminating():  # the kubelet, done with them
            apiserver.remove("Pod", name, "default")
        await eventually(
            lambda: _pod(apiserver, "urgent")["spec"].get("nodeName") == node_name, timeout=60
        )
