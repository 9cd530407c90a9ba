"""``shoal extender``'s decisions: shoal's profiles judging what kube-scheduler asks.

:class:`ExtenderCore` holds an engine (the configuration's profiles, with their
plugins: fit and packing scores, ``ElasticQuota`` admission, ``Coscheduling``'s
minimum resources) fed with what the requests show: the nodes they carry (whole, from
an extender that is not ``nodeCacheCapable``), the pods asked about, the bindings made
through the bind verb, and the pod groups and quotas of ``--objects``. Every such fact
and every answer is a record (an ``Envelope``) for the server's own log, so a run can be
checked afterwards (:func:`verify`): the same facts in the same order give the same
answers. Nothing here does I/O; :mod:`shards.extenders.server` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import numpy as np

from engine.config import SchedulerConfig
from engine.engine import Engine
from engine.extenders import MAX_EXTENDER_PRIORITY
from engine.framework.cycle import CycleState
from events.types import (
    Envelope,
    Event,
    ExtenderAnswered,
    GroupSpec,
    NodeAdded,
    NodeSpec,
    NodeUpdated,
    PodBound,
    PodGroupSubmitted,
    PodSpec,
    PodSubmitted,
)
from shards import plugins
from shards.inputs.groups import group_membership
from shards.inputs.objects import node_spec, pod_spec

PRODUCER: Final = "extender"
UNKNOWN_NODE: Final = "node unknown to shoal (send whole nodes: nodeCacheCapable: false)"


@dataclass(frozen=True)
class FilterAnswer:
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


class ExtenderCore:
    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config
        self.engine = Engine(config, registry=plugins.for_config(config).registry)
        self.out: list[Envelope] = []
        """Records made since :meth:`take` (for the log)."""
        self.binds = 0
        self.nodes: dict[str, NodeSpec] = {}
        """Each node as last recorded."""

    def __repr__(self) -> str:
        return f"ExtenderCore({self.engine!r})"

    def take(self) -> list[Envelope]:
        out, self.out = self.out, []
        return out

    def record(self, event: Event, now: int) -> None:
        env = Envelope(event=event, time=max(now, self.engine.now), producer=PRODUCER)
        self.engine.apply(env)
        self.out.append(env)

    # ------------------------------------------------------------------ facts

    def learn_nodes(self, docs: Iterable[Mapping[str, Any]], now: int) -> list[str]:
        """The nodes of a request's ``Nodes``: new or changed ones are recorded."""
        names = []
        for doc in docs:
            spec = node_spec(doc)
            names.append(spec.name)
            self.learn_node(spec, now)
        return names

    def learn_node(self, spec: NodeSpec, now: int) -> None:
        known = self.nodes.get(spec.name)
        if known == spec:
            return
        self.nodes[spec.name] = spec
        self.record(NodeAdded(node=spec) if known is None else NodeUpdated(node=spec), now)

    def learn_pod(self, doc: Mapping[str, Any], now: int) -> PodSpec:
        """The request's pod (recorded when new or changed); a group it names by the
        older labels, with ``min-available``, is recorded too (a PodGroup comes from
        ``--objects``)."""
        spec = _spec_of(doc)
        group, minimum = group_membership(doc)
        if group:
            spec = msgspec.structs.replace(spec, group=group)
            if minimum is not None and group not in self.engine.groups:
                namespace, name = group.split("/", 1)
                self.record(
                    PodGroupSubmitted(
                        group=GroupSpec(
                            namespace=namespace, name=name, min_member=minimum, source="labels"
                        )
                    ),
                    now,
                )
        known = self.engine.pods.get(spec.key)
        if known is None or known.spec != spec:
            self.record(PodSubmitted(pod=spec), now)
        return spec

    def learn(self, events: Iterable[Event], now: int) -> None:
        """Pod groups, quotas (``--objects``)."""
        for event in events:
            self.record(event, now)

    # ------------------------------------------------------------------ verbs

    def filter(self, spec: PodSpec, names: list[str], now: int) -> FilterAnswer:
        """Which of ``names`` the pod's profile lets it go to, and why not the others."""
        engine = self.engine
        pod = engine.pods[spec.key]
        framework = engine.framework_for(pod)
        answer = FilterAnswer([], {}, {})
        state = engine.state
        if framework is None:
            reason = f"no scheduling profile serves schedulerName {spec.scheduler_name!r}"
            answer.unresolvable.update((n, reason) for n in names)
        else:
            cycle = CycleState()
            status = framework.run_pre_filters(cycle, pod, state)
            if not status.ok:
                reason = f"{status.plugin}: {status.message()}"
                answer.failed.update((n, reason) for n in names)
            else:
                masks = [(f, f.filter(cycle, pod, state)) for f in framework.filters]
                for name in names:
                    slot = state.index.get(name)
                    if slot is None:
                        answer.unresolvable[name] = UNKNOWN_NODE
                        continue
                    first = next((f for f, mask in masks if not mask[slot]), None)
                    if first is None:
                        answer.passed.append(name)
                    elif getattr(first, "unresolvable", False):
                        answer.unresolvable[name] = f"rejected by {first.name}"
                    else:
                        answer.failed[name] = f"rejected by {first.name}"
        self.record(
            ExtenderAnswered(
                extender=PRODUCER,
                pods=(spec.key,),
                nodes=tuple(names),
                passed=tuple(answer.passed),
                failed=answer.failed,
                unresolvable=answer.unresolvable,
            ),
            now,
        )
        return answer

    def prioritize(self, spec: PodSpec, names: list[str], now: int) -> dict[str, int]:
        """The profile's weighted scores of ``names``, scaled to 0..10 (the best 10)."""
        engine = self.engine
        pod = engine.pods[spec.key]
        framework = engine.framework_for(pod)
        state = engine.state
        slots = [state.index.get(n) for n in names]
        scores = dict.fromkeys(names, 0)
        known = [s for s in slots if s is not None]
        if framework is not None and known:
            feasible = np.zeros(state.capacity, dtype=np.bool_)
            feasible[known] = True
            cycle = CycleState()
            ready = framework.run_pre_filters(cycle, pod, state).ok and all(
                pre.pre_score(cycle, pod, state, feasible).ok for pre in framework.pre_scores
            )
            if ready:
                masked, _ = framework.score(cycle, pod, state, feasible)
                totals = masked[known]
                low, high = int(totals.min()), int(totals.max())
                for name, slot in zip(names, slots, strict=True):
                    if slot is not None and high > low:
                        value = int(masked[slot]) - low
                        scores[name] = value * MAX_EXTENDER_PRIORITY // (high - low)
        self.record(
            ExtenderAnswered(
                extender=PRODUCER, pods=(spec.key,), nodes=tuple(names), scores=scores
            ),
            now,
        )
        return scores

    def bound(self, key: str, node: str, now: int) -> None:
        """A binding made through the bind verb: the node's room is taken."""
        self.binds += 1
        self.record(
            PodBound(pod=key, node=node, decision_id=f"{key}@extender#{self.binds}", attempt=1),
            now,
        )

    def gang_of(self, key: str) -> tuple[str, int]:
        """The pod's group and its minMember (1 without one)."""
        pod = self.engine.pods.get(key)
        group = self.engine.groups.get(pod.spec.group) if pod and pod.spec.group else None
        if group is None:
            return "", 1
        return group.key, max(group.min_member, 1)


def _spec_of(doc: Mapping[str, Any]) -> PodSpec:
    """A ``v1.Pod`` as kube-scheduler sends it: admission already resolved its priority,
    so a class shoal does not know keeps the pod's own value."""
    spec = doc.get("spec")
    classes: dict[str, int] = {}
    if isinstance(spec, dict):
        name, value = spec.get("priorityClassName"), spec.get("priority")
        if isinstance(name, str) and name and type(value) is int:
            classes[name] = value
    return pod_spec(doc, classes)


def verify(records: Iterable[Envelope], config: SchedulerConfig | None) -> str | None:
    """Fold a server's log into a fresh core and re-derive each recorded answer; the
    first difference, or None."""
    core = ExtenderCore(config)
    for env in records:
        event = env.event
        if isinstance(event, ExtenderAnswered) and event.pods:
            spec = (
                core.engine.pods[event.pods[0]].spec if event.pods[0] in core.engine.pods else None
            )
            if spec is None:
                return f"offset {env.offset}: an answer about unknown pod {event.pods[0]}"
            if event.passed is not None:
                fa = core.filter(spec, list(event.nodes), env.time)
                again: tuple[Any, ...] = (tuple(fa.passed), fa.failed, fa.unresolvable)
                was: tuple[Any, ...] = (event.passed, event.failed, event.unresolvable)
            else:
                again = (core.prioritize(spec, list(event.nodes), env.time),)
                was = (event.scores,)
            core.take()
            if again != was:
                return f"offset {env.offset}: recorded {was!r}, derived {again!r}"
        else:
            core.engine.apply(env)
            if isinstance(event, NodeAdded | NodeUpdated):
                core.nodes[event.node.name] = event.node
    return None
