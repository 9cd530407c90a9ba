"""The engine of one shard: a pure fold of events plus scheduling passes.

``apply(envelope)`` folds any event (inputs and decisions alike; decisions are applied
idempotently, so replaying its own output changes nothing). ``schedule()`` runs one pass
at the time of the latest event: it drains the active queue, assumes each placement in
the state, and returns the decisions as events for the caller to append. No clock, no
I/O, no randomness: the same events give the same decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from engine.config import SchedulerConfig, default_config
from engine.framework.interfaces import ClusterEvent
from engine.framework.registry import Registry, builtin_registry
from engine.framework.runtime import Attempt, Diagnosis, Framework
from engine.framework.status import Status
from engine.pod import PodInfo, pod_info
from engine.queue import SchedulingQueue
from engine.state import ClusterState
from events.types import (
    BindFailed,
    ClockTicked,
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
    PodSubmitted,
    PodSucceeded,
    PodUnschedulable,
)

NO_PROFILE = "no scheduling profile serves schedulerName {!r}"


@dataclass(frozen=True, slots=True)
class Explanation:
    """One attempt of the pod under ``--explain``."""

    time: int
    attempt: int
    node: str | None
    status: Status
    diagnosis: Diagnosis | None


class Engine:
    """Scheduling state and logic of one shard."""

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        shard: int = 0,
        registry: Registry | None = None,
    ) -> None:
        self.config = config or default_config()
        self.shard = shard
        registry = registry or builtin_registry()
        self.frameworks = {p.scheduler_name: Framework(p, registry) for p in self.config.profiles}
        self._default = self.frameworks[self.config.profiles[0].scheduler_name]
        self.state = ClusterState()
        self.queue = SchedulingQueue(
            self.config.initial_backoff_seconds, self.config.max_backoff_seconds
        )
        self.pods: dict[str, PodInfo] = {}
        """Live pods: pending, assumed or bound. Finished and deleted pods are dropped."""
        self.bindings: dict[str, str] = {}
        """Pod → decision id of its current placement."""
        self.now = 0
        self.explain: str | None = None
        self.explanations: list[Explanation] = []
        self._submissions = 0
        self._counters = {"attempts": 0, "bound": 0, "unschedulable": 0, "events": 0}

    def __repr__(self) -> str:
        return f"Engine(shard={self.shard}, now={self.now}, {self.state!r}, {self.queue!r})"

    def stats(self) -> dict[str, int]:
        return {**self._counters, **self.queue.stats(), **self.state.stats()}

    def framework_for(self, pod: PodInfo) -> Framework | None:
        name = pod.spec.scheduler_name
        if not name:
            return self._default
        return self.frameworks.get(name)

    # ------------------------------------------------------------------ fold

    def apply(self, envelope: Envelope) -> None:
        """Fold one event. Idempotent for decisions and duplicate submissions."""
        self._counters["events"] += 1
        self.now = max(self.now, envelope.time)
        event = envelope.event
        match event:
            case PodSubmitted(pod=spec):
                self._submit(spec.key, event)
            case PodBound():
                self._bound(event)
            case PodUnschedulable():
                self._unschedulable(event)
            case BindFailed():
                self._bind_failed(event)
            case PodDeleted(pod=key) | PodSucceeded(pod=key) | PodFailed(pod=key):
                self._gone(key)
            case PodEvicted(pod=key) | PodPreempted(pod=key):
                self._gone(key)
            case NodeAdded(node=spec):
                self._fire(ClusterEvent.NODE_ADDED, self.state.add_node(spec))
            case NodeUpdated(node=spec):
                self._fire(ClusterEvent.NODE_UPDATED, self.state.update_node(spec))
            case NodeRemoved(name=name):
                for key in self.state.remove_node(name):
                    self.bindings.pop(key, None)
            case ClockTicked():
                pass

    def _submit(self, key: str, event: PodSubmitted) -> None:
        if key in self.pods:
            return
        info = pod_info(event.pod, self.state.resources, self._submissions)
        self._submissions += 1
        self.state.ensure_rows()
        self.pods[key] = info
        self.queue.add(key, info.priority, info.seq)

    def _bound(self, event: PodBound) -> None:
        pod = self.pods.get(event.pod)
        slot = self.state.index.get(event.node)
        if pod is None or slot is None or self.bindings.get(event.pod) == event.decision_id:
            return
        self.queue.remove(event.pod)
        pod.attempts = max(pod.attempts, event.attempt)
        self.state.assume(event.pod, slot, pod.request)
        self.bindings[event.pod] = event.decision_id

    def _unschedulable(self, event: PodUnschedulable) -> None:
        pod = self.pods.get(event.pod)
        if pod is None or pod.attempts >= event.attempt:
            return
        pod.attempts = event.attempt
        framework = self.framework_for(pod)
        events = framework.events_for(event.plugins) if framework else frozenset()
        self.queue.park(
            event.pod, pod.priority, pod.seq, pod.attempts, self.now, event.plugins, events
        )

    def _bind_failed(self, event: BindFailed) -> None:
        pod = self.pods.get(event.pod)
        if pod is None or self.bindings.get(event.pod) != event.decision_id:
            return
        del self.bindings[event.pod]
        slot = self.state.forget(event.pod)
        self.queue.back_off(event.pod, pod.priority, pod.seq, pod.attempts, self.now)
        if slot is not None:
            self._fire(ClusterEvent.POD_FREED, slot)

    def _gone(self, key: str) -> None:
        if self.pods.pop(key, None) is None:
            return
        self.queue.remove(key)
        self.bindings.pop(key, None)
        slot = self.state.forget(key)
        if slot is not None:
            self._fire(ClusterEvent.POD_FREED, slot)

    def _fire(self, event: ClusterEvent, slot: int) -> None:
        """Requeue parked pods that ``event`` on ``slot`` may help (hints per shape)."""
        verdicts: dict[tuple[object, ...], bool] = {}

        def helps(key: str, plugins: tuple[str, ...]) -> bool:
            pod = self.pods[key]
            framework = self.framework_for(pod)
            if framework is None:
                return False
            cache_key = (id(framework), pod.shape_key, plugins)
            verdict = verdicts.get(cache_key)
            if verdict is None:
                verdict = framework.worth_retrying(pod, plugins, event, slot, self.state)
                verdicts[cache_key] = verdict
            return verdict

        self.queue.on_event(event, self.now, helps)

    # ------------------------------------------------------------------ decide

    def next_wakeup(self) -> int | None:
        """Simulated time at which a pass would do something new without new events."""
        return self.queue.next_wakeup()

    def schedule(self) -> list[Event]:
        """Run one pass at ``self.now``; return the decisions (already applied)."""
        self.queue.flush_backoff(self.now)
        out: list[Event] = []
        failed: dict[tuple[object, ...], Attempt] = {}
        state = self.state
        while (key := self.queue.pop()) is not None:
            pod = self.pods[key]
            pod.attempts += 1
            self._counters["attempts"] += 1
            framework = self.framework_for(pod)
            if framework is None:
                reason = NO_PROFILE.format(pod.spec.scheduler_name)
                self.queue.park(key, pod.priority, pod.seq, pod.attempts, self.now, (), frozenset())
                out.append(
                    PodUnschedulable(pod=key, attempt=pod.attempts, reason=reason, shard=self.shard)
                )
                self._counters["unschedulable"] += 1
                continue
            explain = key == self.explain
            cache_key = (id(framework), pod.shape_key)
            attempt = None if explain else failed.get(cache_key)
            if attempt is None:
                attempt = framework.schedule(pod, state, explain=explain)
            if explain:
                node = state.names[attempt.slot] if attempt.slot >= 0 else None
                self.explanations.append(
                    Explanation(self.now, pod.attempts, node, attempt.status, attempt.diagnosis)
                )
            if attempt.slot >= 0:
                decision_id = f"{key}@{pod.seq}#{pod.attempts}"
                state.assume(key, attempt.slot, pod.request)
                self.bindings[key] = decision_id
                node_name = state.names[attempt.slot]
                assert node_name is not None
                out.append(
                    PodBound(
                        pod=key,
                        node=node_name,
                        decision_id=decision_id,
                        attempt=pod.attempts,
                        shard=self.shard,
                        score=attempt.score,
                    )
                )
                self._counters["bound"] += 1
                continue
            diagnosis = attempt.diagnosis
            plugins = tuple(diagnosis.plugins) if diagnosis else ()
            if not plugins and attempt.status.plugin:
                plugins = (attempt.status.plugin,)
            if diagnosis is not None and diagnosis.plugins:
                failed[cache_key] = attempt
            self.queue.park(
                key,
                pod.priority,
                pod.seq,
                pod.attempts,
                self.now,
                plugins,
                framework.events_for(plugins),
            )
            out.append(
                PodUnschedulable(
                    pod=key,
                    attempt=pod.attempts,
                    reason=attempt.status.message(),
                    rejections=diagnosis.rejections() if diagnosis else {},
                    plugins=plugins,
                    shard=self.shard,
                )
            )
            self._counters["unschedulable"] += 1
        return out


def same_decision(a: Event, b: Event) -> bool:
    """Whether two decision events are the same decision (ignoring nothing: exact)."""
    return msgspec.structs.asdict(a) == msgspec.structs.asdict(b) and type(a) is type(b)
