"""The placed pods of a cluster state as columns: node, namespace and labels per row.

Inter-pod rules (InterPodAffinity, PodTopologySpread) count the pods that match a label
selector in each topology domain. Evaluating a selector over every placed pod is one
comparison per requirement over these columns (labels as integer codes per key, ``-1``
absent, as the nodes' labels are in :class:`~engine.model.state.ClusterState`); the
matches per node are one ``bincount`` over the pods' node slots, and per domain one more
over the nodes' label codes.

The table is *derived*, never state: it is rebuilt from ``ClusterState.pods`` and the
pods' specs, and kept in step through the state's journal (placing or releasing a pod
touches its node's slot; only the changed slots are read again), so a snapshot never
holds it and a restored engine rebuilds it on first use. Gang members staged in a
statement are placed in the state, so they count for each other as soon as they are
staged.

Pods with inter-pod terms of their own (``with_terms``) are listed apart, and their
terms grouped (``groups``: one group per distinct term and role, with the pods that
carry it and their slots): an incoming pod's symmetric checks (existing pods'
anti-affinity, their preferred terms) match each distinct term once, however many
replicas share it, and count the domains of its pods in one ``bincount``.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Final

import msgspec
import numpy as np

from engine.model.state import ABSENT, Bools, ClusterState, Codes, Ints
from events.types import LabelSelector, PodAffinityTerm, PodSpec

if TYPE_CHECKING:
    from engine.model.pods import PodInfo

ANTI: Final = "anti"
"""Role of a required anti-affinity term (it filters, symmetrically)."""
AFFINITY: Final = "affinity"
"""Role of a required affinity term (it scores, symmetrically, at
``hardPodAffinityWeight``)."""
PREFERRED: Final = "preferred"
"""Role of a preferred term: its weight, negative for anti-affinity."""
_REBUILD: Final = 4096
"""Above this many changed slots since the last sync, rebuild the table whole."""
_LOG: Final = 4096
"""Entries a label's log keeps (see :class:`LabelLog`); beyond, the older half goes."""
_LOGS: Final = 256
"""Labels logged at most; beyond, every log is dropped (their readers count whole)."""
_TABLES: weakref.WeakKeyDictionary[ClusterState, PodTable] = weakref.WeakKeyDictionary()
_LAST: list[tuple[weakref.ref[ClusterState], PodTable] | None] = [None]
"""The table looked up last (most calls are for the same state, in a row)."""


def has_terms(spec: PodSpec) -> bool:
    """Whether a placed pod with ``spec`` takes part in others' symmetric checks."""
    return bool(
        spec.pod_affinity
        or spec.pod_anti_affinity
        or spec.pod_affinity_preferred
        or spec.pod_anti_affinity_preferred
    )


def selector_matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """``metav1.LabelSelector`` semantics for one pod's labels (None matches nothing)."""
    if selector is None:
        return False
    for key, value in selector.match_labels.items():
        if labels.get(key) != value:
            return False
    for req in selector.match_expressions:
        have = labels.get(req.key)
        op = req.operator
        if op == "In" and (have is None or have not in req.values):
            return False
        if op == "NotIn" and have is not None and have in req.values:
            return False
        if op == "Exists" and have is None:
            return False
        if op == "DoesNotExist" and have is not None:
            return False
    return True


def term_matches(term: PodAffinityTerm, spec: PodSpec) -> bool:
    """kube-scheduler's ``PodMatchesTermsNamespaceAndSelector`` for one pod."""
    if not term.all_namespaces and spec.namespace not in term.namespaces:
        return False
    return selector_matches(term.selector, spec.labels)


@dataclass(slots=True)
class TermGroup:
    """One distinct term of placed pods in one role, and the pods that carry it."""

    role: str
    term: PodAffinityTerm
    weight: int
    members: dict[str, int] = field(default_factory=dict)
    """Pod → its slot."""

    def slots(self) -> Ints:
        return np.fromiter(self.members.values(), dtype=np.int64, count=len(self.members))


def _roles(spec: PodSpec) -> list[tuple[str, PodAffinityTerm, int]]:
    return [
        *((ANTI, t, 0) for t in spec.pod_anti_affinity),
        *((AFFINITY, t, 0) for t in spec.pod_affinity),
        *((PREFERRED, w.term, w.weight) for w in spec.pod_affinity_preferred),
        *((PREFERRED, w.term, -w.weight) for w in spec.pod_anti_affinity_preferred),
    ]


_ENCODER: Final = msgspec.msgpack.Encoder()


class LabelLog:
    """The rows added to and removed from a table that carry one label (key and
    value), in order: ``(slot, +1 or -1, spec)``. A reader that counts the pods some
    selector requiring that label matches keeps its count by reading only the entries
    since it last read (:meth:`since`), not every pod on the nodes changed since:
    those of other labels cannot change its count. Entries are numbered from the
    log's start; the oldest are dropped beyond ``_LOG`` (a reader that far behind
    counts whole again)."""

    __slots__ = ("base", "entries")

    def __init__(self) -> None:
        self.base = 0
        self.entries: list[tuple[int, int, PodSpec]] = []

    def __repr__(self) -> str:
        return f"LabelLog(base={self.base}, entries={len(self.entries)})"

    @property
    def end(self) -> int:
        """The number of the next entry."""
        return self.base + len(self.entries)

    def since(self, position: int) -> list[tuple[int, int, PodSpec]] | None:
        """The entries from number ``position`` on; None if some were dropped."""
        if position < self.base:
            return None
        return self.entries[position - self.base :]

    def append(self, slot: int, sign: int, spec: PodSpec) -> None:
        entries = self.entries
        entries.append((slot, sign, spec))
        if len(entries) > _LOG:
            half = len(entries) // 2
            del entries[:half]
            self.base += half


class PodTable:
    """Placed pods as rows (see the module docstring)."""

    def __init__(self) -> None:
        cap = 64
        self.row_of: dict[str, int] = {}
        self.specs: list[PodSpec | None] = [None] * cap
        self.node: Ints = np.full(cap, -1, dtype=np.int64)
        self.namespace: Codes = np.full(cap, ABSENT, dtype=np.int32)
        self.namespaces: dict[str, int] = {}
        self.labels: dict[str, Codes] = {}
        self.values: dict[str, dict[str, int]] = {}
        self.on_slot: dict[int, dict[str, None]] = {}
        self.with_terms: dict[str, int] = {}
        """Placed pods with inter-pod terms → their slot."""
        self.terms_version = 0
        """Bumped whenever ``with_terms`` changes."""
        self.groups: dict[tuple[str, int, bytes], TermGroup] = {}
        """(role, weight, the term's bytes) → its group."""
        self._free: list[int] = []
        self._unlabelled: dict[int, None] = {}
        self._next = 0
        self._position = -1
        self._logs: dict[str, dict[str, LabelLog]] = {}
        """Label key → value → its log, for the labels some reader asked to follow
        (:meth:`label_log`); no other label is logged."""
        self.rows = False
        """Whether the rows are kept. Until a pod with terms is placed or a query needs
        the rows, only ``with_terms`` (empty) is: each placement is checked for terms
        and nothing else is written."""

    def __repr__(self) -> str:
        return f"PodTable(rows={len(self.row_of)}, with_terms={len(self.with_terms)})"

    # ------------------------------------------------------------------ sync

    def sync(self, state: ClusterState, pods: Mapping[str, PodInfo], *, rows: bool) -> None:
        """Bring the table in step with ``state.pods`` (specs from ``pods``); with
        ``rows``, its rows too (kept from then on)."""
        end = state.journal_end
        if end == self._position and (self.rows or not rows):
            return
        if not self.rows:
            if rows or self._terms_placed(state, pods):
                self.rows = True
                self._rebuild(state, pods)
            self._position = end
            return
        changed = None if self._position < 0 else state.changed_since(self._position)
        if changed is None or len(changed) > _REBUILD:
            self._rebuild(state, pods)
        else:
            # per changed slot, its journal entries (one, the common case, not counted)
            runs = [(changed[0], 1)] if len(changed) == 1 else sorted(Counter(changed).items())
            for slot, times in runs:
                if not self._added(state, pods, slot, times):
                    self._sync_slot(state, pods, slot)
        self._position = end

    def _terms_placed(self, state: ClusterState, pods: Mapping[str, PodInfo]) -> bool:
        """Whether a pod placed since the last sync has inter-pod terms (rows not kept:
        none placed before had)."""
        changed = None if self._position < 0 else state.changed_since(self._position)
        if changed is None:
            keys: Iterable[str] = state.pods
        else:
            # Only the pods placed since: each placement is one journal entry and puts
            # its pod last in ``state.pods`` (a dict, in insertion order), so they are
            # among its newest ``len(changed)`` entries. O(changes), however many pods
            # share the changed nodes (walking those grew with the pods per node: 2% of
            # the coordinator at 20,000 pods, 18% at 100,000).
            keys = islice(reversed(state.pods), len(changed))
        for key in keys:
            info = pods.get(key)
            if info is not None and has_terms(info.spec):
                return True
        return False

    def _rebuild(self, state: ClusterState, pods: Mapping[str, PodInfo]) -> None:
        self._logs.clear()  # readers count whole again (cheaper than every row twice)
        for key in list(self.row_of):
            self._remove(key)
        for key, placed in state.pods.items():
            info = pods.get(key)
            if info is not None:
                self._add(key, placed.slot, info.spec)

    def _added(
        self, state: ClusterState, pods: Mapping[str, PodInfo], slot: int, times: int
    ) -> bool:
        """The common change, pods placed on ``slot`` and nothing else: ``times`` journal
        entries for it since the last sync, and ``times`` more pods there than the table
        has. Each placement is one entry and puts its pod last among the slot's (a dict,
        in insertion order); a removal or a change of the node is an entry too and adds
        none, so the counts agree only when every entry was a placement, and the new
        pods are the slot's newest ``times``: ``O(pods placed)``, not ``O(pods on the
        node)`` (the walk of :meth:`_sync_slot` over every pod of each changed node was
        most of a spread pod's filter on a coordinator folding hand-overs in bulk)."""
        now = state.node_pods[slot]
        have = self.on_slot.get(slot)
        if len(now) != (len(have) if have else 0) + times:
            return False
        if times == 1:  # (the common case, one pod placed: no lists)
            key = next(reversed(now))
            info = pods.get(key)
            if key in self.row_of or info is None:
                return False
            self._add(key, slot, info.spec)
            return True
        new = list(islice(reversed(now), times))
        row_of = self.row_of
        infos = []
        for key in new:
            info = pods.get(key)
            if info is None or key in row_of:
                return False
            infos.append(info)
        for key, info in zip(reversed(new), reversed(infos), strict=True):
            self._add(key, slot, info.spec)
        return True

    def _sync_slot(self, state: ClusterState, pods: Mapping[str, PodInfo], slot: int) -> None:
        have = self.on_slot.get(slot)
        now = state.node_pods[slot] if slot < len(state.node_pods) else {}
        if have:
            for key in [k for k in have if k not in now]:
                self._remove(key)
        row_of = self.row_of
        specs = self.specs
        for key in now:
            info = pods.get(key)
            row = row_of.get(key)
            if row is not None:
                if info is not None and specs[row] is info.spec and self.node[row] == slot:
                    continue
                self._remove(key)  # gone, another spec, or moved here from another slot
            if info is not None:
                self._add(key, slot, info.spec)

    def _grow(self) -> None:
        old = self.node.shape[0]
        new = old * 2
        self.specs.extend([None] * old)
        self.node = np.concatenate([self.node, np.full(old, -1, dtype=np.int64)])
        self.namespace = np.concatenate([self.namespace, np.full(old, ABSENT, dtype=np.int32)])
        for key, col in self.labels.items():
            self.labels[key] = np.concatenate([col, np.full(new - old, ABSENT, dtype=np.int32)])

    def _add(self, key: str, slot: int, spec: PodSpec) -> None:
        if self._free:
            row = self._free.pop()
        else:
            if self._next >= self.node.shape[0]:
                self._grow()
            row = self._next
            self._next += 1
        self.row_of[key] = row
        self.specs[row] = spec
        self.node[row] = slot
        code = self.namespaces.get(spec.namespace)
        if code is None:
            code = self.namespaces[spec.namespace] = len(self.namespaces)
        self.namespace[row] = code
        self._unlabelled[row] = None
        on = self.on_slot.get(slot)
        if on is None:
            on = self.on_slot[slot] = {}
        on[key] = None
        if self._logs:
            self._log(slot, 1, spec)
        if has_terms(spec):
            self.with_terms[key] = slot
            self.terms_version += 1
            for role, term, weight in _roles(spec):
                index = (role, weight, _ENCODER.encode(term))
                group = self.groups.get(index)
                if group is None:
                    group = self.groups[index] = TermGroup(role, term, weight)
                group.members[key] = slot

    def _label(self) -> None:
        """Write the label codes of the rows added since the last query (placing a pod
        costs a few dictionary operations; codes are written when a selector needs
        them)."""
        specs = self.specs
        for row in self._unlabelled:
            spec = specs[row]
            assert spec is not None
            for label, value in spec.labels.items():
                col = self.labels.get(label)
                if col is None:
                    col = np.full(self.node.shape[0], ABSENT, dtype=np.int32)
                    self.labels[label] = col
                    self.values[label] = {}
                values = self.values[label]
                col[row] = values.setdefault(value, len(values))
        self._unlabelled.clear()

    def _remove(self, key: str) -> None:
        row = self.row_of.pop(key)
        spec = self.specs[row]
        slot = int(self.node[row])
        self.specs[row] = None
        self.node[row] = -1
        self.namespace[row] = ABSENT
        if self._unlabelled.pop(row, 0) is not None and spec is not None:
            for label in spec.labels:
                self.labels[label][row] = ABSENT
        on = self.on_slot.get(slot)
        if on is not None:
            on.pop(key, None)
            if not on:
                del self.on_slot[slot]
        if self._logs and spec is not None:
            self._log(slot, -1, spec)
        if self.with_terms.pop(key, None) is not None:
            self.terms_version += 1
            assert spec is not None
            for role, term, weight in _roles(spec):
                index = (role, weight, _ENCODER.encode(term))
                group = self.groups.get(index)
                if group is not None:
                    group.members.pop(key, None)
                    if not group.members:
                        del self.groups[index]
        self._free.append(row)

    def _log(self, slot: int, sign: int, spec: PodSpec) -> None:
        labels = spec.labels
        for label, values in self._logs.items():  # (few: the labels readers follow)
            value = labels.get(label)
            if value is not None:
                log = values.get(value)
                if log is not None:
                    log.append(slot, sign, spec)

    def label_log(self, key: str, value: str) -> LabelLog:
        """The log of the rows carrying label ``key=value``, from now on (see
        :class:`LabelLog`); the same object while it is kept (a reader holding another
        one counts whole again)."""
        values = self._logs.get(key)
        log = None if values is None else values.get(value)
        if log is None:
            if sum(len(v) for v in self._logs.values()) >= _LOGS:
                self._logs.clear()
            log = self._logs.setdefault(key, {})[value] = LabelLog()
        return log

    def followed(self, key: str, value: str) -> LabelLog | None:
        """The log :meth:`label_log` gave for ``key=value``, if it is still kept."""
        values = self._logs.get(key)
        return None if values is None else values.get(value)

    # ------------------------------------------------------------------ matching

    def matching(
        self, selector: LabelSelector | None, namespaces: tuple[str, ...], everywhere: bool
    ) -> Bools:
        """Rows of placed pods in ``namespaces`` (every namespace with ``everywhere``)
        whose labels ``selector`` matches (None matches nothing)."""
        if self._unlabelled:
            self._label()
        size = self.node.shape[0]
        none = np.zeros(size, dtype=np.bool_)
        if selector is None:
            return none
        mask = self.node >= 0
        if not everywhere:
            codes = [self.namespaces[n] for n in namespaces if n in self.namespaces]
            if not codes:
                return none
            mask &= (
                self.namespace == codes[0] if len(codes) == 1 else np.isin(self.namespace, codes)
            )
        for key, value in selector.match_labels.items():
            code = self.values.get(key, {}).get(value)
            if code is None:
                return none
            mask &= self.labels[key] == code
        for req in selector.match_expressions:
            col = self.labels.get(req.key)
            op = req.operator
            if op in ("In", "NotIn"):
                known = self.values.get(req.key, {})
                codes = [known[v] for v in req.values if v in known]
                if col is None or not codes:
                    hit = none
                else:
                    hit = col == codes[0] if len(codes) == 1 else np.isin(col, codes)
                mask &= hit if op == "In" else ~hit
            elif op == "Exists":
                mask &= col >= 0 if col is not None else none
            elif col is not None:  # DoesNotExist
                mask &= col < 0
        return mask

    def of_role(self, role: str) -> list[TermGroup]:
        return [g for g in self.groups.values() if g.role == role]

    def term_rows(self, term: PodAffinityTerm) -> Bools:
        return self.matching(term.selector, term.namespaces, term.all_namespaces)

    def per_node(self, rows: Bools, capacity: int) -> Ints:
        """How many of ``rows`` are placed on each slot."""
        return np.bincount(self.node[rows], minlength=capacity)[:capacity].astype(np.int64)


def pod_table(state: ClusterState, pods: Mapping[str, PodInfo], *, rows: bool = True) -> PodTable:
    """The table of ``state``'s placed pods, in step with it (one per state object).
    ``rows=False``: only ``with_terms`` is read (rows are kept once a pod with terms is
    placed, or a caller asks for them)."""
    last = _LAST[0]
    if last is not None and last[0]() is state:
        table = last[1]
    else:
        found = _TABLES.get(state)
        table = PodTable() if found is None else found
        _TABLES[state] = table
        _LAST[0] = (weakref.ref(state), table)
    if table._position != state.journal_end or (rows and not table.rows):
        table.sync(state, pods, rows=rows)
    return table


def domain_counts(state: ClusterState, key: str, per_node: Ints, nodes: Bools) -> Ints:
    """Per value code of node label ``key``: the sum of ``per_node`` over ``nodes``
    that have the label."""
    col = state.label_columns.get(key)
    values = len(state.label_values.get(key, {}))
    if col is None:
        return np.zeros(values, dtype=np.int64)
    cap = per_node.shape[0]
    have = nodes[:cap] & (col[:cap] >= 0)
    return np.bincount(col[:cap][have], weights=per_node[have], minlength=values).astype(np.int64)


def node_codes(state: ClusterState, key: str) -> Codes:
    """The nodes' value codes of label ``key`` (``-1``: absent)."""
    col = state.label_columns.get(key)
    if col is None:
        return np.full(state.capacity, ABSENT, dtype=np.int32)
    return col
