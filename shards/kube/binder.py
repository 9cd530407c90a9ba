"""The Kubernetes binder: decisions from the log → the API, optimistically.

- ``PodBound`` (from a shard) → ``pods/binding``, naming the pod's uid as a
  precondition. A refusal (409 already bound elsewhere, or the name now another pod's;
  404 the pod is gone; 4xx) becomes ``BindFailed`` and the shard un-assumes and
  requeues the pod. Binding the same decision twice is harmless: a 409 that says
  the pod is on the decided node is success.
- ``PodPreempted`` / ``PodEvicted`` → the Eviction API (a pod already gone is fine).
  ``PodMigrated`` too: a pod cannot move, so the rescheduler's move is an eviction from
  where it runs (its node held like a victim's), and says so (``MigrationEvicted``):
  once the pod is gone, the engine holds its planned node for the replacement its
  controller creates (``engine/model/holds.py``).
  A PodDisruptionBudget that forbids it (429) is waited out: the eviction is tried
  again with back-off (``eviction_backoff`` seconds, doubling, at most
  ``eviction_attempts`` times), without holding up the other decisions; given up, it is
  logged and the bindings waiting for that node fail (``BindFailed``, naming the budget).
- **Victims hold their capacity until they are gone.** An evicted pod terminates for
  its grace period (30 s by default) and its resources stay taken meanwhile; the engine
  freed them when it decided. So a ``PodBound`` onto a node where a pod this binder
  evicted is still present is not applied yet: the pod is *nominated* (its
  ``status.nominatedNodeName`` is patched, as kube-scheduler does) and bound once
  ingest reports every such pod gone (``PodDeleted``, ``PodSucceeded``, ``PodFailed``)
  or the binder sees it gone itself (it reads each such pod every ``recheck_seconds``
  while a binding waits: with several shards, ingest's report of a victim's deletion
  goes to the coordinator, which no longer relays it to the shard that evicted it), or
  fails (``BindFailed``) after ``nomination_timeout`` seconds, to be decided again.
  Any binding onto that node waits, not only the preemptor's: whatever the engine
  placed there counted the victims' resources as free. Restart-safe: the position the
  binder records never passes the first decision still waiting, so a restarted binder
  applies it again (every action here is idempotent).
- ``PodUnschedulable`` and ``PodRejected`` → an ``events.k8s.io/v1`` ``Event``
  (``FailedScheduling``, type Warning; core/v1 where that API is not served) on the
  pod, so ``kubectl describe`` says why it is pending; repeated ones are aggregated
  and rate-limited per pod (``shards/kube/recorder.py``). A ``PodUnschedulable``
  also sets the pod's ``PodScheduled`` condition to ``False`` (reason
  ``Unschedulable``, the Event's message), as kube-scheduler does; the API server
  turns it ``True`` when the pod is bound. With several shards the pods the
  coordinator judges (gangs, pods no shard could place) are told by the binder of
  partition 0, which follows the control partition (read only) for them: once, not
  once per binder; where it got to is recorded in its own partition
  (``PositionRecorded`` of ``binder-control``), so a restart does not tell them again.
- ``PodGroupStatusChanged`` → the ``status`` of scheduler-plugins PodGroups (a merge
  patch of the status subresource), and the conditions kube-scheduler writes on
  Kubernetes' own PodGroups (``shards/kube/groupstatus.py``). With several shards a
  gang is known whole only to the coordinator's view, which reports its status in the
  control partition: the binder of partition 0 follows that partition (read only) for
  the groups' status.
- A ``PodBound`` naming GPU cards carries them as annotations of the Binding itself,
  in the form the device plugin of the pod's convention reads (``shards/kube/devices.py``):
  the API server copies a Binding's annotations onto the pod in the same write that sets
  its node, so a pod is never bound without its cards, nor given cards without being
  bound, and the binder needs no right to patch pods (one that could rewrite any pod's
  spec, its image included).

The API being unreachable is retried with back-off; a decision is never dropped
silently: after ``max_attempts`` it becomes ``BindFailed`` (for bindings) or a logged
error (for the informational writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from events.log import EventLog, read_past_unreadable
from events.types import (
    Envelope,
    Event,
    MigrationEvicted,
    PodBound,
    PodEvicted,
    PodGroupStatusChanged,
    PodMigrated,
    PodPreempted,
    PodRejected,
    PodUnschedulable,
    PositionRecorded,
)
from shards.kube.apicall import ApiRetry, Unavailable, raw, split_key
from shards.kube.bindwindow import BindWindow, subjects_of
from shards.kube.client import RateLimit
from shards.kube.client import api_message as _message
from shards.kube.controlfollow import CONTROL_TOLD, ControlFollower
from shards.kube.drabinder import DraAllocator
from shards.kube.evicting import Evicter, bind_failed
from shards.kube.known import Known
from shards.kube.recorder import NS_PER_S
from shards.kube.telling import Teller
from shards.kube.victims import Victims

log = logging.getLogger(__name__)

_ADMISSION: Final = ("ingest", "router")
"""Producers of a ``PodRejected`` for a pod refused at admission: ingest (one shard), or
the coordinator forwarding it (several)."""


class KubeBinder:
    def __init__(
        self,
        api: ApiClient,
        log_: EventLog,
        *,
        partition: int = 0,
        max_attempts: int = 5,
        initial_backoff: float = 0.05,
        clock: Callable[[], int] = time.time_ns,
        nomination_timeout: float = 120.0,
        eviction_attempts: int = 10,
        eviction_backoff: float = 1.0,
        recheck_seconds: float = 1.0,
        in_flight: int = 16,
        rate: RateLimit | None = None,
        control: int | None = None,
    ) -> None:
        if in_flight < 1:
            raise ValueError("in_flight must be at least 1")
        self.in_flight = in_flight
        """Bindings sent at once, at most (the API server answers each in milliseconds:
        one at a time, they cap the binder at a few hundred pods a second)."""
        self.rate = rate or RateLimit()
        """Client-side rate limit on the binder's API calls (``--kube-qps``/``--kube-burst``)."""
        self.core = client.CoreV1Api(api)
        self.log = log_
        self.partition = partition
        self.position = 0
        self.resumed = False
        self.max_attempts = max_attempts
        self.initial_backoff = initial_backoff
        self.clock = clock
        self._retry = ApiRetry(self.rate, max_attempts, initial_backoff)
        self.victims = Victims(
            nomination_timeout=int(nomination_timeout * NS_PER_S),
            eviction_attempts=eviction_attempts,
            eviction_backoff=int(eviction_backoff * NS_PER_S),
            recheck=int(recheck_seconds * NS_PER_S),
        )
        self.known = Known()
        """Uids, GPU requests, groups and GPU nodes learnt from the inputs."""
        self.dra = DraAllocator(api)
        """Pods' DRA claims, allocated and reserved before they are bound."""
        self.counters = {
            "bound": 0,
            "bind_failed": 0,
            "evicted": 0,
            "events": 0,
            "group_status": 0,
            "skipped": 0,
            "nominated": 0,
            "evictions_refused": 0,
            "evictions_given_up": 0,
            "devices_written": 0,
            "migrations": 0,
            "conditions": 0,
        }
        self.teller = Teller(api, self.core, self._retry, clock=clock, counters=self.counters)
        self.evicter = Evicter(
            self.core,
            self._retry,
            self.victims,
            clock=clock,
            counters=self.counters,
            gone=self._gone,
        )
        """Events, conditions and group status: why pods are pending."""
        self.recorder = self.teller.recorder
        self.follower = ControlFollower(
            log_, control, partition, self.known, self.teller, clock=clock
        )
        """Several shards (``control``, the control partition): what the coordinator
        reports there for the binder of partition 0 to write (read only)."""

    def __repr__(self) -> str:
        return f"KubeBinder(position={self.position}, {self.counters})"

    def stats(self) -> dict[str, int]:
        return {
            "position": self.position,
            **self.victims.stats(),
            **self.counters,
            "claims_allocated": self.dra.allocated,
            **{f"events_{k}": v for k, v in self.recorder.counters.items()},
        }

    async def resume(self) -> int:
        """Start after the last position this binder recorded in the log (0 if none).

        The pod-group sources seen before it are learnt again on the way."""
        records, _, _ = await read_past_unreadable(self.log, self.partition, 0)
        for env in records:
            event = env.event
            if isinstance(event, PositionRecorded) and event.component == "binder":
                # the newest: it may be behind an earlier one while a binding waits
                self.position = event.position
            elif isinstance(event, PositionRecorded) and event.component == CONTROL_TOLD:
                self.follower.told = event.position
            elif isinstance(event, PodPreempted | PodEvicted | PodMigrated):
                if env.producer.startswith("shard-"):
                    self._hold(as_eviction(event) if isinstance(event, PodMigrated) else event)
            else:
                self._learn(event)
        self.resumed = True
        return self.position

    def _hold(self, event: PodPreempted | PodEvicted) -> None:
        """An eviction decided: the pod holds its node until ingest says it is gone (if
        the log says it is there at all: one already gone frees nothing)."""
        uid = self.known.uids.pop(event.pod, None)
        if uid is not None:
            self.victims.hold(event.node, event.pod, uid)

    def _gone(self, key: str) -> None:
        """``key`` left the cluster (or finished)."""
        self.victims.gone(key)
        self._forget_told(key)

    def _forget_told(self, key: str) -> None:
        """``key`` was bound or is gone: what it was told is not bumped again."""
        self.teller.forget(key)

    def _learn(self, event: Event) -> None:
        """Keep what later decisions need from a record that is not one (a group's
        convention, a pod's uid and cards, its claims); a pod gone is forgotten."""
        self.dra.learn(event)
        gone = self.known.learn(event)
        if gone is not None:
            self._gone(gone)

    async def poll(self) -> int:
        """Apply what is new in the log; return the events appended (bind failures)."""
        if not self.resumed:
            await self.resume()
        await self.follower.follow()
        records, unreadable, position = await read_past_unreadable(
            self.log, self.partition, self.position
        )
        for offset, reason in unreadable:  # skipped, and recorded by its partition's reader
            self.counters["skipped"] += 1
            log.warning("record skipped partition=%d offset=%d: %s", self.partition, offset, reason)
        out: list[Envelope] = []
        applied = False
        window = BindWindow(self.in_flight)
        try:
            for env in records:
                event = env.event
                if isinstance(event, PositionRecorded):
                    continue
                from_shard = env.producer.startswith("shard-")
                applied = applied or from_shard
                if self._independent(env, window):
                    assert isinstance(event, PodBound)
                    await window.room()
                    window.start(env, event, self._apply(env))
                elif (
                    not from_shard
                    and not (isinstance(event, PodRejected) and env.producer in _ADMISSION)
                    and not (subjects_of(event) & window.subjects)
                ):
                    # what a later decision needs (a uid, a node's cards), of no pod
                    # or node being bound now: no need to wait for the bindings
                    self._learn(event)
                else:
                    await window.settle()  # what came before is done first
                    window.done(env, await self._apply(env))
            await window.settle()
        finally:
            window.cancel()  # only left running if this poll failed or was cancelled
        for env, caused in window.results():
            out.extend(
                Envelope(event=e, time=self.clock(), causation=env.offset, producer="binder")
                for e in caused
            )
        due = await self._due()
        out.extend(Envelope(event=e, time=self.clock(), producer="binder") for e in due)
        if not records and not due:
            self.position = position
            return 0
        if applied or due:
            # recorded with the results, atomically: a restart resumes after these,
            # or at the first decision still waiting, which it applies again
            pending = self.victims.pending()
            out.append(
                Envelope(
                    event=PositionRecorded(component="binder", position=min([position, *pending])),
                    time=self.clock(),
                    producer="binder",
                )
            )
        if out:
            await self.log.append(out, self.partition)
        # only now: if the append failed, the same records are applied again, and
        # every action here is idempotent (a repeated binding is recognised)
        self.position = position
        return sum(1 for e in out if not isinstance(e.event, PositionRecorded))

    def _independent(self, env: Envelope, window: BindWindow) -> bool:
        """Whether ``env`` is a binding that may be sent while the window's are in
        flight: a shard's ``PodBound`` onto a node no eviction holds, of a pod none of
        them binds."""
        event = env.event
        return (
            isinstance(event, PodBound)
            and env.producer.startswith("shard-")
            and not self.victims.holds(event.node)
            and event.pod not in window.subjects
        )

    async def run(self, stop: asyncio.Event, interval: float = 0.05) -> None:
        while not stop.is_set():
            if await self.poll() == 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)

    async def _due(self) -> list[Event]:
        """What time or the cluster made due: evictions to try again, bindings whose
        victims are gone (applied) or that waited too long (failed)."""
        now = self.clock()
        out: list[Event] = []
        for key, eviction in self.victims.evictions_due(now):
            out.extend(await self.evicter.evict(key, eviction.node, eviction.offset))
        for key, uid in self.victims.to_recheck(now):
            if await self.evicter.is_gone(key, uid):
                self._gone(key)
        for event in self.victims.released():
            out.extend(await self._apply_bind(event))
        waited = self.victims.nomination_timeout // NS_PER_S
        for event, victims in self.victims.late(now):
            self.counters["bind_failed"] += 1
            out.append(
                bind_failed(
                    event,
                    f"still nominated after {waited}s: {victims} still terminating on {event.node}",
                )
            )
        return out

    async def _apply(self, env: Envelope) -> list[Event]:
        event = env.event
        from_shard = env.producer.startswith("shard-")
        try:
            match event:
                case PodBound() if from_shard:
                    if self.victims.holds(event.node):
                        await self.evicter.nominate(event, env.offset or 0)
                        return []
                    return await self._apply_bind(event)
                case PodPreempted() | PodEvicted() if from_shard:
                    self._hold(event)
                    return await self.evicter.evict(event.pod, event.node, env.offset or 0)
                case PodMigrated() if from_shard:
                    # a pod cannot move: it is evicted (budgets honoured) and its node
                    # held until it is gone; its controller's replacement is placed
                    # like any new pod
                    self._hold(as_eviction(event))
                    self.counters["migrations"] += 1
                    carried = MigrationEvicted(
                        pod=event.pod, to_node=event.to_node, decision_id=event.decision_id
                    )
                    return [
                        carried,
                        *await self.evicter.evict(event.pod, event.from_node, env.offset or 0),
                    ]
                case PodUnschedulable() if from_shard and event.attempt > 0:
                    await self._unschedulable(event, self.known.uids.get(event.pod, ""))
                case PodRejected() if from_shard or env.producer in _ADMISSION:
                    # from a shard, or refused by ingest (told by the coordinator when
                    # there are several shards)
                    if event.uid:
                        self.known.uids[event.pod] = event.uid
                    await self._warn(event.pod, "FailedScheduling", event.reason)
                    self.known.uids.pop(event.pod, None)
                case PodGroupStatusChanged() if from_shard:
                    await self.teller.group_status(event, self.known.group_sources.get(event.group))
                case _ if not from_shard:
                    self._learn(event)
        except Unavailable as exc:
            if isinstance(event, PodBound):
                self.counters["bind_failed"] += 1
                return [bind_failed(event, f"API unavailable: {exc}")]
            log.error("could not apply decision offset=%s error=%s", env.offset, exc)
        return []

    async def _apply_bind(self, event: PodBound) -> list[Event]:
        try:
            caused = await self._bind(event)
        except Unavailable as exc:
            self.counters["bind_failed"] += 1
            return [bind_failed(event, f"API unavailable: {exc}")]
        if not caused:
            self._forget_told(event.pod)
        return caused

    async def _bind(self, event: PodBound) -> list[Event]:
        namespace, name = split_key(event.pod)
        cards = self.known.device_annotations(event)
        unallocated = await self.dra.allocate(event, self.known.uids.get(event.pod), self._retry)
        if unallocated is not None:
            self.counters["bind_failed"] += 1
            return [bind_failed(event, unallocated)]
        body = client.V1Binding(
            # the uid is a precondition: the API server refuses to bind another pod
            # that has taken the name since (409); the annotations are copied onto the
            # pod with its node
            metadata=client.V1ObjectMeta(
                name=name,
                namespace=namespace,
                uid=self.known.uids.get(event.pod),
                annotations=cards,
            ),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=event.node),
        )
        try:
            # the generated model fails to parse the server's answer: take it raw
            await self._retry(
                lambda: raw(
                    self.core.create_namespaced_pod_binding(
                        name, namespace, body, _preload_content=False
                    )
                )
            )
        except ApiException as exc:
            if exc.status == 409 and await self._bound_to(namespace, name) == event.node:
                return []  # the same decision applied twice
            self.counters["bind_failed"] += 1
            return [bind_failed(event, f"{exc.status} {exc.reason}: {_message(exc)}")]
        self.counters["bound"] += 1
        if cards is not None:
            self.counters["devices_written"] += 1
        return []

    async def _bound_to(self, namespace: str, name: str) -> str | None:
        try:
            pod = await self.core.read_namespaced_pod(name, namespace)
        except ApiException:
            return None
        return pod.spec.node_name if pod.spec else None

    async def _warn(self, key: str, reason: str, message: str) -> None:
        await self.teller.warn(key, self.known.uids.get(key, ""), reason, message)

    async def _unschedulable(self, event: PodUnschedulable, uid: str) -> None:
        await self.teller.unschedulable(event, uid, self.known.group_of.get(event.pod))


def as_eviction(event: PodMigrated) -> PodEvicted:
    """What a migration is to a Kubernetes cluster: the pod evicted from where it runs."""
    return PodEvicted(
        pod=event.pod,
        node=event.from_node,
        reason=f"moved to {event.to_node} to make room for {event.by}",
        decision_id=event.decision_id,
        shard=event.shard,
    )
