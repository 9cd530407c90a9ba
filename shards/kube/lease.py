"""Leader election with ``coordination.k8s.io/v1`` Leases (optimistic concurrency).

A candidate holds the lease while it renews it within ``lease_seconds``; another takes
over only once the holder's last renewal is older than that. Every write carries the
``resourceVersion`` it read, so two candidates can never both believe they won: the
loser's write gets 409 Conflict.

Each round reports to an :class:`~shards.kube.apihealth.ApiHealth` (shared by the
process's electors) what the API server did: answered usefully (a lease taken, renewed,
held by another, a race lost), or failed, by kind: ``unreachable`` (no answer: refused,
timed out), ``lease-namespace-missing`` (on create, 404 ``namespaces "X" not found``),
``forbidden`` (401/403: RBAC), ``http-NNN`` (any other status), ``error`` (an answer the
client could not take). Every call carries a time-out of two thirds of the lease
(client-go's renew deadline for its defaults, 10 s of 15 s), so that a server that
accepts connections and never answers is a failure too.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from events.errors import cause
from shards.kube.apihealth import ApiHealth

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
        health: ApiHealth | None = None,
    ) -> None:
        self.api = client.CoordinationV1Api(api)
        self.host = api.configuration.host
        self.health = health if health is not None else ApiHealth()
        self.timeout = max(lease_seconds * 2 / 3, 1.0)
        """Seconds a call to the API server may take."""
        self.rounds = 0
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
        """One round: become or stay leader if allowed; return whether leader now.
        An error status is reported to ``health`` and means not leader; no answer at
        all raises (``run`` reports it)."""
        self.rounds += 1
        now = self.clock()
        timeout = self.timeout
        try:
            lease = await self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=timeout
            )
        except ApiException as exc:
            if exc.status != 404:
                return self._failed("read", exc)
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                spec=self._spec(now, now, 0),
            )
            try:
                await self.api.create_namespaced_lease(
                    self.namespace, body, _request_timeout=timeout
                )
            except ApiException as create_exc:
                if create_exc.status == 409:  # another candidate created it first
                    return self._answered(False, "create lost: 409")
                return self._failed("create", create_exc)
            return self._answered(True, "created")
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity
        renewed = _aware(spec.renew_time)
        duration = spec.lease_duration_seconds or self.lease_seconds
        expired = renewed is None or (now - renewed).total_seconds() > duration
        if holder != self.identity and not expired:
            return self._answered(False, f"held by {holder}")
        transitions = (spec.lease_transitions or 0) + (0 if holder == self.identity else 1)
        acquired = spec.acquire_time if holder == self.identity else now
        lease.spec = self._spec(_aware(acquired) or now, now, transitions)
        try:
            await self.api.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=timeout
            )
        except ApiException as exc:
            if exc.status == 409:  # another candidate wrote first
                return self._answered(False, "write lost: 409")
            return self._failed("update", exc)
        return self._answered(
            True, "renewed" if holder == self.identity else f"took over from {holder}"
        )

    def _answered(self, leader: bool, why: str) -> bool:
        self.health.ok(self.name)
        return self._set(leader, why)

    def _failed(self, verb: str, exc: ApiException) -> bool:
        """An error status: report it by kind, with what to do about it."""
        status = exc.status or 0
        said = f"{status} {exc.reason or ''}".strip() + f": {_message(exc)}"
        lease = f"Lease {self.namespace}/{self.name}"
        if verb == "create" and status == 404 and _message(exc).startswith("namespaces "):
            kind = "lease-namespace-missing"
            message = (
                f"cannot create {lease}: its namespace {self.namespace!r} does not exist "
                f"(the API server said {said}); create namespace {self.namespace} or pass "
                "--namespace with one that exists"
            )
        elif status in (401, 403):
            kind = "forbidden"
            message = (
                f"the API server refused to {verb} {lease} ({said}); let this process's "
                f"user get, create and update leases in {self.namespace} (deploy/'s RBAC "
                "does)"
            )
        else:
            kind = f"http-{status}"
            message = f"the API server answered {verb} of {lease} with {said}"
        self.health.failed(self.name, kind, message, answered=True)
        return self._set(False, f"{verb} failed: {status}")

    def _unreachable(self, exc: BaseException) -> None:
        timed_out = isinstance(exc, TimeoutError)
        why = f"no answer within {self.timeout:g}s" if timed_out else cause(exc)
        message = (
            f"cannot reach the API server at {self.host} ({why}); check --host, "
            "--kubeconfig or $KUBECONFIG, and that the server is up"
        )
        self.health.failed(self.name, "unreachable", message, answered=False)
        self._set(False, f"{type(exc).__name__}: {exc}")

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
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                self._unreachable(exc)  # no answer: refused, reset, timed out, TLS...
            except Exception as exc:  # an answer the client could not take, a bug
                self.health.failed(
                    self.name,
                    "error",
                    f"Lease {self.namespace}/{self.name}: round failed: {cause(exc)}",
                    answered=False,
                )
                self._set(False, cause(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)


def _message(exc: ApiException) -> str:
    """The server's ``Status`` message, else its body, else the reason."""
    body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else exc.body
    try:
        message = json.loads(body or "")["message"]
    except (ValueError, TypeError, KeyError):
        return str(body or exc.reason or "no message").strip()[:300]
    return str(message)


def _aware(moment: Any) -> datetime.datetime | None:
    if moment is None:
        return None
    if isinstance(moment, str):
        moment = datetime.datetime.fromisoformat(moment.replace("Z", "+00:00"))
    if isinstance(moment, datetime.datetime) and moment.tzinfo is None:
        return moment.replace(tzinfo=datetime.UTC)
    return moment if isinstance(moment, datetime.datetime) else None
