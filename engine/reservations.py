"""The shard's side of the cross-shard gang protocol, and what a routed shard reports.

A part of a cross-shard gang arrives as ``ReservationRequested``: the shard makes it a
gang of its own (``minMember`` = every pod of the part), places it in one staged step
without preemption, and answers at once: ``ReservationGranted`` with the placements
(held: assumed in state, not bound) or ``ReservationDenied`` (nothing held). It never
waits for capacity, so a part can never hold some capacity while waiting for more:
the hold-and-wait that deadlocks two gangs cannot happen on a shard.

Reservation states, as a transition table::

    staging ── placed whole ──► held ── ReservationCommitted ──► committed (PodBound each)
    staging ── does not fit ──► (ReservationDenied, forgotten)
    held ── ReservationAborted, or expires_at passed ──► (ReservationReleased, forgotten)
    committed ── ReservationAborted, or one pod failed to bind ──►
                 (PodUnbound for the rest, ReservationReleased, forgotten)

Everything the shard decides here is a decision event that it also folds, so a shard
that restarts rebuilds its reservations (and their expiry times) from its partition.

Hand-backs: a pod or gang the router gave this shard (not ``final``) that does not fit,
even with preemption, is handed back (``PodHandedBack``) and forgotten, so the router
can try another shard. Summaries (``ShardSummary``) tell the router this shard's
capacity after every pass that changed it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import numpy as np

from events.types import (
    PodBound,
    PodHandedBack,
    PodUnbound,
    ReservationReleased,
    ShardSummary,
)

if TYPE_CHECKING:
    from engine.passes import SchedulingPass
    from engine.scheduler import Engine

STAGING: Final = "staging"
HELD: Final = "held"
COMMITTING: Final = "committing"
COMMITTED: Final = "committed"


@dataclass(slots=True)
class Reservation:
    rid: str
    group: str
    pods: tuple[str, ...]
    expires_at: int
    state: str = STAGING
    bound: set[str] = field(default_factory=set)
    """Pods whose ``PodBound`` was emitted after the commit."""
    ending: str = ""
    """Why it must be let go at the next pass (aborted, a bind failed); empty: it need not."""

    def __repr__(self) -> str:
        return f"Reservation({self.rid!r}, {self.state}, pods={len(self.pods)})"


def decision_id(pod: str, rid: str) -> str:
    return f"{pod}@{rid}"


def settle_reservations(p: SchedulingPass) -> None:
    """Commit what was committed, let go of what was aborted, broken or expired."""
    e = p.e
    for rid in sorted(e.reservations):
        res = e.reservations[rid]
        if res.state == COMMITTING:
            commit(p, res)
        if res.ending:
            release(p, res, res.ending)
        elif res.state in (STAGING, HELD) and res.expires_at <= e.now:
            release(p, res, "expired: no commit before the reservation's time-out")


def commit(p: SchedulingPass, res: Reservation) -> None:
    e = p.e
    for key in res.pods:
        slot = e.state.pods[key].slot if key in e.state.pods else None
        if key in res.bound or slot is None:
            continue
        node = e.state.names[slot] or ""
        pod = e.pods[key]
        res.bound.add(key)
        p.out.append(
            PodBound(
                pod=key,
                node=node,
                decision_id=decision_id(key, res.rid),
                attempt=pod.attempts,
                shard=e.shard,
            )
        )
        e.count("bound")
    res.state = COMMITTED


def release(p: SchedulingPass, res: Reservation, reason: str) -> None:
    """Let ``res`` go: unbind what was bound, then forget the part."""
    e = p.e
    for key in res.pods:
        if key in res.bound and key in e.state.pods:
            slot = e.state.pods[key].slot
            p.out.append(
                PodUnbound(
                    pod=key,
                    node=e.state.names[slot] or "",
                    decision_id=decision_id(key, res.rid),
                    reason=f"reservation {res.rid} {reason}",
                    shard=e.shard,
                )
            )
    event = ReservationReleased(rid=res.rid, group=res.group, reason=reason, shard=e.shard)
    e.released(event)
    p.out.append(event)


RESOLVABLE: Final = frozenset({"NodeResourcesFit", "ElasticQuota", "Coscheduling"})
"""Rejecting plugins whose verdict changes when capacity frees up."""


def hand_back(
    p: SchedulingPass,
    *,
    pod: str = "",
    group: str = "",
    reason: str,
    plugins: tuple[str, ...] = (),
) -> None:
    event = PodHandedBack(
        pod=pod,
        group=group,
        reason=reason,
        shard=p.e.shard,
        resolvable=bool(RESOLVABLE.intersection(plugins)),
    )
    p.e.handed_back(event)
    p.out.append(event)


def summary(e: Engine) -> ShardSummary:
    """This shard's capacity now, for the router."""
    state = e.state
    valid = state.valid
    names = state.resources.names[: state.alloc.shape[0]]
    alloc = state.alloc[: len(names), valid]
    free = state.free[: len(names), valid]
    count = int(valid.sum())
    totals = alloc.sum(axis=1) if count else np.zeros(len(names), dtype=np.int64)
    used = totals - (free.sum(axis=1) if count else 0)
    largest = free.max(axis=1) if count else np.zeros(len(names), dtype=np.int64)
    return ShardSummary(
        shard=e.shard,
        seen=e.seen,
        nodes=count,
        allocatable={n: int(v) for n, v in zip(names, totals, strict=True) if v},
        used={n: int(v) for n, v in zip(names, used, strict=True) if v},
        largest={n: int(v) for n, v in zip(names, largest, strict=True) if v},
        pending=len(e.queue) + len(e.waiting),
    )
