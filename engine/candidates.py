"""The changes a counterfactual tries for a waiting unit, smallest first
(:mod:`engine.counterfactual` checks each by running the engine on a copy of the state).

Each change is the inputs that make it (a ``QuotaDefined``, ``PodDeleted`` records, a
pod submitted again with one constraint relaxed, ``NodeAdded`` copies of a node), so
that what the copy is given is exactly what a person (or a test, in a simulation) would
do. The order, and the sizes within each kind:

1. a quota: its ``max`` raised to exactly the use the unit needs; its ``min`` raised by
   what the quotas' guarantees lack for that use (when the unit must borrow and nothing
   is idle to borrow), ``max`` with it where needed;
2. pods leaving: the fewest pods of the unit's priority or lower (lower ones first)
   whose room, on the nodes the unit's static rules allow, the unit needs; or, for a
   quota, the fewest of the namespace's own pods (over ``max``), or of the borrowers'
   (to give back what they borrow); or those its required anti-affinity keeps it
   away from (its terms, or theirs), on the node where they are fewest;
3. one constraint of the pod relaxed: a toleration added for one taint, one key of its
   node selector dropped, its required node affinity dropped, one spread constraint's
   ``maxSkew`` raised by 1 (then made ``ScheduleAnyway``), one required pod
   (anti-)affinity term dropped, ``spec.nodeName`` cleared (a pod of a gang is not
   relaxed: a PodGroup's members are not submitted again one by one); or a cordoned
   node it could use uncordoned;
4. nodes added, as the last resort: copies of an existing node the unit's static rules
   allow (the one that holds the most members empty, then has the most room now): 1,
   2, 3, 4, then a quarter, half, three quarters and all of the members still without
   a node.

Where a quota blocks too, the changes of 2 and 3 are tried again with the quota change
that gives most (its ``min`` and ``max`` raised) made as well, before the nodes of 4;
and the nodes last of all with it.

Cost: each candidate is built from the state in O(nodes + pods) Python work at most
(the victims' search sorts the pods of a node); :data:`MAX_CANDIDATES` bounds how many
are made.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Final

import msgspec
import numpy as np

from engine.framework.cycle import CycleState
from engine.model.groups import GroupInfo
from engine.model.pods import PodInfo
from engine.model.podtable import selector_matches
from engine.model.quota import quantity, scale
from engine.model.shard import ShardModel
from engine.model.state import Bools, ClusterState, Ints
from engine.plugins.node_affinity import NodeAffinity
from engine.plugins.taints import HARD_EFFECTS, TaintToleration, tolerates
from engine.plugins.unschedulable import NodeUnschedulable
from events.types import (
    Event,
    NodeAdded,
    NodeSpec,
    NodeUpdated,
    PodAffinityTerm,
    PodDeleted,
    PodSpec,
    PodSubmitted,
    QuotaDefined,
    Toleration,
)

HOSTNAME: Final = "kubernetes.io/hostname"
MAX_CANDIDATES: Final = 24
"""Changes tried for one unit at most (each costs a copy of the state and a few passes)."""
MAX_LEAVING: Final = 8
"""Pods a change may ask to leave at most."""
MAX_NODES: Final = 64
"""Nodes a change may add at most."""
RELAXED: Final = "+relaxed"
"""Appended to the uid of a pod submitted again with a constraint relaxed (another pod
under the same name, as the fold requires)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One candidate: what it is (``kind``: ``quota-max``, ``quota-min``,
    ``pods-leave``, ``relax``, ``nodes``), in words, the inputs that make it, and the
    pods it asks to leave (named), if any."""

    kind: str
    text: str
    events: tuple[Event, ...]
    leaving: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Unit:
    """A waiting unit: a pod, or a gang (``group`` set) with its pending members."""

    key: str
    pods: tuple[PodInfo, ...]
    group: GroupInfo | None = None

    @property
    def first(self) -> PodInfo:
        return self.pods[0]

    @property
    def priority(self) -> int:
        return max(p.spec.priority for p in self.pods)

    @property
    def needed(self) -> int:
        """Members that still need a node (1 for a pod)."""
        return len(self.pods)


def candidates(e: ShardModel, unit: Unit) -> Iterator[Change]:
    """The changes to try for ``unit``, smallest first (at most :data:`MAX_CANDIDATES`)."""
    return islice(_all(e, unit), MAX_CANDIDATES)


def _all(e: ShardModel, unit: Unit) -> Iterator[Change]:
    quota = list(_quota(e, unit))
    yield from quota
    fewer = list(_leaving(e, unit))
    relaxed = list(_relaxed(e, unit.first)) if unit.group is None else []
    yield from fewer
    yield from relaxed
    uncordoned = list(_uncordoned(e, unit.first))
    yield from uncordoned
    both = quota[-1:]  # the quota change that gives the most (its min and max raised)
    yield from (_with(q, x) for q in both for x in (*fewer, *relaxed, *uncordoned))
    nodes = list(_nodes(e, unit))
    yield from nodes
    yield from (_with(q, x) for q in both for x in nodes)


def _with(first: Change, then: Change) -> Change:
    """Two changes made together (a quota raised, and nodes added)."""
    return Change(
        f"{first.kind}+{then.kind}",
        f"{first.text}, and {then.text}",
        first.events + then.events,
        then.leaving,
    )


# ------------------------------------------------------------------ quota


def _wanted(e: ShardModel, unit: Unit) -> dict[str, int]:
    quota = e.quotas.get(unit.first.spec.namespace)
    wanted: dict[str, int] = {}
    if quota is None:
        return wanted
    for member in unit.pods:
        for name, amount in e.quotas.wanted(quota, member.request).items():
            wanted[name] = wanted.get(name, 0) + amount
    return wanted


def _quota(e: ShardModel, unit: Unit) -> Iterator[Change]:
    """Its ``max`` raised to exactly the use the unit needs, where over; then, where the
    quotas' guarantees are short of that use, its ``min`` raised by the shortfall (and
    ``max`` with it, where ``min`` would pass it)."""
    namespace = unit.first.spec.namespace
    quota = e.quotas.get(namespace)
    if quota is None:
        return
    wanted = _wanted(e, unit)
    spec = quota.spec
    maximum = dict(spec.max)
    for resource, amount in wanted.items():
        limit = quota.max_of(resource)
        need = quota.used.get(resource, 0) + amount
        if limit is not None and need > limit:
            maximum[resource] = -(-need // scale(resource))
    if maximum != spec.max:
        raised = msgspec.structs.replace(spec, max=maximum)
        yield Change(
            "quota-max",
            f"quota {namespace} has max {_changed(spec.max, maximum)}",
            (QuotaDefined(quota=raised),),
        )
    short = e.quotas.short(wanted)
    if not short:
        return
    minimum = dict(spec.min)
    for resource, shortfall in short.items():
        raised_to = quota.min_of(resource) + shortfall
        minimum[resource] = -(-raised_to // scale(resource))
        if resource in maximum and maximum[resource] < minimum[resource]:
            maximum[resource] = minimum[resource]
    words = f"min {_changed(spec.min, minimum)}"
    if maximum != spec.max:
        words += f" and max {_changed(spec.max, maximum)}"
    raised = msgspec.structs.replace(spec, min=minimum, max=maximum)
    yield Change("quota-min", f"quota {namespace} has {words}", (QuotaDefined(quota=raised),))


def _changed(before: dict[str, int], after: dict[str, int]) -> str:
    """``cpu 12 (not 8), nvidia.com/gpu 10 (not 8)``: the amounts that differ, in a
    quota's spelling."""
    return ", ".join(
        f"{r} {quantity(r, v * scale(r))} (not {quantity(r, before.get(r, 0) * scale(r))})"
        for r, v in sorted(after.items())
        if before.get(r, 0) != v
    )


# ------------------------------------------------------------------ pods leaving


def eligible(pod: PodInfo, state: ClusterState) -> Bools:
    """Nodes ``pod`` could use if they had room: those its node selector and affinity,
    its tolerations and the nodes' cordons allow (the static filters)."""
    cycle = CycleState()
    mask = state.valid.copy()
    for plugin in (NodeAffinity(), TaintToleration(), NodeUnschedulable()):
        mask &= plugin.filter(cycle, pod, state)
    return mask


def _leave(keys: list[str], why: str) -> Change:
    shown = ", ".join(keys)
    return Change(
        "pods-leave",
        f"{shown} {'leaves' if len(keys) == 1 else 'leave'}{why}",
        tuple(PodDeleted(pod=k) for k in keys),
        tuple(keys),
    )


def _leaving(e: ShardModel, unit: Unit) -> Iterator[Change]:
    own = {p.key for p in unit.pods}
    state = e.state
    movable = {
        key: placed
        for key, placed in state.pods.items()
        if placed.priority <= unit.priority and key not in own
    }
    if movable:
        plan = _room_plan(e, unit, movable)
        if plan:
            nodes = sorted({state.names[state.pods[k].slot] or "" for k in plan})
            yield _leave(plan, f" (room on {', '.join(nodes)})")
    yield from _quota_leaving(e, unit, movable)
    yield from _in_the_way(e, unit, movable)


def _room_plan(e: ShardModel, unit: Unit, movable: Mapping[str, object]) -> list[str]:
    """The fewest movable pods whose room places the unit's members, one member at a
    time on the node that needs the fewest to leave (ties: the lower priorities, then
    the node's name); empty when no plan within :data:`MAX_LEAVING`."""
    state = e.state
    free = state.free.copy()
    mask = eligible(unit.first, state)
    slots = [int(s) for s in np.flatnonzero(mask)]
    if not slots:
        return []
    gone: list[str] = []
    for member in unit.pods:
        best: tuple[int, int, str, int, list[str]] | None = None
        for slot in slots:
            victims = _victims(e, member, slot, free, movable, gone)
            if victims is None:
                continue
            top = max((state.pods[v].priority for v in victims), default=-(2**62))
            key = (len(victims), top, state.names[slot] or "", slot, victims)
            if best is None or key[:3] < best[:3]:
                best = key
        if best is None:
            return []
        slot, victims = best[3], best[4]
        for v in victims:
            for row, amount in state.pods[v].request:
                free[row, slot] += amount
        for row, amount in member.request:
            free[row, slot] -= amount
        gone += victims
        if len(gone) > MAX_LEAVING:
            return []
    return gone


def _victims(
    e: ShardModel,
    pod: PodInfo,
    slot: int,
    free: Ints,
    movable: Mapping[str, object],
    gone: list[str],
) -> list[str] | None:
    """The fewest movable pods on ``slot`` to remove so ``pod`` fits its free columns
    (lower priorities, then bigger requests, first); None: not within bounds."""
    state = e.state
    short = {row: amount - int(free[row, slot]) for row, amount in pod.request}
    short = {row: s for row, s in short.items() if s > 0}
    if not short:
        return []
    here = [k for k in state.node_pods[slot] if k in movable and k not in gone]

    def weight(key: str) -> tuple[int, int, str]:
        placed = state.pods[key]
        got = dict(placed.request)
        return (placed.priority, -sum(min(got.get(r, 0), s) for r, s in short.items()), key)

    victims: list[str] = []
    for key in sorted(here, key=weight):
        got = dict(state.pods[key].request)
        if not any(got.get(r, 0) > 0 for r in short):
            continue
        victims.append(key)
        for row in list(short):
            short[row] -= got.get(row, 0)
            if short[row] <= 0:
                del short[row]
        if not short:
            return victims
        if len(victims) >= MAX_LEAVING:
            return None
    return None


def _selects(term: PodAffinityTerm, owner: str, target: PodSpec) -> bool:
    """Whether the anti-affinity ``term`` of a pod of namespace ``owner`` selects
    ``target``."""
    namespaces = term.namespaces or (owner,)
    if not term.all_namespaces and target.namespace not in namespaces:
        return False
    return selector_matches(term.selector, target.labels)


def _in_the_way(e: ShardModel, unit: Unit, movable: Mapping[str, object]) -> Iterator[Change]:
    """The fewest movable pods that keep the unit's first pod off a node by required
    anti-affinity (its own terms selecting them, or theirs selecting it), on the node
    the static rules allow where the fewest are in the way."""
    spec = unit.first.spec
    state = e.state
    blockers: dict[str, list[str]] = {}
    for key in movable:
        info = e.pods.get(key)
        if info is None:
            continue
        other = info.spec
        keys = [
            t.topology_key for t in spec.pod_anti_affinity if _selects(t, spec.namespace, other)
        ]
        keys += [
            t.topology_key for t in other.pod_anti_affinity if _selects(t, other.namespace, spec)
        ]
        if keys:
            blockers[key] = keys
    if not blockers:
        return
    best: tuple[int, str, list[str]] | None = None
    for slot in (int(s) for s in np.flatnonzero(eligible(unit.first, state))):
        labels = state.node_labels[slot]
        here = sorted(
            k
            for k, keys in blockers.items()
            if any(
                tk in labels and state.node_labels[state.pods[k].slot].get(tk) == labels[tk]
                for tk in keys
            )
        )
        if here and len(here) <= MAX_LEAVING:
            candidate = (len(here), state.names[slot] or "", here)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
    if best is not None:
        yield _leave(best[2], f" (in the way of its anti-affinity on {best[1]})")


def _quota_leaving(e: ShardModel, unit: Unit, movable: Mapping[str, object]) -> Iterator[Change]:
    """Pods whose leaving gives the quota room: the namespace's own (over ``max``), or
    the borrowers' (to give back what they borrow); biggest users first."""
    namespace = unit.first.spec.namespace
    quota = e.quotas.get(namespace)
    if quota is None:
        return
    wanted = _wanted(e, unit)
    over = {
        r: quota.used.get(r, 0) + a - (quota.max_of(r) or 0)
        for r, a in wanted.items()
        if quota.max_of(r) is not None
    }
    over = {r: v for r, v in over.items() if v > 0}
    if over:
        mine = [k for k in movable if e.pods.get(k) and e.pods[k].spec.namespace == namespace]
        plan = _cover(e, mine, over)
        if plan:
            yield _leave(plan, f" (quota {namespace} over its max)")
        return
    short = e.quotas.short(wanted)
    if short:
        others = [
            k
            for k in movable
            if (info := e.pods.get(k)) is not None
            and info.spec.namespace != namespace
            and (q := e.quotas.get(info.spec.namespace)) is not None
            and q.borrowing(short)
        ]
        plan = _cover(e, others, short)
        if plan:
            yield _leave(plan, " (borrowed quota given back)")


def _cover(e: ShardModel, keys: list[str], need: dict[str, int]) -> list[str]:
    left = dict(need)
    chosen: list[str] = []

    def size(key: str) -> tuple[int, int, str]:
        use = e.quotas.named(e.pods[key].request)
        return (e.state.pods[key].priority, -sum(use.get(r, 0) for r in left), key)

    for key in sorted(keys, key=size):
        use = e.quotas.named(e.pods[key].request)
        if not any(use.get(r, 0) > 0 for r in left):
            continue
        chosen.append(key)
        for r in list(left):
            left[r] -= use.get(r, 0)
            if left[r] <= 0:
                del left[r]
        if not left:
            return chosen
        if len(chosen) >= MAX_LEAVING:
            return []
    return []


# ------------------------------------------------------------------ one constraint relaxed


def _again(spec: PodSpec, text: str, **changes: object) -> Change:
    relaxed = msgspec.structs.replace(spec, uid=(spec.uid or spec.key) + RELAXED, **changes)
    return Change(
        "relax",
        text,
        (PodDeleted(pod=spec.key), PodSubmitted(pod=relaxed)),
    )


def _relaxed(e: ShardModel, pod: PodInfo) -> Iterator[Change]:
    spec = pod.spec
    state = e.state
    counts: dict[tuple[str, str, str], int] = {}
    for taint, code in state.taint_codes.items():
        if taint.effect in HARD_EFFECTS and not tolerates(spec.tolerations, taint):
            n = int((state.taint_rows[code] & state.valid).sum())
            if n:
                counts[(taint.key, taint.value, taint.effect)] = n
    for (key, value, effect), _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]:
        spelled = f"{key}={value}:{effect}" if value else f"{key}:{effect}"
        toleration = Toleration(key=key, value=value, effect=effect, operator="Equal")
        yield _again(
            spec,
            f"the pod tolerates {spelled}",
            tolerations=(*spec.tolerations, toleration),
        )
    for key, value in sorted(spec.node_selector.items()):
        rest = {k: v for k, v in spec.node_selector.items() if k != key}
        yield _again(spec, f"the pod's nodeSelector drops {key}={value}", node_selector=rest)
    if spec.required_affinity is not None:
        yield _again(spec, "the pod's required node affinity is dropped", required_affinity=None)
    if spec.node_name:
        yield _again(spec, f"the pod's spec.nodeName ({spec.node_name}) is cleared", node_name="")
    for i, c in enumerate(spec.spread_constraints):
        if c.when_unsatisfiable != "DoNotSchedule":
            continue
        wider = msgspec.structs.replace(c, max_skew=c.max_skew + 1)
        yield _again(
            spec,
            f"the spread constraint on {c.topology_key} has maxSkew {c.max_skew + 1} "
            f"(not {c.max_skew})",
            spread_constraints=_swap(spec.spread_constraints, i, wider),
        )
        soft = msgspec.structs.replace(c, when_unsatisfiable="ScheduleAnyway")
        yield _again(
            spec,
            f"the spread constraint on {c.topology_key} is ScheduleAnyway",
            spread_constraints=_swap(spec.spread_constraints, i, soft),
        )
    for i, term in enumerate(spec.pod_anti_affinity[:3]):
        yield _again(
            spec,
            f"the pod's required pod anti-affinity term on {term.topology_key} is dropped",
            pod_anti_affinity=_without(spec.pod_anti_affinity, i),
        )
    for i, term in enumerate(spec.pod_affinity[:3]):
        yield _again(
            spec,
            f"the pod's required pod affinity term on {term.topology_key} is dropped",
            pod_affinity=_without(spec.pod_affinity, i),
        )


def _uncordoned(e: ShardModel, pod: PodInfo) -> Iterator[Change]:
    """A cordoned node the pod's selector, affinity and tolerations allow, uncordoned
    (the one it names in ``spec.nodeName`` first, then by name; two at most)."""
    state = e.state
    cycle = CycleState()
    mask = state.valid & state.unschedulable
    for plugin in (NodeAffinity(), TaintToleration()):
        mask &= plugin.filter(cycle, pod, state)
    names = sorted(
        (state.names[int(s)] or "" for s in np.flatnonzero(mask)),
        key=lambda n: (n != pod.spec.node_name, n),
    )
    for name in names[:2]:
        spec = node_spec(state, state.index[name], name)
        yield Change("uncordon", f"node {name} is uncordoned", (NodeUpdated(node=spec),))


def _without(terms: tuple[PodAffinityTerm, ...], i: int) -> tuple[PodAffinityTerm, ...]:
    return terms[:i] + terms[i + 1 :]


def _swap(items: tuple[object, ...], i: int, new: object) -> tuple[object, ...]:
    return (*items[:i], new, *items[i + 1 :])


# ------------------------------------------------------------------ nodes added


def node_spec(state: ClusterState, slot: int, name: str) -> NodeSpec:
    """A node like the one at ``slot`` (its allocatable, labels, taints, annotations),
    named ``name`` (and so labelled, where the node carries its host name)."""
    resources = state.resources
    allocatable = {
        resources.name(row): int(state.alloc[row, slot])
        for row in range(len(resources))
        if row not in resources.card_needs and state.alloc[row, slot] > 0
    }
    labels = dict(state.node_labels[slot])
    if HOSTNAME in labels:
        labels[HOSTNAME] = name  # its own host name, as the kubelet labels a node
    return NodeSpec(
        name=name,
        allocatable=allocatable,
        labels=labels,
        taints=state.node_taints[slot],
        annotations=dict(state.node_annotations[slot]),
    )


def _nodes(e: ShardModel, unit: Unit) -> Iterator[Change]:
    state = e.state
    pod = unit.first
    slots = [int(s) for s in np.flatnonzero(eligible(pod, state))]
    if not slots:
        return

    def fits(column: Ints, slot: int) -> int:
        return min(
            (max(int(column[row, slot]), 0) // amount for row, amount in pod.request if amount),
            default=0,
        )

    def roomy(slot: int) -> tuple[int, int, str]:
        # the most members in an empty one, then the most room now (a node in the
        # domain with the most room, for a gang's topology), then the name
        return (-fits(state.alloc, slot), -fits(state.free, slot), state.names[slot] or "")

    slot = min(slots, key=roomy)
    if roomy(slot)[0] == 0:
        return  # not even an empty node of any allowed shape holds one member
    like = state.names[slot] or ""
    names: list[str] = []
    i = 0
    while len(names) < min(unit.needed, MAX_NODES):
        i += 1
        name = f"{like}-like-{i}"
        if name not in state.index:
            names.append(name)
    for count in node_counts(len(names)):
        yield Change(
            "nodes",
            f"{count} node(s) like {like} {'is' if count == 1 else 'are'} added",
            tuple(NodeAdded(node=node_spec(state, slot, n)) for n in names[:count]),
        )


def node_counts(most: int) -> list[int]:
    """How many nodes to try adding, fewest first: 1 to 4, then a quarter, half,
    three quarters and all of ``most`` (a gang's members still without a node)."""
    counts = {c for c in (1, 2, 3, 4) if c <= most}
    counts |= {max(1, most * q // 4) for q in (1, 2, 3, 4)}
    return sorted(counts)


__all__ = ["MAX_CANDIDATES", "Change", "Unit", "candidates", "eligible", "node_spec"]
