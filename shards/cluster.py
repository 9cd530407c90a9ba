"""The simulated cluster and its binder.

The cluster is the authority a binder commits to: it keeps its own record of nodes and
of what runs where, and re-checks every decision against it before binding (a decision
that no longer fits, names a vanished node or a deleted pod fails, and the failure is
an event). Bound pods with ``shoal.io/runtime`` succeed that many simulated seconds
later; pods on a removed node fail with ``NodeLost``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from events.types import (
    BindFailed,
    Envelope,
    Event,
    NodeAdded,
    NodeRemoved,
    NodeUpdated,
    PodBound,
    PodDeleted,
    PodEvicted,
    PodFailed,
    PodPreempted,
    PodSpec,
    PodSubmitted,
    PodSucceeded,
    PodUnbound,
)


@dataclass(slots=True)
class _Node:
    allocatable: dict[str, int]
    used: dict[str, int] = field(default_factory=dict)
    pods: dict[str, None] = field(default_factory=dict)


class SimulatedCluster:
    """What a kubelet and API server would know, in memory."""

    def __init__(self) -> None:
        self.nodes: dict[str, _Node] = {}
        self.specs: dict[str, PodSpec] = {}
        """Pods submitted and not yet finished or deleted."""
        self.running: dict[str, tuple[str, str]] = {}
        """Pod → (node, decision id)."""
        self._timers: list[tuple[int, int, str, str]] = []
        self._seq = 0
        self.bind_failures = 0

    def __repr__(self) -> str:
        return f"SimulatedCluster(nodes={len(self.nodes)}, running={len(self.running)})"

    def stats(self) -> dict[str, int]:
        return {
            "nodes": len(self.nodes),
            "running": len(self.running),
            "timers": len(self._timers),
            "bind_failures": self.bind_failures,
        }

    def observe(self, env: Envelope) -> list[Event]:
        """Fold a cluster event; return the events it causes (pods lost with a node)."""
        match env.event:
            case NodeAdded(node=spec) | NodeUpdated(node=spec):
                node = self.nodes.get(spec.name)
                if node is None:
                    self.nodes[spec.name] = _Node(dict(spec.allocatable))
                else:
                    node.allocatable = dict(spec.allocatable)
            case NodeRemoved(name=name):
                node = self.nodes.pop(name, None)
                if node is not None:
                    lost = list(node.pods)
                    for key in lost:
                        self._stop(key)
                    return [PodFailed(pod=key, node=name, reason="NodeLost") for key in lost]
            case PodSubmitted(pod=spec):
                if spec.key not in self.running:
                    self.specs[spec.key] = spec
            case PodDeleted(pod=key) | PodEvicted(pod=key) | PodPreempted(pod=key):
                self._stop(key)
                self.specs.pop(key, None)
            case _:
                pass
        return []

    def _stop(self, key: str) -> None:
        where = self.running.pop(key, None)
        if where is None:
            return
        node = self.nodes.get(where[0])
        spec = self.specs.pop(key, None)
        if node is not None:
            node.pods.pop(key, None)
            if spec is not None:
                for resource, amount in spec.requests.items():
                    node.used[resource] = node.used.get(resource, 0) - amount
                node.used["pods"] = node.used.get("pods", 0) - 1

    def unbind(self, decision: PodUnbound) -> None:
        """Take a placement back; the pod stays, pending again."""
        where = self.running.get(decision.pod)
        if where is None or where[1] != decision.decision_id:
            return
        spec = self.specs.get(decision.pod)
        self._stop(decision.pod)
        if spec is not None:
            self.specs[decision.pod] = spec

    def bind(self, decision: PodBound, now: int) -> list[Event]:
        """Apply a decision; return a ``BindFailed`` if the cluster cannot honour it."""
        current = self.running.get(decision.pod)
        if current is not None:
            if current[1] == decision.decision_id:
                return []  # the same decision twice changes nothing
            return [self._fail(decision, f"pod already bound to {current[0]}")]
        spec = self.specs.get(decision.pod)
        if spec is None:
            return [self._fail(decision, "pod not found")]
        node = self.nodes.get(decision.node)
        if node is None:
            return [self._fail(decision, f"node {decision.node} not found")]
        wanted = dict(spec.requests)
        wanted["pods"] = wanted.get("pods", 0) + 1
        for resource, amount in wanted.items():
            if node.used.get(resource, 0) + amount > node.allocatable.get(resource, 0):
                return [self._fail(decision, f"node {decision.node} has insufficient {resource}")]
        for resource, amount in wanted.items():
            node.used[resource] = node.used.get(resource, 0) + amount
        node.pods[decision.pod] = None
        self.running[decision.pod] = (decision.node, decision.decision_id)
        runtime = spec.runtime
        if runtime is not None:
            self._seq += 1
            heapq.heappush(
                self._timers, (now + runtime, self._seq, decision.pod, decision.decision_id)
            )
        return []

    def _fail(self, decision: PodBound, reason: str) -> BindFailed:
        self.bind_failures += 1
        return BindFailed(
            pod=decision.pod, node=decision.node, decision_id=decision.decision_id, reason=reason
        )

    def next_time(self) -> int | None:
        while self._timers:
            due, _, key, decision_id = self._timers[0]
            if self.running.get(key, ("", ""))[1] == decision_id:
                return due
            heapq.heappop(self._timers)
        return None

    def due(self, now: int) -> list[Event]:
        """Pods whose runtime is over by ``now``, as ``PodSucceeded`` events."""
        out: list[Event] = []
        while self._timers and self._timers[0][0] <= now:
            _, _, key, decision_id = heapq.heappop(self._timers)
            where = self.running.get(key)
            if where is None or where[1] != decision_id:
                continue
            spec = self.specs.get(key)
            self._stop(key)
            if spec is not None and spec.fails:
                out.append(PodFailed(pod=key, node=where[0], reason="Error"))
            else:
                out.append(PodSucceeded(pod=key, node=where[0]))
        return out

    def check_invariants(self) -> None:
        for name, node in self.nodes.items():
            for resource, amount in node.used.items():
                assert amount <= node.allocatable.get(resource, 0), (
                    f"{name} over-committed {resource}"
                )
