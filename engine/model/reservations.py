"""Reservations: a part of a gang a shard stages and holds for the coordinator.

A part arrives as ``ReservationRequested``: pods to place all together, optionally on
nodes the coordinator chose (``placements``) after evicting ``victims``. The shard
stages it whole and answers at once: granted (held, or bound at once for a part that
``commit``s at once) or denied (nothing held). It never waits for capacity while
holding some, so the hold-and-wait that deadlocks two gangs cannot happen on a shard.

States (:class:`ReservationState`), as a transition table; :data:`TRANSITIONS` is the
same table in code and :func:`advance` refuses any other move::

    staging ── placed whole ─────────────────────────────► held
    held ── ReservationCommitted (or at once: ``commit``) ─► committing
    committing ── a PodBound emitted for each pod ───────► committed
    staging ── does not fit ──► (ReservationDenied, forgotten)
    held, committing, committed ── aborted, expired, or a bind broke it ──►
        (PodUnbound for what was bound, ReservationReleased, forgotten)

Everything the shard decides here is a decision event that it also folds, so a shard
that restarts rebuilds its reservations (and their expiry times) from its partition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from engine.model.groups import TransitionError


class ReservationState(StrEnum):
    STAGING = "staging"
    HELD = "held"
    COMMITTING = "committing"
    COMMITTED = "committed"


STAGING: Final = ReservationState.STAGING
HELD: Final = ReservationState.HELD
COMMITTING: Final = ReservationState.COMMITTING
COMMITTED: Final = ReservationState.COMMITTED

TRANSITIONS: Final[frozenset[tuple[ReservationState, ReservationState]]] = frozenset(
    {(STAGING, HELD), (HELD, COMMITTING), (COMMITTING, COMMITTED)}
)


@dataclass(slots=True)
class Reservation:
    rid: str
    group: str
    pods: tuple[str, ...]
    expires_at: int
    state: ReservationState = STAGING
    bound: set[str] = field(default_factory=set)
    """Pods whose ``PodBound`` was emitted after the commit."""
    ending: str = ""
    """Why it must be let go at the next pass (aborted, a bind failed); empty: it need not."""
    placements: dict[str, str] = field(default_factory=dict)
    """Pod → the node the coordinator chose for it (empty: the shard chooses)."""
    moves: dict[str, str] = field(default_factory=dict)
    """Pods moved here from another shard's node → that node (committed as moves)."""
    moved_for: str = ""
    """The pod the moves make room for."""
    moved_by: dict[str, str] = field(default_factory=dict)
    """Moved pods made room for another pod than ``moved_for`` → that pod
    (``ReservationRequested.moved_by``)."""
    at_once: bool = False
    """Commit as soon as it is staged (a part that is the whole reservation)."""
    plain: bool = False
    """Its pods are pods of their own, in no gang (``ReservationRequested.plain``)."""
    devices: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Pod → the GPU cards the coordinator chose for it (``ReservationRequested.devices``)."""
    leaving: dict[str, str] = field(default_factory=dict)
    """Pods of this shard the plan moves to other shards → their node here
    (``ReservationRequested.leaving``)."""
    lifted: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Those taken off their nodes while the part is held → the GPU cards they held
    there (put back if it is let go)."""

    def __repr__(self) -> str:
        return f"Reservation({self.rid!r}, {self.state.value}, pods={len(self.pods)})"

    def advance(self, state: ReservationState) -> None:
        """Move to ``state``, as :data:`TRANSITIONS` allows."""
        if state != self.state and (self.state, state) not in TRANSITIONS:
            raise TransitionError(f"reservation {self.rid}: {self.state.value} -> {state.value}")
        self.state = state


def decision_id(pod: str, rid: str) -> str:
    return f"{pod}@{rid}"
