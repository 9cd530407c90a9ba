"""The plain pods at the head of the coordinator's queue, handed over in one step.

:func:`take` takes them out of the queue, in queue order, checked once per kind of pod
(:func:`kind_key`); :meth:`shards.coordinator.dispatch.ShardDispatch._hand_batch` then
chooses each one's shard and hands it over. Why, and the cost per pod: the docstring of
:mod:`shards.coordinator.dispatch`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

from engine.engine import Engine
from engine.framework.runtime import Framework
from engine.model.pods import PodInfo


class Handing(Protocol):
    """What :func:`take` reads of the coordinator."""

    engine: Engine
    inflight: list[int]
    hard: dict[str, None]
    held_by: dict[str, dict[str, None]]


MAX_BATCH: Final = 8192
"""Pods handed over in one step at most."""


class Kind:
    """A kind of pod in a batch handed over (:func:`take`): the checks made
    once for it, and its pods' choices of shard."""

    __slots__ = ("candidates", "counts", "framework", "lead", "pods", "table", "taken")

    def __init__(self, framework: Framework, lead: PodInfo, counts: list[int]) -> None:
        self.framework = framework
        self.lead = lead
        self.counts = counts
        """Per shard, its nodes that pass every filter for this kind (the view's)."""
        self.candidates = [s for s, count in enumerate(counts) if count > 0]
        self.pods = 1
        self.table: list[list[int]] | None = None
        """Per shard, its score after ``j`` more pods of the kind
        (:func:`shards.coordinator.choice.run_scores`)."""
        self.taken = [0] * len(counts)
        """Per shard, the pods of this kind the batch gave it so far."""

    def __repr__(self) -> str:
        return f"Kind({self.lead.key!r}, pods={self.pods})"


def kind_key(pod: PodInfo) -> tuple[object, ...]:
    """What decides a plain pod's hand-over besides the view (its filters, pre-filters,
    scores, whether an inter-pod rule applies to it): pods with equal keys are one kind,
    checked once per batch. Hashed by the caller (TypeError: a constraint holding a
    dict, such as a label selector; such a pod is handed over alone)."""
    spec = pod.spec
    return (
        pod.shape_key,
        spec.namespace,
        spec.scheduler_name,
        spec.priority,
        spec.priority_class,
        spec.preemption_policy,
        tuple(spec.labels.items()),
        spec.spread_constraints,
        spec.owner_selector,
        spec.owner,
        spec.pod_affinity,
        spec.pod_anti_affinity,
        spec.pod_affinity_preferred,
        spec.pod_anti_affinity_preferred,
        spec.claims,
    )


def take(
    c: Handing, lead: PodInfo, kind: Kind, kind_of: Callable[[PodInfo], Kind | None]
) -> list[tuple[PodInfo, Kind]]:
    """``lead`` and the plain pods that follow it at the head of the queue, in queue
    order, as long as each passes the checks of a hand-over (made once per kind of
    pod: :func:`kind_key`), taken out of the queue. Only where no quota orders the
    queue (dominant shares change with each charge, and admission with them) and no
    extender is asked; a pod handed back (decided here), held under a claim, or in
    a gang ends the batch, and so does a pod whose kind cannot be handed over."""
    e = c.engine
    batch = [(lead, kind)]
    if e.quotas or e.config.extenders:
        return batch
    # every pod handed over takes one node at least: no more than there are nodes
    bound = min(len(e.state.index) - sum(c.inflight), MAX_BATCH)
    if bound <= 1:
        return batch
    try:
        kinds = {kind_key(lead): kind}
    except TypeError:
        return batch  # (a spec with unhashable constraints: handed over alone)
    queue = e.queue
    pods = e.pods
    placed = e.state.pods
    hard = c.hard
    held = c.held_by
    queue.remove(lead.key)  # handed: the pass removes it too (a no-op then)
    while len(batch) < bound:
        key = queue.peek(None)
        if key is None:
            break
        pod = pods.get(key)
        if pod is None or key in placed or key in hard or key in held:
            break
        spec = pod.spec
        if spec.group or spec.depends_on:
            break
        try:
            found = kinds.get(kind_key(pod))
        except TypeError:
            break
        if found is None:
            found = kind_of(pod)
            if found is None:
                break
            kinds[kind_key(pod)] = found
        queue.remove(key)
        batch.append((pod, found))
        found.pods += 1
    return batch
