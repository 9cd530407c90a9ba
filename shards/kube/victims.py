"""The binder's bookkeeping of evictions under way and the bindings they hold back.

No I/O here (``shards/kube/binder.py`` makes the API calls): which pods were evicted
from which node and are not yet gone (``held``: their resources are still taken), which
bindings wait for a node to be free of them (``waiting``: each with its deadline), and
which evictions a disruption budget refused (``evictions``: each with its attempts and
when it is due again). Times are the binder's clock, in nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from events.types import PodBound


@dataclass
class Waiting:
    """A binding held back until the victims on its node are gone."""

    offset: int
    event: PodBound
    deadline: int


@dataclass
class Eviction:
    """An eviction a disruption budget refused, to be tried again at ``due``."""

    offset: int
    node: str
    attempts: int
    due: int
    why: str = ""


class Victims:
    def __init__(
        self,
        *,
        nomination_timeout: int,
        eviction_attempts: int,
        eviction_backoff: int,
        recheck: int,
    ) -> None:
        self.nomination_timeout = nomination_timeout
        self.eviction_attempts = eviction_attempts
        self.eviction_backoff = eviction_backoff
        self.recheck = recheck
        self.next_recheck = 0
        self.held: dict[str, dict[str, str]] = {}
        """Node → pods evicted from it and not yet gone (→ their uid)."""
        self.waiting: dict[str, list[Waiting]] = {}
        """Node → bindings onto it held back until ``held[node]`` is empty."""
        self.evictions: dict[str, Eviction] = {}
        """Pods whose eviction a disruption budget refused, to be tried again."""

    def __repr__(self) -> str:
        return f"Victims({self.stats()})"

    def stats(self) -> dict[str, int]:
        return {
            "waiting": sum(len(w) for w in self.waiting.values()),
            "held": sum(len(h) for h in self.held.values()),
            "evictions_pending": len(self.evictions),
        }

    def hold(self, node: str, pod: str, uid: str) -> None:
        """``pod`` (of ``uid``) is being evicted from ``node``: it holds it until gone."""
        self.held.setdefault(node, {})[pod] = uid

    def holds(self, node: str) -> bool:
        return node in self.held

    def gone(self, key: str) -> None:
        """``key`` left the cluster (or finished): what it held on its node is free; if
        it was waiting for a node itself, it no longer needs a binding."""
        self.evictions.pop(key, None)
        for node, pods in list(self.held.items()):
            pods.pop(key, None)
            if not pods:
                del self.held[node]
        for node, waiting in list(self.waiting.items()):
            self.waiting[node] = [w for w in waiting if w.event.pod != key]
            if not self.waiting[node]:
                del self.waiting[node]

    def wait(self, offset: int, event: PodBound, now: int) -> bool:
        """Hold ``event`` back; False if that decision already waits."""
        waiting = self.waiting.setdefault(event.node, [])
        if any(w.event.decision_id == event.decision_id for w in waiting):
            return False
        waiting.append(Waiting(offset, event, now + self.nomination_timeout))
        return True

    def refused(
        self, key: str, node: str, offset: int, why: str, now: int
    ) -> list[PodBound] | None:
        """An eviction of ``key`` refused: None while it will be tried again (with
        back-off), else given up: the bindings that waited for ``node``, now to fail."""
        previous = self.evictions.get(key)
        attempts = (previous.attempts if previous else 0) + 1
        if attempts < self.eviction_attempts:
            delay = self.eviction_backoff * 2 ** (attempts - 1)
            self.evictions[key] = Eviction(offset, node, attempts, now + delay, why)
            return None
        # given up: the pod stays, and holds its node's capacity while it does
        self.evictions.pop(key, None)
        return [w.event for w in self.waiting.pop(node, [])]

    def attempts(self, key: str) -> int:
        eviction = self.evictions.get(key)
        return eviction.attempts if eviction else 0

    def evictions_due(self, now: int) -> list[tuple[str, Eviction]]:
        return [(k, e) for k, e in self.evictions.items() if e.due <= now]

    def to_recheck(self, now: int) -> list[tuple[str, str]]:
        """The held pods (and uids) to look up in the cluster now: those that a waiting
        binding needs gone, once every ``recheck``."""
        if not self.waiting or now < self.next_recheck:
            return []
        self.next_recheck = now + self.recheck
        return [(key, uid) for node in self.waiting for key, uid in self.held.get(node, {}).items()]

    def released(self) -> list[PodBound]:
        """The waiting bindings whose node no longer holds a victim (taken out)."""
        free = [node for node in self.waiting if node not in self.held]
        return [w.event for node in free for w in self.waiting.pop(node)]

    def late(self, now: int) -> list[tuple[PodBound, str]]:
        """The waiting bindings past their deadline (taken out), each with the victims
        it still waited for."""
        out: list[tuple[PodBound, str]] = []
        for node, waiting in list(self.waiting.items()):
            victims = ", ".join(self.held.get(node, {}))
            out.extend((w.event, victims) for w in waiting if w.deadline <= now)
            self.waiting[node] = [w for w in waiting if w.deadline > now]
            if not self.waiting[node]:
                del self.waiting[node]
        return out

    def pending(self) -> list[int]:
        """The log offsets of decisions not yet applied (the binder's recorded position
        must not pass them)."""
        offsets = [w.offset for ws in self.waiting.values() for w in ws]
        return offsets + [e.offset for e in self.evictions.values()]
