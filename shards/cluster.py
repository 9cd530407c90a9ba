"""The simulated cluster and its binder.

The cluster is the authority a binder commits to: it keeps its own record of nodes and
of what runs where, and re-checks every decision against it before binding (a decision
that no longer fits, names a vanished node or a deleted pod fails, and the failure is
an event). Bound pods with ``shoal.io/runtime`` succeed that many simulated seconds
later; pods on a removed node fail with ``NodeLost``.

GPU cards are checked as a device plugin would: the cards a decision names must exist on
the node, be as many as the pod asks for, and have the share it asks for free (compute in
milli-cards, memory per mille); the cluster keeps its own per-card record.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from engine.model.devices import (
    WHOLE,
    GpuRequest,
    GpuRequestError,
    gpu_request,
    node_cards,
    scalar_requests,
)
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
    PodMigrated,
    PodPreempted,
    PodSpec,
    PodSubmitted,
    PodSucceeded,
    PodUnbound,
)
from events.types import NodeSpec as _NodeSpec


@dataclass(slots=True)
class _Node:
    allocatable: dict[str, int]
    used: dict[str, int] = field(default_factory=dict)
    pods: dict[str, None] = field(default_factory=dict)
    cards: list[list[int]] = field(default_factory=list)
    """Per card: compute and memory (per mille) in use."""
    card_mib: int = 0


def _set_cards(node: _Node, spec: _NodeSpec) -> None:
    count, mib = node_cards(spec.allocatable, spec.labels)
    have = node.cards
    node.cards = [have[i] if i < len(have) else [0, 0] for i in range(count)]
    node.card_mib = mib


class SimulatedCluster:
    """What a kubelet and API server would know, in memory."""

    def __init__(self) -> None:
        self.nodes: dict[str, _Node] = {}
        self.specs: dict[str, PodSpec] = {}
        """Pods submitted and not yet finished or deleted."""
        self.running: dict[str, tuple[str, str]] = {}
        """Pod → (node, decision id)."""
        self.holding: dict[str, tuple[tuple[int, ...], int, int]] = {}
        """Pod → the cards it holds, and the compute and memory it takes on each."""
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
                    node = self.nodes[spec.name] = _Node(dict(spec.allocatable))
                else:
                    node.allocatable = dict(spec.allocatable)
                _set_cards(node, spec)
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
        held = self.holding.pop(key, None)
        if node is not None:
            node.pods.pop(key, None)
            if spec is not None:
                for resource, amount in _scalar(spec).items():
                    node.used[resource] = node.used.get(resource, 0) - amount
                node.used["pods"] = node.used.get("pods", 0) - 1
            if held is not None:
                devices, milli, memory = held
                for card in devices:
                    if card < len(node.cards):
                        node.cards[card][0] -= milli
                        node.cards[card][1] -= memory

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
        try:
            gpu = gpu_request(spec.requests)
        except GpuRequestError as exc:
            return [self._fail(decision, f"invalid GPU request: {exc}")]
        wanted = scalar_requests(spec.requests, gpu)
        wanted["pods"] = wanted.get("pods", 0) + 1
        for resource, amount in wanted.items():
            if node.used.get(resource, 0) + amount > node.allocatable.get(resource, 0):
                return [self._fail(decision, f"node {decision.node} has insufficient {resource}")]
        held = None
        if gpu is not None:
            held = _take_cards(node, gpu, decision.devices)
            if isinstance(held, str):
                return [self._fail(decision, f"node {decision.node}: {held}")]
            self.holding[decision.pod] = held
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

    def migrate(self, decision: PodMigrated, now: int) -> list[Event]:
        """A running pod moves: it stops where it runs and starts again on its new node
        under the new decision (its runtime starts again). A move the new node cannot
        hold fails like a binding (``BindFailed`` for the new decision)."""
        return [event for _, event in self.migrate_all([decision], now)]

    def migrate_all(self, decisions: list[PodMigrated], now: int) -> list[tuple[int, Event]]:
        """Moves made together (a plan's, one after another in a partition): every
        moving pod stops first, then each starts on its new node, in order, so a plan
        that swaps pods between nodes fits as its scheduler found it did (one by one,
        a pod could meet the pod it replaces still running). A pod moved again starts
        a new step at that move. What failed: the index of the decision and its
        ``BindFailed``."""
        failed: list[tuple[int, Event]] = []
        step: list[int] = []
        pods: set[str] = set()
        for i, decision in enumerate(decisions):
            if decision.pod in pods:
                failed += self._move_step(decisions, step, now)
                step, pods = [], set()
            step.append(i)
            pods.add(decision.pod)
        return failed + self._move_step(decisions, step, now)

    def _move_step(
        self, decisions: list[PodMigrated], step: list[int], now: int
    ) -> list[tuple[int, Event]]:
        """Stop the pods of ``step`` (indices into ``decisions``, each pod once), then
        start each on its new node."""
        moving = [
            i
            for i in step
            if (current := self.running.get(decisions[i].pod)) is None
            or current[1] != decisions[i].decision_id
        ]  # (not the same move seen twice)
        for i in moving:
            decision = decisions[i]
            spec = self.specs.get(decision.pod)
            if decision.pod in self.running:
                self._stop(decision.pod)
            if spec is not None:
                self.specs[decision.pod] = spec
        failed: list[tuple[int, Event]] = []
        for i in moving:
            decision = decisions[i]
            bound = PodBound(
                pod=decision.pod,
                node=decision.to_node,
                decision_id=decision.decision_id,
                attempt=0,
                devices=decision.devices,
            )
            failed += [(i, event) for event in self.bind(bound, now)]
        return failed

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
            for i, (milli, memory) in enumerate(node.cards):
                assert 0 <= milli <= WHOLE and 0 <= memory <= WHOLE, (
                    f"{name} over-committed GPU card {i}"
                )
            for resource, amount in node.used.items():
                assert amount <= node.allocatable.get(resource, 0), (
                    f"{name} over-committed {resource}"
                )


def _scalar(spec: PodSpec) -> dict[str, int]:
    try:
        return scalar_requests(spec.requests, gpu_request(spec.requests))
    except GpuRequestError:
        return dict(spec.requests)


def _take_cards(
    node: _Node, gpu: GpuRequest, devices: tuple[int, ...]
) -> tuple[tuple[int, ...], int, int] | str:
    """Charge ``gpu`` on ``devices`` of ``node``, or say why it cannot be."""
    if len(devices) != gpu.cards or len(set(devices)) != len(devices):
        return f"the decision names cards {list(devices)} for a pod of {gpu.cards} card(s)"
    milli = gpu.need.milli
    if gpu.need.memory_mib and node.card_mib <= 0:
        return "GPU memory asked in MiB, the node does not say its cards' memory"
    memory = gpu.memory_on(node.card_mib)
    for card in devices:
        if not 0 <= card < len(node.cards):
            return f"has no GPU card {card}"
        used_milli, used_memory = node.cards[card]
        if used_milli + milli > WHOLE or used_memory + memory > WHOLE:
            return f"GPU card {card} has not the share asked free"
    for card in devices:
        node.cards[card][0] += milli
        node.cards[card][1] += memory
    return devices, milli, memory
