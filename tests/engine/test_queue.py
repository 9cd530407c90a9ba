from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.model.changes import ClusterEvent
from engine.model.queue import Room, SchedulingQueue
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


@given(
    pods=st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0, 10])), min_size=1, max_size=12),
    requests=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 2)), min_size=4, max_size=4),
    room=st.tuples(st.integers(0, 8), st.integers(0, 4)),
)
def test_parked_pods_take_freed_room_in_queue_order_across_buckets(
    pods: list[tuple[int, int]], requests: list[tuple[int, int]], room: tuple[int, int]
) -> None:
    """Pods of several buckets (shape, priority) parked in arrival order; room freed on
    a node wakes them in queue order (priority, then arrival), each while the room left
    holds its request, whatever bucket it is in: the pods a scheduler trying every pod
    in that order would place there (before, each bucket took the room whole, in the
    order of its first pod, so a later pod of one bucket took it from an earlier pod
    of another)."""
    q = SchedulingQueue()
    shapes = {}
    for seq, (shape, priority) in enumerate(pods):
        key = f"p{seq}"
        shapes[key] = (shape, priority)
        q.park(key, priority, seq, 1, 0, ("NodeResourcesFit",), FIT, shape=shape)
    budget = {0: room[0], 1: room[1]}

    def share(key: str) -> Room:
        cpu, cards = requests[shapes[key][0]]
        return Room(budget, tuple((row, n) for row, n in ((0, cpu), (1, cards)) if n > 0))

    q.on_event(ClusterEvent.POD_FREED, SECOND, lambda k, p: True, share)
    woken = {key for key in shapes if q.where(key) != "unschedulable"}
    left = {0: room[0], 1: room[1]}
    want = set()
    for seq in sorted(range(len(pods)), key=lambda i: (-pods[i][1], i)):
        cpu, cards = requests[pods[seq][0]]
        if left[0] >= cpu and left[1] >= cards:
            left[0] -= cpu
            left[1] -= cards
            want.add(f"p{seq}")
    assert woken == want
