"""What a run did, as a fold of its log: each pod's final node, phase and reason.

The same fold serves ``simulate`` (at the end of the run) and ``replay`` (at any
offset), so the two always agree on the ``--json`` schema of DESIGN.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.model.dra import DeviceMismatch, claim_results
from events.types import (
    Answer,
    BindFailed,
    Envelope,
    NodeAdded,
    NodeRemoved,
    NodeSpec,
    NodeUpdated,
    PodBound,
    PodDeleted,
    PodEvicted,
    PodFailed,
    PodGroupStatusChanged,
    PodGroupSubmitted,
    PodMigrated,
    PodPreempted,
    PodRejected,
    PodRouted,
    PodSpec,
    PodSubmitted,
    PodSucceeded,
    PodUnbound,
    PodUnschedulable,
    ReservationRequested,
    SnapshotTaken,
    is_decision,
)

WAITING = "waiting to be scheduled"


@dataclass(slots=True)
class PodView:
    node: str | None = None
    phase: str = "Pending"
    reason: str = WAITING
    shard: int | None = None
    attempts: int = 0
    bound_at: int | None = None
    decision: str = ""
    """The decision id of its current placement."""
    devices: tuple[int, ...] = ()
    """The GPU cards it holds on ``node``."""
    claims: tuple[dict[str, str], ...] = ()
    """Its DRA claims' devices there: ``claim``, ``request``, ``driver``, ``pool``,
    ``device`` each (:func:`engine.model.dra.claim_results`)."""
    answer: Answer | None = None
    """The engine's answer for the person waiting, while ``reason`` is the one it
    answers (:meth:`current_answer`)."""
    answered: str = ""

    def current_answer(self) -> Answer | None:
        """The answer to why the pod waits now (None: bound, ended, or not answered)."""
        if self.phase == "Pending" and self.answer is not None and self.answered == self.reason:
            return self.answer
        return None

    def shown_reason(self) -> str:
        """The answer's line where there is one, else the reason."""
        answer = self.current_answer()
        return answer.text() if answer is not None else self.reason

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "phase": self.phase}
        if self.devices and self.phase == "Bound":
            out["devices"] = list(self.devices)
        if self.claims and self.phase == "Bound":
            out["claims"] = list(self.claims)
        if self.phase != "Bound" and self.reason:
            out["reason"] = self.reason
        answer = self.current_answer()
        if answer is not None:
            out["answer"] = answer_json(answer)
        if self.shard is not None:
            out["shard"] = self.shard
        out["attempts"] = self.attempts
        return out


@dataclass(slots=True)
class GroupView:
    min_member: int
    source: str
    phase: str = "Pending"
    scheduled: int = 0
    reason: str = ""
    members: int = 0
    answer: Answer | None = None
    """The answer its pending members were last given."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.phase,
            "scheduled": self.scheduled,
            "min_member": self.min_member,
            "members": self.members,
            "source": self.source,
        }
        if self.reason:
            out["reason"] = self.reason
        if self.answer is not None and self.phase == "Pending":
            out["answer"] = answer_json(self.answer)
        return out


def answer_json(answer: Answer) -> dict[str, Any]:
    """An answer in ``--json``: kind, summary, evidence, next_step and the one line."""
    return {
        "kind": answer.kind,
        "summary": answer.summary,
        "evidence": list(answer.evidence),
        "next_step": answer.next_step,
        "text": answer.text(),
    }


class RunReport:
    """Folds envelopes into per-pod views and run counters."""

    def __init__(self, control: int | None = None) -> None:
        self.control = control
        """The control partition of a log with several shards (None: one shard)."""
        self.pods: dict[str, PodView] = {}
        self.groups: dict[str, GroupView] = {}
        self.preemptions: list[dict[str, str]] = []
        self.migrations: list[dict[str, str]] = []
        self.nodes: set[str] = set()
        self._dra_nodes: dict[str, NodeSpec] = {}
        """Nodes with DRA devices, as last told."""
        self._claimants: dict[str, PodSpec] = {}
        """Pods with DRA claims."""
        self._pending_members: dict[str, int] = {}
        self._group_of: dict[str, str] = {}
        """Pod → its pod group (for the group's answer)."""
        self.current: dict[str, tuple[int, int]] = {}
        """Pod → (control offset, shard) of the router's latest hand-out (several shards
        only). Router records are ordered by the control offset that caused them, not by
        time: records of different partitions may share a time."""
        self.events = 0
        self.decisions = 0
        self.bind_failures = 0
        self.last_time = 0

    def __repr__(self) -> str:
        return f"RunReport(pods={len(self.pods)}, events={self.events})"

    def _stale(self, key: str, shard: int) -> bool:
        """A decision by a shard the pod has since left (handed back)?"""
        current = self.current.get(key)
        return current is not None and shard >= 0 and shard != current[1]

    def _over(self, key: str) -> bool:
        """Has pod ``key`` ended (rejected, finished, deleted, evicted)? Several
        partitions merged by time may put a shard's record of an earlier decision after
        the control partition's end of the pod; only a new submission starts it again."""
        view = self.pods.get(key)
        return view is not None and view.phase in ("Failed", "Succeeded", "Deleted")

    def apply(self, env: Envelope) -> None:
        if env.stream == "relay" or isinstance(env.event, SnapshotTaken):
            return  # a copy of a shard's record, for the router; a shard's saved state
        if env.producer == "router" and env.partition != self.control:
            if isinstance(env.event, PodRouted | ReservationRequested):
                self._routed(env)
            return  # a copy the router forwarded: the original is in the control partition
        self.events += 1
        self.last_time = max(self.last_time, env.time)
        event = env.event
        if is_decision(event):
            self.decisions += 1
        match event:
            case (
                PodUnbound(pod=key)
                | PodUnschedulable(pod=key)
                | PodBound(pod=key)
                | BindFailed(pod=key)
            ) if self._over(key):
                pass  # an earlier decision's record, merged after the pod's end
            case PodUnbound(pod=key):
                view = self._view(key)
                if view.phase == "Bound" and view.decision == event.decision_id:
                    view.node, view.phase = None, "Pending"
                    view.reason = f"unbound from {event.node}: {event.reason}"
            case PodUnschedulable(pod=key) | PodBound(pod=key) if self._stale(key, event.shard):
                pass
            case NodeAdded(node=spec) | NodeUpdated(node=spec):
                self.nodes.add(spec.name)
                if spec.devices or spec.name in self._dra_nodes:
                    self._dra_nodes[spec.name] = spec
            case NodeRemoved(name=name):
                self.nodes.discard(name)
                self._dra_nodes.pop(name, None)
            case PodSubmitted(pod=spec):
                self.pods[spec.key] = PodView()
                if spec.claims:
                    self._claimants[spec.key] = spec
                if spec.group:
                    self._group_of[spec.key] = spec.group
                group = self.groups.get(spec.group)
                if group is not None:
                    group.members += 1
                elif spec.group:
                    self._pending_members[spec.group] = self._pending_members.get(spec.group, 0) + 1
            case PodGroupSubmitted(group=spec):
                self.groups[spec.key] = GroupView(
                    spec.min_member, spec.source, members=self._pending_members.pop(spec.key, 0)
                )
            case PodGroupStatusChanged(group=key):
                view_g = self.groups.get(key)
                if view_g is not None:
                    view_g.phase, view_g.scheduled = event.phase, event.scheduled
                    view_g.reason = event.reason
            case PodUnschedulable(pod=key):
                view = self._view(key)
                if view.phase == "Pending":
                    view.reason = event.reason
                    if event.answer is not None:
                        view.answer, view.answered = event.answer, event.reason
                        group_view = self.groups.get(self._group_of.get(key, ""))
                        if group_view is not None:
                            group_view.answer = event.answer
                view.attempts = max(view.attempts, event.attempt)
                if event.shard >= 0:
                    view.shard = event.shard
            case PodRejected(pod=key):
                view = self._view(key)
                view.phase, view.reason = "Failed", event.reason
            case PodBound(pod=key):
                view = self._view(key)
                view.node, view.phase, view.reason = event.node, "Bound", ""
                view.attempts = max(view.attempts, event.attempt)
                view.shard = event.shard
                view.bound_at = env.time
                view.decision = event.decision_id
                view.devices = event.devices
                view.claims = self._claims_of(key, event.node, event.devices)
            case BindFailed(pod=key):
                self.bind_failures += 1
                view = self._view(key)
                if view.decision == event.decision_id and view.phase == "Bound":
                    view.node, view.phase = None, "Pending"
                    view.reason = f"binding to {event.node} failed: {event.reason}"
            case PodSucceeded(pod=key):
                view = self._view(key)
                view.phase, view.reason = "Succeeded", ""
            case PodFailed(pod=key):
                view = self._view(key)
                view.phase, view.reason = "Failed", event.reason or "failed"
            case PodDeleted(pod=key):
                view = self._view(key)
                view.phase, view.reason = "Deleted", "deleted"
            case PodEvicted(pod=key):
                view = self._view(key)
                view.phase, view.reason = "Failed", f"Evicted: {event.reason}"
                view.node = event.node or view.node  # (its bind may be merged after it)
            case PodMigrated(pod=key):
                view = self._view(key)
                if view.decision != event.decision_id:
                    view.node, view.phase, view.reason = event.to_node, "Bound", ""
                    view.decision = event.decision_id
                    view.devices = event.devices
                    view.claims = self._claims_of(key, event.to_node, event.devices)
                    view.bound_at = env.time
                    self.migrations.append(
                        {"pod": key, "from": event.from_node, "to": event.to_node, "by": event.by}
                    )
            case PodPreempted(pod=key):
                view = self._view(key)
                view.phase, view.reason = "Failed", f"Preempted by {event.by}"
                view.node = event.node or view.node  # (its bind may be merged after it)
                self.preemptions.append({"pod": key, "node": event.node, "by": event.by})
            case _:
                pass

    def _claims_of(self, key: str, node: str, cards: tuple[int, ...]) -> tuple[dict[str, str], ...]:
        pod, spec = self._claimants.get(key), self._dra_nodes.get(node)
        if pod is None or spec is None:
            return ()
        try:
            results = claim_results(pod, spec, cards)
        except DeviceMismatch as exc:
            return ({"error": str(exc)},)
        return tuple(
            {
                "claim": request.claim,
                "request": request.request,
                "driver": device.driver,
                "pool": device.pool,
                "device": device.device,
            }
            for request, device in results
        )

    def _routed(self, env: Envelope) -> None:
        event = env.event
        keys = (
            [event.pod.key]
            if isinstance(event, PodRouted)
            else [spec.key for spec in event.pods]
            if isinstance(event, ReservationRequested)
            else []
        )
        for key in keys:
            if self.current.get(key, (-1, -1))[0] <= env.causation:
                self.current[key] = (env.causation, env.partition)

    def _view(self, key: str) -> PodView:
        view = self.pods.get(key)
        if view is None:
            view = self.pods[key] = PodView()
        return view

    def counts(self) -> dict[str, int]:
        phases = {"Bound": 0, "Pending": 0, "Succeeded": 0, "Failed": 0, "Deleted": 0}
        for view in self.pods.values():
            phases[view.phase] = phases.get(view.phase, 0) + 1
        return {
            "bound": phases["Bound"],
            "pending": phases["Pending"],
            "succeeded": phases["Succeeded"],
            "failed": phases["Failed"],
            "deleted": phases["Deleted"],
            "pods": len(self.pods),
            "nodes": len(self.nodes),
            "events": self.events,
            "decisions": self.decisions,
            "bind_failures": self.bind_failures,
        }

    def to_json(self, **summary: Any) -> dict[str, Any]:
        return {
            "pods": {key: view.to_json() for key, view in sorted(self.pods.items())},
            "groups": {key: view.to_json() for key, view in sorted(self.groups.items())},
            "migrations": list(self.migrations),
            "preemptions": list(self.preemptions),
            "summary": {**self.counts(), "simulated_seconds": self.last_time / 1e9, **summary},
        }


def merge(parts: list[list[Envelope]]) -> list[Envelope]:
    """Partitions merged into one history for reports: by time, then the control
    partition (inputs) before the shards, then offset."""
    if len(parts) == 1:
        return parts[0]
    control = len(parts) - 1
    merged = [
        (env.time, 0 if p == control else 1, p, env.offset, env)
        for p, records in enumerate(parts)
        for env in records
    ]
    merged.sort(key=lambda item: item[:4])
    return [item[4] for item in merged]
