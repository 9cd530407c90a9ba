"""Why a pod is pending, told on the pod by ``shoal serve`` at any shard count: one
``FailedScheduling`` Event (aggregated) and the ``PodScheduled=False`` condition, both
carrying the engine's answer, whether a shard or (several shards) the coordinator judged
the pod: the binder of partition 0 follows the coordinator's judgements in the control
partition, so they are written once, not once per binder."""

from __future__ import annotations

from typing import Any

import pytest

from events.memory import MemoryLog
from events.types import Envelope, PodSpec, PodSubmitted, PodUnschedulable
from shards.kube.binder import KubeBinder
from tests.kube.apiserver import FakeApiServer
from tests.kube.serving import serving
from tests.kube.test_ingest import eventually, node, pod
from tests.kube.test_serve_groups import _replays


def _told(apiserver: Any, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in apiserver.all("Event")
        if e["involvedObject"]["name"] == name and e["reason"] == "FailedScheduling"
    ]


def _scheduled(apiserver: Any, name: str) -> dict[str, Any]:
    found = apiserver.get("Pod", name, "default") or {}
    conditions = (found.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "PodScheduled"), {})


@pytest.mark.real_kube
@pytest.mark.parametrize("shards", [1, 2])
async def test_a_pod_that_fits_nowhere_is_told_why_once(apiserver: Any, shards: int) -> None:
    """A pod asking 8 cpus where the nodes have 4: one FailedScheduling Event on it
    (naming its uid) and PodScheduled=False, reason Unschedulable, both with the
    engine's answer; a pod that fits is bound (its condition True); the log replays."""
    apiserver.put("Node", node("n0"))
    apiserver.put("Node", node("n1"))
    big = pod("big")
    big["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "8"
    apiserver.put("Pod", big)
    uid = apiserver.get("Pod", "big", "default")["metadata"]["uid"]
    async with serving(apiserver, shards) as service:
        apiserver.put("Pod", pod("fine"))
        await eventually(lambda: bool(_told(apiserver, "big")), timeout=60)
        await eventually(lambda: _scheduled(apiserver, "big").get("status") == "False", timeout=60)
        await eventually(
            lambda: bool(apiserver.get("Pod", "fine", "default")["spec"].get("nodeName")),
            timeout=60,
        )
        parts = await _replays(service, shards)
    (event,) = _told(apiserver, "big")  # once: not once per binder
    assert event["involvedObject"]["uid"] == uid and event["type"] == "Warning", event
    assert "Insufficient cpu" in event["message"], event
    # the engine's answer first, then kube-scheduler's counts of nodes
    assert "cpu" in event["message"].split("(", 1)[0].lower(), event
    assert not event["message"].startswith("0/"), event
    condition = _scheduled(apiserver, "big")
    assert condition["reason"] == "Unschedulable", condition
    assert condition["message"] == event["message"], (condition, event)
    assert apiserver.get("Pod", "big", "default")["spec"].get("nodeName") is None
    assert sum(len(p) for p in parts) > 0


async def test_a_restarted_binder_does_not_tell_the_coordinators_judgements_again(
    apiserver: FakeApiServer, api: Any
) -> None:
    """Several shards: binder 0 follows the control partition for the coordinator's
    judgements (not a shard's relayed ones, not another partition's binder's); after a
    restart it resumes past what it told (one Event of count 1, not bumped)."""
    apiserver.put("Pod", pod("gang-0"))
    uid = apiserver.get("Pod", "gang-0", "default")["metadata"]["uid"]
    log = MemoryLog(partitions=3)
    spec = PodSpec(name="gang-0", namespace="default", uid=uid, requests={"cpu": 1000})
    judged = PodUnschedulable(pod="default/gang-0", attempt=1, reason="no room", shard=-1)
    relayed = PodUnschedulable(pod="default/gang-0", attempt=2, reason="a shard's", shard=1)
    await log.append(
        [
            Envelope(event=PodSubmitted(pod=spec), producer="ingest"),
            Envelope(event=judged, producer="router"),
            Envelope(event=relayed, producer="relay-1"),
        ],
        2,
    )
    first = KubeBinder(api, log, initial_backoff=0.01, control=2)
    await first.poll()
    (event,) = _told(apiserver, "gang-0")
    assert event["message"] == "no room" and event["involvedObject"]["uid"] == uid, event
    assert _scheduled(apiserver, "gang-0")["message"] == "no room"
    again = KubeBinder(api, log, initial_backoff=0.01, control=2)
    await again.poll()
    (event,) = _told(apiserver, "gang-0")
    assert not event.get("series") and not event.get("count"), event  # told once
