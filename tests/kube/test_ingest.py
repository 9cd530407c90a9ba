"""Ingest against the in-repo API server with the real kubernetes-asyncio client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import orjson
import pytest

from events.filelog import FileLog
from events.memory import MemoryLog
from events.types import (
    DisruptionBudgetDeleted,
    DisruptionBudgetSet,
    NodeAdded,
    NodeRemoved,
    NodeUpdated,
    PodBound,
    PodDeleted,
    PodGroupSubmitted,
    PodSubmitted,
    PodSucceeded,
    QuotaDefined,
)
from shards.kube.client import api_client
from shards.kube.ingest import KubeIngest
from shards.kube.reflector import WATCH_BATCH, Reflector
from tests.kube.apiserver import FakeApiServer


def node(name: str, cpu: str = "4") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"zone": "a"}},
        "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}},
    }


def pod(
    name: str,
    ns: str = "default",
    node_name: str = "",
    scheduler: str = "",
    labels: dict[str, str] | None = None,
    priority_class: str = "",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "1"}}}]
    }
    if node_name:
        spec["nodeName"] = node_name
    if scheduler:
        spec["schedulerName"] = scheduler
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


async def eventually(check: Callable[[], bool], timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


@pytest.fixture
async def running(
    apiserver: FakeApiServer, api: Any
) -> AsyncIterator[tuple[KubeIngest, MemoryLog]]:
    log = MemoryLog()
    ingest = KubeIngest(api, log, scheduler_names=["default-scheduler", "shoal"], watch_seconds=1)
    for r in ingest.reflectors:
        r.initial_backoff = 0.01
    stop = asyncio.Event()
    task = asyncio.create_task(ingest.run(stop))
    await asyncio.wait_for(ingest.synced(), 5)
    yield ingest, log
    stop.set()
    apiserver.drop_watches()
    await asyncio.wait_for(task, 10)


def kinds(log: MemoryLog) -> list[tuple[str, str]]:
    out = []
    for env in log._parts[0]:
        e = env.event
        name = getattr(e, "pod", None) or getattr(e, "name", None)
        if isinstance(e, NodeAdded | NodeUpdated):
            name = e.node.name
        elif isinstance(e, PodSubmitted):
            name = e.pod.key
        elif isinstance(e, PodGroupSubmitted):
            name = e.group.key
        elif isinstance(e, QuotaDefined):
            name = e.quota.namespace
        out.append((type(e).__name__, str(name)))
    return out


async def test_initial_list_then_watch(apiserver: FakeApiServer, api: Any) -> None:
    apiserver.put("PriorityClass", {"metadata": {"name": "high"}, "value": 1000})
    apiserver.put("Node", node("n1"))
    apiserver.put("Pod", pod("pending", priority_class="high"))
    apiserver.put("Pod", pod("bound-elsewhere", node_name="n1", scheduler="other"))
    apiserver.put("Pod", pod("not-ours", scheduler="other"))
    apiserver.put(
        "PodGroup",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "metadata": {"name": "g", "namespace": "ml"},
            "spec": {"minMember": 2},
        },
    )
    apiserver.put(
        "ElasticQuota",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "metadata": {"name": "q", "namespace": "ml"},
            "spec": {"min": {"cpu": "2"}, "max": {"cpu": "4"}},
        },
    )
    log = MemoryLog()
    ingest = KubeIngest(api, log, watch_seconds=1)
    stop = asyncio.Event()
    task = asyncio.create_task(ingest.run(stop))
    await asyncio.wait_for(ingest.synced(), 5)
    got = kinds(log)
    assert ("NodeAdded", "n1") in got
    assert ("PodSubmitted", "default/pending") in got
    assert ("PodSubmitted", "default/bound-elsewhere") in got and (
        "PodBound",
        "default/bound-elsewhere",
    ) in got
    assert all(name != "default/not-ours" for _, name in got)
    assert ("PodGroupSubmitted", "ml/g") in got and ("QuotaDefined", "ml") in got
    submitted = next(
        e.event
        for e in log._parts[0]
        if isinstance(e.event, PodSubmitted) and e.event.pod.name == "pending"
    )
    assert submitted.pod.priority == 1000
    # then changes stream in
    apiserver.put("Node", node("n2"))
    apiserver.put("Node", node("n1", cpu="8"))
    apiserver.remove("Node", "n2")
    apiserver.put("Pod", {**pod("pending"), "status": {"phase": "Succeeded"}})
    await eventually(
        lambda: (
            ("NodeRemoved", "n2") in kinds(log)
            and ("PodSucceeded", "default/pending") in kinds(log)
        )
    )
    assert ("NodeUpdated", "n1") in kinds(log)
    stop.set()
    apiserver.drop_watches()
    await asyncio.wait_for(task, 10)


async def test_410_relists_without_losing_or_repeating(
    apiserver: FakeApiServer, running: tuple[KubeIngest, MemoryLog]
) -> None:
    ingest, log = running
    apiserver.put("Node", node("a"))
    await eventually(lambda: ("NodeAdded", "a") in kinds(log))
    apiserver.drop_watches()
    # while nobody watches: changes, then the history is compacted away
    apiserver.put("Node", node("b"))
    apiserver.remove("Node", "a")
    apiserver.compact()
    await eventually(
        lambda: ("NodeRemoved", "a") in kinds(log) and ("NodeAdded", "b") in kinds(log)
    )
    nodes_reflector = next(r for r in ingest.reflectors if r.name == "nodes")
    assert nodes_reflector.counters["relists_410"] >= 1
    assert kinds(log).count(("NodeAdded", "b")) == 1
    assert kinds(log).count(("NodeAdded", "a")) == 1


async def test_disconnect_mid_watch_resumes_from_the_last_version(
    apiserver: FakeApiServer, running: tuple[KubeIngest, MemoryLog]
) -> None:
    _, log = running
    for i in range(5):
        apiserver.put("Pod", pod(f"p{i}"))
        if i == 2:
            apiserver.drop_watches()
    await eventually(lambda: sum(1 for k, _ in kinds(log) if k == "PodSubmitted") == 5)
    await asyncio.sleep(0.2)
    assert sorted(n for k, n in kinds(log) if k == "PodSubmitted") == [
        f"default/p{i}" for i in range(5)
    ]


async def test_garbage_answers_back_off_and_recover(
    apiserver: FakeApiServer, running: tuple[KubeIngest, MemoryLog]
) -> None:
    ingest, log = running
    apiserver.garbage = 6
    apiserver.drop_watches()
    apiserver.put("Node", node("after-garbage"))
    await eventually(lambda: ("NodeAdded", "after-garbage") in kinds(log))
    assert sum(r.counters["errors"] for r in ingest.reflectors) >= 1


async def test_bad_objects_are_skipped_with_a_reason(
    apiserver: FakeApiServer, running: tuple[KubeIngest, MemoryLog]
) -> None:
    ingest, log = running
    bad = pod("negative")
    bad["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "-1"
    apiserver.put("Pod", bad)
    apiserver.put("Pod", pod("fine"))
    await eventually(lambda: ("PodSubmitted", "default/fine") in kinds(log))
    assert any("default/negative" in r and "negative quantity" in r for r in ingest.rejected)
    assert ("PodSubmitted", "default/negative") not in kinds(log)


async def test_a_node_with_more_cards_than_a_table_holds_is_skipped_with_a_reason(
    apiserver: FakeApiServer, running: tuple[KubeIngest, MemoryLog]
) -> None:
    """One node stating 200,000 cards would size every shard's card table: ingest
    skips it (logged and kept in ``rejected``); the other nodes are added."""
    ingest, log = running
    huge = node("huge")
    huge["status"]["allocatable"]["nvidia.com/gpu"] = "200000"
    apiserver.put("Node", huge)
    apiserver.put("Node", node("fine"))
    await eventually(lambda: ("NodeAdded", "fine") in kinds(log))
    assert any("Node huge" in r and "200000 GPU cards" in r for r in ingest.rejected)
    assert ("NodeAdded", "huge") not in kinds(log)


async def test_deleted_pod_and_observed_binding(
    apiserver: FakeApiServer, running: tuple[KubeIngest, MemoryLog]
) -> None:
    _, log = running
    apiserver.put("Node", node("n"))
    apiserver.put("Pod", pod("p"))
    await eventually(lambda: ("PodSubmitted", "default/p") in kinds(log))
    apiserver.put("Pod", pod("p", node_name="n"))
    await eventually(lambda: ("PodBound", "default/p") in kinds(log))
    bound = next(e.event for e in log._parts[0] if isinstance(e.event, PodBound))
    assert bound.decision_id.startswith("observed:") and bound.node == "n"
    apiserver.remove("Pod", "p", "default")
    await eventually(lambda: ("PodDeleted", "default/p") in kinds(log))
    assert isinstance(log._parts[0][-1].event, PodDeleted | NodeRemoved | PodSucceeded | PodBound)


async def test_a_watch_that_ends_in_silence_fails_the_ingest(
    apiserver: FakeApiServer, api: Any
) -> None:
    """A library handing a reflector a ``CancelledError`` (a client stopped under it)
    must not leave that kind unwatched while the others go on: the ingest fails, and
    its caller starts a fresh one."""
    ingest = KubeIngest(api, MemoryLog(), watch_seconds=1)
    victim = ingest.reflectors[-1]

    async def cancelled(stop: asyncio.Event) -> None:
        raise asyncio.CancelledError

    victim.run = cancelled  # type: ignore[method-assign]
    with pytest.raises(ExceptionGroup) as failed:
        await asyncio.wait_for(ingest.run(asyncio.Event()), 10)
    assert f"{victim.name}: the watch ended unexpectedly" in str(failed.value.exceptions[0])


async def test_pods_are_listed_after_the_nodes_even_when_the_node_list_is_slow(
    apiserver: FakeApiServer, api: Any
) -> None:
    """The first pods a shard sees find the nodes in the log before them (listed
    concurrently, pods came first whenever the node list was slower, and each failed
    for want of nodes); a CRD that is not installed holds nobody up."""
    for name in ("n1", "n2"):
        apiserver.put("Node", node(name))
    for i in range(3):
        apiserver.put("Pod", pod(f"p{i}"))
    log = MemoryLog()
    ingest = KubeIngest(api, log, watch_seconds=1)
    nodes = next(r for r in ingest.reflectors if r.name == "nodes")
    groups = next(r for r in ingest.reflectors if r.name == "podgroups")
    list_nodes = nodes.call

    async def slow_nodes(**kwargs: Any) -> Any:
        if not nodes.synced.is_set():
            await asyncio.sleep(0.3)
        return await list_nodes(**kwargs)

    async def not_installed(**kwargs: Any) -> Any:
        from kubernetes_asyncio.client.exceptions import ApiException

        raise ApiException(status=404, reason="Not Found")

    nodes.call = slow_nodes
    groups.call = not_installed
    groups.initial_backoff = 0.05
    stop = asyncio.Event()
    task = asyncio.create_task(ingest.run(stop))
    await eventually(lambda: sum(k == "PodSubmitted" for k, _ in kinds(log)) == 3, timeout=10)
    got = kinds(log)
    first_pod = next(i for i, (k, _) in enumerate(got) if k == "PodSubmitted")
    assert {name for k, name in got[:first_pod] if k == "NodeAdded"} == {"n1", "n2"}
    assert groups.counters["errors"] >= 1 and not groups.synced.is_set()
    stop.set()
    apiserver.drop_watches()
    await asyncio.wait_for(task, 10)


async def test_one_pod_no_record_can_hold_never_stops_the_rest(
    apiserver: FakeApiServer, api: Any, tmp_path: Path
) -> None:
    """A pod asking 100P CPUs (10^20 milli-CPUs: beyond 64 bits) among others: the
    initial list appends every object in one call; the one bad pod is refused with a
    reason and every other object is recorded, on a log that encodes what it stores."""
    apiserver.put("Node", node("n"))
    huge = pod("huge")
    huge["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "100P"
    apiserver.put("Pod", huge)
    for i in range(3):
        apiserver.put("Pod", pod(f"fine-{i}"))
    log = FileLog(tmp_path / "ingest.events")
    ingest = KubeIngest(api, log, watch_seconds=1)
    stop = asyncio.Event()
    task = asyncio.create_task(ingest.run(stop))
    try:
        await asyncio.wait_for(ingest.synced(), 10)
        await eventually(lambda: len(ingest.rejected) >= 1)
        recorded = {(type(e.event).__name__, _key(e.event)) for e in await log.read(0, 0)}
        assert {("PodSubmitted", f"default/fine-{i}") for i in range(3)} <= recorded
        assert ("NodeAdded", "n") in recorded
        assert ("PodSubmitted", "default/huge") not in recorded
        assert ("PodRejected", "default/huge") in recorded  # the binder tells the pod
        assert any("default/huge" in r for r in ingest.rejected), ingest.rejected
    finally:
        stop.set()
        apiserver.drop_watches()
        await asyncio.wait_for(task, 10)
        await log.close()


def _key(event: Any) -> str:
    subject = getattr(event, "pod", None) or getattr(event, "node", None)
    if isinstance(subject, str):
        return subject
    return str(getattr(subject, "key", None) or getattr(subject, "name", ""))


def buffered_watch(count: int, tail: bytes = b"") -> Callable[..., Any]:
    """A watch call answering ``count`` node events already buffered (a busy server),
    then ``tail`` and the end of the stream."""
    protocol = mock.Mock(_reading_paused=False)
    content = aiohttp.StreamReader(protocol, limit=1 << 16, loop=asyncio.get_running_loop())
    for i in range(count):
        content.feed_data(
            orjson.dumps(
                {
                    "type": "ADDED",
                    "object": {"metadata": {"name": f"n{i}", "resourceVersion": str(i + 1)}},
                }
            )
            + b"\n"
        )
    if tail:
        content.feed_data(tail)
    content.feed_eof()

    class Response:
        status = 200

        def __init__(self) -> None:
            self.content = content

        def release(self) -> None:
            pass

    async def call(**kwargs: Any) -> Response:
        assert kwargs["watch"] is True and kwargs["_preload_content"] is False
        return Response()

    return call


async def no_relist(items: list[dict[str, Any]]) -> None:
    pass


async def test_a_watch_with_data_buffered_yields_to_the_other_tasks() -> None:
    """The watch loop yields between batches of events: with a whole stream already
    buffered (a busy API server), the binder and the shards in the same event loop
    still run between two batches instead of after the last event."""
    total = 3 * WATCH_BATCH + 10
    seen: list[int] = []
    turns: list[int] = []

    async def on_event(kind: str, obj: dict[str, Any]) -> None:
        seen.append(len(turns))  # how often the other task had run before this event

    reflector = Reflector("nodes", buffered_watch(total), on_event, no_relist)

    async def other_task() -> None:
        while len(seen) < total:
            turns.append(len(seen))
            await asyncio.sleep(0)

    other = asyncio.create_task(other_task())
    version = await reflector._watch("0", asyncio.Event())
    await other
    assert version == str(total) and len(seen) == total
    # the other task ran between batches all along, not only once the stream was read
    for k in range(1, 4):
        assert seen[k * WATCH_BATCH] > seen[k * WATCH_BATCH - 1], k


async def test_the_events_already_received_are_handled_and_appended_together() -> None:
    """Each batch of buffered watch events is handled inside one ``batch`` context (ingest
    appends it as one record batch), at most WATCH_BATCH events each, in order; an
    unfinished last line is an event of its own when the stream ends."""
    total = 2 * WATCH_BATCH + 5
    last = orjson.dumps(
        {"type": "ADDED", "object": {"metadata": {"name": "last", "resourceVersion": "999"}}}
    )
    batches: list[list[str]] = []
    current: list[str] = []

    @contextlib.asynccontextmanager
    async def batch() -> AsyncIterator[None]:
        current.clear()
        yield
        batches.append(list(current))

    async def on_event(kind: str, obj: dict[str, Any]) -> None:
        current.append(obj["metadata"]["name"])

    reflector = Reflector("nodes", buffered_watch(total, tail=last), on_event, no_relist)
    reflector.batch = batch
    version = await reflector._watch("0", asyncio.Event())
    assert version == "999"
    names = [name for b in batches for name in b]
    assert names == [f"n{i}" for i in range(total)] + ["last"]
    assert all(len(b) <= WATCH_BATCH for b in batches) and len(batches) <= 4


async def test_ingest_appends_a_busy_watch_in_few_batches(
    apiserver: FakeApiServer, api: Any
) -> None:
    """Pods created faster than ingest appends go to the log in fewer appends than
    events (each append is one record batch every reader goes through)."""

    class Counting(MemoryLog):
        appends = 0

        async def append(self, envelopes: Any, partition: int = 0) -> list[int]:
            Counting.appends += 1
            await asyncio.sleep(0.005)  # a broker's answer takes a while
            return await super().append(envelopes, partition)

    log = Counting()
    ingest = KubeIngest(api, log, scheduler_names=["default-scheduler"], watch_seconds=5)
    stop = asyncio.Event()
    task = asyncio.create_task(ingest.run(stop))
    try:
        await asyncio.wait_for(ingest.synced(), 5)
        before = Counting.appends
        for i in range(300):
            apiserver.put("Pod", pod(f"p{i}"))
        await eventually(lambda: sum(1 for k, _ in kinds(log) if k == "PodSubmitted") == 300)
        assert Counting.appends - before < 300
    finally:
        stop.set()
        apiserver.drop_watches()
        await asyncio.wait_for(task, 10)


@pytest.mark.real_kube
async def test_the_built_in_system_priority_classes_are_taken(
    apiserver: FakeApiServer, api: Any
) -> None:
    """Every cluster has them, with values above the user limit: no rejection on start.
    A user class may not take their prefix: the real server refuses one (422), and
    ingest refuses one the in-repo server lets through."""
    for name, value in [
        ("system-node-critical", 2000001000),
        ("system-cluster-critical", 2000000000),
    ]:
        apiserver.put("PriorityClass", {"metadata": {"name": name}, "value": value})
    fake = isinstance(apiserver, FakeApiServer)
    if fake:
        apiserver.put("PriorityClass", {"metadata": {"name": "system-mine"}, "value": 5})
    apiserver.put("Pod", pod("critical", priority_class="system-node-critical"))
    log = MemoryLog()
    ingest = KubeIngest(api, log, watch_seconds=1)
    stop = asyncio.Event()
    task = asyncio.create_task(ingest.run(stop))
    await asyncio.wait_for(ingest.synced(), 5)
    await eventually(lambda: any(isinstance(e.event, PodSubmitted) for e in log._parts[0]))
    assert ingest.classes["system-node-critical"] == 2000001000
    assert ingest.rejected == (
        [
            "PriorityClass system-mine: metadata.name: the prefix system- is reserved for the "
            "built-in classes system-cluster-critical (2000000000), system-node-critical "
            "(2000001000)"
        ]
        if fake
        else []
    )
    (submitted,) = [e.event for e in log._parts[0] if isinstance(e.event, PodSubmitted)]
    assert submitted.pod.priority == 2000001000
    stop.set()
    apiserver.drop_watches()
    await asyncio.wait_for(task, 10)


@pytest.mark.real_kube
async def test_a_gated_pod_is_scheduled_once_its_gates_are_removed(
    apiserver: FakeApiServer, api: Any
) -> None:
    """A pod created with scheduling gates (Kueue's, say) is not submitted, as
    kube-scheduler does not schedule it; once an update removes them, it is."""
    apiserver.put("Node", node("n1"))
    gated = pod("held")
    gated["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    apiserver.put("Pod", gated)
    log = MemoryLog()
    ingest = KubeIngest(api, log, watch_seconds=1)
    stop = asyncio.Event()
    task = asyncio.create_task(ingest.run(stop))
    await asyncio.wait_for(ingest.synced(), 5)
    assert ("PodSubmitted", "default/held") not in kinds(log)
    current = apiserver.get("Pod", "held", "default")
    current["spec"]["schedulingGates"] = []
    apiserver.put("Pod", current)
    await eventually(lambda: ("PodSubmitted", "default/held") in kinds(log))
    stop.set()
    apiserver.drop_watches()
    await asyncio.wait_for(task, 10)


def _budget(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_disruption_budgets_are_watched_at_the_version_served(version: str) -> None:
    """v1.25 and later serve ``policy/v1`` only, servers before v1.21 ``policy/v1beta1``
    only: ingest asks for the first and goes on with the second where it is not served. A budget
    set, replaced, deleted; a malformed one skipped with a reason."""
    server = FakeApiServer(budget_version=version)
    await server.start()
    api = await api_client(host=server.url, token="test-token")
    try:
        server.put("PodDisruptionBudget", _budget("web", {"minAvailable": 1}))
        server.put("PodDisruptionBudget", _budget("bad", {"minAvailable": "150%"}))
        log = MemoryLog()
        ingest = KubeIngest(api, log, watch_seconds=1)
        stop = asyncio.Event()
        task = asyncio.create_task(ingest.run(stop))
        await asyncio.wait_for(ingest.synced(), 5)

        def budgets() -> list[Any]:
            return [
                e.event
                for e in log._parts[0]
                if isinstance(e.event, DisruptionBudgetSet | DisruptionBudgetDeleted)
            ]

        assert [(b.budget.key, b.budget.min_available) for b in budgets()] == [("default/web", 1)]
        assert any("default/bad" in r and "spec.minAvailable" in r for r in ingest.rejected)
        # a status update (the disruption controller's count) tells nothing new
        stored = server.get("PodDisruptionBudget", "web", "default")
        assert stored is not None
        server.put("PodDisruptionBudget", {**stored, "status": {"disruptionsAllowed": 1}})
        server.put(
            "PodDisruptionBudget",
            _budget("web", {"maxUnavailable": "50%", "selector": {"matchLabels": {"a": "b"}}}),
        )
        server.remove("PodDisruptionBudget", "web", "default")
        await eventually(lambda: len(budgets()) == 3)
        replaced, deleted = budgets()[1:]
        assert isinstance(replaced, DisruptionBudgetSet)
        assert replaced.budget.max_unavailable == "50%" and replaced.budget.min_available is None
        assert isinstance(deleted, DisruptionBudgetDeleted) and deleted.budget == "default/web"
        assert ingest.budget_versions == (version,)
        stop.set()
        server.drop_watches()
        await asyncio.wait_for(task, 10)
    finally:
        await api.close()
        await server.stop()
