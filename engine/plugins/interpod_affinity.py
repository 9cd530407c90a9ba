"""InterPodAffinity: required pod affinity and anti-affinity filter, preferred terms score.

kube-scheduler's rules (``pkg/scheduler/framework/plugins/interpodaffinity``), over
all nodes at once with the placed pods as columns (:mod:`engine.model.podtable`):

- **affinity** (the pod's required terms): a node passes when, for every term, it has
  the term's topology key and some placed pod matching *all* the terms runs in the same
  domain (same value of that key). The first pod of a series that matches its own terms
  passes on any node that has every key, when no placed pod matches them all anywhere;
- **anti-affinity** (the pod's required terms): a node fails when, for some term, it
  has the key and a placed pod matching that term runs in its domain;
- **existing pods' anti-affinity** (symmetry): a node fails when a placed pod with a
  required anti-affinity term that matches the incoming pod runs in its domain of that
  term's key.

A term looks in the namespaces it names (``namespaces``, and ``namespaceSelector``
resolved at input), by default the pod's own. Score: per topology domain, the weights
of the pod's preferred terms matched by placed pods there (anti-affinity subtracts),
plus, symmetrically, the placed pods' preferred terms that the incoming pod matches and
their required affinity terms at ``hardPodAffinityWeight``; a node scores the sum over
its domains, normalised to 0..100 between the lowest and highest feasible node.

The filter looks beyond one node, so it is not *local*: a pod it applies to (see
:meth:`InterPodAffinity.applies`) is evaluated whole each attempt, and with several
shards it is decided on the coordinator, which sees every pod (``README``: inter-pod
rules). A pod it does not apply to skips it, keeping the shape caches. Preemption does
not evict pods to satisfy these rules (it frees resources only): the rejections are
unresolvable, as NodePorts' are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from engine.framework.cycle import CycleState
from engine.framework.handle import Handle
from engine.model.changes import ClusterEvent
from engine.model.pods import PodInfo
from engine.model.podtable import AFFINITY as AFFINITY_ROLE
from engine.model.podtable import (
    ANTI,
    PREFERRED,
    PodTable,
    domain_counts,
    node_codes,
    pod_table,
    term_matches,
)
from engine.model.state import Bools, ClusterState, Ints
from events.errors import InputError
from events.types import PodAffinityTerm, PodSpec

NAME: Final = "InterPodAffinity"
AFFINITY: Final = "node(s) didn't match pod affinity rules"
ANTI_AFFINITY: Final = "node(s) didn't match pod anti-affinity rules"
EXISTING: Final = "node(s) didn't satisfy existing pods anti-affinity rules"


def _pairs_mask(state: ClusterState, pairs: Mapping[str, Bools]) -> Bools:
    """Nodes whose value of some key is marked in that key's row of value codes."""
    hit = np.zeros(state.capacity, dtype=np.bool_)
    for key, marked in pairs.items():
        codes = node_codes(state, key)
        has = codes >= 0
        hit |= has & marked[np.maximum(codes, 0)]
    return hit


def existing_anti_pairs(table: PodTable, spec: PodSpec, state: ClusterState) -> dict[str, Bools]:
    """Per topology key, the value codes (a mark per code) of the domains where a
    placed pod's required anti-affinity term matches a pod with ``spec`` (each distinct
    term matched once)."""
    pairs: dict[str, Bools] = {}
    for group in table.of_role(ANTI):
        if term_matches(group.term, spec):
            key = group.term.topology_key
            codes = node_codes(state, key)[group.slots()]
            codes = codes[codes >= 0]
            if codes.size:
                marked = pairs.get(key)
                if marked is None:
                    size = max(len(state.label_values.get(key, {})), 1)
                    marked = pairs[key] = np.zeros(size, dtype=np.bool_)
                marked[codes] = True
    return pairs


class InterPodAffinity:
    name = NAME
    static = False
    unresolvable = True
    local = False
    cluster_wide = True
    """Its verdicts read pods on other nodes (see the module docstring)."""

    def __init__(self, args: Mapping[str, Any], where: str, handle: Handle) -> None:
        unknown = sorted(
            set(args) - {"hardPodAffinityWeight", "ignorePreferredTermsOfExistingPods"}
        )
        if unknown:
            raise InputError(f"unknown args {unknown}", location=where)
        weight = args.get("hardPodAffinityWeight", 1)
        if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= 100:
            raise InputError(
                f"hardPodAffinityWeight must be an integer 0..100, got {weight!r}",
                location=where,
            )
        ignore = args.get("ignorePreferredTermsOfExistingPods", False)
        if not isinstance(ignore, bool):
            raise InputError(
                "ignorePreferredTermsOfExistingPods must be true or false", location=where
            )
        self.hard_weight = weight
        self.ignore_existing_preferred = ignore
        self.handle = handle
        self._applies: dict[tuple[object, ...], bool] = {}
        self._applies_version = -1

    def __repr__(self) -> str:
        return f"InterPodAffinity(hardPodAffinityWeight={self.hard_weight})"

    def _table(self, state: ClusterState, *, rows: bool = True) -> PodTable:
        return pod_table(state, self.handle.pods, rows=rows)

    # ------------------------------------------------------------------ filter

    def applies(self, pod: PodInfo, state: ClusterState) -> bool:
        """Whether the filter may reject a node for ``pod``: it has required terms, or
        a placed pod's required anti-affinity term matches it."""
        spec = pod.spec
        if spec.pod_affinity or spec.pod_anti_affinity:
            return True
        table = self._table(state, rows=False)
        if not table.with_terms:
            return False
        if self._applies_version != table.terms_version:
            self._applies.clear()
            self._applies_version = table.terms_version
        key = (spec.namespace, tuple(sorted(spec.labels.items())))
        verdict = self._applies.get(key)
        if verdict is None:
            verdict = self._applies[key] = any(
                term_matches(group.term, spec) for group in table.of_role(ANTI)
            )
        return verdict

    def verdicts(self, pod: PodInfo, state: ClusterState) -> tuple[Bools, Bools, Bools]:
        """Per slot, whether the pod's affinity, its anti-affinity, and the existing
        pods' anti-affinity allow it there."""
        spec = pod.spec
        table = self._table(state)
        cap = state.capacity
        ones = np.ones(cap, dtype=np.bool_)
        affinity = ones
        if spec.pod_affinity:
            terms = spec.pod_affinity
            both = table.term_rows(terms[0])
            for term in terms[1:]:
                both = both & table.term_rows(term)
            per_node = table.per_node(both, cap)
            has_keys = ones.copy()
            exist = ones.copy()
            anywhere = False
            for term in terms:
                codes = node_codes(state, term.topology_key)
                counts = domain_counts(state, term.topology_key, per_node, state.valid)
                has = codes >= 0
                has_keys &= has
                exist &= has & (
                    np.where(has, counts[np.maximum(codes, 0)] if counts.size else 0, 0) > 0
                )
                anywhere = anywhere or bool(counts.any())
            own = all(term_matches(term, spec) for term in terms)
            affinity = has_keys & (exist | (not anywhere and own))
        anti = ones
        if spec.pod_anti_affinity:
            blocked = np.zeros(cap, dtype=np.bool_)
            for term in spec.pod_anti_affinity:
                per_node = table.per_node(table.term_rows(term), cap)
                codes = node_codes(state, term.topology_key)
                counts = domain_counts(state, term.topology_key, per_node, state.valid)
                if counts.size:
                    blocked |= (codes >= 0) & (counts[np.maximum(codes, 0)] > 0)
            anti = ~blocked
        existing = ones
        if table.with_terms:
            pairs = existing_anti_pairs(table, spec, state)
            if pairs:
                existing = ~_pairs_mask(state, pairs)
        return affinity, anti, existing

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Bools:
        if not self.applies(pod, state):
            return state.valid
        affinity, anti, existing = self.verdicts(pod, state)
        return state.valid & affinity & anti & existing

    def reasons(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, rejected: Bools
    ) -> dict[str, int]:
        """Each node under the first rule it breaks, in kube-scheduler's order."""
        affinity, anti, existing = self.verdicts(pod, state)
        out: dict[str, int] = {}
        left = rejected.copy()
        for reason, ok in ((AFFINITY, affinity), (ANTI_AFFINITY, anti), (EXISTING, existing)):
            hit = left & ~ok
            count = int(hit.sum())
            if count:
                out[reason] = count
                left &= ok
        return out or {AFFINITY: int(rejected.sum())}

    def events(self) -> frozenset[ClusterEvent]:
        return frozenset(
            {
                ClusterEvent.NODE_ADDED,
                ClusterEvent.NODE_UPDATED,
                ClusterEvent.POD_FREED,
                ClusterEvent.POD_PLACED,
            }
        )

    # ------------------------------------------------------------------ score

    def score(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools
    ) -> Ints | int:
        """The sum over the node's domains of the weights of matched preferred terms
        (kube-scheduler's ``topologyScore``); 0 everywhere when nothing counts."""
        spec = pod.spec
        own = spec.pod_affinity_preferred or spec.pod_anti_affinity_preferred
        table = self._table(state, rows=bool(own))
        if not own and not table.with_terms:
            return 0
        cap = state.capacity
        scores: dict[str, Ints] = {}
        touched = False

        def add_counts(term: PodAffinityTerm, weight: int) -> None:
            nonlocal touched
            rows = table.term_rows(term)
            if not rows.any():
                return
            per_node = table.per_node(rows, cap)
            counts = domain_counts(state, term.topology_key, per_node, state.valid)
            if not (per_node > 0)[node_codes(state, term.topology_key)[:cap] >= 0].any():
                return
            touched = True
            have = scores.get(term.topology_key)
            size = len(state.label_values.get(term.topology_key, {}))
            if have is None:
                have = scores[term.topology_key] = np.zeros(size, dtype=np.int64)
            have[: counts.size] += weight * counts

        for weighted in spec.pod_affinity_preferred:
            add_counts(weighted.term, weighted.weight)
        for weighted in spec.pod_anti_affinity_preferred:
            add_counts(weighted.term, -weighted.weight)
        for group in table.groups.values():
            if group.role == AFFINITY_ROLE:
                weight = self.hard_weight
            elif group.role == PREFERRED and not self.ignore_existing_preferred:
                weight = group.weight
            else:
                continue
            if weight == 0 or not term_matches(group.term, spec):
                continue
            codes = node_codes(state, group.term.topology_key)[group.slots()]
            codes = codes[codes >= 0]
            if codes.size == 0:
                continue
            touched = True
            size = len(state.label_values.get(group.term.topology_key, {}))
            have = scores.get(group.term.topology_key)
            if have is None:
                have = scores[group.term.topology_key] = np.zeros(size, dtype=np.int64)
            have += weight * np.bincount(codes, minlength=size)[:size]
        if not touched:
            return 0
        total = np.zeros(cap, dtype=np.int64)
        for key, by_domain in scores.items():
            codes = node_codes(state, key)[:cap]
            has = codes >= 0
            total[has] += by_domain[codes[has]]
        cycle.write(NAME, "scored", True)
        return total

    def normalize(self, scores: Ints | int, feasible: Bools) -> Ints | int:
        """kube-scheduler's: ``100 * (s - min) / (max - min)`` over the feasible nodes,
        truncated (float64, as Go's ``int64(float64)``); 0 everywhere when max = min."""
        if isinstance(scores, int):
            return 0
        values = scores[feasible[: scores.shape[0]]]
        if values.size == 0:
            return 0
        low, high = int(values.min()), int(values.max())
        if high == low:
            return 0
        out = (100.0 * ((scores - low).astype(np.float64) / float(high - low))).astype(np.int64)
        return out
