"""``FailedScheduling`` Events, aggregated and rate-limited as kube-scheduler's are; and
the pod's ``PodScheduled=False`` condition (:class:`PodScheduledWriter`).

kube-scheduler writes ``events.k8s.io/v1`` Events through client-go's event broadcaster
(``k8s.io/client-go/tools/events``), and so does this module wherever the server serves
that API (asked once, by discovery); where it does not, it writes ``core/v1`` Events as
client-go's older recorder (``tools/record``) does. ``kubectl describe pod`` shows both:
they are one store, seen through two APIs. What both do, and this module too:

- **aggregation**: a pod's second and later Events with the same reason do not create
  new objects. ``events.k8s.io/v1`` (the broadcaster): the Event's ``series`` gets the
  count and ``lastObservedTime`` (a patch of ``series`` only: the server keeps an
  Event's ``note``, ``eventTime`` and the rest immutable, so the note stays the first
  one's, as kube-scheduler's does; the pod's condition carries the latest answer); a
  repetition more than ``series_seconds`` (client-go's 6 minutes) after the last one
  seen starts a new Event. ``core/v1`` (the recorder): the one Event of that pod and
  reason gets its ``count`` raised, its ``lastTimestamp`` and ``message`` brought up to
  date (a merge patch of those fields). ``kubectl describe pod`` then shows ``(x12 over
  3m)`` instead of twelve lines. An Event the server has dropped meanwhile (they live
  an hour) is created again.
- **a spam filter**: each pod has a token bucket (``burst`` writes, then one every
  ``refill_seconds``, client-go's 25 and 5 minutes). A repetition that finds the bucket
  empty is not written, only counted, and the next write carries the count.

An ``events.k8s.io/v1`` Event says what kube-scheduler's say: ``reportingController``
the component (``shoal``), ``reportingInstance`` the component and the host (the pod's
name), ``action: Scheduling``, ``regarding`` the pod (with its uid), the note cut to the
server's 1,024 characters as kube-scheduler cuts it.

What is remembered is bounded: a pod is forgotten when it is bound or gone
(:meth:`EventRecorder.forget`), and at most ``max_pods`` pods are remembered (the
oldest is dropped; its next Event is created afresh, as after a restart, when nothing
is remembered either).
"""

from __future__ import annotations

import datetime
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from shards.kube.client import KubeError, checked
from shards.kube.groups import Dialect, served_version

log = logging.getLogger(__name__)

MERGE_PATCH: Final = "application/merge-patch+json"
"""What a merge patch must say it is: the client would send a dict as a JSON Patch,
which the API server refuses (400) for custom resources and Events alike."""
AS_MERGE_PATCH: Final[dict[str, Any]] = {"_content_type": MERGE_PATCH}
"""The keyword that makes a client's patch call send a merge patch (its typing lacks it)."""
AS_STRATEGIC: Final[dict[str, Any]] = {"_content_type": "application/strategic-merge-patch+json"}
"""A strategic merge patch: a pod's ``status.conditions`` are merged by type."""
NS_PER_S: Final = 1_000_000_000
EVENTS_V1: Final = Dialect("events", "events.k8s.io", ("v1",), "events")
"""The API kube-scheduler writes its Events to (asked by discovery, as any group)."""
CORE: Final = "v1"
ACTION: Final = "Scheduling"
"""An ``events.k8s.io/v1`` Event's ``action`` (required): kube-scheduler's."""
NOTE_LIMIT: Final = 1024
"""The most bytes of an ``events.k8s.io/v1`` note the server takes (``NoteLengthLimit``)."""
INSTANCE_LIMIT: Final = 128
"""The most characters of a ``reportingInstance`` (``ReportingInstanceLengthLimit``)."""


def note_of(message: str) -> str:
    """``message`` as a note the server takes: cut to ``NOTE_LIMIT`` bytes, ending in
    `` ...`` where cut (kube-scheduler's ``truncateMessage``)."""
    raw = message.encode()
    if len(raw) <= NOTE_LIMIT:
        return message
    return raw[: NOTE_LIMIT - 4].decode(errors="ignore") + " ..."


def micro_time(ns: int) -> str:
    """A ``MicroTime``: RFC 3339 with microseconds (``eventTime``, ``lastObservedTime``)."""
    stamp = datetime.datetime.fromtimestamp(ns // NS_PER_S, datetime.UTC)
    return stamp.replace(microsecond=ns // 1000 % 1_000_000).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _seconds(ns: int) -> str:
    """A ``Time``: RFC 3339 to the second (``core/v1``'s ``lastTimestamp``)."""
    stamp = datetime.datetime.fromtimestamp(ns / NS_PER_S, datetime.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Told:
    """One pod's Event of one reason: its name, the occurrences it counts, the API it
    was written through and when the last occurrence was seen (ns)."""

    name: str
    count: int
    api: str
    seen: int


@dataclass
class _Pod:
    """One pod's Events (by reason) and its token bucket."""

    uid: str
    tokens: float
    refilled: int
    events: dict[str, _Told] = field(default_factory=dict)
    unwritten: dict[str, int] = field(default_factory=dict)


class EventRecorder:
    """Writes Warning Events on pods through ``api``; ``retry`` runs one API call with the
    binder's retries. The caller translates ``ApiException``s it raises into log lines;
    nothing here raises anything else."""

    def __init__(
        self,
        api: ApiClient,
        retry: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]],
        *,
        clock: Callable[[], int],
        component: str = "shoal",
        instance: str | None = None,
        burst: int = 25,
        refill_seconds: float = 300.0,
        series_seconds: float = 360.0,
        max_pods: int = 100_000,
    ) -> None:
        self.client = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.retry = retry
        self.clock = clock
        self.component = component
        self.instance = (instance or f"{component}-{socket.gethostname()}")[:INSTANCE_LIMIT]
        """``reportingInstance``: as kube-scheduler's, the controller and the host."""
        self.burst = burst
        self.refill_ns = int(refill_seconds * NS_PER_S)
        self.series_ns = int(series_seconds * NS_PER_S)
        self.max_pods = max_pods
        self.api: str | None = None
        """Where Events are written: ``events.k8s.io/v1`` or (not served) ``v1``; None
        until discovery has answered."""
        self.pods: dict[str, _Pod] = {}
        self.counters = {"created": 0, "bumped": 0, "suppressed": 0}

    def __repr__(self) -> str:
        return f"EventRecorder(api={self.api}, pods={len(self.pods)}, {self.counters})"

    def forget(self, key: str) -> None:
        """``key`` was bound or is gone: its Events need no more bumps."""
        self.pods.pop(key, None)

    async def _discover(self) -> str:
        """The API to write to, asked once (an answer that is not one is asked again)."""
        if self.api is None:
            try:
                served = await self.retry(lambda: served_version(self.client, EVENTS_V1))
            except KubeError as exc:
                log.warning("events.k8s.io discovery unreadable; core/v1 this time: %s", exc)
                return CORE
            self.api = f"{EVENTS_V1.group}/{served}" if served else CORE
            log.info("Events written through api=%s", self.api)
        return self.api

    async def warn(self, key: str, uid: str, reason: str, message: str) -> bool:
        """Record a Warning ``reason`` on pod ``key``; True if the API was written."""
        now = self.clock()
        pod = self.pods.get(key)
        if pod is None or pod.uid != uid:
            if pod is None and len(self.pods) >= self.max_pods:
                del self.pods[next(iter(self.pods))]
            pod = self.pods[key] = _Pod(uid=uid, tokens=float(self.burst), refilled=now)
        if self.refill_ns > 0:
            pod.tokens = min(float(self.burst), pod.tokens + (now - pod.refilled) / self.refill_ns)
        pod.refilled = now
        if pod.tokens < 1:
            pod.unwritten[reason] = pod.unwritten.get(reason, 0) + 1
            known = pod.events.get(reason)
            if known is not None:
                known.seen = now
            self.counters["suppressed"] += 1
            return False
        pod.tokens -= 1
        api = await self._discover()
        occurrences = 1 + pod.unwritten.pop(reason, 0)
        known = pod.events.get(reason)
        if known is not None and self._continues(known, api, now):
            try:
                await self._bump(key, known, occurrences, message, now)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                # expired on the server (Events live an hour): created again below
                occurrences += known.count
            else:
                known.count += occurrences
                known.seen = now
                self.counters["bumped"] += 1
                return True
        # client-go names an Event "<object>.<nanoseconds in hex>"
        told = _Told(name=f"{key.split('/', 1)[1]}.{now:x}", count=occurrences, api=api, seen=now)
        if api == CORE:
            await self._create_core(key, uid, told, reason, message)
        else:
            await self._create(key, uid, told, reason, message)
        pod.events[reason] = told
        self.counters["created"] += 1
        return True

    def _continues(self, known: _Told, api: str, now: int) -> bool:
        """Whether a repetition is counted on the Event ``known``: a ``core/v1`` one always
        (client-go's recorder), an ``events.k8s.io/v1`` one while its series goes on
        (the broadcaster ends a series ``series_seconds`` after its last occurrence)."""
        if known.api != api:
            return False
        return api == CORE or now - known.seen <= self.series_ns

    async def _bump(self, key: str, known: _Told, occurrences: int, message: str, now: int) -> None:
        """Count ``occurrences`` more on the Event ``known``: its ``series`` (the rest of
        an ``events.k8s.io/v1`` Event is immutable), or its ``count``, ``lastTimestamp``
        and ``message`` (``core/v1``)."""
        namespace = key.split("/", 1)[0]
        count = known.count + occurrences
        if known.api == CORE:
            body: dict[str, Any] = {
                "count": count,
                "lastTimestamp": _seconds(now),
                "message": message,
            }
            await self.retry(
                lambda: _raw(
                    self.core.patch_namespaced_event(
                        known.name, namespace, body, **AS_MERGE_PATCH, _preload_content=False
                    )
                )
            )
            return
        body = {"series": {"count": count, "lastObservedTime": micro_time(now)}}
        await self.retry(
            lambda: _raw(
                self.custom.patch_namespaced_custom_object(
                    "events.k8s.io",
                    "v1",
                    namespace,
                    "events",
                    known.name,
                    body,
                    **AS_MERGE_PATCH,
                    _preload_content=False,
                )
            )
        )

    async def _create(self, key: str, uid: str, told: _Told, reason: str, message: str) -> None:
        """Create an ``events.k8s.io/v1`` Event; one that counts several occurrences (some
        were held back, or its predecessor expired) is created with its ``series``."""
        namespace, name = key.split("/", 1)
        regarding = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name}
        if uid:
            regarding["uid"] = uid  # what `kubectl describe pod` selects a pod's Events by
        event: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": told.name, "namespace": namespace},
            "eventTime": micro_time(told.seen),
            "reportingController": self.component,
            "reportingInstance": self.instance,
            "action": ACTION,
            "reason": reason,
            "regarding": regarding,
            "note": note_of(message),
            "type": "Warning",
        }
        if told.count > 1:
            event["series"] = {"count": told.count, "lastObservedTime": micro_time(told.seen)}
        await self.retry(
            lambda: _raw(
                self.custom.create_namespaced_custom_object(
                    "events.k8s.io", "v1", namespace, "events", event, _preload_content=False
                )
            )
        )

    async def _create_core(
        self, key: str, uid: str, told: _Told, reason: str, message: str
    ) -> None:
        """Create a ``core/v1`` Event (a server without ``events.k8s.io/v1``)."""
        namespace, name = key.split("/", 1)
        stamp = datetime.datetime.fromtimestamp(told.seen / NS_PER_S, datetime.UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=told.name, namespace=namespace),
            # uid and apiVersion: what `kubectl describe pod` selects the pod's Events by
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Pod", name=name, namespace=namespace, uid=uid or None
            ),
            reason=reason,
            message=message,
            type="Warning",
            source=client.V1EventSource(component=self.component),
            reporting_component=self.component,
            first_timestamp=stamp,
            last_timestamp=stamp,
            count=told.count,
        )
        await self.retry(
            lambda: _raw(
                self.core.create_namespaced_event(namespace, event, _preload_content=False)
            )
        )


class PodScheduledWriter:
    """Sets a pending pod's ``PodScheduled`` condition to ``False`` (reason
    ``Unschedulable``, the ``FailedScheduling`` Event's message), as kube-scheduler does;
    the API server turns it ``True`` when the pod is bound. Written again only when the
    message changes; at most ``max_pods`` pods remembered (the oldest forgotten: its
    next message is written again, harmlessly)."""

    def __init__(
        self,
        core: client.CoreV1Api,
        retry: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]],
        *,
        clock: Callable[[], int],
        max_pods: int = 100_000,
    ) -> None:
        self.core = core
        self.retry = retry
        self.clock = clock
        self.max_pods = max_pods
        self.written: dict[str, str] = {}
        """Pods whose condition was written → its message."""

    def forget(self, key: str) -> None:
        """``key`` was bound or is gone."""
        self.written.pop(key, None)

    async def unschedulable(self, key: str, message: str) -> bool:
        """Write pod ``key``'s condition unless it says ``message`` already; True if the
        API was written. Raises what ``retry`` raises."""
        if self.written.get(key) == message:
            return False
        namespace, name = key.split("/", 1)
        stamp = datetime.datetime.fromtimestamp(self.clock() / NS_PER_S, datetime.UTC)
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        body = {"status": {"conditions": [condition]}}
        await self.retry(
            lambda: _raw(
                self.core.patch_namespaced_pod_status(
                    name, namespace, body, **AS_STRATEGIC, _preload_content=False
                )
            )
        )
        if key not in self.written and len(self.written) >= self.max_pods:
            del self.written[next(iter(self.written))]
        self.written[key] = message
        return True


async def _raw(call: Awaitable[Any]) -> None:
    """Await a raw (``_preload_content=False``) call; ``ApiException`` if not 2xx."""
    response = await checked(await call)
    response.release()
