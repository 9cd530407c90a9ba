"""The scheduling queue: active, back-off and unschedulable pods.

- *active*: a heap ordered by priority (high first), then arrival order, then name;
- *back-off*: pods that may be retried once their back-off expires (simulated time),
  ``initial * 2**(attempts-1)`` capped at ``maximum``;
- *unschedulable*: pods whose last attempt failed, parked until a cluster event that
  one of the rejecting plugins declared (``events()``, refined by ``worth_retrying``)
  arrives. There is no polling: a pod nobody can help stays parked, with its reason.

Transition table (a pod is in at most one place)::

    submitted ─────────────────────────────► active
    active ── attempt fails ───────────────► unschedulable
    unschedulable ── helpful event, backing off ─► back-off
    unschedulable ── helpful event, back-off over ─► active
    back-off ── time reaches expiry (flush) ─► active
    any ── deleted / bound ────────────────► (gone)

Heaps use lazy deletion: an entry is live only if its generation matches the pod's.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from engine.framework.interfaces import ClusterEvent
from events.types import SECOND


@dataclass(slots=True)
class _Entry:
    where: str
    generation: int
    priority: int
    seq: int
    name: str
    backoff_until: int = 0
    plugins: tuple[str, ...] = ()
    events: frozenset[ClusterEvent] = frozenset()


class SchedulingQueue:
    def __init__(self, initial_backoff_seconds: int = 1, max_backoff_seconds: int = 10) -> None:
        self.initial_backoff = initial_backoff_seconds * SECOND
        self.max_backoff = max_backoff_seconds * SECOND
        self._entries: dict[str, _Entry] = {}
        self._active: list[tuple[int, int, str, int]] = []
        self._backoff: list[tuple[int, int, str, int]] = []
        self._parked: dict[ClusterEvent, dict[str, None]] = {e: {} for e in ClusterEvent}
        self._generation = 0

    def __repr__(self) -> str:
        return f"SchedulingQueue({self.stats()})"

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def stats(self) -> dict[str, int]:
        counts = {"active": 0, "backoff": 0, "unschedulable": 0}
        for entry in self._entries.values():
            counts[entry.where] += 1
        return counts

    def where(self, key: str) -> str | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.where

    def reason_plugins(self, key: str) -> tuple[str, ...]:
        entry = self._entries.get(key)
        return () if entry is None else entry.plugins

    # ------------------------------------------------------------------ moves

    def _next_generation(self) -> int:
        self._generation += 1
        return self._generation

    def add(self, key: str, priority: int, seq: int) -> None:
        """A new pod (or one requeued after a bind failure): straight to active."""
        self.remove(key)
        entry = _Entry("active", self._next_generation(), priority, seq, key)
        self._entries[key] = entry
        heapq.heappush(self._active, (-priority, seq, key, entry.generation))

    def remove(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None and entry.where == "unschedulable":
            for event in entry.events:
                self._parked[event].pop(key, None)

    def pop(self) -> str | None:
        """The highest-priority active pod, removed from the queue (None if empty)."""
        while self._active:
            _, _, key, generation = heapq.heappop(self._active)
            entry = self._entries.get(key)
            if entry is not None and entry.generation == generation and entry.where == "active":
                del self._entries[key]
                return key
        return None

    def park(
        self,
        key: str,
        priority: int,
        seq: int,
        attempts: int,
        now: int,
        plugins: tuple[str, ...],
        events: frozenset[ClusterEvent],
    ) -> None:
        """The attempt failed: wait for one of ``events``, then back off."""
        self.remove(key)
        backoff = min(self.initial_backoff << max(attempts - 1, 0), self.max_backoff)
        entry = _Entry(
            "unschedulable",
            self._next_generation(),
            priority,
            seq,
            key,
            backoff_until=now + backoff,
            plugins=plugins,
            events=events,
        )
        self._entries[key] = entry
        for event in events:
            self._parked[event][key] = None

    def on_event(
        self, event: ClusterEvent, now: int, helps: Callable[[str, tuple[str, ...]], bool]
    ) -> int:
        """Move parked pods that ``event`` may help; return how many moved.

        ``helps(key, plugins)`` refines the choice (queueing hints).
        """
        moved = 0
        for key in list(self._parked[event]):
            entry = self._entries[key]
            if not helps(key, entry.plugins):
                continue
            self._unpark(entry, now)
            moved += 1
        return moved

    def back_off(self, key: str, priority: int, seq: int, attempts: int, now: int) -> None:
        """Retry ``key`` after its back-off, whatever happens meanwhile (bind failures)."""
        self.park(key, priority, seq, attempts, now, (), frozenset())
        self._unpark(self._entries[key], now)

    def _unpark(self, entry: _Entry, now: int) -> None:
        for ev in entry.events:
            self._parked[ev].pop(entry.name, None)
        entry.generation = self._next_generation()
        if entry.backoff_until > now:
            entry.where = "backoff"
            heapq.heappush(
                self._backoff, (entry.backoff_until, entry.seq, entry.name, entry.generation)
            )
        else:
            entry.where = "active"
            heapq.heappush(self._active, (-entry.priority, entry.seq, entry.name, entry.generation))

    def flush_backoff(self, now: int) -> None:
        """Move pods whose back-off has expired by ``now`` to active."""
        while self._backoff and self._backoff[0][0] <= now:
            _, _, key, generation = heapq.heappop(self._backoff)
            entry = self._entries.get(key)
            if entry is not None and entry.generation == generation and entry.where == "backoff":
                entry.where = "active"
                entry.generation = self._next_generation()
                heapq.heappush(self._active, (-entry.priority, entry.seq, key, entry.generation))

    def next_wakeup(self) -> int | None:
        """Earliest back-off expiry, if any pod is backing off."""
        while self._backoff:
            until, _, key, generation = self._backoff[0]
            entry = self._entries.get(key)
            if entry is not None and entry.generation == generation and entry.where == "backoff":
                return until
            heapq.heappop(self._backoff)
        return None

    def has_active(self) -> bool:
        return any(e.where == "active" for e in self._entries.values()) if self._active else False

    def parked(self) -> Iterator[str]:
        return (k for k, e in self._entries.items() if e.where == "unschedulable")
