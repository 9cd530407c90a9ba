"""The binder's evictions and the bindings that wait for them (``shards.kube.binder``).

An eviction goes to the Eviction API; a PodDisruptionBudget's refusal (429) or an API
out of reach is tried again with back-off (:class:`~shards.kube.victims.Victims` keeps
the schedule), and given up after ``eviction_attempts``: then the bindings waiting on
the victim's node fail. A binding onto a node whose victims are still there waits,
nominated (``status.nominatedNodeName``, as kube-scheduler writes it); the binder asks
the API whether such a victim is gone when ingest cannot tell it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from events.types import BindFailed, Event, PodBound
from shards.kube.apicall import ApiRetry, Unavailable, raw, split_key
from shards.kube.client import api_message, checked
from shards.kube.recorder import AS_MERGE_PATCH
from shards.kube.victims import Victims

log = logging.getLogger(__name__)


def bind_failed(event: PodBound, reason: str) -> BindFailed:
    """The record that rolls ``event`` back (the shard un-assumes and requeues the pod)."""
    return BindFailed(pod=event.pod, node=event.node, decision_id=event.decision_id, reason=reason)


class Evicter:
    """Evicts victims and nominates the bindings that wait for them, counting in
    ``counters`` (the binder's); ``gone`` is told of a victim found gone."""

    def __init__(
        self,
        core: client.CoreV1Api,
        retry: ApiRetry,
        victims: Victims,
        *,
        clock: Callable[[], int],
        counters: dict[str, int],
        gone: Callable[[str], None],
    ) -> None:
        self.core = core
        self.retry = retry
        self.victims = victims
        self.clock = clock
        self.counters = counters
        self.gone = gone

    def __repr__(self) -> str:
        return f"Evicter({self.victims.stats()})"

    async def evict(self, key: str, node: str, offset: int) -> list[Event]:
        """Evict ``key``; a disruption budget's refusal (429) is tried again later, and
        given up after ``eviction_attempts``: then the bindings waiting on its node fail."""
        namespace, name = split_key(key)
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
        try:
            await self.retry(
                lambda: raw(
                    self.core.create_namespaced_pod_eviction(
                        name, namespace, body, _preload_content=False
                    )
                ),
                busy=False,
            )
        except ApiException as exc:
            if exc.status == 404:  # already gone: it holds nothing
                self.gone(key)
                return []
            if exc.status != 429:
                self.victims.evictions.pop(key, None)
                log.error("eviction refused pod=%s status=%s", key, exc.status)
                return []
            return self._refused(key, node, offset, f"429 {api_message(exc) or exc.reason}")
        except Unavailable as exc:
            return self._refused(key, node, offset, f"API unavailable: {exc}")
        self.victims.evictions.pop(key, None)
        self.counters["evicted"] += 1
        return []

    def _refused(self, key: str, node: str, offset: int, why: str) -> list[Event]:
        self.counters["evictions_refused"] += 1
        waited = self.victims.refused(key, node, offset, why, self.clock())
        attempts = self.victims.attempts(key)
        if waited is None:
            log.warning("eviction refused; retrying pod=%s attempt=%d error=%s", key, attempts, why)
            return []
        self.counters["evictions_given_up"] += 1
        log.error("eviction given up pod=%s error=%s", key, why)
        self.counters["bind_failed"] += len(waited)
        return [bind_failed(e, f"victim {key} could not be evicted: {why}") for e in waited]

    async def is_gone(self, key: str, uid: str) -> bool:
        """Pod ``key`` (of ``uid``) is no longer in the cluster, or has finished: what
        the API says now (unreachable: not known to be gone)."""
        namespace, name = split_key(key)
        try:
            response = await checked(
                await self.core.read_namespaced_pod(name, namespace, _preload_content=False)
            )
            found = json.loads(await response.read())
        except ApiException as exc:
            return exc.status == 404
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return False
        meta = found.get("metadata") or {}
        phase = (found.get("status") or {}).get("phase")
        return meta.get("uid") != uid or phase in ("Succeeded", "Failed")

    async def nominate(self, event: PodBound, offset: int) -> None:
        """Hold ``event`` back until its node's victims are gone; tell the pod where it
        is going (``status.nominatedNodeName``), as kube-scheduler does."""
        if not self.victims.wait(offset, event, self.clock()):
            return
        self.counters["nominated"] += 1
        namespace, name = split_key(event.pod)
        body = {"status": {"nominatedNodeName": event.node}}
        try:
            await self.retry(
                lambda: raw(
                    self.core.patch_namespaced_pod_status(
                        name, namespace, body, **AS_MERGE_PATCH, _preload_content=False
                    )
                )
            )
        except (ApiException, Unavailable) as exc:
            # informational: the binding still waits, and still happens
            log.warning("nomination not written pod=%s error=%s", event.pod, exc)
