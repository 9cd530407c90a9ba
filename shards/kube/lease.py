"""Leader election with ``coordination.k8s.io/v1`` Leases (optimistic concurrency).

A candidate holds the lease while it renews it within ``lease_seconds``; another takes
over only once the holder's last renewal is older than that. Every write carries the
``resourceVersion`` it read, so two candidates can never both believe they won: the
loser's write gets 409 Conflict.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LeaderElector:
    def __init__(
        self,
        api: ApiClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: int = 15,
        clock: Callable[[], datetime.datetime] = _now,
    ) -> None:
        self.api = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.leader = False
        self.transitions = 0

    def __repr__(self) -> str:
        return (
            f"LeaderElector({self.namespace}/{self.name}, identity={self.identity!r}, "
            f"leader={self.leader})"
        )

    async def try_acquire_or_renew(self) -> bool:
        """One round: become or stay leader if allowed; return whether leader now."""
        now = self.clock()
        try:
            lease = await self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                return self._set(False, f"read failed: {exc.status}")
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                spec=self._spec(now, now, 0),
            )
            try:
                await self.api.create_namespaced_lease(self.namespace, body)
            except ApiException as create_exc:
                return self._set(False, f"create lost: {create_exc.status}")
            return self._set(True, "created")
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity
        renewed = _aware(spec.renew_time)
        duration = spec.lease_duration_seconds or self.lease_seconds
        expired = renewed is None or (now - renewed).total_seconds() > duration
        if holder != self.identity and not expired:
            return self._set(False, f"held by {holder}")
        transitions = (spec.lease_transitions or 0) + (0 if holder == self.identity else 1)
        acquired = spec.acquire_time if holder == self.identity else now
        lease.spec = self._spec(_aware(acquired) or now, now, transitions)
        try:
            await self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as exc:
            return self._set(False, f"write lost: {exc.status}")
        return self._set(True, "renewed" if holder == self.identity else f"took over from {holder}")

    def _spec(
        self, acquired: datetime.datetime, renewed: datetime.datetime, transitions: int
    ) -> Any:
        return client.V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=self.lease_seconds,
            acquire_time=acquired,
            renew_time=renewed,
            lease_transitions=transitions,
        )

    def _set(self, leader: bool, why: str) -> bool:
        if leader != self.leader:
            self.transitions += 1
            log.info(
                "leadership changed lease=%s identity=%s leader=%s why=%s",
                self.name,
                self.identity,
                leader,
                why,
            )
        self.leader = leader
        return leader

    async def run(self, stop: asyncio.Event, renew_every: float | None = None) -> None:
        """Keep trying until ``stop``; ``leader`` tells the current state."""
        interval = renew_every if renew_every is not None else self.lease_seconds / 3
        while not stop.is_set():
            try:
                await self.try_acquire_or_renew()
            except Exception as exc:
                self._set(False, f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)


def _aware(moment: Any) -> datetime.datetime | None:
    if moment is None:
        return None
    if isinstance(moment, str):
        moment = datetime.datetime.fromisoformat(moment.replace("Z", "+00:00"))
    if isinstance(moment, datetime.datetime) and moment.tzinfo is None:
        return moment.replace(tzinfo=datetime.UTC)
    return moment if isinstance(moment, datetime.datetime) else None
