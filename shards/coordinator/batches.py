"""The plain pods at the head of the coordinator's queue, handed over in one step.

:meth:`shards.coordinator.dispatch.ShardDispatch._hand_over` hands a plain pod that a
shard certainly holds over with :func:`hand_batch`: :func:`take` takes it and the plain
pods behind it out of the queue, in queue order, checked once per kind of pod
(:func:`kind_key`, :func:`kind_of`, with the checks of :mod:`shards.coordinator.handover`);
:func:`hand_batch` then chooses each one's shard and hands it over. Why a unit is handed
over or decided here: the docstring of :mod:`shards.coordinator.dispatch`.

**Handing over in batches, and why.** The plain pods at the head of the queue are handed
over in one step (:func:`hand_batch`): in queue order, each while a shard certainly
holds it, the batch ending at the first pod that does not (it waits at the head, as one
by one it would) or that cannot be handed over at all (a gang, one handed back...: the
exact path of :mod:`shards.coordinator.dispatch`). A pod that only an inter-pod rule or
a spread constraint keeps on the coordinator is decided in its place in the batch when
that is exact, and the batch goes on (:func:`hand_batch`, "Pods decided in place").
The checks (profile, inter-pod rules, extenders, pre-filters, feasible nodes per shard)
are made once per kind of pod in the batch (:func:`kind_key`: same request, filters,
labels and constraints), not per pod; the choice of shard for the pods of one kind is
one vectorised score of every shard after 0, 1, 2... more pods of that kind
(:func:`shards.coordinator.choice.run_scores`), so a run of identical pods (one
Deployment's, Job's) goes exactly where one by one it would; pods of other kinds in the
same batch are not counted in a kind's scores (each kind spreads on its own; all are
counted in what a shard certainly holds). Batches are made only where no quota orders
the queue (dominant shares and admission change with every charge) and no extender is
asked; otherwise a pod is handed over alone, as before.

**Cost per pod handed over** (the cost model of :mod:`shards.coordinator.coordinator`;
5,000 nodes, one template, 2 shards, a busy 2-core machine): about 7 µs: per pod,
taking it out of the queue and its kind's key (about 3), its choice (a look-up and a
comparison per shard), its ``PodRouted`` and decision id (drawn for the batch at
once), its flight; per kind and batch, the checks, the count of feasible nodes per
shard and the shards' sums, both O(nodes changed since the kind was last counted):
:class:`shards.coordinator.handover.Counted` and :class:`shards.coordinator.handover.Sums`,
and its shards' scores (a kind with one pod in the batch is scored without the
wide table of a run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

from engine.framework.runtime import Framework
from engine.model.pods import PodInfo
from events.types import Event, PodRouted
from shards.coordinator.choice import run_scores
from shards.coordinator.flights import LabelKey, label_key
from shards.coordinator.handover import Checks, Viewing


class Handing(Viewing, Protocol):
    """What a batch's hand-over reads and asks of the coordinator."""

    inflight: list[int]
    hard: dict[str, None]
    held_by: dict[str, dict[str, None]]
    counters: dict[str, int]

    def send(self, partition: int, event: Event) -> None: ...

    def next_seq(self) -> int: ...

    def next_seqs(self, count: int) -> int: ...

    def send_all(self, outputs: list[tuple[int, Event]]) -> None: ...

    def fly_run(self, pods: list[PodInfo], shards: list[int], decisions: list[str]) -> None: ...


MAX_BATCH: Final = 8192
"""Pods handed over in one step at most."""


class Kind:
    """A kind of pod in a batch handed over (:func:`take`): the checks made
    once for it, and its pods' choices of shard."""

    __slots__ = ("candidates", "counts", "framework", "lead", "most", "pods", "table", "taken")

    def __init__(
        self, framework: Framework, lead: PodInfo, counts: list[int], inflight: list[int]
    ) -> None:
        self.framework = framework
        self.lead = lead
        self.counts = counts
        """Per shard, its nodes that pass every filter for this kind (the view's)."""
        self.candidates = [s for s, count in enumerate(counts) if count > 0]
        self.most = sum(
            max(count - flying, 0) for count, flying in zip(counts, inflight, strict=True)
        )
        """Pods of this kind the batch can hand over at most (``inflight``: per shard, the
        pods under way there): a pod goes to a shard only while more of its nodes pass
        the kind's filters than pods are under way there. The one after them would end
        the batch, so :func:`take` ends it there."""
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
    c: Handing,
    lead: PodInfo,
    kind: Kind,
    kind_of: Callable[[PodInfo], Kind | None],
    in_place: Callable[[PodInfo], bool] | None = None,
) -> list[tuple[PodInfo, Kind | None]]:
    """``lead`` and the plain pods that follow it at the head of the queue, in queue
    order, as long as each passes the checks of a hand-over (made once per kind of
    pod: :func:`kind_key`), taken out of the queue. Only where no quota orders the
    queue (dominant shares change with each charge, and admission with them) and no
    extender is asked; a pod handed back (decided here), held under a claim, or in
    a gang ends the batch, and so does a pod whose kind cannot be handed over, unless
    ``in_place`` says it may be decided here within the batch: it is taken with no
    kind (None), in its place in the order (:func:`hand_batch`)."""
    e = c.engine
    batch: list[tuple[PodInfo, Kind | None]] = [(lead, kind)]
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
        known: tuple[object, ...] | None
        try:
            known = kind_key(pod)
            found = kinds.get(known)
        except TypeError:  # (a label selector in its constraints, say)
            known = found = None
        if found is None:
            if in_place is not None and in_place(pod):
                queue.take_active(key)
                batch.append((pod, None))
                continue
            if known is None:
                break
            found = kind_of(pod)  # (counts its first pod)
            if found is None or found.most == 0:
                break
            kinds[known] = found
        elif found.pods == found.most:
            break  # (this one would not be handed over: the batch ends here)
        else:
            found.pods += 1
        queue.take_active(key)  # (the head peek gave: active)
        batch.append((pod, found))
    return batch


def kind_of(c: Handing, checks: Checks, pod: PodInfo) -> Kind | None:
    """The checks of :meth:`shards.coordinator.dispatch.ShardDispatch._hand_over` for a
    plain pod that follows the head of the queue, made once per kind of pod in a batch
    (None: not to be handed over)."""
    e = c.engine
    framework = e.profiles.framework_for(pod)
    if framework is None or not framework.incremental or not checks.summarised(framework):
        return None
    if framework.conditional and framework.cluster_wide(pod, e.state):
        return None
    counts = checks.counts(("counts", pod.shape_key, pod.spec.scheduler_name), [pod], [framework])
    if not checks.admitted([pod], [framework]):
        return None
    kind = Kind(framework, pod, counts, c.inflight)
    return kind if kind.candidates else None


class InPlace(Protocol):
    """Decides, within a batch, a pod that only inter-pod rules or spread constraints
    keep on the coordinator (:meth:`shards.coordinator.dispatch.ShardDispatch._early`)."""

    def candidate(self, pod: PodInfo) -> bool:
        """Whether ``pod`` is one to try (cheap: its profile and rules, not the view)."""
        ...

    def decide(self, pod: PodInfo, ahead: list[LabelKey], spare: list[int]) -> int | None:
        """Place ``pod`` on the view now, its records ahead of the batch's in the log, if
        it is exact so: no pod of the batch before it (namespaces and labels
        ``ahead``) nor any flying pod is one its rules count, and its node's shard can
        spare a node (``spare``: per shard, how many more nodes the pods handed to it
        in the batch can do without). The shard of its node, or None (not placed)."""
        ...


def hand_batch(
    c: Handing,
    checks: Checks,
    framework: Framework,
    lead: PodInfo,
    counts: list[int],
    in_place: InPlace | None = None,
) -> bool:
    """Hand ``lead`` and the plain pods behind it over in one step
    (:func:`take`), in queue order, each while a shard
    certainly holds it (more of the shard's nodes pass its filters than pods are
    handed there and unanswered). ``lead`` goes
    where :meth:`Checks.choose` puts it; each other pod to the best shard by the scores of
    its kind with the pods of that kind before it in the batch counted pending
    there (one vectorised score per kind: :func:`run_scores`; pods of other kinds
    in the same batch are not counted, so several kinds spread each on its own).
    Pods after the first that does not fit where it would go are queued again as
    they were (same priority and arrival: the same place in the queue); the pass
    then finds that one at the head, as if pods were handed one by one.

    **Pods decided in place** (``in_place``): a pod that only inter-pod rules or spread
    constraints keep here does not end the batch when it can be decided at once
    (:meth:`InPlace.decide`); its claim's records go ahead of the batch's hand-overs
    in the log, so its shard takes it on before them. Each pod handed to that shard
    before it in the batch must still be certainly held with one node fewer (its
    kind's feasible nodes there, less everything ahead of it in the log), so every
    shard's spare count is the least, over its hand-overs in the batch, of feasible
    nodes less pods ahead, and each pod decided in place takes one; the pods after
    it count it among those handed to its shard (it takes at most one node). The
    kinds' scores are not taken again after it, as pods of other kinds in the batch
    are not counted in them: the choice of shard is the best by the view when the
    batch began (where the pod lands on that shard is its engine's choice anyway).
    The outcome does not depend on it: every pod handed over is certainly held."""
    e = c.engine
    first = checks.choose(framework, lead, counts)
    if first is None or counts[first] < c.inflight[first] + 1:
        return False  # (the queue untouched: nothing moved)
    head = Kind(framework, lead, counts, c.inflight)
    batch = take(
        c,
        lead,
        head,
        lambda pod: kind_of(c, checks, pod),
        None if in_place is None else in_place.candidate,
    )
    pending = c.pending
    kinds: dict[int, Kind] = {}
    for _, kind in batch:
        if kind is not None:
            kinds[id(kind)] = kind

    for kind in kinds.values():
        # the lead alone needs no table (it goes to ``first``); any other kind does,
        # even with one pod, to go to its best shard
        if len(kind.candidates) > 1 and (kind is not head or kind.pods > 1):
            view = checks.shard_view(kind.framework, kind.lead)
            kind.table = run_scores(kind.framework, kind.lead, view, pending, kind.pods)
    inflight = list(c.inflight)
    spare = [len(e.state.index)] * c.n
    ahead: dict[int, LabelKey] = {}
    handed_pods: list[tuple[PodInfo, Kind]] = []
    shards: list[int] = []
    end = len(batch)
    for index, (pod, item) in enumerate(batch):
        if item is None:
            assert in_place is not None
            placed = in_place.decide(pod, list(ahead.values()), spare)
            if placed is None:
                end = index
                break
            inflight[placed] += 1
            spare[placed] -= 1
            continue
        kind = item
        candidates = kind.candidates
        taken = kind.taken
        table = kind.table
        if index == 0:
            shard = first
        elif table is None:
            shard = candidates[0]  # (its only candidate)
        elif len(candidates) == 2:  # (two shards: one comparison, as max() makes it)
            a, b = candidates if pod.tiebreak % 2 == 0 else candidates[::-1]
            shard = a if table[a][taken[a]] >= table[b][taken[b]] else b
        else:
            start = pod.tiebreak % len(candidates)
            order = candidates[start:] + candidates[:start]
            shard = max(order, key=lambda s: table[s][taken[s]])
        if kind.counts[shard] < inflight[shard] + 1:
            end = index
            break
        inflight[shard] += 1
        taken[shard] += 1
        spare[shard] = min(spare[shard], kind.counts[shard] - inflight[shard])
        if in_place is not None and id(kind) not in ahead:
            ahead[id(kind)] = label_key(kind.lead.spec.namespace, kind.lead.spec.labels)
        handed_pods.append((pod, kind))
        shards.append(shard)
    handed = len(shards)
    for pod, _ in batch[end:]:
        e.queue.add(pod.key, pod.priority, pod.seq, e.queue_of(pod.spec.namespace))
    seq = c.next_seqs(handed)
    routed: list[tuple[int, Event]] = []
    if len(kinds) == 1:  # (one kind: no grouping)
        pods = [pod for pod, _ in handed_pods]
        decisions = [f"{pod.key}#{seq + i}" for i, pod in enumerate(pods)]
        routed = [
            (shard, PodRouted(pod=pod.spec, decision_id=decision))
            for pod, shard, decision in zip(pods, shards, decisions, strict=True)
        ]
        c.send_all(routed)
        c.fly_run(pods, shards, decisions)
    else:
        by_kind: dict[int, tuple[list[PodInfo], list[int], list[str]]] = {}
        for (pod, kind), shard in zip(handed_pods, shards, strict=True):
            decision = f"{pod.key}#{seq}"
            seq += 1
            routed.append((shard, PodRouted(pod=pod.spec, decision_id=decision)))
            group = by_kind.get(id(kind))
            if group is None:
                group = by_kind[id(kind)] = ([], [], [])
            group[0].append(pod)
            group[1].append(shard)
            group[2].append(decision)
        c.send_all(routed)
        for kind_pods, kind_shards, decisions in by_kind.values():
            c.fly_run(kind_pods, kind_shards, decisions)
    c.counters["handed"] += handed
    c.counters["batches"] += 1
    return True
