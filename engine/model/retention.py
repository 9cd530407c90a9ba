"""What an engine keeps of what is over, and for how long; and groups' time-outs.

A shard that kept every finished pod and group for ever grew by about 330 bytes of
memory and 200 bytes of snapshot per finished pod (pods in gangs of four, ``shoal
loadtest --churn``), and checked every gang ever seen for its time-out at every pass:
its CPU per pod went from 153 µs at 100,000 finished pods to 960 µs at 1,000,000. What
a finished pod or group is still needed for:

- *dependencies*: a unit that names it in ``shoal.io/depends-on`` reads its outcome
  (Succeeded or Failed) whenever it is settled;
- *names used again*: a pod told again under the name of one that finished is the same
  pod (ignored) unless its uid differs; a pod naming a group that is over is refused
  (or starts the group's next run);
- *reports*: a group's last status was emitted when it changed; nothing reads it later.

So the engine keeps them for a *retention window* in log time (the event timestamps it
already receives, never a clock): ``finishedRetentionSeconds`` of the configuration,
600 seconds by default. A pod or group over for longer than that is forgotten, unless a
live unit (a pod or group not over, or a pod waiting for its group's next run) names it
as a dependency: then it is kept while that unit lives, and for a window after. The
sweep runs in the fold, when a record moves log time on, in batches (once the oldest
entry is an eighth of a window past due), so that it costs nothing per pod in between;
it is a function of the records folded alone, so replay forgets exactly what the run
forgot (a pass that decides nothing leaves no record: a sweep there could not be
replayed).

Once forgotten, a name is as if never seen: a dependency on it waits ("not found") as
for a pod that does not exist yet; a pod told again under it is a new pod; a pod naming
a forgotten group waits for that group's PodGroup.

Group time-outs (``scheduleTimeoutSeconds``) are a heap of deadlines
(:class:`Deadlines`), armed when a group gets its spec or goes back to Pending: a pass
looks only at the deadlines that have passed, never at the groups that are over.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import Final, Protocol

from engine.model.groups import PENDING, GroupInfo, NextRuns, group_unit, is_group_unit
from engine.model.pods import PodInfo
from engine.model.queue import SchedulingQueue
from events.types import SECOND

RETENTION_SECONDS: Final = 600
"""The default retention window (``finishedRetentionSeconds``)."""
SWEEP_SLACK: Final = 8
"""A sweep runs once the oldest entry is a ``1/SWEEP_SLACK`` window past due."""


class Retired:
    """Names that are over (finished pods, groups over as ``@namespace/name``), oldest
    first, with when each was last retired: an entry is due once ``window`` of log
    time has passed since."""

    def __init__(self, window_seconds: int = RETENTION_SECONDS) -> None:
        self.window = window_seconds * SECOND
        self.order: deque[tuple[int, str]] = deque()
        self.at: dict[str, int] = {}
        """Name → when it was last retired (an older entry of ``order`` is stale)."""

    def __repr__(self) -> str:
        return f"Retired(window={self.window // SECOND}s, names={len(self.at)})"

    def __len__(self) -> int:
        return len(self.at)

    def add(self, key: str, now: int) -> None:
        """``key`` is over at ``now`` (again: its window starts anew)."""
        if self.at.get(key) == now:
            return
        self.at[key] = now
        self.order.append((now, key))

    def discard(self, key: str) -> None:
        """``key`` is live again (or forgotten another way): no longer due."""
        self.at.pop(key, None)

    def sweeps(self, now: int) -> bool:
        """Whether :meth:`due` at ``now`` would take anything out (False: time may move
        on to ``now`` with nothing to forget)."""
        order = self.order
        return bool(order) and order[0][0] <= now - self.window - self.window // SWEEP_SLACK

    def due(self, now: int) -> list[str]:
        """The names over for a whole window at ``now``, taken out (oldest first); none
        until the oldest is an eighth of a window past due, so that sweeps come in
        batches."""
        order = self.order
        cutoff = now - self.window
        if not order or order[0][0] > cutoff - self.window // SWEEP_SLACK:
            return []
        out = []
        at = self.at
        while order and order[0][0] <= cutoff:
            when, key = order.popleft()
            if at.get(key) == when:
                del at[key]
                out.append(key)
        return out


Valid = Callable[[str, int], bool]
"""``valid(group, deadline)``: whether an entry still stands (the group is Pending with
that deadline)."""


class Deadlines:
    """Groups' time-outs, soonest first: a heap of ``(deadline, seq, group)`` with lazy
    deletion (an entry whose group is gone, over, or has another deadline now is
    dropped when it comes up)."""

    def __init__(self) -> None:
        self.heap: list[tuple[int, int, str]] = []

    def __repr__(self) -> str:
        return f"Deadlines(entries={len(self.heap)})"

    def __len__(self) -> int:
        return len(self.heap)

    def arm(self, deadline: int, seq: int, group: str) -> None:
        heapq.heappush(self.heap, (deadline, seq, group))

    def compact(self) -> None:
        """Sort the heap (still a heap): its layout depends on when passes popped it,
        and a pass that decides nothing is not replayed; sorted, equal entries give
        equal snapshots. Nothing it answers depends on the layout."""
        self.heap.sort()

    def due(self, now: int, valid: Valid) -> list[tuple[int, int, str]]:
        """The entries due at ``now`` that still stand, taken out (each group once);
        stale ones are dropped."""
        heap = self.heap
        out: dict[str, tuple[int, int, str]] = {}
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if valid(entry[2], entry[0]):
                out.setdefault(entry[2], entry)
        return list(out.values())

    def next_after(self, now: int, valid: Valid) -> int | None:
        """The soonest deadline after ``now`` that still stands (the heap unchanged: a
        walk of its tree in order, as far as the first entry that stands)."""
        heap = self.heap
        if not heap:
            return None
        frontier = [(heap[0], 0)]
        for _ in range(len(heap)):  # every entry at most once
            if not frontier:
                break
            entry, index = heapq.heappop(frontier)
            if entry[0] > now and valid(entry[2], entry[0]):
                return entry[0]
            for child in (2 * index + 1, 2 * index + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
        return None


# ---------------------------------------------------------------------- on the model


class Retaining(Protocol):
    """What the functions below read and change of a shard's model
    (:class:`engine.model.shard.ShardModel`)."""

    now: int
    retired: Retired
    deadlines: Deadlines
    pods: dict[str, PodInfo]
    groups: dict[str, GroupInfo]
    outcomes: dict[str, str]
    finished_uids: dict[str, str]
    next_runs: NextRuns
    queue: SchedulingQueue
    waiting: dict[str, str]
    dirty: dict[str, None]
    held: dict[str, list[int]]
    planned: dict[str, dict[str, str]]
    planned_cards: dict[str, dict[str, tuple[int, ...]]]
    broken: dict[str, str]
    dependents: dict[str, dict[str, None]]
    depending: dict[str, None]
    group_changes: dict[str, None]
    dispatched: dict[str, str]

    def over(self, group: GroupInfo) -> bool: ...


def forget_finished(m: Retaining) -> None:
    """Forget the pods and groups over for a whole retention window that no live unit
    names as a dependency (those are retired again: kept a window more). A group is
    kept while its status is still to be reported, a next run waits for its name, or
    its placement is under way elsewhere."""
    due = m.retired.due(m.now)
    if not due:
        return
    named = _named(m)
    for name in due:
        if is_group_unit(name):
            group = m.groups.get(name[1:])
            if group is None or not m.over(group):
                continue  # live again (it is retired again once over)
            key = group.key
            if key in named or key in m.group_changes or key in m.next_runs or name in m.dispatched:
                m.retired.add(name, m.now)
                continue
            del m.groups[key]
            m.queue.remove(name)
            for held in (m.waiting, m.dirty, m.held, m.planned, m.planned_cards):
                held.pop(name, None)
            m.broken.pop(key, None)
            m.dependents.pop(key, None)
            m.depending.pop(name, None)
        elif name in m.outcomes:
            if name in named:
                m.retired.add(name, m.now)
                continue
            del m.outcomes[name]
            m.finished_uids.pop(name, None)
            m.dependents.pop(name, None)


def _named(m: Retaining) -> set[str]:
    """Every name a live unit depends on (pruning ``depending`` of the gone)."""
    names: set[str] = set()
    for unit in list(m.depending):
        deps: tuple[str, ...] = ()
        if is_group_unit(unit):
            group = m.groups.get(unit[1:])
            if group is not None and group.spec is not None:
                deps = group.spec.depends_on
        elif unit in m.pods:
            deps = m.pods[unit].spec.depends_on
        if deps:
            names.update(deps)
        else:
            del m.depending[unit]
    for spec, waiting in m.next_runs.values():
        names.update(spec.depends_on)
        for pod in waiting:
            names.update(pod.depends_on)
    return names


def timed_out(m: Retaining) -> list[GroupInfo]:
    """Pending groups past their deadline, in the order of ``m.groups`` (as a scan of
    every group found them); one whose placement is under way elsewhere is left for a
    later pass (it answers first)."""
    out = []
    for entry in m.deadlines.due(m.now, _stands(m)):
        if group_unit(entry[2]) in m.dispatched:
            m.deadlines.arm(*entry)
        else:
            out.append(m.groups[entry[2]])
    if len(out) > 1:
        order = {key: i for i, key in enumerate(m.groups)}
        out.sort(key=lambda group: order[group.key])
    return out


def next_deadline(m: Retaining) -> int | None:
    """The soonest time-out after ``m.now`` of a Pending group."""
    return m.deadlines.next_after(m.now, _stands(m))


def _stands(m: Retaining) -> Valid:
    groups = m.groups

    def stands(key: str, deadline: int) -> bool:
        group = groups.get(key)
        return group is not None and group.phase == PENDING and group.deadline == deadline

    return stands
