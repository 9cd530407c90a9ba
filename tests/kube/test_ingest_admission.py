"""Through ingest, pods are admitted as the API server admits them: a PriorityClass's
``preemptionPolicy`` and ``globalDefault`` reach its pods, host ports are carried, and
nodes get the labels a kubelet sets."""

from __future__ import annotations

import asyncio
from typing import Any

from events.memory import MemoryLog
from events.types import HostPort, NodeAdded, PodSubmitted
from shards.kube.ingest import KubeIngest
from tests.kube.apiserver import FakeApiServer


def _pod(name: str, **spec: Any) -> dict[str, Any]:
    container = {"name": "c", "resources": {"requests": {"cpu": "1"}}}
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [container], **spec},
        "status": {"phase": "Pending"},
    }


async def test_class_fields_and_host_ports_reach_the_log(
    apiserver: FakeApiServer, api: Any
) -> None:
    apiserver.put(
        "PriorityClass",
        {"metadata": {"name": "polite"}, "value": 1000, "preemptionPolicy": "Never"},
    )
    apiserver.put(
        "PriorityClass", {"metadata": {"name": "normal"}, "value": 10, "globalDefault": True}
    )
    apiserver.put(
        "Node",
        {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "4"}}},
    )
    apiserver.put("Pod", _pod("named", priorityClassName="polite"))
    apiserver.put("Pod", _pod("unnamed"))
    web = _pod("web")
    web["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "hostPort": 80}]
    apiserver.put("Pod", web)
    log = MemoryLog()
    ingest = KubeIngest(api, log, watch_seconds=1)
    stop = asyncio.Event()
    task = asyncio.create_task(ingest.run(stop))
    try:
        await asyncio.wait_for(ingest.synced(), 15)
    finally:
        stop.set()
        apiserver.drop_watches()
        await asyncio.wait_for(task, 15)
    events = [e.event for e in log._parts[0]]
    pods = {e.pod.name: e.pod for e in events if isinstance(e, PodSubmitted)}
    named, unnamed, web_spec = pods["named"], pods["unnamed"], pods["web"]
    assert (named.priority, named.preemption_policy) == (1000, "Never")
    assert (unnamed.priority, unnamed.priority_class, unnamed.preemption_policy) == (
        10,
        "normal",
        "PreemptLowerPriority",
    )
    assert web_spec.host_ports == (HostPort(port=80),)
    (added,) = [e for e in events if isinstance(e, NodeAdded)]
    assert added.node.labels["kubernetes.io/hostname"] == "n1"
