"""The scheduling queue: active, back-off and unschedulable pods.

- *active*: a heap ordered by priority (high first), then arrival order, then name;
- *back-off*: pods that may be retried once their back-off expires (simulated time),
  ``initial * 2**(attempts-1)`` capped at ``maximum`` (a gang: at least ``group_backoff``);
- *unschedulable*: pods whose last attempt failed, parked until a cluster event that
  one of the rejecting plugins declared (``events()``, refined by ``worth_retrying``)
  arrives. There is no polling: a pod nobody can help stays parked, with its reason.

Transition table (a pod is in at most one place)::

    submitted ─────────────────────────────► active
    active ── attempt fails ───────────────► unschedulable
    unschedulable ── helpful event, backing off ─► back-off
    unschedulable ── helpful event, back-off over ─► active

Parked pods are bucketed by (shape, rejecting plugins, priority): pods of one bucket
would get the same answer, so hints run once per bucket, and an event can wake a bounded
number of them (a freed node holds only so many pods: waking the rest would only make
them fail again). Buckets are woken best first (priority, then arrival).
    back-off ── time reaches expiry (flush) ─► active
    any ── deleted / bound ────────────────► (gone)

Heaps use lazy deletion: an entry is live only if its generation matches the pod's.

Active pods sit in one heap per *queue* (a tenant: the namespace of an elastic quota,
or ``""``). ``pop`` takes the best head by a rank the engine supplies, so that queues
that borrow capacity are served by dominant resource share (DRF); without a rank, heads
compare by priority, then arrival, exactly as one heap would.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from itertools import islice

import msgspec

from engine.model.changes import ClusterEvent
from engine.model.groups import is_group_unit
from events.types import SECOND


class _Entry(msgspec.Struct, gc=False):
    """A unit's place in the queue: one per pod waiting, built in C, not tracked by the
    cyclic collector (``gc=False``: strings, numbers, tuples and a frozenset of enums)."""

    where: str
    generation: int
    priority: int
    seq: int
    name: str
    backoff_until: int = 0
    plugins: tuple[str, ...] = ()
    events: frozenset[ClusterEvent] = frozenset()
    queue: str = ""
    bucket: tuple[object, ...] = ()


Rank = Callable[[str, str, int, int], tuple[object, ...]]
"""(queue, key, priority, seq) → sort key; the smallest head is popped next."""


class SchedulingQueue:
    def __init__(self, initial_backoff_seconds: int = 1, max_backoff_seconds: int = 10) -> None:
        self.initial_backoff = initial_backoff_seconds * SECOND
        self.max_backoff = max_backoff_seconds * SECOND
        self.group_backoff = 0
        """The least back-off of a gang (Coscheduling's ``podGroupBackoffSeconds``)."""
        self._entries: dict[str, _Entry] = {}
        self._active: dict[str, list[tuple[int, int, str, int]]] = {}
        self._backoff: list[tuple[int, int, str, int]] = []
        self._parked: dict[ClusterEvent, dict[tuple[object, ...], dict[str, None]]] = {
            e: {} for e in ClusterEvent
        }
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

    @property
    def generation(self) -> int:
        """Bumped by every move: equal before and after, nothing moved."""
        return self._generation

    def where(self, key: str) -> str | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.where

    def waits_for(self, event: ClusterEvent) -> bool:
        """Whether some parked pod waits for ``event``."""
        return bool(self._parked.get(event))

    def parked_from(self, event: ClusterEvent, priority: int) -> bool:
        """Whether a unit of ``priority`` or higher is parked until ``event`` (one look
        per bucket of parked pods, not per pod)."""
        buckets = self._parked.get(event)
        if not buckets:
            return False
        for bucket, keys in buckets.items():
            level = bucket[2]  # (shape, plugins, priority): see :meth:`park`
            if keys and isinstance(level, int) and level >= priority:
                return True
        return False

    def backing_off(self, key: str, now: int) -> bool:
        """Whether ``key``, woken at ``now``, would wait out a back-off first."""
        entry = self._entries.get(key)
        return entry is not None and entry.backoff_until > now

    def reason_plugins(self, key: str) -> tuple[str, ...]:
        entry = self._entries.get(key)
        return () if entry is None else entry.plugins

    # ------------------------------------------------------------------ moves

    def _next_generation(self) -> int:
        self._generation += 1
        return self._generation

    def add(self, key: str, priority: int, seq: int, queue: str = "") -> None:
        """A new pod (or one requeued after a bind failure): straight to active."""
        self.remove(key)
        entry = _Entry("active", self._next_generation(), priority, seq, key, queue=queue)
        self._entries[key] = entry
        self._push_active(entry)

    def add_new(self, pods: list[tuple[str, int, int]], queue: str = "") -> None:
        """:meth:`add` for each ``(key, priority, seq)`` of ``pods`` in order, pods new
        to the queue (the caller checks: none has an entry): the same entries,
        generations and heap (the bulk fold of submissions,
        :func:`engine.model.bulk.submit_all`, one call per namespace's run)."""
        entries = self._entries
        heap = self._active.get(queue)
        if heap is None:
            heap = self._active[queue] = []
        push = heapq.heappush
        generation = self._generation
        for key, priority, seq in pods:
            generation += 1
            entries[key] = _Entry("active", generation, priority, seq, key, queue=queue)
            push(heap, (-priority, seq, key, generation))
        self._generation = generation

    def take_active(self, key: str) -> None:
        """Take ``key``, the head :meth:`peek` just gave (active), out of the queue:
        :meth:`remove` without the look at where it waits (its heap entry goes at the
        next look at the head, as after :meth:`remove`)."""
        del self._entries[key]

    def _push_active(self, entry: _Entry) -> None:
        entry.where = "active"
        heap = self._active.get(entry.queue)
        if heap is None:
            heap = self._active[entry.queue] = []
        heapq.heappush(heap, (-entry.priority, entry.seq, entry.name, entry.generation))

    def _head(self, heap: list[tuple[int, int, str, int]]) -> tuple[int, int, str, int] | None:
        while heap:
            head = heap[0]
            entry = self._entries.get(head[2])
            if entry is not None and entry.generation == head[3] and entry.where == "active":
                return head
            heapq.heappop(heap)
        return None

    def remove(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None and entry.where == "unschedulable":
            self._unindex(entry)

    def _unindex(self, entry: _Entry) -> None:
        for event in entry.events:
            buckets = self._parked[event]
            keys = buckets.get(entry.bucket)
            if keys is not None:
                keys.pop(entry.name, None)
                if not keys:
                    del buckets[entry.bucket]

    def pop(self, rank: Rank | None = None) -> str | None:
        """The next active pod by ``rank`` (default: priority, then arrival), removed
        from the queue; None if nothing is active."""
        best_heap = self._best(rank)
        if best_heap is None:
            return None
        _, _, name, _ = heapq.heappop(best_heap)
        del self._entries[name]
        return name

    def peek(self, rank: Rank | None = None) -> str | None:
        """The unit :meth:`pop` would return, left in the queue. One queue (the usual
        case, and every run the coordinator hands over, taken from the head one pod
        after another) is looked at directly."""
        active = self._active
        if len(active) == 1:
            head = self._head(next(iter(active.values())))
            return None if head is None else head[2]
        best_heap = self._best(rank)
        return None if best_heap is None else best_heap[0][2]

    def _best(self, rank: Rank | None) -> list[tuple[int, int, str, int]] | None:
        if len(self._active) == 1:  # one queue (the usual case): its head, if any
            heap = next(iter(self._active.values()))
            return heap if self._head(heap) is not None else None
        best_heap: list[tuple[int, int, str, int]] | None = None
        best_key: tuple[object, ...] | None = None
        for queue, heap in self._active.items():
            head = self._head(heap)
            if head is None:
                continue
            key = rank(queue, head[2], -head[0], head[1]) if rank else (head[0], head[1], head[2])
            if best_key is None or key < best_key:
                best_heap, best_key = heap, key
        return best_heap

    def park(
        self,
        key: str,
        priority: int,
        seq: int,
        attempts: int,
        now: int,
        plugins: tuple[str, ...],
        events: frozenset[ClusterEvent],
        queue: str = "",
        shape: object = None,
    ) -> None:
        """The attempt failed: wait for one of ``events``, then back off. ``shape``
        (the pod's equivalence class) lets similar pods share hints and wake-ups."""
        self.remove(key)
        backoff = min(self.initial_backoff << max(attempts - 1, 0), self.max_backoff)
        if is_group_unit(key):
            backoff = max(backoff, self.group_backoff)
        entry = _Entry(
            "unschedulable",
            self._next_generation(),
            priority,
            seq,
            key,
            backoff_until=now + backoff,
            plugins=plugins,
            events=events,
            queue=queue,
            bucket=(shape, plugins, priority),
        )
        self._entries[key] = entry
        for event in events:
            self._parked.setdefault(event, {}).setdefault(entry.bucket, {})[key] = None

    def on_event(
        self,
        event: ClusterEvent,
        now: int,
        helps: Callable[[str, tuple[str, ...]], bool],
        limit: Callable[[str, int], int] | None = None,
    ) -> int:
        """Move parked pods that ``event`` may help; return how many moved.

        ``helps(key, plugins)`` refines the choice (queueing hints), asked once per
        bucket with its first pod. ``limit(key, waiting)`` bounds how many pods of that
        bucket to wake (default: all).
        """
        buckets = self._parked.get(event)
        if not buckets:
            return 0
        order = sorted(buckets, key=lambda b: self._bucket_rank(buckets[b]))
        moved = 0
        for bucket in order:
            keys = buckets.get(bucket)
            if not keys:
                continue
            first = next(iter(keys))
            if not helps(first, self._entries[first].plugins):
                continue
            count = len(keys) if limit is None else min(limit(first, len(keys)), len(keys))
            for key in list(islice(keys, count)):
                self._unpark(self._entries[key], now)
                moved += 1
        return moved

    def _bucket_rank(self, keys: dict[str, None]) -> tuple[int, int]:
        entry = self._entries[next(iter(keys))]
        return (-entry.priority, entry.seq)

    def back_off(
        self, key: str, priority: int, seq: int, attempts: int, now: int, queue: str = ""
    ) -> None:
        """Retry ``key`` after its back-off, whatever happens meanwhile (bind failures)."""
        self.park(key, priority, seq, attempts, now, (), frozenset(), queue)
        self._unpark(self._entries[key], now)

    def _unpark(self, entry: _Entry, now: int) -> None:
        self._unindex(entry)
        entry.generation = self._next_generation()
        if entry.backoff_until > now:
            entry.where = "backoff"
            heapq.heappush(
                self._backoff, (entry.backoff_until, entry.seq, entry.name, entry.generation)
            )
        else:
            self._push_active(entry)

    def flush_backoff(self, now: int) -> None:
        """Move pods whose back-off has expired by ``now`` to active."""
        while self._backoff and self._backoff[0][0] <= now:
            item = heapq.heappop(self._backoff)
            if self._live(item):
                entry = self._entries[item[2]]
                entry.generation = self._next_generation()
                self._push_active(entry)

    def _live(self, item: tuple[int, int, str, int]) -> bool:
        entry = self._entries.get(item[2])
        return entry is not None and entry.generation == item[3] and entry.where == "backoff"

    def compact(self) -> None:
        """Drop superseded back-off records and keep the rest sorted (a sorted list is a
        heap). What the queue does next is unchanged; it makes equal queues equal however
        often :meth:`next_wakeup` (which drops stale records as it looks) was asked
        between passes, so a snapshot's bytes depend only on the log."""
        self._backoff = sorted(item for item in self._backoff if self._live(item))

    def next_wakeup(self) -> int | None:
        """Earliest back-off expiry, if any pod is backing off."""
        while self._backoff:
            if self._live(self._backoff[0]):
                return self._backoff[0][0]
            heapq.heappop(self._backoff)
        return None
