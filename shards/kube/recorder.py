"""``FailedScheduling`` Events, aggregated and rate-limited as kube-scheduler's are; and
the pod's ``PodScheduled=False`` condition (:class:`PodScheduledWriter`).

kube-scheduler writes Events through client-go's recorder, which does two things this
module does too:

- **aggregation**: a pod's second and later Events with the same reason do not create
  new objects: the one Event of that pod and reason gets its ``count`` raised, its
  ``lastTimestamp`` and ``message`` brought up to date (a merge patch of those fields).
  ``kubectl describe pod`` then shows ``(x12 over 3m)`` instead of twelve lines. An Event
  the server has dropped meanwhile (they live an hour) is created again.
- **a spam filter**: each pod has a token bucket (``burst`` writes, then one every
  ``refill_seconds``, client-go's 25 and 5 minutes). A repetition that finds the bucket
  empty is not written, only counted, and the next write carries the count.

What is remembered is bounded: a pod is forgotten when it is bound or gone
(:meth:`EventRecorder.forget`), and at most ``max_pods`` pods are remembered (the
oldest is dropped; its next Event is created afresh, as after a restart, when nothing
is remembered either).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from shards.kube.client import checked

log = logging.getLogger(__name__)

MERGE_PATCH: Final = "application/merge-patch+json"
"""What a merge patch must say it is: the client would send a dict as a JSON Patch,
which the API server refuses (400) for custom resources and Events alike."""
AS_MERGE_PATCH: Final[dict[str, Any]] = {"_content_type": MERGE_PATCH}
"""The keyword that makes a client's patch call send a merge patch (its typing lacks it)."""
AS_STRATEGIC: Final[dict[str, Any]] = {"_content_type": "application/strategic-merge-patch+json"}
"""A strategic merge patch: a pod's ``status.conditions`` are merged by type."""
NS_PER_S: Final = 1_000_000_000


@dataclass
class _Pod:
    """One pod's Events (reason → the Event's name and count) and its token bucket."""

    uid: str
    tokens: float
    refilled: int
    events: dict[str, tuple[str, int]] = field(default_factory=dict)
    unwritten: dict[str, int] = field(default_factory=dict)


class EventRecorder:
    """Writes Warning Events on pods through ``core`` (a ``CoreV1Api``); ``retry`` runs one
    API call with the binder's retries. The caller translates ``ApiException``s it
    raises into log lines; nothing here raises anything else."""

    def __init__(
        self,
        core: client.CoreV1Api,
        retry: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]],
        *,
        clock: Callable[[], int],
        component: str = "shoal",
        burst: int = 25,
        refill_seconds: float = 300.0,
        max_pods: int = 100_000,
    ) -> None:
        self.core = core
        self.retry = retry
        self.clock = clock
        self.component = component
        self.burst = burst
        self.refill_ns = int(refill_seconds * NS_PER_S)
        self.max_pods = max_pods
        self.pods: dict[str, _Pod] = {}
        self.counters = {"created": 0, "bumped": 0, "suppressed": 0}

    def __repr__(self) -> str:
        return f"EventRecorder(pods={len(self.pods)}, {self.counters})"

    def forget(self, key: str) -> None:
        """``key`` was bound or is gone: its Events need no more bumps."""
        self.pods.pop(key, None)

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
            self.counters["suppressed"] += 1
            return False
        pod.tokens -= 1
        occurrences = 1 + pod.unwritten.pop(reason, 0)
        namespace, name = key.split("/", 1)
        stamp = datetime.datetime.fromtimestamp(now / NS_PER_S, datetime.UTC)
        known = pod.events.get(reason)
        if known is not None:
            event_name, count = known
            body = {
                "count": count + occurrences,
                "lastTimestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "message": message,
            }
            try:
                await self.retry(
                    lambda: _raw(
                        self.core.patch_namespaced_event(
                            event_name,
                            namespace,
                            body,
                            **AS_MERGE_PATCH,
                            _preload_content=False,
                        )
                    )
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
                # expired on the server (Events live an hour): created again below
                occurrences += count
            else:
                pod.events[reason] = (event_name, count + occurrences)
                self.counters["bumped"] += 1
                return True
        # client-go names an Event "<object>.<nanoseconds in hex>"
        event_name = f"{name}.{now:x}"
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=event_name, namespace=namespace),
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
            count=occurrences,
        )
        await self.retry(
            lambda: _raw(
                self.core.create_namespaced_event(namespace, event, _preload_content=False)
            )
        )
        pod.events[reason] = (event_name, occurrences)
        self.counters["created"] += 1
        return True


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
