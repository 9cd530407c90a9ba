"""``shoal serve`` with the pod-group dialects it watches besides scheduler-plugins':
Kubernetes' own Workload and PodGroup (``scheduling.k8s.io/v1beta1``, on the real
kube-apiserver v1.37 with ``GenericWorkload``), Volcano's, KAI's and Tencent's PodGroups
(their CRDs: ``tests/fixtures/crds``) and the older coscheduling labels (no object), on
the in-repo and the real API server; and a dialect whose CRD is not installed, told
once and not watched."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from engine.model.pools import POOL_LABEL
from events.memory import MemoryLog
from events.types import (
    Envelope,
    PodBound,
    PodGroupStatusChanged,
    PodGroupSubmitted,
    PodRejected,
    PodSubmitted,
    PodUnschedulable,
)
from shards.kube.client import api_client
from shards.kube.groupstatus import DISRUPTION_TARGET, INITIALLY_SCHEDULED, conditions_after
from shards.kube.ingest import KubeIngest
from shards.replay import replay, replay_routed
from shards.serve import Service
from tests.kube.apiserver import FakeApiServer
from tests.kube.serving import serving
from tests.kube.test_ingest import eventually, node, pod


async def _replays(service: Service, shards: int) -> list[list[Envelope]]:
    """The log as recorded; it replays, every pass verified."""
    assert service.bus is not None
    parts = [await service.bus.read(p, 0) for p in range(service.bus.partitions)]
    if shards == 1:
        verified = replay(parts[0], verify=True)
    else:
        verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, verified.mismatch
    return parts


def _bound(apiserver: Any, names: list[str]) -> list[str]:
    return [n for n in names if (apiserver.get("Pod", n, "default") or {})["spec"].get("nodeName")]


def _condition(apiserver: Any, kind: str, name: str, type_: str) -> dict[str, Any]:
    group = apiserver.get(kind, name, "default") or {}
    found = [c for c in (group.get("status") or {}).get("conditions") or [] if c["type"] == type_]
    return found[0] if found else {}


def _member(name: str, group: str) -> dict[str, Any]:
    item = pod(name)
    item["spec"]["schedulingGroup"] = {"podGroupName": group}
    return item


@pytest.mark.real_kube
@pytest.mark.parametrize("shards", [1, 2])
async def test_a_kubernetes_pod_group_is_scheduled_whole_or_not_at_all(
    apiserver: Any, shards: int
) -> None:
    """A Workload and the PodGroup a controller makes of it (gang of 5 one-cpu pods) on
    two 2-cpu nodes: no member is bound, and the PodGroup says Unschedulable, as
    kube-scheduler's condition does; a third node makes room and the whole gang is
    bound, the condition turned True. The log replays."""
    for i, pool in enumerate("ab"):
        item = node(f"n{i}", cpu="2")
        item["metadata"]["labels"][POOL_LABEL] = pool
        apiserver.put("Node", item)
    gang = {"gang": {"minCount": 5}}
    apiserver.put(
        "Workload",
        {
            "metadata": {"name": "train", "namespace": "default"},
            "spec": {"podGroupTemplates": [{"name": "workers", "schedulingPolicy": gang}]},
        },
    )
    apiserver.put(
        "KubePodGroup",
        {
            "metadata": {"name": "train-workers", "namespace": "default"},
            "spec": {
                "workloadRef": {"workloadName": "train", "templateName": "workers"},
                "schedulingPolicy": gang,
            },
        },
    )
    members = [f"w{i}" for i in range(5)]
    for name in members:
        apiserver.put("Pod", _member(name, "train-workers"))
    async with serving(apiserver, shards) as service:

        def unschedulable() -> bool:
            found = _condition(apiserver, "KubePodGroup", "train-workers", INITIALLY_SCHEDULED)
            return found.get("status") == "False"

        await eventually(unschedulable, timeout=60)
        found = _condition(apiserver, "KubePodGroup", "train-workers", INITIALLY_SCHEDULED)
        assert found["reason"] == "Unschedulable" and found["message"], found
        assert _bound(apiserver, members) == []
        # its message is the engine's answer for the gang, as its members are told
        assert service.bus is not None
        answers = {
            e.event.answer.text()
            for p in range(service.bus.partitions)
            for e in await service.bus.read(p, 0)
            if isinstance(e.event, PodUnschedulable) and e.event.answer is not None
        }
        assert found["message"] in answers, (found["message"], answers)
        room = node("n2", cpu="2")
        room["metadata"]["labels"][POOL_LABEL] = "a"
        apiserver.put("Node", room)
        await eventually(lambda: len(_bound(apiserver, members)) == 5, timeout=60)

        def scheduled() -> bool:
            found = _condition(apiserver, "KubePodGroup", "train-workers", INITIALLY_SCHEDULED)
            return found.get("status") == "True"

        await eventually(scheduled, timeout=60)
        found = _condition(apiserver, "KubePodGroup", "train-workers", INITIALLY_SCHEDULED)
        assert found["reason"] == "Scheduled" and found["lastTransitionTime"], found
        assert not _condition(apiserver, "KubePodGroup", "train-workers", DISRUPTION_TARGET)
        parts = await _replays(service, shards)
    told = [e.event.group for p in parts for e in p if isinstance(e.event, PodGroupSubmitted)]
    assert told and {(g.key, g.source, g.min_member) for g in told} == {
        ("default/train-workers", "kubernetes", 5)
    }
    bound = [e.event.pod for p in parts for e in p if isinstance(e.event, PodBound)]
    assert sorted(set(bound)) == [f"default/{m}" for m in members]


@pytest.mark.real_kube
async def test_volcano_and_kai_pod_groups_are_watched_live(apiserver: Any) -> None:
    """A Volcano PodGroup (minMember 3) and a KAI PodGroup (minMember 2), their pods
    joined by the annotations of each: each gang waits whole for room, then binds."""
    apiserver.put("Node", node("n0", cpu="4"))
    apiserver.put(
        "VolcanoPodGroup",
        {"metadata": {"name": "vc", "namespace": "default"}, "spec": {"minMember": 3}},
    )
    apiserver.put(
        "KaiPodGroup",
        {"metadata": {"name": "kai", "namespace": "default"}, "spec": {"minMember": 2}},
    )
    volcano = [f"vc{i}" for i in range(3)]
    kai = [f"kai{i}" for i in range(2)]
    for name in volcano:
        item = pod(name)
        item["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "vc"}
        apiserver.put("Pod", item)
    for name in kai:
        item = pod(name)
        item["metadata"]["annotations"] = {"pod-group-name": "kai"}
        apiserver.put("Pod", item)
    async with serving(apiserver, 1) as service:
        # 4 cpus: the Volcano gang (3) or the KAI gang (2) fits, not both
        await eventually(
            lambda: len(_bound(apiserver, volcano)) == 3 or len(_bound(apiserver, kai)) == 2,
            timeout=60,
        )
        assert len(_bound(apiserver, volcano)) in (0, 3) and len(_bound(apiserver, kai)) in (0, 2)
        apiserver.put("Node", node("n1", cpu="4"))
        await eventually(lambda: len(_bound(apiserver, volcano + kai)) == 5, timeout=60)
        parts = await _replays(service, 1)
    told = {
        e.event.group.key: e.event.group for e in parts[0] if isinstance(e.event, PodGroupSubmitted)
    }
    assert {k: (g.source, g.min_member) for k, g in told.items()} == {
        "default/vc": ("volcano", 3),
        "default/kai": ("kai", 2),
    }


async def _unschedulable(service: Service, pods: list[str]) -> None:
    """Wait until the log says each of ``pods`` found no node."""
    assert service.bus is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        parts = [await service.bus.read(p, 0) for p in range(service.bus.partitions)]
        told = {e.event.pod for p in parts for e in p if isinstance(e.event, PodUnschedulable)}
        if {f"default/{n}" for n in pods} <= told:
            return
        assert loop.time() < deadline, f"not all unschedulable: {sorted(told)}"
        await asyncio.sleep(0.05)


@pytest.mark.real_kube
@pytest.mark.parametrize("shards", [1, 2])
async def test_tencent_and_labelled_gangs_are_watched_live(apiserver: Any, shards: int) -> None:
    """A Tencent batch-scheduler PodGroup (minMember 3, pods joined by its label) and a
    gang of the older coscheduling labels (name and min-available 3 on each pod, no
    object) on one 2-cpu node: neither gang fits, no member is bound; a 4-cpu node makes
    room for both and all six bind. The label gang is told once, as ``simulate`` tells
    it; the log replays."""
    apiserver.put("Node", node("n0", cpu="2"))
    apiserver.put(
        "TencentPodGroup",
        {"metadata": {"name": "tc", "namespace": "default"}, "spec": {"minMember": 3}},
    )
    tencent = [f"tc{i}" for i in range(3)]
    labelled = [f"lb{i}" for i in range(3)]
    for name in tencent:
        apiserver.put("Pod", pod(name, labels={"group.batch.scheduler.tencent.com": "tc"}))
    for name in labelled:
        labels = {
            "pod-group.scheduling.sigs.k8s.io/name": "lb",
            "pod-group.scheduling.sigs.k8s.io/min-available": "3",
        }
        apiserver.put("Pod", pod(name, labels=labels))
    async with serving(apiserver, shards) as service:
        await _unschedulable(service, tencent + labelled)
        assert _bound(apiserver, tencent + labelled) == []
        apiserver.put("Node", node("n1", cpu="4"))
        await eventually(lambda: len(_bound(apiserver, tencent + labelled)) == 6, timeout=60)
        parts = await _replays(service, shards)
    told = [
        (e.event.group.key, e.event.group.source, e.event.group.min_member)
        for part in parts
        for e in part
        if isinstance(e.event, PodGroupSubmitted) and e.producer == "ingest"
    ]
    assert sorted(told) == [("default/lb", "labels", 3), ("default/tc", "tencent", 3)]


async def test_a_member_whose_min_available_differs_is_refused() -> None:
    """Two pods naming one group by the older labels with different min-available: the
    second is refused at admission (``simulate`` refuses such a scenario), the group is
    told once, with the first member's minimum."""
    server = FakeApiServer()
    await server.start()
    api = await api_client(host=server.url, token="test-token")
    try:
        server.put("Node", node("n0", cpu="4"))
        for name, minimum in (("a", "2"), ("b", "3")):
            labels = {
                "pod-group.scheduling.sigs.k8s.io/name": "g",
                "pod-group.scheduling.sigs.k8s.io/min-available": minimum,
            }
            server.put("Pod", pod(name, labels=labels))
        log = MemoryLog()
        ingest = KubeIngest(api, log, watch_seconds=1)
        stop = asyncio.Event()
        task = asyncio.create_task(ingest.run(stop))
        await asyncio.wait_for(ingest.synced(), 10)
        await eventually(lambda: any(isinstance(e.event, PodRejected) for e in log._parts[0]))
        events = [e.event for e in log._parts[0]]
        groups = [e.group for e in events if isinstance(e, PodGroupSubmitted)]
        assert [(g.key, g.min_member, g.source) for g in groups] == [("default/g", 2, "labels")]
        refused = [e for e in events if isinstance(e, PodRejected)]
        assert [r.pod for r in refused] == ["default/b"]
        assert "min-available 3 differs from 2" in refused[0].reason
        submitted = [e.pod.key for e in events if isinstance(e, PodSubmitted)]
        assert submitted == ["default/a"]
        stop.set()
        server.drop_watches()
        await asyncio.wait_for(task, 10)
    finally:
        await api.close()
        await server.stop()


async def test_a_dialect_not_served_is_told_once_and_not_watched(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Volcano's and KAI's CRDs not installed: ingest lists everything else, tells each
    missing dialect once at INFO, and counts it as listed (serve gets ready)."""
    server = FakeApiServer(without=("scheduling.volcano.sh", "scheduling.run.ai"))
    await server.start()
    api = await api_client(host=server.url, token="test-token")
    try:
        server.put(
            "KubePodGroup",
            {"metadata": {"name": "g"}, "spec": {"schedulingPolicy": {"basic": {}}}},
        )
        log = MemoryLog()
        ingest = KubeIngest(api, log, watch_seconds=1)
        stop = asyncio.Event()
        with caplog.at_level(logging.INFO, logger="shards.kube.groups"):
            task = asyncio.create_task(ingest.run(stop))
            await asyncio.wait_for(ingest.synced(), 10)
            await eventually(
                lambda: any(isinstance(e.event, PodGroupSubmitted) for e in log._parts[0])
            )
        told = [r.getMessage() for r in caplog.records if "not served" in r.getMessage()]
        assert len(told) == 2, told
        assert any("scheduling.volcano.sh" in m for m in told)
        assert any("scheduling.run.ai" in m for m in told)
        assert ingest.stats()["podgroups.volcano_lists"] == 0
        assert ingest.stats()["podgroups.kubernetes_lists"] == 1
        stop.set()
        server.drop_watches()
        await asyncio.wait_for(task, 10)
    finally:
        await api.close()
        await server.stop()


def _told(phase: str, reason: str = "", scheduled: int = 0) -> PodGroupStatusChanged:
    return PodGroupStatusChanged(group="default/g", phase=phase, scheduled=scheduled, reason=reason)


def test_the_initially_scheduled_condition_moves_as_kube_schedulers_does() -> None:
    """Unschedulable, then Scheduled (a transition: its time moves), then Unschedulable
    again is not written (True stays True); the same status told twice changes nothing;
    a preemption adds DisruptionTarget beside it."""
    group: dict[str, Any] = {"metadata": {"generation": 2}, "status": {}}
    first = conditions_after(group, _told("Pending", "2 of 3 fit"), now="t1")
    assert first == [
        {
            "type": INITIALLY_SCHEDULED,
            "status": "False",
            "reason": "Unschedulable",
            "message": "2 of 3 fit",
            "observedGeneration": 2,
            "lastTransitionTime": "t1",
        }
    ]
    group["status"]["conditions"] = first
    assert conditions_after(group, _told("Pending", "2 of 3 fit"), now="t2") is None
    second = conditions_after(group, _told("Scheduled", scheduled=3), now="t3")
    assert second is not None
    assert (second[0]["status"], second[0]["reason"], second[0]["lastTransitionTime"]) == (
        "True",
        "Scheduled",
        "t3",
    )
    group["status"]["conditions"] = second
    assert conditions_after(group, _told("Pending", "1 of 3 fit"), now="t4") is None
    third = conditions_after(group, _told("Pending", "preempted by default/urgent"), now="t5")
    assert third is not None and [c["type"] for c in third] == [
        INITIALLY_SCHEDULED,
        DISRUPTION_TARGET,
    ]
    assert third[0]["status"] == "True" and third[1]["reason"] == "PreemptionByScheduler"
