"""PodTopologySpread's ``DoNotSchedule`` verdict without a pass over every node per pod.

The verdict (:meth:`engine.plugins.topology_spread.PodTopologySpread.verdicts`, kept as
the reference) reads, per constraint, which nodes are *eligible* (they have every
constraint's key and pass the pod's node inclusion policies), how many matching pods
each domain holds over them, and then judges every node by its domain. Computed whole,
that is a dozen passes over every node for each pod (5 ms at 130,000 nodes). But

* the eligible nodes, their domain codes and which domains exist depend on the nodes'
  labels and taints and the pod's selector, affinity and tolerations only: they are
  kept per pod ``static_key`` and constraint set until ``state.static_version`` moves;
* a domain's count is the number of matching placed pods on its eligible nodes,
  counted once over the placed pods' table (:mod:`engine.model.podtable`), ``O(placed
  pods)``, then kept per constraint and namespace (:class:`Tallies`) from the pods
  added and removed since that carry a label the selector requires (the pod table's
  :class:`~engine.model.podtable.LabelLog`: ``O(such pods)``, one or two between two
  pods of a template however many other templates' pods were placed meanwhile); for
  a selector that requires no label, counted whole each time, or on large clusters
  kept by recounting, from the state's journal, the nodes changed since (``O(changed
  nodes * pods on each)``); the whole count again beyond ``_RECOUNT`` of either;
* a node's verdict is its domains' (a node lacking a constraint's key fails), so the
  mask over every node is a function of the per-domain verdicts: kept per distinct
  tuple of them, which changes only when some domain crosses the skew.

So a spread pod whose selector requires a label costs ``O(matching pods placed or
gone since + domains)`` (others ``O(placed pods + domains)``, on large clusters
``O(changed nodes * pods on each + domains)``) when its per-domain verdicts are ones seen
before (spread verdicts alternate between a few as domains fill in turn), and one
pass over the nodes when they are new. The mask returned is shared: callers
must not modify it (it is read-only), and the framework keeps the pod shape's scores
under it from one pod to the next (``Framework._derived``). Property test
(``tests/engine/test_best_index.py``): equal to the reference on random clusters.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from engine.model.pods import PodInfo
from engine.model.podtable import LabelLog, PodTable, node_codes, selector_matches
from engine.model.state import Bools, ClusterState, Codes, Ints
from events.types import LabelSelector, PodSpec, TopologySpreadConstraint

_MASKS: Final = 16
"""Masks kept per pod kind (distinct per-domain verdicts seen); beyond, start again."""


class Tallies:
    """Where matching pods are tallied per node (module-level so tests may lower it)."""

    min_nodes = 16384
    """Nodes from which the counts of a constraint whose selector requires no label are
    kept and recounted on the changed nodes. Recounting costs some 1.5 µs per pod on
    the changed nodes, counting whole some 6 ns per placed pod (numpy over the placed
    pods' table): with about twenty nodes changed between two pods of a kind, the
    tally pays from some 5,000 nodes on whatever the pods per node, and by far once
    placed pods number in the millions (the whole count reads every one for every
    spread pod)."""

    by_label = True
    """Whether a selector that requires a label (``app: web``, as nearly every one does)
    keeps its counts from that label's log (:class:`~engine.model.podtable.LabelLog`) on
    every cluster size: ``O(matching pods placed or gone since)`` per spread pod,
    against the whole count's ``O(placed pods)`` (6 ns each: 120 µs per spread pod
    with 20,000 placed, most of such a pod's cost on 5,000 nodes)."""


_LISTED: Final = 64
"""Domains (label values) up to which a constraint's verdicts are taken in plain Python."""
_RECOUNT: Final = 256
"""Above this many nodes changed since a tally was kept, count it whole again."""
_TALLIES: Final = 8
"""Namespaces tallied per constraint of a pod kind; beyond, start again."""
_KINDS: Final = 32
"""Pod kinds kept per state; beyond, start again. Memory per node and state: at most
``_KINDS * (_MASKS + 1 + constraints * (1 + 8 * _TALLIES))`` bytes (one boolean per
node per mask, one ``int64`` per node per tally); in practice a kind, one constraint
and one namespace per spread template: 26 bytes per node."""

Verdict = tuple[bool, ...] | bytes | None
"""One constraint's verdict per domain (in plain Python, or numpy's bytes); None: no
eligible domain, nothing skewed."""
Included = Callable[[PodInfo, ClusterState, TopologySpreadConstraint], Bools]
AllKeys = Callable[[ClusterState, tuple[TopologySpreadConstraint, ...]], Bools]


@dataclass(slots=True)
class _Tally:
    """The placed pods one constraint's selector matches in one namespace, as of
    journal ``position``: per node, and per domain over the eligible nodes."""

    position: int
    per_node: Ints
    counts: Ints
    seen: dict[str, tuple[PodSpec | None, bool]] = field(default_factory=dict)
    """Placed pods judged: their spec, and whether the selector matches it (a pod on
    a changed node is judged once, not at every change of its node)."""
    label: tuple[str, str] | None = None
    """A label every matching pod carries (the selector requires it), if any."""
    log: LabelLog | None = None
    """The table's log of that label: the tally reads its entries from ``logged`` on
    (pods of other labels cannot change the count), not the changed nodes' pods."""
    logged: int = 0


@dataclass(slots=True)
class _Part:
    """One constraint's static facts, and its tallies (by the pod's namespace)."""

    constraint: TopologySpreadConstraint
    codes: Codes
    eligible: Bools
    present: Bools
    """Domains (value codes) holding an eligible node."""
    domains: int
    values: int
    listed: list[int] | None = None
    """The present domains' codes, where there are at most ``_LISTED`` domains (the
    verdicts are then taken in plain Python); None: beyond."""
    tallies: dict[str, _Tally] = field(default_factory=dict)


@dataclass(slots=True)
class _Kind:
    """What a pod kind (static key and constraints) reads, as of one static version."""

    labelled: Bools
    parts: list[_Part]
    masks: dict[tuple[Verdict, ...], Bools] = field(default_factory=dict)


@dataclass(slots=True)
class _StateCache:
    version: int
    capacity: int
    kinds: dict[tuple[object, ...], _Kind] = field(default_factory=dict)


def _selector_key(selector: LabelSelector | None) -> object:
    if selector is None:
        return None
    return (tuple(sorted(selector.match_labels.items())), selector.match_expressions)


def constraint_key(c: TopologySpreadConstraint) -> tuple[object, ...]:
    return (
        c.max_skew,
        c.topology_key,
        c.when_unsatisfiable,
        _selector_key(c.selector),
        c.min_domains,
        c.node_affinity_policy,
        c.node_taints_policy,
    )


class HardSpread:
    """The cached ``DoNotSchedule`` masks of one plugin instance, per cluster state."""

    def __init__(self) -> None:
        self._states: weakref.WeakKeyDictionary[ClusterState, _StateCache] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"HardSpread(states={len(self._states)})"

    def _kind(
        self,
        pod: PodInfo,
        state: ClusterState,
        hard: tuple[TopologySpreadConstraint, ...],
        included: Included,
        all_keys: AllKeys,
    ) -> _Kind:
        cache = self._states.get(state)
        if (
            cache is None
            or cache.version != state.static_version
            or cache.capacity != state.capacity
        ):
            cache = self._states[state] = _StateCache(state.static_version, state.capacity)
        key = (pod.static_key, tuple(constraint_key(c) for c in hard))
        kind = cache.kinds.get(key)
        if kind is None:
            labelled = all_keys(state, hard)
            parts = []
            for c in hard:
                codes = node_codes(state, c.topology_key)
                eligible = labelled & included(pod, state, c)
                values = len(state.label_values.get(c.topology_key, {}))
                present = np.zeros(values, dtype=np.bool_)
                present[codes[eligible]] = True
                listed = np.flatnonzero(present).tolist() if values <= _LISTED else None
                parts.append(_Part(c, codes, eligible, present, int(present.sum()), values, listed))
            if len(cache.kinds) >= _KINDS:
                cache.kinds.clear()
            kind = cache.kinds[key] = _Kind(labelled, parts)
        return kind

    def mask(
        self,
        pod: PodInfo,
        state: ClusterState,
        hard: tuple[TopologySpreadConstraint, ...],
        table: PodTable,
        included: Included,
        all_keys: AllKeys,
    ) -> Bools:
        """``labelled & within`` of the reference ``verdicts``, read-only."""
        kind = self._kind(pod, state, hard, included, all_keys)
        verdicts: list[Verdict] = []
        for part in kind.parts:
            if part.domains == 0:
                verdicts.append(None)  # no eligible domain: nothing is skewed
                continue
            c = part.constraint
            counts = _counts(part, pod.spec.namespace, state, table)
            own = 1 if selector_matches(c.selector, pod.spec.labels) else 0
            if part.listed is not None:
                # few domains: their verdicts in plain Python (numpy's cost per call,
                # not the arithmetic, is what half a dozen operations on a handful of
                # counts would cost)
                listed = counts.tolist()
                minimum = 0
                if part.domains >= c.min_domains:
                    minimum = min([listed[d] for d in part.listed])
                limit = c.max_skew - own + minimum
                verdicts.append(tuple([n <= limit for n in listed]))
            else:
                minimum = 0 if part.domains < c.min_domains else int(counts[part.present].min())
                verdicts.append((counts + own - minimum <= c.max_skew).tobytes())
        key = tuple(verdicts)
        mask = kind.masks.get(key)
        if mask is None:
            mask = kind.labelled.copy()
            for part, verdict in zip(kind.parts, verdicts, strict=True):
                if verdict is not None:
                    if isinstance(verdict, tuple):
                        ok = np.array(verdict, dtype=np.bool_)
                    else:
                        ok = np.frombuffer(verdict, dtype=np.bool_)
                    # a node without the key: True (it fails through ``labelled``)
                    mask &= np.concatenate(([True], ok))[part.codes.astype(np.int64) + 1]
            mask.flags.writeable = False
            if len(kind.masks) >= _MASKS:
                kind.masks.clear()
            kind.masks[key] = mask
        return mask


def _counts(part: _Part, namespace: str, state: ClusterState, table: PodTable) -> Ints:
    """Matching placed pods per domain of ``part`` (eligible nodes only): counted
    whole the first time, then kept by reading the pods added and removed since (of
    the label the selector requires: :class:`engine.model.podtable.LabelLog`), or,
    for a selector that requires no label, by recounting the nodes changed since,
    from the pods on each (``table`` is in step with ``state``). The result is the
    tally's own array: callers must not modify it."""
    selector = part.constraint.selector
    label = _required_label(selector) if Tallies.by_label else None
    if label is None and len(state.index) < Tallies.min_nodes:
        rows = table.matching(selector, (namespace,), False)
        slots = table.node[rows]
        slots = slots[part.eligible[slots]]
        return np.bincount(part.codes[slots], minlength=part.values)
    tally = part.tallies.get(namespace)
    if tally is not None and _caught_up(tally, part, namespace, state, table):
        return tally.counts
    log = None if label is None else table.label_log(*label)
    rows = table.matching(selector, (namespace,), False)
    per_node = table.per_node(rows, state.capacity)
    counts = np.bincount(
        part.codes[part.eligible], weights=per_node[part.eligible], minlength=part.values
    ).astype(np.int64)
    if len(part.tallies) >= _TALLIES:
        part.tallies.clear()
    tally = _Tally(state.journal_end, per_node, counts, label=label, log=log)
    if log is not None:
        tally.logged = log.end
    part.tallies[namespace] = tally
    return counts


def _required_label(selector: LabelSelector | None) -> tuple[str, str] | None:
    """A label (key, value) every pod ``selector`` matches carries; None: none is."""
    if selector is None or not selector.match_labels:
        return None
    return min(selector.match_labels.items())


def _caught_up(
    tally: _Tally, part: _Part, namespace: str, state: ClusterState, table: PodTable
) -> bool:
    """Bring ``tally`` up to date with ``table``; False where it must be counted whole
    (too much changed, or what changed is no longer known)."""
    end = state.journal_end
    selector = part.constraint.selector
    per_node, counts = tally.per_node, tally.counts
    eligible, codes = part.eligible, part.codes
    if tally.log is not None:
        assert tally.label is not None
        log = tally.log
        entries = log.since(tally.logged) if table.followed(*tally.label) is log else None
        if entries is None or len(entries) > _RECOUNT:
            return False
        for slot, sign, spec in entries:
            if spec.namespace == namespace and selector_matches(selector, spec.labels):
                per_node[slot] = per_node.item(slot) + sign
                if eligible.item(slot):
                    domain = codes.item(slot)
                    counts[domain] = counts.item(domain) + sign
        tally.logged = log.end
        tally.position = end
        return True
    changed = state.changed_since(tally.position)
    if changed is None or len(changed) > _RECOUNT:
        return False
    if changed:
        seen = tally.seen
        if len(seen) > 2 * len(table.row_of) + _RECOUNT:
            seen.clear()  # pods gone since: start again
        on_slot, specs, row_of = table.on_slot, table.specs, table.row_of
        for slot in set(changed):
            now = 0
            for key in on_slot.get(slot, ()):
                placed = specs[row_of[key]]
                known = seen.get(key)
                if known is None or known[0] is not placed:
                    # (a name may come back with another spec: judged again)
                    hit = (
                        placed is not None
                        and placed.namespace == namespace
                        and selector_matches(selector, placed.labels)
                    )
                    known = seen[key] = (placed, hit)
                now += known[1]
            was = per_node.item(slot)  # (``item``: a Python int, not a numpy scalar)
            if now != was:
                per_node[slot] = now
                if eligible.item(slot):
                    domain = codes.item(slot)
                    counts[domain] = counts.item(domain) + now - was
    tally.position = end
    return True
