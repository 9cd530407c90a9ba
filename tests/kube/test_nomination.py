"""Preemption against the API: victims hold their node until they are gone, the
preemptor is nominated meanwhile, and evictions wait out disruption budgets (repeated
FailedScheduling Events: tests/kube/test_events.py)."""

from __future__ import annotations

from typing import Any

import pytest

from events.memory import MemoryLog
from events.types import (
    BindFailed,
    Envelope,
    MigrationEvicted,
    PodBound,
    PodDeleted,
    PodMigrated,
    PodPreempted,
    PodSpec,
    PodSubmitted,
)
from shards.kube.binder import KubeBinder
from tests.kube.apiserver import FakeApiServer
from tests.kube.test_binder import _scheduling
from tests.kube.test_ingest import node, pod

S = 1_000_000_000


def decision(event: Any) -> Envelope:
    return Envelope(event=event, producer="shard-0")


def ingested(event: Any) -> Envelope:
    return Envelope(event=event, producer="ingest")


def _running(apiserver: FakeApiServer, name: str, node: str, **labels: str) -> dict[str, Any]:
    obj = pod(name, node_name=node, labels=dict(labels))
    obj["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    return apiserver.put("Pod", obj)


async def _preemption(apiserver: FakeApiServer, log: MemoryLog) -> None:
    """victim runs on n1; urgent preempts it and is bound there."""
    victim = _running(apiserver, "victim", "n1", app="db")
    urgent = apiserver.put("Pod", pod("urgent"))
    await log.append(
        [
            ingested(
                PodSubmitted(
                    pod=PodSpec(namespace="default", name="victim", uid=victim["metadata"]["uid"])
                )
            ),
            ingested(
                PodSubmitted(
                    pod=PodSpec(namespace="default", name="urgent", uid=urgent["metadata"]["uid"])
                )
            ),
            decision(PodPreempted(pod="default/victim", node="n1", by="default/urgent")),
            decision(PodBound(pod="default/urgent", node="n1", decision_id="d1", attempt=1)),
        ]
    )


def _node_of(apiserver: FakeApiServer, name: str) -> str | None:
    found = apiserver.get("Pod", name, "default")
    return (found or {}).get("spec", {}).get("nodeName")


@pytest.mark.real_kube
async def test_the_preemptor_is_nominated_and_bound_once_its_victim_is_gone(
    apiserver: FakeApiServer, api: Any
) -> None:
    log = MemoryLog()
    now = [0]
    binder = KubeBinder(api, log, initial_backoff=0.01, clock=lambda: now[0])
    await _preemption(apiserver, log)
    assert await binder.poll() == 0
    victim = apiserver.get("Pod", "victim", "default")
    assert victim["metadata"]["deletionTimestamp"]  # terminating: it still holds n1
    assert _node_of(apiserver, "urgent") is None
    assert apiserver.get("Pod", "urgent", "default")["status"]["nominatedNodeName"] == "n1"
    assert binder.stats()["waiting"] == 1
    # a binder started now waits for the same victim (it applies the decision again)
    restarted = KubeBinder(api, log, initial_backoff=0.01, clock=lambda: now[0])
    assert await restarted.poll() == 0
    assert _node_of(apiserver, "urgent") is None and restarted.stats()["waiting"] == 1
    # the kubelet is done with it; ingest sees it gone
    apiserver.remove("Pod", "victim", "default")
    await log.append([ingested(PodDeleted(pod="default/victim"))])
    await restarted.poll()
    assert _node_of(apiserver, "urgent") == "n1"
    assert restarted.stats()["waiting"] == 0
    again = KubeBinder(api, log, initial_backoff=0.01, clock=lambda: now[0])
    await again.poll()
    assert again.stats()["waiting"] == 0 and again.counters["bind_failed"] == 0


@pytest.mark.real_kube
async def test_a_victim_gone_unreported_is_seen_gone_by_the_binder_itself(
    apiserver: FakeApiServer, api: Any
) -> None:
    """With several shards ingest's report of the deletion goes to the coordinator, not
    to the shard's partition: the binder reads the victims while a binding waits."""
    log = MemoryLog()
    now = [0]
    binder = KubeBinder(api, log, initial_backoff=0.01, clock=lambda: now[0], recheck_seconds=5)
    await _preemption(apiserver, log)
    assert await binder.poll() == 0
    assert binder.stats()["waiting"] == 1
    apiserver.remove("Pod", "victim", "default")  # the kubelet; nothing in this partition
    now[0] += 1 * S
    await binder.poll()
    assert _node_of(apiserver, "urgent") is None  # not looked at again before 5 s
    now[0] += 5 * S
    await binder.poll()
    assert _node_of(apiserver, "urgent") == "n1"
    assert binder.stats()["waiting"] == 0 and binder.stats()["held"] == 0


@pytest.mark.real_kube
async def test_a_nomination_that_waits_too_long_fails_the_binding(
    apiserver: FakeApiServer, api: Any
) -> None:
    log = MemoryLog()
    now = [0]
    binder = KubeBinder(api, log, initial_backoff=0.01, clock=lambda: now[0], nomination_timeout=60)
    await _preemption(apiserver, log)
    assert await binder.poll() == 0
    now[0] += 59 * S
    assert await binder.poll() == 0
    now[0] += 2 * S
    assert await binder.poll() == 1
    (failed,) = [e.event for e in await log.read(0, 0) if isinstance(e.event, BindFailed)]
    assert failed.decision_id == "d1" and "default/victim still terminating" in failed.reason
    assert _node_of(apiserver, "urgent") is None


@pytest.mark.real_kube
async def test_an_eviction_waits_out_a_disruption_budget(
    apiserver: FakeApiServer, api: Any
) -> None:
    budget = apiserver.put(
        "PodDisruptionBudget",
        {
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "db"}}, "minAvailable": 1},
            "status": {"observedGeneration": 1, "disruptionsAllowed": 0, "desiredHealthy": 1},
        },
    )
    log = MemoryLog()
    now = [0]
    binder = KubeBinder(api, log, initial_backoff=0.01, clock=lambda: now[0], eviction_backoff=10)
    await _preemption(apiserver, log)
    assert await binder.poll() == 0
    assert not apiserver.get("Pod", "victim", "default")["metadata"].get("deletionTimestamp")
    assert binder.counters["evictions_refused"] == 1
    now[0] += 5 * S
    await binder.poll()
    assert binder.counters["evictions_refused"] == 1  # not before its back-off
    budget["status"]["disruptionsAllowed"] = 1  # another replica became ready
    apiserver.put("PodDisruptionBudget", budget)
    now[0] += 5 * S
    await binder.poll()
    assert apiserver.get("Pod", "victim", "default")["metadata"]["deletionTimestamp"]
    assert binder.counters["evicted"] == 1
    assert _node_of(apiserver, "urgent") is None  # its victim still terminates
    apiserver.remove("Pod", "victim", "default")
    await log.append([ingested(PodDeleted(pod="default/victim"))])
    await binder.poll()
    assert _node_of(apiserver, "urgent") == "n1"


@pytest.mark.real_kube
async def test_an_eviction_a_budget_never_allows_is_given_up_and_fails_the_binding(
    apiserver: FakeApiServer, api: Any
) -> None:
    apiserver.put(
        "PodDisruptionBudget",
        {
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "db"}}, "minAvailable": 1},
            "status": {"observedGeneration": 1, "disruptionsAllowed": 0, "desiredHealthy": 1},
        },
    )
    log = MemoryLog()
    now = [0]
    binder = KubeBinder(
        api,
        log,
        initial_backoff=0.01,
        clock=lambda: now[0],
        eviction_attempts=3,
        eviction_backoff=1,
    )
    await _preemption(apiserver, log)
    await binder.poll()
    for _ in range(10):  # bounded: three attempts in all
        now[0] += 10 * S
        await binder.poll()
    assert binder.counters["evictions_refused"] == 3
    assert binder.counters["evictions_given_up"] == 1
    (failed,) = [e.event for e in await log.read(0, 0) if isinstance(e.event, BindFailed)]
    assert "could not be evicted" in failed.reason and "disruption budget" in failed.reason
    assert _node_of(apiserver, "urgent") is None
    assert apiserver.get("Pod", "victim", "default")["metadata"].get("deletionTimestamp") is None


@pytest.mark.real_kube
async def test_end_to_end_a_preemptor_waits_nominated_until_its_victims_are_gone(
    apiserver: FakeApiServer, api: Any
) -> None:
    """Ingest, a shard and the binder: a high-priority pod preempts the two that fill
    the node; it is nominated there, and bound only once the kubelet (the test) has
    deleted the terminating victims. The run replays."""
    apiserver.put("PriorityClass", {"metadata": {"name": "low"}, "value": 100})
    apiserver.put("PriorityClass", {"metadata": {"name": "high"}, "value": 1000})
    apiserver.put("Node", node("n1", cpu="2"))
    for name in ("low-0", "low-1"):
        apiserver.put("Pod", pod(name, priority_class="low"))
    async with _scheduling(api, apiserver) as run:
        await run.until(
            lambda: all(_node_of(apiserver, n) == "n1" for n in ("low-0", "low-1")), "bound"
        )
        urgent = pod("urgent", priority_class="high")
        urgent["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
        apiserver.put("Pod", urgent)

        def nominated() -> bool:
            found = apiserver.get("Pod", "urgent", "default") or {}
            return bool((found.get("status") or {}).get("nominatedNodeName") == "n1")

        await run.until(nominated, "nominated")
        await run.until(
            lambda: all(
                (apiserver.get("Pod", n, "default") or {})
                .get("metadata", {})
                .get("deletionTimestamp")
                for n in ("low-0", "low-1")
            ),
            "victims terminating",
        )
        assert _node_of(apiserver, "urgent") is None  # the victims still hold n1
        assert run.binder.stats()["waiting"] == 1
        for name in ("low-0", "low-1"):  # the kubelet is done with them
            apiserver.remove("Pod", name, "default")
        await run.until(lambda: _node_of(apiserver, "urgent") == "n1", "bound after")


@pytest.mark.real_kube
async def test_a_migration_is_an_eviction_and_the_pod_placed_in_its_room_waits(
    apiserver: FakeApiServer, api: Any
) -> None:
    """The rescheduler moved ``movable`` from n1 to n2 for ``big``: in Kubernetes the
    pod is evicted from n1 (it cannot move), and ``big``'s binding onto n1 waits,
    nominated, until it is gone."""
    log = MemoryLog()
    now = [0]
    binder = KubeBinder(api, log, initial_backoff=0.01, clock=lambda: now[0])
    movable = _running(apiserver, "movable", "n1")
    big = apiserver.put("Pod", pod("big"))
    await log.append(
        [
            ingested(
                PodSubmitted(
                    pod=PodSpec(namespace="default", name="movable", uid=movable["metadata"]["uid"])
                )
            ),
            ingested(
                PodSubmitted(
                    pod=PodSpec(namespace="default", name="big", uid=big["metadata"]["uid"])
                )
            ),
            decision(
                PodMigrated(
                    pod="default/movable",
                    from_node="n1",
                    to_node="n2",
                    by="default/big",
                    decision_id="m1",
                )
            ),
            decision(PodBound(pod="default/big", node="n1", decision_id="d1", attempt=1)),
        ]
    )
    assert await binder.poll() == 1  # it says the move was carried out as an eviction
    (carried,) = [e.event for e in log._parts[0] if isinstance(e.event, MigrationEvicted)]
    assert carried.pod == "default/movable" and carried.to_node == "n2"
    assert apiserver.get("Pod", "movable", "default")["metadata"]["deletionTimestamp"]
    assert _node_of(apiserver, "big") is None
    assert apiserver.get("Pod", "big", "default")["status"]["nominatedNodeName"] == "n1"
    assert binder.counters["migrations"] == 1
    apiserver.remove("Pod", "movable", "default")
    await log.append([ingested(PodDeleted(pod="default/movable"))])
    await binder.poll()
    assert _node_of(apiserver, "big") == "n1"
