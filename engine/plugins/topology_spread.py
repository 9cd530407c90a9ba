"""PodTopologySpread: ``DoNotSchedule`` constraints filter, ``ScheduleAnyway`` ones score.

kube-scheduler's rules (``pkg/scheduler/framework/plugins/podtopologyspread``), over
all nodes at once with the placed pods as columns (:mod:`engine.model.podtable`). A
constraint counts the pods of the incoming pod's namespace that its selector matches,
per domain (value of ``topologyKey``), over the *eligible* nodes: those with every
constraint's key, and, by ``nodeAffinityPolicy: Honor`` (the default), matching the
pod's ``nodeSelector`` and required node affinity, and by ``nodeTaintsPolicy: Honor``
(default ``Ignore``) tolerating their ``NoSchedule``/``NoExecute`` taints.

- **Filter**: a node without the key fails (unresolvable); otherwise its skew, the
  count in its domain plus one if the pod matches its own selector minus the smallest
  count over eligible domains (0 while fewer than ``minDomains`` domains exist), must
  not exceed ``maxSkew``.
- **Score**: per constraint, ``count * log(domains + 2) + (maxSkew - 1)`` summed over
  the node's constraints (for ``kubernetes.io/hostname`` the count is the node's own and
  ``domains`` the scored nodes), rounded; then ``100 * (max + min - s) / max`` in
  integers (fewer matching pods, higher score). Nodes lacking a key score 0.

Default constraints (a pod without its own): the profile's ``defaultConstraints`` with
``defaultingType: List``, or kube-scheduler's system defaults (``hostname`` maxSkew 3
and ``zone`` maxSkew 5, both ``ScheduleAnyway``) with ``System``, the default; they
select with the pod's owner's selector (``PodSpec.owner_selector``: the ReplicaSet or
StatefulSet that made it), and a pod without one gets none (kube-scheduler's
``DefaultSelector`` over Services and controllers; Services are not modelled).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from engine.framework.cycle import CycleState
from engine.framework.handle import Handle
from engine.model.changes import ClusterEvent
from engine.model.pods import PodInfo
from engine.model.podtable import PodTable, node_codes, pod_table, selector_matches
from engine.model.state import Bools, ClusterState, Ints
from engine.plugins.selector import match_labels, match_terms
from engine.plugins.spread_cache import HardSpread
from engine.plugins.taints import HARD_EFFECTS, tolerates
from events.errors import InputError
from events.types import TopologySpreadConstraint

NAME: Final = "PodTopologySpread"
HOSTNAME: Final = "kubernetes.io/hostname"
ZONE: Final = "topology.kubernetes.io/zone"
SKEW: Final = "node(s) didn't match pod topology spread constraints"
MISSING: Final = "node(s) didn't match pod topology spread constraints (missing required label)"
SYSTEM_DEFAULTS: Final = (
    TopologySpreadConstraint(
        max_skew=3, topology_key=HOSTNAME, when_unsatisfiable="ScheduleAnyway"
    ),
    TopologySpreadConstraint(max_skew=5, topology_key=ZONE, when_unsatisfiable="ScheduleAnyway"),
)
WHEN: Final = ("DoNotSchedule", "ScheduleAnyway")


def _default_constraints(raw: Any, where: str) -> tuple[TopologySpreadConstraint, ...]:
    if not isinstance(raw, list):
        raise InputError("defaultConstraints must be a list", location=where)
    out: list[TopologySpreadConstraint] = []
    for i, item in enumerate(raw):
        loc = f"{where}: defaultConstraints[{i}]"
        if not isinstance(item, dict):
            raise InputError("must be a mapping", location=loc)
        unknown = sorted(set(item) - {"maxSkew", "topologyKey", "whenUnsatisfiable"})
        if "labelSelector" in item:
            raise InputError("labelSelector is not allowed in default constraints", location=loc)
        if unknown:
            raise InputError(f"unknown fields {unknown}", location=loc)
        skew = item.get("maxSkew")
        if not isinstance(skew, int) or isinstance(skew, bool) or skew < 1:
            raise InputError(f"maxSkew must be an integer >= 1, got {skew!r}", location=loc)
        key = item.get("topologyKey")
        if not isinstance(key, str) or not key:
            raise InputError("topologyKey must be a non-empty string", location=loc)
        when = item.get("whenUnsatisfiable")
        if when not in WHEN:
            raise InputError(
                f"whenUnsatisfiable must be DoNotSchedule or ScheduleAnyway, got {when!r}",
                location=loc,
            )
        if any(c.topology_key == key and c.when_unsatisfiable == when for c in out):
            raise InputError(f"duplicate constraint for {key} {when}", location=loc)
        out.append(
            TopologySpreadConstraint(max_skew=skew, topology_key=key, when_unsatisfiable=when)
        )
    return tuple(out)


class PodTopologySpread:
    name = NAME
    static = False
    unresolvable = True
    local = False
    cluster_wide = True
    """Its verdicts read pods on other nodes."""

    def __init__(self, args: Mapping[str, Any], where: str, handle: Handle) -> None:
        unknown = sorted(set(args) - {"defaultConstraints", "defaultingType"})
        if unknown:
            raise InputError(f"unknown args {unknown}", location=where)
        defaulting = args.get("defaultingType", "System")
        if defaulting not in ("System", "List"):
            raise InputError(
                f"defaultingType must be System or List, got {defaulting!r}", location=where
            )
        raw = args.get("defaultConstraints", [])
        if defaulting == "System" and raw:
            raise InputError(
                "defaultConstraints must be empty with defaultingType System", location=where
            )
        self.system = defaulting == "System"
        self.defaults = SYSTEM_DEFAULTS if self.system else _default_constraints(raw, where)
        self.handle = handle
        self._hard_masks = HardSpread()

    def __repr__(self) -> str:
        return f"PodTopologySpread(system={self.system}, defaults={len(self.defaults)})"

    def constraints(self, pod: PodInfo) -> tuple[TopologySpreadConstraint, ...]:
        """The pod's own constraints, else the defaults selecting with its owner's
        selector (none without one)."""
        spec = pod.spec
        if spec.spread_constraints:
            return spec.spread_constraints
        if spec.owner_selector is None or not self.defaults:
            return ()
        selector = spec.owner_selector
        return tuple(
            TopologySpreadConstraint(
                max_skew=c.max_skew,
                topology_key=c.topology_key,
                when_unsatisfiable=c.when_unsatisfiable,
                selector=selector,
            )
            for c in self.defaults
        )

    def _hard(self, pod: PodInfo) -> tuple[TopologySpreadConstraint, ...]:
        return tuple(c for c in self.constraints(pod) if c.when_unsatisfiable == "DoNotSchedule")

    def applies(self, pod: PodInfo, state: ClusterState) -> bool:
        """Whether the filter may reject a node: the pod has a ``DoNotSchedule``
        constraint."""
        spec = pod.spec
        if not spec.spread_constraints and (spec.owner_selector is None or not self.defaults):
            return False  # no constraint at all (most pods: asked for every pod routed)
        return bool(self._hard(pod))

    # ------------------------------------------------------------------ helpers

    def _included(self, pod: PodInfo, state: ClusterState, c: TopologySpreadConstraint) -> Bools:
        """Nodes ``c``'s node inclusion policies let count."""
        spec = pod.spec
        mask = state.valid.copy()
        if c.node_affinity_policy == "Honor":
            if spec.node_selector:
                mask &= match_labels(state, spec.node_selector)
            if spec.required_affinity is not None:
                mask &= match_terms(state, spec.required_affinity)
        if c.node_taints_policy == "Honor":
            for taint, code in state.taint_codes.items():
                if taint.effect in HARD_EFFECTS and not tolerates(spec.tolerations, taint):
                    mask &= ~state.taint_rows[code]
        return mask

    @staticmethod
    def _per_node(table: PodTable, pod: PodInfo, c: TopologySpreadConstraint, cap: int) -> Ints:
        rows = table.matching(c.selector, (pod.spec.namespace,), False)
        return table.per_node(rows, cap)

    @staticmethod
    def _all_keys(state: ClusterState, constraints: tuple[TopologySpreadConstraint, ...]) -> Bools:
        mask = state.valid.copy()
        for c in constraints:
            mask &= node_codes(state, c.topology_key) >= 0
        return mask

    # ------------------------------------------------------------------ filter

    def verdicts(self, pod: PodInfo, state: ClusterState) -> tuple[Bools, Bools]:
        """Per slot: has every key; and no constraint's skew is exceeded there."""
        hard = self._hard(pod)
        cap = state.capacity
        table = pod_table(state, self.handle.pods)
        labelled = self._all_keys(state, hard)
        within = np.ones(cap, dtype=np.bool_)
        for c in hard:
            codes = node_codes(state, c.topology_key)
            eligible = labelled & self._included(pod, state, c)
            per_node = self._per_node(table, pod, c, cap)
            values = len(state.label_values.get(c.topology_key, {}))
            counts = np.bincount(codes[eligible], weights=per_node[eligible], minlength=values)
            counts = counts.astype(np.int64)
            present = np.zeros(values, dtype=np.bool_)
            present[codes[eligible]] = True
            domains = int(present.sum())
            if domains == 0:
                continue  # no eligible domain: the minimum is unbounded, nothing is skewed
            minimum = 0 if domains < c.min_domains else int(counts[present].min())
            own = 1 if selector_matches(c.selector, pod.spec.labels) else 0
            has = codes >= 0
            here = np.where(has, counts[np.maximum(codes, 0)], 0)
            within &= ~has | (here + own - minimum <= c.max_skew)
        return labelled, within

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Bools:
        """``labelled & within`` of :meth:`verdicts`, kept between pods
        (:mod:`engine.plugins.spread_cache`); read-only."""
        hard = self._hard(pod)
        if not hard:
            return state.valid
        table = pod_table(state, self.handle.pods)
        return self._hard_masks.mask(pod, state, hard, table, self._included, self._all_keys)

    def reasons(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, rejected: Bools
    ) -> dict[str, int]:
        labelled, within = self.verdicts(pod, state)
        out: dict[str, int] = {}
        missing = int((rejected & ~labelled).sum())
        skewed = int((rejected & labelled & ~within).sum())
        if missing:
            out[MISSING] = missing
        if skewed:
            out[SKEW] = skewed
        return out or {SKEW: int(rejected.sum())}

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

    def _ignored(self, pod: PodInfo, state: ClusterState, feasible: Bools) -> Bools:
        soft = self._soft(pod)
        if pod.spec.spread_constraints or not self.system:
            return feasible & ~self._all_keys(state, soft)
        return np.zeros(state.capacity, dtype=np.bool_)

    def _soft(self, pod: PodInfo) -> tuple[TopologySpreadConstraint, ...]:
        return tuple(c for c in self.constraints(pod) if c.when_unsatisfiable == "ScheduleAnyway")

    def score(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools
    ) -> Ints | int:
        spec = pod.spec
        if not spec.spread_constraints and (spec.owner_selector is None or not self.defaults):
            return 0  # no constraint at all (most pods: asked for every pod scored)
        soft = self._soft(pod)
        if not soft:
            return 0
        cap = state.capacity
        feasible = feasible[:cap] & state.valid
        table = pod_table(state, self.handle.pods)
        ignored = self._ignored(pod, state, feasible)
        scored = feasible & ~ignored
        require_all = bool(pod.spec.spread_constraints) or not self.system
        counting = state.valid & (self._all_keys(state, soft) if require_all else True)
        total = np.zeros(cap, dtype=np.float64)
        for c in soft:
            codes = node_codes(state, c.topology_key)
            per_node = self._per_node(table, pod, c, cap)
            has = codes >= 0
            if c.topology_key == HOSTNAME:
                size = int(scored.sum())
                count = per_node.astype(np.float64)  # (the node's own pods)
            else:
                # domains of the scored nodes (a node without the key: the domain "",
                # as kube-scheduler's map lookup gives, when keys are not required)
                shifted = codes.astype(np.int64) + 1
                values = len(state.label_values.get(c.topology_key, {})) + 1
                known = np.zeros(values, dtype=np.bool_)
                known[shifted[scored]] = True
                size = int(known.sum())
                eligible = counting & self._included(pod, state, c)
                eligible &= known[shifted]
                counts = np.bincount(
                    shifted[eligible], weights=per_node[eligible], minlength=values
                )
                count = counts[shifted].astype(np.float64)
            weight = math.log(size + 2)
            part = count * weight + float(c.max_skew - 1)
            total = np.where(has, total + part, total)
        raw = np.rint(total).astype(np.int64)  # Go's math.Round: half away from zero
        halves = np.abs(total - np.trunc(total)) == 0.5
        if halves.any():
            raw = np.where(halves, (np.trunc(total) + np.sign(total)).astype(np.int64), raw)
        cycle.write(NAME, "ignored", ignored)
        return np.where(ignored, -1, raw)

    def normalize(self, scores: Ints | int, feasible: Bools) -> Ints | int:
        """kube-scheduler's, in integers: ``100 * (max + min - s) / max`` over the
        scored feasible nodes (ignored ones, marked -1, get 0); 100 when max is 0."""
        if isinstance(scores, int):
            return 0
        cap = scores.shape[0]
        valid = feasible[:cap] & (scores >= 0)
        if not valid.any():
            return np.zeros(cap, dtype=np.int64)
        low = int(scores[valid].min())
        high = int(scores[valid].max())
        if high == 0:
            return np.where(valid, 100, 0).astype(np.int64)
        out = (100 * (high + low - scores)) // high
        return np.where(valid, out, 0).astype(np.int64)
