"""The Kubernetes binder: decisions from the log → the API, optimistically.

- ``PodBound`` (from a shard) → ``pods/binding``, naming the pod's uid as a
  precondition. A refusal (409 already bound elsewhere, or the name now another pod's;
  404 the pod is gone; 4xx) becomes ``BindFailed`` and the shard un-assumes and
  requeues the pod. Binding the same decision twice is harmless: a 409 that says
  the pod is on the decided node is success.
- ``PodPreempted`` / ``PodEvicted`` → the Eviction API (a pod already gone is fine).
- ``PodUnschedulable`` and ``PodRejected`` → a core/v1 ``Event`` (``FailedScheduling``,
  type Warning) on the pod, so ``kubectl describe`` says why it is pending.
- ``PodGroupStatusChanged`` → the ``status`` of scheduler-plugins PodGroups.

The API being unreachable is retried with back-off; a decision is never dropped
silently: after ``max_attempts`` it becomes ``BindFailed`` (for bindings) or a logged
error (for the informational writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from events.log import EventLog, read_past_unreadable
from events.types import (
    BindFailed,
    Envelope,
    Event,
    PodBound,
    PodDeleted,
    PodEvicted,
    PodFailed,
    PodGroupStatusChanged,
    PodGroupSubmitted,
    PodPreempted,
    PodRejected,
    PodRouted,
    PodSubmitted,
    PodSucceeded,
    PodUnschedulable,
    PositionRecorded,
    ReservationRequested,
)
from shards.kube.client import checked

log = logging.getLogger(__name__)

_ADMISSION: Final = ("ingest", "router")
"""Producers of a ``PodRejected`` for a pod refused at admission: ingest (one shard), or
the coordinator forwarding it (several)."""
T = TypeVar("T")


class _Unavailable(Exception):
    """The API could not be reached after every retry."""


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
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.log = log_
        self.partition = partition
        self.position = 0
        self.resumed = False
        self.max_attempts = max_attempts
        self.initial_backoff = initial_backoff
        self.clock = clock
        self.group_sources: dict[str, str] = {}
        self.uids: dict[str, str] = {}
        """Live pods → their uid, from the records that brought them: a Binding names it,
        so that a decision made for a pod never binds another that took its name."""
        self.counters = {
            "bound": 0,
            "bind_failed": 0,
            "evicted": 0,
            "events": 0,
            "group_status": 0,
            "skipped": 0,
        }

    def __repr__(self) -> str:
        return f"KubeBinder(position={self.position}, {self.counters})"

    def stats(self) -> dict[str, int]:
        return {"position": self.position, **self.counters}

    async def resume(self) -> int:
        """Start after the last position this binder recorded in the log (0 if none).

        The pod-group sources seen before it are learnt again on the way."""
        records, _, _ = await read_past_unreadable(self.log, self.partition, 0)
        for env in records:
            event = env.event
            if isinstance(event, PositionRecorded) and event.component == "binder":
                self.position = max(self.position, event.position)
            else:
                self._learn(event)
        self.resumed = True
        return self.position

    def _learn(self, event: Event) -> None:
        """Keep what later decisions need from a record that is not one: a group's
        convention, a pod's uid (forgotten when the pod is gone)."""
        match event:
            case PodGroupSubmitted(group=spec):
                self.group_sources[spec.key] = spec.source
            case PodSubmitted(pod=spec) | PodRouted(pod=spec):
                if spec.uid:
                    self.uids[spec.key] = spec.uid
            case ReservationRequested(pods=specs):
                self.uids.update((spec.key, spec.uid) for spec in specs if spec.uid)
            case PodDeleted(pod=key) | PodSucceeded(pod=key) | PodFailed(pod=key):
                self.uids.pop(key, None)
            case _:
                pass

    async def poll(self) -> int:
        """Apply what is new in the log; return the events appended (bind failures)."""
        if not self.resumed:
            await self.resume()
        records, unreadable, position = await read_past_unreadable(
            self.log, self.partition, self.position
        )
        for offset, reason in unreadable:  # skipped, and recorded by its partition's reader
            self.counters["skipped"] += 1
            log.warning("record skipped partition=%d offset=%d: %s", self.partition, offset, reason)
        if not records:
            self.position = position
            return 0
        out: list[Envelope] = []
        applied = False
        for env in records:
            if isinstance(env.event, PositionRecorded):
                continue
            applied = applied or env.producer.startswith("shard-")
            caused = await self._apply(env)
            out.extend(
                Envelope(event=e, time=self.clock(), causation=env.offset, producer="binder")
                for e in caused
            )
        if applied:
            # recorded with the results, atomically: a restart resumes after these
            out.append(
                Envelope(
                    event=PositionRecorded(component="binder", position=position),
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

    async def run(self, stop: asyncio.Event, interval: float = 0.05) -> None:
        while not stop.is_set():
            if await self.poll() == 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)

    async def _apply(self, env: Envelope) -> list[Event]:
        event = env.event
        from_shard = env.producer.startswith("shard-")
        try:
            match event:
                case PodBound() if from_shard:
                    return await self._bind(event)
                case PodPreempted() | PodEvicted() if from_shard:
                    self.uids.pop(event.pod, None)
                    await self._evict(event.pod)
                case PodUnschedulable() if from_shard and event.attempt > 0:
                    await self._warn(event.pod, "FailedScheduling", event.reason)
                case PodRejected() if from_shard or env.producer in _ADMISSION:
                    # from a shard, or refused by ingest (told by the coordinator when
                    # there are several shards)
                    if event.uid:
                        self.uids[event.pod] = event.uid
                    await self._warn(event.pod, "FailedScheduling", event.reason)
                    self.uids.pop(event.pod, None)
                case PodGroupStatusChanged() if from_shard:
                    await self._group_status(event)
                case _ if not from_shard:
                    self._learn(event)
        except _Unavailable as exc:
            if isinstance(event, PodBound):
                self.counters["bind_failed"] += 1
                return [self._failed(event, f"API unavailable: {exc}")]
            log.error("could not apply decision offset=%s error=%s", env.offset, exc)
        return []

    async def _retry(self, call: Callable[[], Awaitable[T]]) -> T:
        delay = self.initial_backoff
        for attempt in range(self.max_attempts):
            try:
                return await call()
            except ApiException as exc:
                if exc.status is not None and exc.status < 500 and exc.status != 429:
                    raise
                why = f"{exc.status} {exc.reason}"
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                why = f"{type(exc).__name__}: {exc}"
            if attempt + 1 < self.max_attempts:
                log.warning("API call failed; retrying in=%.2fs error=%s", delay, why)
                await asyncio.sleep(delay)
                delay *= 2
        raise _Unavailable(why)

    @staticmethod
    async def _raw(call: Awaitable[Any]) -> Any:
        response = await checked(await call)
        response.release()
        return response

    @staticmethod
    def _split(key: str) -> tuple[str, str]:
        namespace, name = key.split("/", 1)
        return namespace, name

    @staticmethod
    def _failed(event: PodBound, reason: str) -> BindFailed:
        return BindFailed(
            pod=event.pod, node=event.node, decision_id=event.decision_id, reason=reason
        )

    async def _bind(self, event: PodBound) -> list[Event]:
        namespace, name = self._split(event.pod)
        body = client.V1Binding(
            # the uid is a precondition: the API server refuses to bind another pod
            # that has taken the name since (409)
            metadata=client.V1ObjectMeta(
                name=name, namespace=namespace, uid=self.uids.get(event.pod)
            ),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=event.node),
        )
        try:
            # the generated model fails to parse the server's answer: take it raw
            await self._retry(
                lambda: self._raw(
                    self.core.create_namespaced_pod_binding(
                        name, namespace, body, _preload_content=False
                    )
                )
            )
        except ApiException as exc:
            if exc.status == 409 and await self._bound_to(namespace, name) == event.node:
                return []  # the same decision applied twice
            self.counters["bind_failed"] += 1
            return [self._failed(event, f"{exc.status} {exc.reason}: {_message(exc)}")]
        self.counters["bound"] += 1
        return []

    async def _bound_to(self, namespace: str, name: str) -> str | None:
        try:
            pod = await self.core.read_namespaced_pod(name, namespace)
        except ApiException:
            return None
        return pod.spec.node_name if pod.spec else None

    async def _evict(self, key: str) -> None:
        namespace, name = self._split(key)
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
        try:
            await self._retry(
                lambda: self._raw(
                    self.core.create_namespaced_pod_eviction(
                        name, namespace, body, _preload_content=False
                    )
                )
            )
            self.counters["evicted"] += 1
        except ApiException as exc:
            if exc.status != 404:
                log.error("eviction refused pod=%s status=%s", key, exc.status)

    async def _warn(self, key: str, reason: str, message: str) -> None:
        namespace, name = self._split(key)
        now = datetime.datetime.now(datetime.UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{name}.", namespace=namespace),
            # uid and apiVersion: what `kubectl describe pod` selects the pod's Events by
            involved_object=client.V1ObjectReference(
                api_version="v1",
                kind="Pod",
                name=name,
                namespace=namespace,
                uid=self.uids.get(key) or None,
            ),
            reason=reason,
            message=message,
            type="Warning",
            source=client.V1EventSource(component="shoal"),
            reporting_component="shoal",
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            await self._retry(
                lambda: self._raw(
                    self.core.create_namespaced_event(namespace, body, _preload_content=False)
                )
            )
            self.counters["events"] += 1
        except ApiException as exc:
            log.warning("event not written pod=%s status=%s", key, exc.status)

    async def _group_status(self, event: PodGroupStatusChanged) -> None:
        if self.group_sources.get(event.group) != "scheduler-plugins":
            return
        namespace, name = self._split(event.group)
        status: dict[str, Any] = {"phase": event.phase, "scheduled": event.scheduled}
        try:
            await self._retry(
                lambda: self._raw(
                    self.custom.patch_namespaced_custom_object_status(
                        "scheduling.x-k8s.io",
                        "v1alpha1",
                        namespace,
                        "podgroups",
                        name,
                        {"status": status},
                        _preload_content=False,
                    )
                )
            )
            self.counters["group_status"] += 1
        except ApiException as exc:
            if exc.status != 404:
                log.warning("group status not written group=%s status=%s", event.group, exc.status)


def _message(exc: ApiException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, bytes | str):
        import json

        try:
            data = json.loads(body)
            return str(data.get("message", ""))
        except ValueError:
            return ""
    return ""
