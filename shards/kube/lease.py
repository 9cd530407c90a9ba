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
client could not take). A server that accepts connections and never answers is a
failure too (every call runs under a time-out, below).

Timing follows client-go's ``leaderelection`` (the same three knobs and defaults):

- ``lease_seconds`` (15 s, client-go's ``LeaseDuration``): how long a candidate waits,
  after it last *saw the lease record change*, before it takes the lease over. Expiry
  is judged by the candidate's own monotonic clock (``observed``), never by comparing
  the holder's ``renewTime`` with our clock: a holder whose clock runs ahead or behind
  cannot make a candidate take over early or late;
- ``renew_deadline`` (10 s, ``RenewDeadline``): a leader that has not renewed
  successfully within it steps down at once (:meth:`LeaderElector.leading` turns
  false the moment it passes, before any renewal round notices), so it stops leading
  while the lease is still its own for ``lease_seconds - renew_deadline``;
- ``retry_period`` (2 s, ``RetryPeriod``): the time between rounds.

Every API call runs under ``request_timeout`` (and a leader's, under what is left of
its renew deadline), so a renewal that hangs (an API server that accepts and never
answers) fails instead of keeping the replica leader.

Each term carries an **epoch** (:attr:`LeaderElector.epoch`): the Lease's
``leaseTransitions`` as this candidate wrote it when it took the lease. Writes are
compare-and-swap on ``resourceVersion``, and a takeover writes a higher count than it
read, so every term's epoch is higher than the one before, as long as the Lease object
lives. A Lease deleted and created again would start from 0: the caller sets
:attr:`LeaderElector.floor` (one above the highest epoch its log has seen) and a new
term never takes an epoch below it (:meth:`LeaderElector.advance_epoch` raises the
current term's). The epoch fences the log (``events.fence``): a deposed leader's late
appends carry an older epoch and are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from events.errors import cause
from shards.kube.apihealth import ApiHealth

log = logging.getLogger(__name__)
_T = TypeVar("_T")


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
        renew_deadline: float | None = None,
        retry_period: float | None = None,
        request_timeout: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = client.CoordinationV1Api(api)
        self.host = api.configuration.host
        self.health = health if health is not None else ApiHealth()
        self.rounds = 0
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.clock = clock
        """Wall clock: only for the times written into the Lease (for people to read)."""
        self.renew_deadline = (
            renew_deadline if renew_deadline is not None else lease_seconds * 2 / 3
        )
        self.retry_period = retry_period if retry_period is not None else lease_seconds * 2 / 15
        self.request_timeout = (
            request_timeout if request_timeout is not None else self.renew_deadline
        )
        self.monotonic = monotonic
        """Our own clock: expiry and the renew deadline are measured with it only."""
        if not 0 < self.retry_period < self.renew_deadline < self.lease_seconds:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration "
                f"(got {self.retry_period:g}, {self.renew_deadline:g}, {self.lease_seconds:g})"
            )
        self.leader = False
        self.transitions = 0
        self.epoch = 0
        """The epoch of the current (or last) term: 0 before the first."""
        self.floor = 0
        """The lowest epoch a new term may take (one above the log's highest)."""
        self.renewed_at = float("-inf")
        """When (``monotonic``) this leader last renewed successfully."""
        self._observed: tuple[object, ...] | None = None
        self._observed_at = 0.0
        """The last lease record we read, and when (``monotonic``) it last changed."""

    def __repr__(self) -> str:
        return (
            f"LeaderElector({self.namespace}/{self.name}, identity={self.identity!r}, "
            f"leader={self.leader}, epoch={self.epoch})"
        )

    def leading(self) -> bool:
        """Whether this replica may act as leader now: it holds the lease and renewed
        it within ``renew_deadline`` (measured now, not at the last round: a process
        frozen and resumed is not leading, whatever ``leader`` still says)."""
        return self.leader and self.monotonic() - self.renewed_at < self.renew_deadline

    def stats(self) -> dict[str, float]:
        return {
            "leader": float(self.leading()),
            "epoch": float(self.epoch),
            "transitions": float(self.transitions),
            "since_renewal": self.monotonic() - self.renewed_at,
        }

    def step_down(self, why: str) -> None:
        """Stop leading now (a deadline passed, or the log refused our epoch: another
        term began). The next round may take the lease again if it is free."""
        self._set(False, why)

    async def _call(self, call: Awaitable[_T]) -> _T:
        """One API call under the request time-out, and a leader's under what is left
        of its renew deadline."""
        limit = self.request_timeout
        if self.leader:
            limit = min(limit, self.renewed_at + self.renew_deadline - self.monotonic())
        async with asyncio.timeout(max(limit, 0.0)):
            return await call

    def _expired(self, lease: Any) -> bool:
        """Whether the holder let the lease lapse, as we observed it: the record has
        not changed for ``leaseDurationSeconds`` of our own clock."""
        spec = lease.spec or client.V1LeaseSpec()
        record = (
            lease.metadata.resource_version if lease.metadata else None,
            spec.holder_identity,
            str(spec.renew_time),
            spec.lease_transitions,
        )
        now = self.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = spec.lease_duration_seconds or self.lease_seconds
        return not spec.holder_identity or self._observed_at + duration < now

    async def try_acquire_or_renew(self) -> bool:
        """One round: become or stay leader if allowed; return whether leader now.
        An error status is reported to ``health``; a leader rides it out until its renew
        deadline passes. No answer at all raises (``run`` reports it): ``TimeoutError``
        when an API call takes longer than allowed."""
        self.rounds += 1
        if self.leader and not self.leading():
            self._set(False, "renew deadline passed")  # then try as a candidate
        now = self.clock()
        try:
            lease = await self._call(self.api.read_namespaced_lease(self.name, self.namespace))
        except ApiException as exc:
            if exc.status != 404:
                return self._failed("read", exc)
            epoch = max(1, self.floor)
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                spec=self._spec(now, now, epoch),
            )
            try:
                await self._call(self.api.create_namespaced_lease(self.namespace, body))
            except ApiException as create_exc:
                if create_exc.status == 409:  # another candidate created it first
                    return self._answered(False, "create lost: 409")
                return self._failed("create", create_exc)
            self.health.ok(self.name)
            return self._won(epoch, "created")
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity
        expired = self._expired(lease)
        if holder != self.identity and not expired:
            return self._answered(False, f"held by {holder}")
        held = spec.lease_transitions or 0
        ours = holder == self.identity
        transitions = held if ours else max(held + 1, self.floor)
        acquired = spec.acquire_time if ours else now
        lease.spec = self._spec(_aware(acquired) or now, now, transitions)
        try:
            await self._call(self.api.replace_namespaced_lease(self.name, self.namespace, lease))
        except ApiException as exc:
            if exc.status == 409:  # another candidate wrote first
                return self._answered(False, "write lost: 409")
            return self._failed("update", exc)
        self.health.ok(self.name)
        return self._won(transitions, "renewed" if ours else f"took over from {holder}")

    async def advance_epoch(self) -> bool:
        """Raise the current term's epoch to :attr:`floor` (the log has seen epochs at
        or above ours: the Lease was deleted and created again). One compare-and-swap
        write; False (and no longer leader) when it fails."""
        if self.epoch >= self.floor:
            return self.leading()
        try:
            lease = await self._call(self.api.read_namespaced_lease(self.name, self.namespace))
            spec = lease.spec or client.V1LeaseSpec()
            if spec.holder_identity != self.identity:
                return self._set(False, f"held by {spec.holder_identity}")
            now = self.clock()
            lease.spec = self._spec(_aware(spec.acquire_time) or now, now, self.floor)
            await self._call(self.api.replace_namespaced_lease(self.name, self.namespace, lease))
        except (ApiException, TimeoutError) as exc:
            return self._set(False, f"epoch write failed: {type(exc).__name__}")
        return self._won(self.floor, f"epoch raised to {self.floor}")

    def _won(self, epoch: int, why: str) -> bool:
        self.renewed_at = self.monotonic()
        if epoch != self.epoch:
            log.info("lease term lease=%s identity=%s epoch=%d", self.name, self.identity, epoch)
        self.epoch = epoch
        return self._set(True, why)

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
        # a leader rides out a failed round until its renew deadline (client-go)
        return self.leading() or self._set(False, f"{verb} failed: {status}")

    def _unreachable(self, exc: BaseException) -> None:
        timed_out = isinstance(exc, TimeoutError)
        why = f"no answer within {self.request_timeout:g}s" if timed_out else cause(exc)
        message = (
            f"cannot reach the API server at {self.host} ({why}); check --host, "
            "--kubeconfig or $KUBECONFIG, and that the server is up"
        )
        self.health.failed(self.name, "unreachable", message, answered=False)
        if not self.leading():  # a leader rides it out until its renew deadline
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
        """Keep trying until ``stop``, a round every ``retry_period`` (or
        ``renew_every``); ``leader`` tells the current state. A leader whose renewal
        fails keeps trying until its renew deadline passes, then steps down."""
        interval = renew_every if renew_every is not None else self.retry_period
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
                if not self.leading():
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
