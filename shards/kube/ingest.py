"""Ingest: list and watch the cluster, append what changed as events.

One *reflector* per kind lists, then watches (``shards.kube.reflector``: resumed after
a watch ends, relisted after ``410 Gone``, backed off after errors); a relist is
reconciled with what was already known (objects that vanished meanwhile are deleted),
so nothing is lost or told twice.

A failure to append to the log is not retried here: the ingest's own bookkeeping has
already moved on, so the caller starts a fresh ingest, which lists everything again;
the repeated events are absorbed by the shards' idempotent handlers.

Kinds (what each becomes, and what is refused: :mod:`shards.kube.translate`, whose
:class:`~shards.kube.translate.Translator` keeps what has been told): Nodes; Pods
(listed once nodes are, so that the first pods find them); PriorityClasses (listed
first, since pods need them); the pod-group kinds of scheduler-plugins, and
Kubernetes', Volcano's, KAI's and Tencent's PodGroups where the server serves them
(``shards.kube.groups``); ElasticQuotas; PodDisruptionBudgets (``policy/v1``, which
every server since v1.21 serves; where it is not served, ``policy/v1beta1``); DRA's
ResourceSlices, DeviceClasses and ResourceClaims where ``resource.k8s.io/v1`` is served
(:mod:`shards.kube.draingest`). An object the scheduler cannot accept is skipped with a
warning naming it and the field, and counted (``stats()["rejected"]``); nothing else is
lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Final

import aiohttp
import msgspec
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from events.codec import encode
from events.errors import InputError
from events.log import EventLog
from events.tasks import being_cancelled
from events.types import Envelope, Event, PodSubmitted
from shards.kube.client import KubeError
from shards.kube.draingest import KINDS as DRA_KINDS
from shards.kube.groups import DIALECTS, Dialect, GroupReflector, group_reflector
from shards.kube.reflector import JSON, Reflector
from shards.kube.translate import DEFAULT_SCHEDULER, Translator

log = logging.getLogger(__name__)


class KubeIngest(Translator):
    """Turns the cluster's objects into shoal events appended to ``log``."""

    def __init__(
        self,
        api: ApiClient,
        log_: EventLog,
        *,
        scheduler_names: Iterable[str] = (DEFAULT_SCHEDULER,),
        partition: int = 0,
        watch_seconds: int = 30,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        super().__init__(scheduler_names)
        self.api = api
        self.log = log_
        self.partition = partition
        self.clock = clock
        self.watch_seconds = watch_seconds
        self.appended = 0
        self._holding = 0
        self._pending: list[Envelope] = []
        """Envelopes emitted while a watch batch is handled, appended at its end."""
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)
        scheduling = client.SchedulingV1Api(api)

        def resource(plural: str) -> Callable[..., Awaitable[Any]]:
            async def call(**kwargs: Any) -> Any:
                return await custom.list_cluster_custom_object(
                    "resource.k8s.io", "v1", plural, **kwargs
                )

            return call

        self._dra_calls = {
            "resourceslices": resource("resourceslices"),
            "deviceclasses": resource("deviceclasses"),
            "resourceclaims": resource("resourceclaims"),
        }

        def crd(plural: str) -> Callable[..., Awaitable[Any]]:
            async def call(**kwargs: Any) -> Any:
                return await custom.list_cluster_custom_object(
                    "scheduling.x-k8s.io", "v1alpha1", plural, **kwargs
                )

            return call

        self.reflectors = [
            self._reflector(
                "priorityclasses", scheduling.list_priority_class, self._priority_class
            ),
            self._reflector("nodes", core.list_node, self._node),
            self._reflector("podgroups", crd("podgroups"), self._pod_group),
            *(self._reflector(d.reflector, None, self._group_of(d), dialect=d) for d in DIALECTS),
            self._reflector("elasticquotas", crd("elasticquotas"), self._quota),
            self._reflector("poddisruptionbudgets", self._budgets_call(), self._budget),
            self._reflector("pods", core.list_pod_for_all_namespaces, self._pod),
        ]
        self.dialects = {r.name: r for r in self.reflectors if isinstance(r, GroupReflector)}
        """The reflectors of the pod-group dialects served or not (``shards.kube.groups``)."""

    def __repr__(self) -> str:
        return (
            f"KubeIngest(nodes={len(self.nodes)}, pods={len(self.pods)}, appended={self.appended})"
        )

    def stats(self) -> dict[str, int]:
        return {
            "nodes": len(self.nodes),
            "pods": len(self.pods),
            "appended": self.appended,
            "rejected": len(self.rejected),
            **self.dra.stats(),
            **{f"{r.name}_{k}": v for r in self.reflectors for k, v in r.counters.items()},
        }

    def _reflector(
        self,
        name: str,
        call: Callable[..., Awaitable[Any]] | None,
        handle: Callable[[str, JSON], list[Event]],
        *,
        dialect: Dialect | None = None,
    ) -> Reflector:
        """A reflector of ``call`` (list or watch), its events told by ``handle``; of
        ``dialect``'s PodGroups once the server serves them, when one is given."""
        known: dict[tuple[str, str], JSON] = {}

        async def on_event(kind: str, obj: JSON) -> None:
            meta = obj.get("metadata") or {}
            key = (meta.get("namespace") or "", meta.get("name") or "")
            if kind == "DELETED":
                known.pop(key, None)
            else:
                known[key] = obj
            await self._emit(handle(kind, obj))

        async def on_relist(items: list[JSON]) -> None:
            seen = {
                ((i.get("metadata") or {}).get("namespace") or "", i["metadata"]["name"]): i
                for i in items
            }
            events: list[Event] = []
            for key, obj in list(known.items()):
                if key not in seen:
                    del known[key]
                    events.extend(handle("DELETED", obj))
            for key, obj in seen.items():
                if known.get(key, {}).get("metadata", {}).get("resourceVersion") != obj[
                    "metadata"
                ].get("resourceVersion"):
                    known[key] = obj
                    events.extend(handle("MODIFIED", obj))
            await self._emit(events)

        if dialect is not None:
            return group_reflector(
                self.api,
                dialect,
                on_event,
                on_relist,
                watch_seconds=self.watch_seconds,
                batch=self._held,
            )
        assert call is not None
        return Reflector(
            name, call, on_event, on_relist, watch_seconds=self.watch_seconds, batch=self._held
        )

    @contextlib.asynccontextmanager
    async def _held(self) -> AsyncIterator[None]:
        """Events emitted inside are appended together on the way out (one record
        batch), those emitted before a failure included."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
            if not self._holding and self._pending:
                pending, self._pending = self._pending, []
                await self._append(pending)

    async def _emit(self, events: list[Event]) -> None:
        """Append ``events`` (what one watch event or one relist changed; inside a watch
        batch, at the batch's end with the rest of it). Each is
        encoded first: one that cannot be (a value no record can hold) is left out and
        reported, and the others are appended, so that one bad object never stops the
        rest (a relist appends every object in one call)."""
        if not events:
            return
        now = self.clock()
        envelopes = [Envelope(event=e, time=now, producer="ingest") for e in events]
        if self._holding:
            self._pending.extend(envelopes)
            return
        await self._append(envelopes)

    async def _append(self, envelopes: list[Envelope]) -> None:
        now = self.clock()
        try:
            await self.log.append(envelopes, self.partition)
        except _UNENCODABLE:
            # nothing was appended (an append encodes every record first): find the
            # records that cannot be encoded, report them, append the others
            kept = []
            for env in envelopes:
                try:
                    encode(env)
                except _UNENCODABLE as exc:
                    problem = InputError(f"cannot be recorded: {exc}")
                    event = env.event
                    if isinstance(event, PodSubmitted):
                        self.pods.pop(event.pod.key, None)
                        refusal = self._refuse_pod(event.pod.key, {"uid": event.pod.uid}, problem)
                        kept += [Envelope(event=e, time=now, producer="ingest") for e in refusal]
                    else:
                        self._reject(f"{type(event).__name__} {_subject(event)}", problem)
                    continue
                kept.append(env)
            if not kept:
                return
            await self.log.append(kept, self.partition)
            envelopes = kept
        self.appended += len(envelopes)

    # ------------------------------------------------------------------ calls

    def _group_of(self, dialect: Dialect) -> Callable[[str, JSON], list[Event]]:
        """The handler of ``dialect``'s PodGroups, at the version its reflector found."""

        def handle(kind: str, obj: JSON) -> list[Event]:
            version = self.dialects[dialect.reflector].version
            return self._pod_group(kind, obj, f"{dialect.group}/{version}")

        return handle

    def _budgets_call(self) -> Callable[..., Awaitable[Any]]:
        """List or watch PodDisruptionBudgets at ``policy/v1``, or at ``policy/v1beta1``
        once the former answers 404 (a server older than v1.21; kubernetes-asyncio no
        longer has that version: a raw call); the version answering is kept."""
        api = self.api
        policy = client.PolicyV1Api(api)
        names = {
            "watch": "watch",
            "resource_version": "resourceVersion",
            "timeout_seconds": "timeoutSeconds",
            "allow_watch_bookmarks": "allowWatchBookmarks",
        }

        async def call(**kwargs: Any) -> Any:
            if self.budget_versions[0] == "v1":
                response: Any = await policy.list_pod_disruption_budget_for_all_namespaces(**kwargs)
                if response.status != 404:
                    return response
                response.release()
                self.budget_versions = ("v1beta1",)
            query = [(names[k], v) for k, v in kwargs.items() if k in names and v is not None]
            return await api.call_api(
                "/apis/policy/v1beta1/poddisruptionbudgets",
                "GET",
                query_params=query,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=False,
                _request_timeout=kwargs.get("_request_timeout"),
            )

        return call

    async def _dra_served(self, stop: asyncio.Event) -> bool:
        """Whether the server serves ``resource.k8s.io/v1`` (v1.34 and later) and this
        ingest may list it (else DRA objects are not watched, and the log says so once);
        asked again with back-off while the server cannot be reached."""
        delay = 0.05
        while not stop.is_set():
            try:
                await self._dra_calls["resourceslices"](limit=1)
                return True
            except ApiException as exc:
                if exc.status in (403, 404):
                    log.info("DRA not watched: resource.k8s.io/v1 answered %s", exc.status)
                    return False
                why = f"API error {exc.status} {exc.reason}"
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                why = f"{type(exc).__name__}: {exc}"
            log.warning(
                "asking for resource.k8s.io/v1 failed; retrying in=%.2fs error=%s", delay, why
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, 5.0)
        return False

    # ------------------------------------------------------------------ running

    async def run(self, stop: asyncio.Event) -> None:
        """Run every reflector until ``stop``, each started once the kinds it waits for
        (:data:`STARTS_AFTER`) have been listed: every other kind after priority classes
        (a pod needs its class), pods after nodes too, so that the first pods a shard
        sees find the cluster's nodes there, as kube-scheduler waits for its caches to
        sync. (Listed concurrently, pods could come first: each then failed for want of
        nodes and waited out its back-off.) The pod-group and quota kinds are waited for
        by nobody: their CRDs may not be installed, and their lists never succeed."""
        if await self._dra_served(stop):
            for plural in DRA_KINDS:

                def handle(kind: str, obj: JSON, plural: str = plural) -> list[Event]:
                    return self._dra(plural, kind, obj)

                self.reflectors.insert(-1, self._reflector(plural, self._dra_calls[plural], handle))
        by_name = {reflector.name: reflector for reflector in self.reflectors}
        async with asyncio.TaskGroup() as tasks:
            for reflector in self.reflectors:
                for name in STARTS_AFTER.get(reflector.name, ()):
                    if name in by_name:  # the DRA kinds: where the server serves them
                        await _wait_any(by_name[name].synced, stop)
                tasks.create_task(_watched(reflector, stop))

    async def synced(self) -> None:
        """Wait until every kind has been listed once."""
        for reflector in self.reflectors:
            await reflector.synced.wait()


STARTS_AFTER: Final = {
    "nodes": ("priorityclasses",),
    "podgroups": ("priorityclasses",),
    **{d.reflector: ("priorityclasses",) for d in DIALECTS},
    "elasticquotas": ("priorityclasses",),
    "poddisruptionbudgets": ("priorityclasses",),
    "pods": ("priorityclasses", "nodes", "resourceslices", "deviceclasses", "resourceclaims"),
    "resourceslices": ("nodes",),
}
"""The kinds each kind's reflector waits to see listed before it starts."""


async def _watched(reflector: Reflector, stop: asyncio.Event) -> None:
    """Run ``reflector``; one that ends before ``stop`` (a ``CancelledError`` from a
    library, which a TaskGroup would let pass in silence) fails the ingest, so that it
    is started again instead of missing that kind from then on."""
    try:
        await reflector.run(stop)
    except asyncio.CancelledError:
        if being_cancelled():
            raise
    if not stop.is_set():
        raise KubeError(f"{reflector.name}: the watch ended unexpectedly")


async def _wait_any(event: asyncio.Event, stop: asyncio.Event) -> None:
    waiters = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


_UNENCODABLE = (OverflowError, msgspec.EncodeError)
"""What encoding a record raises for a value no record can hold (an int beyond 64 bits)."""


def _subject(event: Event) -> str:
    """What ``event`` is about, for a message: a pod's or node's name."""
    for attribute in ("pod", "node", "group", "quota"):
        value = getattr(event, attribute, None)
        if isinstance(value, str):
            return value
        key = getattr(value, "key", None) or getattr(value, "name", None)
        if isinstance(key, str):
            return key
    return ""
