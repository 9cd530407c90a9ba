"""Would run if: the smallest change that lets a waiting unit run, found by running the
engine on a copy of its state.

:func:`counterfactual` takes an engine (one shard's, or the coordinator's view of the
whole cluster), a pending pod or pod group, and tries the changes of
:mod:`engine.candidates` smallest first (a quota raised to exactly what is needed; the
fewest pods of the unit's priority or lower leaving, named; one constraint of the pod
relaxed; nodes of an existing shape added, last). Each is checked the same way: the
state is copied (:func:`engine.snapshot.encode_state` once, :func:`~engine.snapshot.restore`
per change), the change's inputs are folded into the copy one second after the state's
time, and the copy runs its passes, following its own wake-ups (back-offs expiring,
preempted pods leaving) and the ends of the pods that have a runtime (a simulation's
``shoal.io/runtime``; a real cluster's pods have none) as a simulated run would, until
the unit is placed or nothing is left to do. The first that places the unit is the
answer; it carries its inputs, so a test (or a person, in a simulation) can apply
exactly that change and see the unit run.

The engine is pure, so the copy decides what the engine itself would decide after that
change: other waiting units come first where the queue puts them first, and the change
is reported only where the unit still gets the room. On the coordinator's view (several
shards) a change that the copy made work by moving pods (the rescheduler) is passed
over: the shards carry out such moves and may refuse them, so it is not a change the
run is sure to follow.

Cost, on demand only (``replay --explain``, ``simulate --json`` and its table,
``whatif``, the live view's pending units; never in a scheduling pass): one encoding of
the state, then for each of at most :data:`engine.candidates.MAX_CANDIDATES` changes one
decoding and at most :data:`MAX_PASSES` passes. The callers bound the units they ask for
(:data:`MAX_UNITS` each).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import msgspec

from engine.candidates import Change, Unit, candidates
from engine.engine import Engine
from engine.model.groups import PENDING
from engine.snapshot import encode_state, restore
from events.types import (
    SECOND,
    ClockTicked,
    Envelope,
    Event,
    PodFailed,
    PodMigrated,
    PodSucceeded,
)

COORDINATOR: Final = -1
"""The shard number of the coordinator's view (``shards.coordinator``)."""
MAX_PASSES: Final = 8
"""Passes a copy runs after a change at most (a preemption takes two: evict, then place)."""
MAX_UNITS: Final = 20
"""Pending units a command computes counterfactuals for at most (the first by name)."""
DELAY: Final = SECOND
"""How long after the state's time the change is applied (past its instant's passes)."""


@dataclass(frozen=True, slots=True)
class Counterfactual:
    """The change that lets ``unit`` run, when it is applied (``at``, ns), and how many
    changes were tried to find it."""

    unit: str
    change: Change
    at: int
    tried: int

    def text(self) -> str:
        return f"would run if: {self.change.text}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.change.kind,
            "change": self.change.text,
            "text": self.text(),
            "leaving": list(self.change.leaving),
            "at_seconds": self.at / SECOND,
            "tried": self.tried,
            "events": [msgspec.to_builtins(e) for e in self.change.events],
        }


def unit_of(e: Engine, key: str) -> Unit | None:
    """The waiting unit of pod (or pod group) ``key``: the pod, or its gang with the
    members still pending; None if it does not wait, or waits for something no change
    of quota, pods, constraints or nodes makes run (its dependencies, its gang's
    missing members or PodGroup)."""
    group = e.groups.get(key)
    if group is None:
        pod = e.pods.get(key)
        if pod is None or key in e.state.pods:
            return None
        if pod.spec.group:
            group = e.groups.get(pod.spec.group)
            if group is None:
                return None
        elif not e.dependency_state(pod.spec.depends_on).ok:
            return None
        else:
            return Unit(key, (pod,))
    if group.spec is None or group.phase != PENDING:
        return None
    if not e.dependency_state(group.spec.depends_on).ok:
        return None
    members = [e.pods[m] for m in group.members if m in e.pods]
    if len(members) < group.min_member:
        return None
    pending = tuple(p for p in members if p.key not in e.state.pods)
    if not pending:
        return None
    return Unit(group.key, pending, group)


def runs(e: Engine, unit: Unit) -> bool:
    """Whether ``unit`` is placed in ``e`` (a gang: at least ``minMember`` members)."""
    if unit.group is None:
        return unit.key in e.state.pods
    group = e.groups.get(unit.key)
    if group is None:
        return False
    return len(e.placed_members(group)) >= group.min_member


def applied(
    data: bytes, like: Engine, change: Change, at: int, unit: Unit | None = None
) -> tuple[Engine, list[Event]]:
    """A copy of the engine whose state ``data`` holds, with ``change`` folded at ``at``
    and passes run after it (until ``unit``, if given, runs, or nothing is left to do),
    and the decisions of those passes."""
    copy = restore(data, like.config, shard=like.shard, registry=like.registry)
    for event in change.events:
        copy.apply(Envelope(event=event, time=at, producer="ingest"))
    decisions: list[Event] = []
    for _ in range(MAX_PASSES):
        decisions += copy.schedule()
        if unit is not None and runs(copy, unit):
            break
        ending = finishing(copy)
        times = [t for t in (copy.next_wakeup(), ending[0][0] if ending else None) if t is not None]
        if not times:
            break
        now = max(min(times), copy.now)
        ended = [key for end, key in ending if end <= now]
        for key in ended:
            copy.apply(Envelope(event=_ended(copy, key), time=now, producer="cluster"))
        if not ended:
            copy.apply(Envelope(event=ClockTicked(), time=now, producer="clock"))
    return copy, decisions


def finishing(e: Engine) -> list[tuple[int, str]]:
    """(when it ends, pod) for each placed pod with a runtime (``shoal.io/runtime``, a
    simulation's), soonest first: a copy lets them end as the simulated cluster does."""
    out = []
    for key in e.state.pods:
        info = e.pods.get(key)
        start = e.started.get(key)
        if info is not None and start is not None and info.spec.runtime is not None:
            out.append((start + info.spec.runtime, key))
    return sorted(out)


def _ended(e: Engine, key: str) -> Event:
    placed = e.state.pods[key]
    node = e.state.names[placed.slot] or ""
    if e.pods[key].spec.fails:
        return PodFailed(pod=key, node=node, reason="Error")
    return PodSucceeded(pod=key, node=node)


def counterfactual(e: Engine, key: str) -> Counterfactual | None:
    """The smallest change that lets pod (or pod group) ``key`` run, or None: it does
    not wait, or no change tried within the bounds lets it run."""
    unit = unit_of(e, key)
    if unit is None:
        return None
    at = e.now + DELAY
    data = b""
    for tried, change in enumerate(candidates(e, unit), start=1):
        if not data:
            data = encode_state(e)
        copy, decisions = applied(data, e, change, at, unit)
        if runs(copy, unit) and not (e.shard == COORDINATOR and _moves(decisions)):
            return Counterfactual(unit.key, change, at, tried)
    return None


def _moves(decisions: list[Event]) -> bool:
    return any(isinstance(d, PodMigrated) for d in decisions)


def unit_key(e: Engine, pod: str) -> str:
    """The key a counterfactual for pod ``pod`` is asked under: its gang's, if any."""
    info = e.pods.get(pod)
    if info is not None and info.spec.group and info.spec.group in e.groups:
        return info.spec.group
    return pod


__all__ = ["MAX_UNITS", "Counterfactual", "applied", "counterfactual", "unit_key", "unit_of"]
