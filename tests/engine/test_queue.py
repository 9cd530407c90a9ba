from __future__ import annotations

from engine.model.changes import ClusterEvent
from engine.model.queue import SchedulingQueue
from events.types import SECOND

FIT = frozenset({ClusterEvent.POD_FREED, ClusterEvent.NODE_ADDED})


def drain(queue: SchedulingQueue) -> list[str]:
    out = []
    while (key := queue.pop()) is not None:
        out.append(key)
    return out


def test_priority_then_arrival() -> None:
    q = SchedulingQueue()
    q.add("low-early", 0, 0)
    q.add("high-late", 10, 2)
    q.add("low-late", 0, 3)
    q.add("high-early", 10, 1)
    assert drain(q) == ["high-early", "high-late", "low-early", "low-late"]


def test_parked_pod_waits_for_its_event_then_backs_off() -> None:
    q = SchedulingQueue(initial_backoff_seconds=1, max_backoff_seconds=10)
    q.add("p", 0, 0)
    assert q.pop() == "p"
    q.park("p", 0, 0, attempts=1, now=0, plugins=("NodeResourcesFit",), events=FIT)
    assert q.where("p") == "unschedulable"
    assert q.on_event(ClusterEvent.NODE_UPDATED, 0, lambda k, p: True) == 0, "not its event"
    assert q.on_event(ClusterEvent.POD_FREED, SECOND // 2, lambda k, p: False) == 0, "hint said no"
    assert q.on_event(ClusterEvent.POD_FREED, SECOND // 2, lambda k, p: True) == 1
    assert q.where("p") == "backoff" and q.pop() is None
    assert q.next_wakeup() == SECOND
    q.flush_backoff(SECOND)
    assert q.pop() == "p"


def test_backoff_doubles_and_caps() -> None:
    q = SchedulingQueue(initial_backoff_seconds=1, max_backoff_seconds=10)
    for attempts, expected in [(1, 1), (2, 2), (3, 4), (4, 8), (5, 10), (9, 10)]:
        q.park("p", 0, 0, attempts=attempts, now=0, plugins=(), events=FIT)
        q.on_event(ClusterEvent.POD_FREED, 0, lambda k, p: True)
        assert q.next_wakeup() == expected * SECOND
        q.remove("p")


def test_event_after_backoff_goes_straight_to_active() -> None:
    q = SchedulingQueue()
    q.park("p", 0, 0, attempts=1, now=0, plugins=(), events=FIT)
    q.on_event(ClusterEvent.NODE_ADDED, 5 * SECOND, lambda k, p: True)
    assert q.where("p") == "active" and q.pop() == "p"


def test_remove_everywhere_and_stats() -> None:
    q = SchedulingQueue()
    q.add("a", 0, 0)
    q.park("b", 0, 1, attempts=1, now=0, plugins=(), events=FIT)
    q.back_off("c", 0, 2, attempts=1, now=0)
    assert q.stats() == {"active": 1, "backoff": 1, "unschedulable": 1}
    for key in "abc":
        q.remove(key)
    assert len(q) == 0 and drain(q) == []
    assert q.on_event(ClusterEvent.POD_FREED, 0, lambda k, p: True) == 0
    q.flush_backoff(100 * SECOND)
    assert q.pop() is None


def test_compact_drops_superseded_back_offs_and_keeps_what_comes_next() -> None:
    q = SchedulingQueue(initial_backoff_seconds=1, max_backoff_seconds=10)
    q.back_off("a", 0, 0, attempts=1, now=0)
    q.back_off("b", 0, 1, attempts=1, now=0)
    q.back_off("a", 0, 0, attempts=3, now=0)  # supersedes a's first record
    q.remove("b")
    twin = SchedulingQueue(initial_backoff_seconds=1, max_backoff_seconds=10)
    twin.back_off("a", 0, 0, attempts=1, now=0)
    twin.back_off("b", 0, 1, attempts=1, now=0)
    twin.back_off("a", 0, 0, attempts=3, now=0)
    twin.remove("b")
    assert twin.next_wakeup() == 4 * SECOND  # asking drops the stale records on top
    q.compact()
    twin.compact()
    assert q._backoff == twin._backoff == [(4 * SECOND, 0, "a", q._entries["a"].generation)]
    q.flush_backoff(2 * SECOND)
    assert q.pop() is None
    q.flush_backoff(4 * SECOND)
    assert drain(q) == ["a"]
