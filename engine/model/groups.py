"""Pod groups (gangs) and job dependencies: the bookkeeping the engine keeps.

Group phases (:class:`GroupPhase`), as a transition table; :data:`TRANSITIONS` is the
same table in code and :func:`advance` refuses any other move (tie-break: a timeout is
checked at the start of a pass, before any attempt at that instant)::

    Pending ── minMember members placed in one atomic step ─────────► Scheduled
    Pending ── scheduleTimeoutSeconds passed ───────────────────────► Failed
    Pending ── a dependency failed ─────────────────────────────────► Failed
    Scheduled ── every member finished and none failed ─────────────► Succeeded
    Scheduled ── a member failed, was preempted or rejected ────────► Failed
    Scheduled ── a failed bind left fewer than minMember placed ────► Pending

A Pending group is one queue entry (``@namespace/name``); its members are not queued
on their own. Once Scheduled, members that did not fit (beyond ``minMember``) queue as
ordinary pods. A group that lacks members, or waits on a dependency, holds nothing.

Dependencies (``shoal.io/depends-on``) name pods or groups of the same namespace; a
name that is a group means every member of the group. A unit runs when all its
dependencies succeeded, fails when one failed, and waits otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from events.types import GroupSpec, PodSpec

GROUP_PREFIX: Final = "@"


class GroupPhase(StrEnum):
    """A pod group's phase; its value is what events and reports show."""

    PENDING = "Pending"
    SCHEDULED = "Scheduled"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


PENDING: Final = GroupPhase.PENDING
SCHEDULED: Final = GroupPhase.SCHEDULED
SUCCEEDED: Final = GroupPhase.SUCCEEDED
FAILED: Final = GroupPhase.FAILED

TRANSITIONS: Final[frozenset[tuple[GroupPhase, GroupPhase]]] = frozenset(
    {
        (PENDING, SCHEDULED),
        (PENDING, FAILED),
        (SCHEDULED, SUCCEEDED),
        (SCHEDULED, FAILED),
        (SCHEDULED, PENDING),
    }
)
"""The moves a group may make (see the table above); staying put is always allowed."""


class TransitionError(AssertionError):
    """A state machine was asked for a move its table does not have: a bug, not input."""


def advance(group: GroupInfo, phase: GroupPhase, reason: str = "") -> None:
    """Move ``group`` to ``phase`` (with ``reason``), as :data:`TRANSITIONS` allows."""
    if phase != group.phase and (group.phase, phase) not in TRANSITIONS:
        raise TransitionError(f"pod group {group.key}: {group.phase.value} -> {phase.value}")
    group.phase, group.reason = phase, reason


def group_unit(key: str) -> str:
    return GROUP_PREFIX + key


def is_group_unit(unit: str) -> bool:
    return unit.startswith(GROUP_PREFIX)


def group_is_over(group: GroupInfo, live: Mapping[str, object]) -> bool:
    """Whether a group that a PodGroup object declared (it has a uid) is over: it had
    pods and none of them is ``live`` any more (they finished or were deleted), so its
    name may now be another group's (a job deleted and applied again). A group of no
    object (the older labels, a scenario's) is never over: nothing would tell another
    one apart. A part of a cross-shard gang whose pods are all gone is over too: its
    reservation was committed, and its pods ran."""
    return (
        group.spec is not None
        and bool(group.spec.uid)
        and bool(group.members)
        and not any(member in live for member in group.members)
    )


NextRuns = dict[str, tuple[GroupSpec, list[PodSpec]]]
"""Group → the PodGroup of another uid that claimed its name while pods of the run
before were live, and the pods that came for it since (``Engine.next_runs``)."""


def claim_next_run(next_runs: NextRuns, spec: GroupSpec) -> None:
    """``spec`` waits for the run under its name to be over (the latest claim wins,
    with the pods that came for the claims before)."""
    _, waiting = next_runs.get(spec.key, (spec, []))
    next_runs[spec.key] = (spec, waiting)


def hold_for_next_run(next_runs: NextRuns, spec: PodSpec) -> bool | None:
    """Keep pod ``spec`` for its group's next run, if one waits: None if none does,
    else whether it is new there (a pod told twice is kept once)."""
    run = next_runs.get(spec.group) if spec.group else None
    if run is None:
        return None
    waiting = run[1]
    if any(pod.key == spec.key for pod in waiting):
        return False
    waiting.append(spec)
    return True


def next_run_reason(key: str) -> str:
    """Why a pod of a group's next run waits (see ``Engine.next_runs``)."""
    return (
        f"waiting for the pods of the run of pod group {key} before this one to finish "
        "(a PodGroup of that name was created again)"
    )


@dataclass(slots=True)
class GroupInfo:
    key: str
    spec: GroupSpec | None = None
    """None while pods name the group but no PodGroup (or labels) declared it."""
    seq: int = 0
    members: dict[str, None] = field(default_factory=dict)
    phase: GroupPhase = PENDING
    reason: str = ""
    created_at: int = 0
    succeeded: int = 0
    failed: int = 0
    attempts: int = 0
    reported: tuple[str, int, str] | None = None
    """The last (phase, scheduled, reason) emitted as an event."""
    reservation: str = ""
    """Set for a part of a cross-shard gang: the reservation it answers."""

    @property
    def min_member(self) -> int:
        return self.spec.min_member if self.spec is not None else 0

    @property
    def namespace(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def deadline(self) -> int | None:
        if self.spec is None or self.spec.timeout is None:
            return None
        return self.created_at + self.spec.timeout

    def __repr__(self) -> str:
        return f"GroupInfo({self.key!r}, {self.phase}, members={len(self.members)})"


@dataclass(frozen=True, slots=True)
class DependencyState:
    """Where a unit's dependencies stand: all met, one failed, or still waiting."""

    ok: bool
    failed: str = ""
    waiting: str = ""
    details: tuple[tuple[str, str], ...] = ()
    """(dependency, its state) for ``--explain``."""


def find_cycle(
    edges: Callable[[str], Iterable[str]], roots: Iterable[str], done: set[str] | None = None
) -> list[str] | None:
    """A cycle reachable from ``roots`` in a graph given by ``edges`` (a name → the names
    it waits for), as the names along it with the first repeated at the end, or None.
    ``done``: names known to reach no cycle (to those, the names found so are added).

    Iterative depth-first search: chains of any length, no recursion limit; each name's
    edges are asked for once.
    """
    if done is None:
        done = set()
    for root in roots:
        if root in done:
            continue
        path: list[str] = [root]
        on_path = {root}
        iters = [iter(edges(root))]
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                iters.pop()
                continue
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                iters.append(iter(edges(nxt)))
    return None
