"""Binder, leader election and an end-to-end run against the in-repo API server."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from engine.engine import Engine
from events.memory import MemoryLog
from events.types import (
    Answer,
    BindFailed,
    Envelope,
    GroupSpec,
    PodBound,
    PodDeleted,
    PodGroupStatusChanged,
    PodGroupSubmitted,
    PodPreempted,
    PodSpec,
    PodSubmitted,
    PodUnschedulable,
)
from shards.kube.binder import KubeBinder
from shards.kube.ingest import KubeIngest
from shards.kube.lease import LeaderElector
from shards.replay import replay
from shards.worker import ShardWorker
from tests.kube.apiserver import FakeApiServer
from tests.kube.test_ingest import eventually, node, pod


def decision(event: Any) -> Envelope:
    return Envelope(event=event, producer="shard-0")


@pytest.mark.real_kube
async def test_binding_and_conflicts(apiserver: FakeApiServer, api: Any) -> None:
    apiserver.put("Pod", pod("free"))
    apiserver.put("Pod", pod("taken", node_name="other"))
    apiserver.put("Pod", pod("twice"))
    log = MemoryLog()
    binder = KubeBinder(api, log, initial_backoff=0.01)
    await log.append(
        [
            decision(PodBound(pod="default/free", node="n1", decision_id="d1", attempt=1)),
            decision(PodBound(pod="default/taken", node="n1", decision_id="d2", attempt=1)),
            decision(PodBound(pod="default/ghost", node="n1", decision_id="d3", attempt=1)),
            decision(PodBound(pod="default/twice", node="n1", decision_id="d4", attempt=1)),
            decision(PodBound(pod="default/twice", node="n1", decision_id="d4", attempt=1)),
        ]
    )
    assert await binder.poll() == 2
    assert apiserver.get("Pod", "free", "default")["spec"]["nodeName"] == "n1"
    assert apiserver.get("Pod", "twice", "default")["spec"]["nodeName"] == "n1"
    failed = {e.event.pod: e.event for e in log._parts[0] if isinstance(e.event, BindFailed)}
    assert set(failed) == {"default/taken", "default/ghost"}
    assert failed["default/taken"].reason.startswith("409")
    assert "already assigned" in failed["default/taken"].reason
    assert failed["default/ghost"].reason.startswith("404")
    assert binder.counters["bound"] == 2  # the repeated decision was recognised, not re-bound


@pytest.mark.real_kube
async def test_a_decision_never_binds_another_pod_that_took_the_name(
    apiserver: FakeApiServer, api: Any
) -> None:
    """A decision made for a pod that was deleted and created again (same name, new
    uid) before the binder applied it is refused by the API server (the Binding names
    the uid it was made for) and becomes BindFailed; the new pod stays unbound. A
    decision for the pod it was made for binds, also after a restart of the binder."""
    first = apiserver.put("Pod", pod("web-0"))
    log = MemoryLog()
    spec = PodSpec(namespace="default", name="web-0", uid=first["metadata"]["uid"])
    await log.append([Envelope(event=PodSubmitted(pod=spec), producer="ingest")])
    apiserver.remove("Pod", "web-0", "default")
    second = apiserver.put("Pod", pod("web-0"))
    await log.append(
        [decision(PodBound(pod="default/web-0", node="n1", decision_id="old", attempt=1))]
    )
    binder = KubeBinder(api, log, initial_backoff=0.01)
    assert await binder.poll() == 1
    (failed,) = [e.event for e in await log.read(0, 0) if isinstance(e.event, BindFailed)]
    assert failed.reason.startswith("409") and "Precondition failed: UID" in failed.reason
    assert not apiserver.get("Pod", "web-0", "default")["spec"].get("nodeName")
    new = PodSpec(namespace="default", name="web-0", uid=second["metadata"]["uid"])
    await log.append(
        [
            Envelope(event=PodDeleted(pod="default/web-0"), producer="ingest"),
            Envelope(event=PodSubmitted(pod=new), producer="ingest"),
            decision(PodBound(pod="default/web-0", node="n1", decision_id="new", attempt=1)),
        ]
    )
    restarted = KubeBinder(api, log, initial_backoff=0.01)  # learns the uids again
    assert await restarted.poll() == 0
    assert apiserver.get("Pod", "web-0", "default")["spec"]["nodeName"] == "n1"


@pytest.mark.real_kube
async def test_evictions_events_and_group_status(apiserver: FakeApiServer, api: Any) -> None:
    apiserver.put("Pod", pod("victim", node_name="n1"))
    apiserver.put(
        "PodGroup",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "metadata": {"name": "g", "namespace": "default"},
            "spec": {"minMember": 2},
        },
    )
    log = MemoryLog()
    binder = KubeBinder(api, log, initial_backoff=0.01)
    await log.append(
        [
            Envelope(
                event=PodGroupSubmitted(
                    group=GroupSpec(
                        namespace="default", name="g", min_member=2, source="scheduler-plugins"
                    )
                ),
                producer="ingest",
            ),
            decision(PodPreempted(pod="default/victim", node="n1", by="default/urgent")),
            decision(PodPreempted(pod="default/already-gone", node="n1", by="default/urgent")),
            decision(
                PodUnschedulable(
                    pod="default/waiting",
                    attempt=1,
                    reason="0/3 nodes are available: 3 Insufficient cpu.",
                )
            ),
            decision(
                PodUnschedulable(pod="default/quiet", attempt=0, reason="waiting for members")
            ),
            decision(PodGroupStatusChanged(group="default/g", phase="Scheduled", scheduled=2)),
        ]
    )
    await binder.poll()
    # bound and not finished: it terminates for its grace period, as on a real server
    assert apiserver.get("Pod", "victim", "default")["metadata"]["deletionGracePeriodSeconds"] == 30
    (event,) = apiserver.all("Event")
    assert event["reason"] == "FailedScheduling" and event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "waiting"
    assert event["message"] == "0/3 nodes are available: 3 Insufficient cpu."
    assert apiserver.get("PodGroup", "g", "default")["status"] == {
        "phase": "Scheduled",
        "scheduled": 2,
    }


async def test_unreachable_api_fails_the_bind_after_retries(
    api: Any, apiserver: FakeApiServer
) -> None:
    apiserver.put("Pod", pod("p"))
    log = MemoryLog()
    binder = KubeBinder(api, log, initial_backoff=0.01, max_attempts=3)
    await apiserver.stop()
    await log.append([decision(PodBound(pod="default/p", node="n", decision_id="d", attempt=1))])
    assert await binder.poll() == 1
    (failed,) = [e.event for e in log._parts[0] if isinstance(e.event, BindFailed)]
    assert failed.reason.startswith("API unavailable")


async def test_leader_election(apiserver: FakeApiServer, api: Any) -> None:
    clock = [datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)]
    mono = [0.0]  # expiry is judged by the candidate's own clock

    def advance(seconds: int) -> None:
        clock[0] += datetime.timedelta(seconds=seconds)
        mono[0] += seconds

    a = LeaderElector(
        api,
        namespace="shoal",
        name="ingest",
        identity="a",
        lease_seconds=10,
        clock=lambda: clock[0],
        monotonic=lambda: mono[0],
    )
    b = LeaderElector(
        api,
        namespace="shoal",
        name="ingest",
        identity="b",
        lease_seconds=10,
        clock=lambda: clock[0],
        monotonic=lambda: mono[0],
    )
    assert await a.try_acquire_or_renew() is True
    assert await b.try_acquire_or_renew() is False
    advance(5)
    assert await a.try_acquire_or_renew() is True  # renewed
    advance(8)
    assert await b.try_acquire_or_renew() is False  # a renewed 8 s ago
    advance(11)
    assert await b.try_acquire_or_renew() is True  # a stopped renewing: b takes over
    lease = apiserver.get("Lease", "ingest", "shoal")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 2
    assert await a.try_acquire_or_renew() is False


async def test_stale_lease_write_loses(apiserver: FakeApiServer, api: Any) -> None:
    a = LeaderElector(api, namespace="shoal", name="coord", identity="a")
    assert await a.try_acquire_or_renew()
    real = a.api.replace_namespaced_lease

    async def racing(*args: Any, **kwargs: Any) -> Any:
        lease = apiserver.get("Lease", "coord", "shoal")
        lease["spec"]["holderIdentity"] = "intruder"
        apiserver.put("Lease", lease)  # someone else wrote in between
        return await real(*args, **kwargs)

    a.api.replace_namespaced_lease = racing  # type: ignore[method-assign]
    assert await a.try_acquire_or_renew() is False
    assert apiserver.get("Lease", "coord", "shoal")["spec"]["holderIdentity"] == "intruder"


@dataclass
class _Run:
    log: MemoryLog
    ingest: KubeIngest
    worker: ShardWorker
    binder: KubeBinder
    tasks: tuple[asyncio.Task[None], ...]

    async def until(self, check: Callable[[], bool], what: str) -> None:
        """Wait for ``check``; else say which part died, or where each part stands."""
        try:
            await eventually(check)
        except AssertionError:
            for part in self.tasks:  # a part that died says why
                if part.done():
                    raise AssertionError(f"{part.get_name()} ended: {part.exception()!r}") from None
            raise AssertionError(
                f"{what} not in time: ingest={self.ingest.stats()} worker={self.worker.stats()} "
                f"engine={self.worker.engine.stats()} binder={self.binder.stats()}"
            ) from None


@contextlib.asynccontextmanager
async def _scheduling(api: Any, apiserver: FakeApiServer) -> AsyncIterator[_Run]:
    """Ingest, one shard and the binder against the API server until the block ends
    (then the log replays)."""
    log = MemoryLog()
    stop = asyncio.Event()
    ingest = KubeIngest(api, log, watch_seconds=1)
    worker = ShardWorker(Engine(), log)
    binder = KubeBinder(api, log, initial_backoff=0.01)

    async def loop() -> None:
        while not stop.is_set():
            await worker.poll()
            await binder.poll()
            await asyncio.sleep(0.02)

    tasks = (asyncio.create_task(ingest.run(stop)), asyncio.create_task(loop()))
    try:
        yield _Run(log, ingest, worker, binder, tasks)
    finally:
        stop.set()
        apiserver.drop_watches()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert replay(await log.read(0, 0), verify=True).mismatch is None


@pytest.mark.real_kube
async def test_end_to_end_pods_get_bound(apiserver: FakeApiServer, api: Any) -> None:
    for name in ("n1", "n2"):
        apiserver.put("Node", node(name))
    for i in range(6):
        apiserver.put("Pod", pod(f"p{i}"))
    big = pod("too-big")
    big["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "64"
    apiserver.put("Pod", big)
    async with _scheduling(api, apiserver) as run:
        await run.until(
            lambda: all(
                apiserver.get("Pod", f"p{i}", "default")["spec"].get("nodeName") for i in range(6)
            ),
            "bound",
        )
        await eventually(
            lambda: any(e["involvedObject"]["name"] == "too-big" for e in apiserver.all("Event"))
        )
        nodes = {apiserver.get("Pod", f"p{i}", "default")["spec"]["nodeName"] for i in range(6)}
        assert nodes == {"n1", "n2"}


@pytest.mark.real_kube
async def test_a_restarted_binder_resumes_where_it_left_off(
    apiserver: FakeApiServer, api: Any
) -> None:
    apiserver.put("Pod", pod("a"))
    log = MemoryLog()
    await log.append(
        [
            decision(PodBound(pod="default/a", node="n1", decision_id="d1", attempt=1)),
            decision(PodUnschedulable(pod="default/b", attempt=1, reason="no room")),
            decision(PodBound(pod="default/gone", node="n1", decision_id="d2", attempt=1)),
        ]
    )
    first = KubeBinder(api, log, initial_backoff=0.01)
    assert await first.poll() == 1  # the BindFailed for the missing pod
    assert await first.poll() == 0  # its own records apply nothing, record nothing
    events_before = len(apiserver.all("Event"))
    end = await log.end_offset(0)
    restarted = KubeBinder(api, log, initial_backoff=0.01)
    assert await restarted.resume() == 3
    assert await restarted.poll() == 0
    assert await log.end_offset(0) == end, "nothing applied twice, nothing appended"
    assert len(apiserver.all("Event")) == events_before
    await log.append(
        [decision(PodUnschedulable(pod="default/c", attempt=1, reason="still no room"))]
    )
    assert await restarted.poll() == 0
    assert len(apiserver.all("Event")) == events_before + 1


@pytest.mark.real_kube
async def test_a_pod_deleted_and_created_again_under_its_name_is_bound_again(
    apiserver: FakeApiServer, api: Any
) -> None:
    """A StatefulSet's pod, or one deleted and applied again, comes back under the same
    name as another object (another uid): it is scheduled and bound like any new pod,
    and the run replays."""
    apiserver.put("Node", node("n1"))
    apiserver.put("Pod", pod("web-0"))

    def bound_to() -> str | None:
        found = apiserver.get("Pod", "web-0", "default")
        return found["spec"].get("nodeName") if found else None

    async with _scheduling(api, apiserver) as run:
        worker = run.worker
        await run.until(lambda: bound_to() == "n1", "bound")
        first_uid = apiserver.get("Pod", "web-0", "default")["metadata"]["uid"]
        assert apiserver.remove("Pod", "web-0", "default") is not None
        await eventually(lambda: "default/web-0" in worker.engine.outcomes)
        apiserver.put("Pod", pod("web-0"))  # the API server gives it a new uid
        assert apiserver.get("Pod", "web-0", "default")["metadata"]["uid"] != first_uid
        await eventually(lambda: bound_to() == "n1")
        assert worker.engine.pods["default/web-0"].spec.uid != first_uid
    records = await run.log.read(0, 0)
    decided = [e.event for e in records if isinstance(e.event, PodBound) and e.event.attempt]
    assert [b.pod for b in decided] == ["default/web-0", "default/web-0"]
    assert decided[0].decision_id != decided[1].decision_id


@pytest.mark.real_kube
async def test_a_gang_deleted_and_applied_again_is_bound_again(
    apiserver: FakeApiServer, api: Any
) -> None:
    """A job of a PodGroup and its pods, deleted and applied again (the same names,
    new uids): the new gang is scheduled all together, as the first was."""

    def apply_job() -> None:
        apiserver.put(
            "PodGroup",
            {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "metadata": {"name": "job", "namespace": "default"},
                "spec": {"minMember": 2},
            },
        )
        for name in ("w0", "w1"):
            apiserver.put("Pod", pod(name, labels={"scheduling.x-k8s.io/pod-group": "job"}))

    def all_bound() -> bool:
        pods = [apiserver.get("Pod", name, "default") for name in ("w0", "w1")]
        return all(p and p["spec"].get("nodeName") == "n1" for p in pods)

    apiserver.put("Node", node("n1"))
    apply_job()
    async with _scheduling(api, apiserver) as run:
        worker = run.worker
        await run.until(all_bound, "bound")
        old = apiserver.get("PodGroup", "job", "default")["metadata"]["uid"]
        for name in ("w0", "w1"):
            assert apiserver.remove("Pod", name, "default") is not None
        assert apiserver.remove("PodGroup", "job", "default") is not None
        await eventually(lambda: not worker.engine.pods)
        apply_job()
        await eventually(all_bound)
        group = worker.engine.groups["default/job"]
        assert group.spec is not None and group.spec.uid not in ("", old)
        assert group.phase == "Scheduled"


@pytest.mark.parametrize("in_flight", [1, 16])
async def test_bindings_go_out_together_up_to_a_bound(
    apiserver: FakeApiServer, api: Any, in_flight: int
) -> None:
    """A binding takes the server a while (an etcd write): the binder sends up to
    ``in_flight`` at once instead of one after another, never more, and each pod is
    bound once."""
    apiserver.binding_seconds = 0.02
    names = [f"p{i}" for i in range(48)]
    for name in names:
        apiserver.put("Pod", pod(name))
    log = MemoryLog()
    binder = KubeBinder(api, log, initial_backoff=0.01, in_flight=in_flight)
    await log.append(
        [decision(PodBound(pod=f"default/{n}", node="n1", decision_id=n, attempt=1)) for n in names]
    )
    assert await binder.poll() == 0  # nothing failed
    assert binder.counters["bound"] == len(names)
    assert all(apiserver.get("Pod", n, "default")["spec"]["nodeName"] == "n1" for n in names)
    if in_flight == 1:
        assert apiserver.bindings_at_once == 1
    else:
        assert 1 < apiserver.bindings_at_once <= in_flight


async def test_a_slow_binding_holds_up_only_its_own_slot(
    apiserver: FakeApiServer, api: Any
) -> None:
    """Bindings are not sent in lockstep groups: while one waits for a slow answer (a
    busy API server), the others go on through the remaining slots, and inputs between
    decisions (ingest's records in the same partition) do not stop them either."""
    names = [f"p{i}" for i in range(40)]
    for name in names:
        apiserver.put("Pod", pod(name))
    apiserver.held_bindings["p0"] = len(names) - 1  # answered once all the others are
    log = MemoryLog()
    binder = KubeBinder(api, log, initial_backoff=0.01, in_flight=4)
    records = []
    for n in names:
        records.append(Envelope(event=PodDeleted(pod=f"default/gone-{n}"), producer="ingest"))
        records.append(decision(PodBound(pod=f"default/{n}", node="n1", decision_id=n, attempt=1)))
    await log.append(records)
    assert await binder.poll() == 0
    assert binder.counters["bound"] == len(names)
    assert apiserver.bound_order[-1] == "p0" and sorted(apiserver.bound_order) == sorted(names)
    assert apiserver.bindings_at_once <= 4


async def test_a_failed_scheduling_event_leads_with_the_answer(
    apiserver: FakeApiServer, api: Any
) -> None:
    """``kubectl describe pod`` shows the engine's answer (why, and what to do), then
    kube-scheduler's count of nodes by reason."""
    apiserver.put("Pod", pod("waiting"))
    log = MemoryLog()
    binder = KubeBinder(api, log, initial_backoff=0.01)
    answer = Answer(
        kind="taint",
        summary="3 node(s) have taint dedicated=infra:NoSchedule, which the pod does not tolerate",
        next_step="add a toleration for dedicated=infra:NoSchedule to the pod",
    )
    await log.append(
        [
            decision(
                PodUnschedulable(
                    pod="default/waiting",
                    attempt=1,
                    reason="0/3 nodes are available: 3 node(s) had untolerated taint {dedicated: infra}.",
                    answer=answer,
                )
            )
        ]
    )
    await binder.poll()
    (event,) = apiserver.all("Event")
    assert event["reason"] == "FailedScheduling"
    assert event["message"] == (
        "3 node(s) have taint dedicated=infra:NoSchedule, which the pod does not tolerate: "
        "add a toleration for dedicated=infra:NoSchedule to the pod "
        "(0/3 nodes are available: 3 node(s) had untolerated taint {dedicated: infra}.)"
    )
