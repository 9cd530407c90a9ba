"""The framework runtime: one profile's plugins run over all nodes of a shard at once.

Per attempt: pre-filter → filters (static ones cached per pod shape until a node
changes) → [post-filter if nothing fits] → pre-score → weighted scores → select →
reserve → permit. Node selection is deterministic: the highest total score wins; ties
are broken by a rotation derived from the pod's name (a stable hash), so equal nodes are
spread across pods yet every replay picks the same one.

With ``percentageOfNodesToScore`` set, only the first feasible nodes of a scan are
scored (:mod:`engine.framework.sample`): the shape caches keep every node's verdict and
local score, and the sample masks them per attempt.

Filters that read pods on other nodes (inter-pod affinity, spread constraints) say
which pods they apply to (``applies``): a pod none applies to never runs them, and one
some apply to keeps its shape's cached local verdicts and scores, their verdict ANDed on
top.

A failed attempt is diagnosed in full (every rejected node's reasons) unless the
caller asks for it briefly (a preemptor: the reasons matter only if preemption fails
too); then :mod:`engine.framework.rejecting` says which filters rejected nodes, kept
per shape and refreshed over the changed nodes, and :meth:`Framework.complete` gives
the reasons later, on the same state.

Why one module of over 500 lines: the shape caches and the attempt that reads them are
one mechanism; split, a cache could be refreshed by rules the attempt does not follow.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from engine.config import ProfileConfig
from engine.framework.best import BestIndex, Limits, MaskedScores
from engine.framework.cycle import CycleState
from engine.framework.handle import Handle
from engine.framework.interfaces import (
    CardChooserPlugin,
    FilterPlugin,
    NormalizeScorePlugin,
    PermitPlugin,
    Plugin,
    PostFilterPlugin,
    PostFilterResult,
    PotentialPlugin,
    PreFilterPlugin,
    PreScorePlugin,
    QueueingHintPlugin,
    ReservePlugin,
    ScorePlugin,
)
from engine.framework.registry import Registry
from engine.framework.rejecting import Rejecting
from engine.framework.results import (
    Attempt,
    Diagnosis,
    NodeScore,
    Verdict,
    full_scores,
    select,
)
from engine.framework.sample import nodes_to_find, sample
from engine.framework.status import SUCCESS, Code, Status
from engine.model.changes import EVERY, ClusterEvent
from engine.model.pods import PodInfo
from engine.model.state import Bools, ClusterState, Ints, any_set
from events.errors import InputError

_PROTOCOLS: Mapping[str, type] = {
    "preFilter": PreFilterPlugin,
    "filter": FilterPlugin,
    "postFilter": PostFilterPlugin,
    "preScore": PreScorePlugin,
    "score": ScorePlugin,
    "reserve": ReservePlugin,
    "permit": PermitPlugin,
}
TOP_NODES = 5
INCREMENTAL_LIMIT = 512
"""Above this many changed nodes since a shape was last evaluated, recompute it whole."""
DERIVED = 8
"""Shared masks kept per shape (spread verdicts alternate between a few); and
``DERIVED_TOTAL`` over all shapes."""
STABLE = "stable-mask"
"""Cycle key: ``(feasible, mask, under)`` when one filter that reads other nodes
applied and gave a shared read-only mask (``feasible`` is the shape's verdict ANDed
with it; ``under``: the shape's scores under it, brought up to date by the filtering,
or None)."""
DERIVED_SHIFT = 5
"""Scores under a shared mask follow the shape's rewritten slots up to
``max(INCREMENTAL_LIMIT, nodes >> DERIVED_SHIFT)`` of them (beyond, they are built anew)."""
SCALAR_LIMIT = 8
"""Up to this many changed nodes are refreshed one by one in plain Python, beyond it
with numpy over a gathered view."""
SHAPE_CACHE_SIZE = 128
STATIC_CACHE_SIZE = 256
DERIVED_TOTAL = 32
"""Memory per node of a profile's caches, at most: ``SHAPE_CACHE_SIZE`` shapes of 17
bytes (verdict, local and masked scores, and their index: 16 bytes per ``BLOCK``
nodes), ``STATIC_CACHE_SIZE`` static verdicts of 1 byte, and ``DERIVED_TOTAL`` scores
and verdicts under spread masks of 9 bytes: about 2.4 KB per node in all, far less in practice (a
shape per pod template and static key in use)."""
EXTENDER = "extender "
"""How rejections by HTTP extenders are named (``extender URLPREFIX``)."""


@dataclass(slots=True)
class _ShapeEntry:
    """What the framework knows of one pod shape as of journal ``position``."""

    position: int
    feasible: Bools
    local: Ints | None = None
    """Weighted sum of the local score plugins (None until first scored), read only
    where ``feasible`` holds: a slot whose verdict changes is scored again (on the
    compiled path a shape's first scores leave the other slots at 0)."""
    masked: Ints | None = None
    """``where(feasible, local, -1)``, kept in step with both."""
    pending: Ints | None = None
    """Slots whose feasibility was refreshed but whose scores are not yet."""
    pending_view: ClusterState | None = None
    pending_slots: list[int] | None = None
    """Like ``pending``, refreshed one by one (see ``SCALAR_LIMIT``)."""
    best: BestIndex | None = None
    """Block maxima of ``masked`` (:mod:`engine.framework.best`), built at the first
    attempt that selects through it; told of every slot refreshed since."""
    derived: dict[int, MaskedScores] = field(default_factory=dict)
    """``masked`` under each of the last few shared masks a filter that reads other
    nodes gave (by the mask's ``id``: the entry holds the mask, so the id is its)."""


@dataclass(slots=True)
class _ScoreEntry:
    plugin: ScorePlugin
    weight: int
    normalize: bool
    static: bool = False
    """The plugin's ``static`` (a score that depends on the node's labels and taints
    only), read once."""


class Framework:
    """A profile's plugins, instantiated once and run for each attempt."""

    def __init__(self, profile: ProfileConfig, registry: Registry, handle: Handle) -> None:
        self.profile = profile
        where = f"profile {profile.scheduler_name!r}"
        instances: dict[str, Plugin] = {}

        def get(name: str) -> Plugin:
            if name not in instances:
                instances[name] = registry.create(
                    name, profile.args.get(name, {}), f"{where}: plugin {name}", handle
                )
            return instances[name]

        for name in profile.args:
            if name not in registry:
                raise InputError(f"pluginConfig names unknown plugin {name!r}", location=where)
        chosen: dict[str, list[tuple[Plugin, int]]] = {}
        for point, proto in _PROTOCOLS.items():
            entries = [(get(ref.name), ref.weight) for ref in profile.points.get(point, ())]
            off = profile.multi_point_off.get(point, frozenset())
            for ref in profile.multi_point:
                if ref.name in off or "*" in off:
                    continue
                plugin = get(ref.name)
                if isinstance(plugin, proto) and all(p.name != ref.name for p, _ in entries):
                    entries.append((plugin, ref.weight or 1))
            for plugin, _ in entries:
                if not isinstance(plugin, proto):
                    raise InputError(
                        f"plugin {plugin.name!r} does not implement the {point} extension point",
                        location=where,
                    )
            chosen[point] = entries
        self.plugins = instances
        self.pre_filters: list[PreFilterPlugin] = [p for p, _ in chosen["preFilter"]]  # type: ignore[misc]
        self.filters: list[FilterPlugin] = [p for p, _ in chosen["filter"]]  # type: ignore[misc]
        self.static_filters = [f for f in self.filters if f.static]
        self.conditional = [f for f in self.filters if not f.static and hasattr(f, "applies")]
        """Filters that look beyond one node and say which pods they apply to
        (``applies(pod, state)``): a pod none applies to skips them (they would pass
        every node); for one some apply to, their verdict is ANDed to its shape's."""
        self.dynamic_filters = [
            f for f in self.filters if not f.static and f not in self.conditional
        ]
        self._room_plugins = frozenset({f.name for f in self.static_filters} | {"NodeResourcesFit"})
        """Plugins whose verdict on a node only its free room can change."""
        self.post_filters: list[PostFilterPlugin] = [p for p, _ in chosen["postFilter"]]  # type: ignore[misc]
        self.pre_scores: list[PreScorePlugin] = [p for p, _ in chosen["preScore"]]  # type: ignore[misc]
        self.scores = [
            _ScoreEntry(p, w, isinstance(p, NormalizeScorePlugin), getattr(p, "static", False))  # type: ignore[arg-type]
            for p, w in chosen["score"]
        ]
        self.reserves: list[ReservePlugin] = [p for p, _ in chosen["reserve"]]  # type: ignore[misc]
        self.permits: list[PermitPlugin] = [p for p, _ in chosen["permit"]]  # type: ignore[misc]
        self._static_cache: dict[tuple[object, ...], Bools] = {}
        self._static_feasible: dict[tuple[object, ...], tuple[Bools, Bools]] = {}
        """Per static key: the static mask and :meth:`static_feasible` of it (read-only)."""
        self._static_version = -1
        self._requeue = [
            (f.name, f.events(), f if isinstance(f, QueueingHintPlugin) else None)
            for f in [*self.pre_filters, *self.filters]
            if hasattr(f, "events")
        ]
        """Per filter (and pre-filter that says): the events that may help a pod it
        rejected, and its hint."""
        self.incremental = all(getattr(f, "local", False) for f in self.dynamic_filters)
        """Keep per-shape results between attempts (all dynamic filters are local)."""
        self._local_scores = [e for e in self.scores if e.plugin.local]
        self._scalar = all(hasattr(f, "filter_one") for f in self.dynamic_filters) and all(
            hasattr(e.plugin, "score_one") for e in self._local_scores
        )
        """Every dynamic filter and local score has a one-slot form: a refresh of a few
        nodes runs them in plain Python (same results; numpy costs more per call)."""
        self._global_scores = [e for e in self.scores if not e.plugin.local]
        self._card_choosers: list[CardChooserPlugin] = [
            e.plugin for e in self.scores if isinstance(e.plugin, CardChooserPlugin)
        ]
        """Score plugins that also choose a GPU pod's cards on the chosen node."""
        self.potential: PotentialPlugin | None = next(
            (e.plugin for e in self.scores if isinstance(e.plugin, PotentialPlugin)), None
        )
        """The first score plugin that says how fragmented a node is (the rescheduler
        compares its plans by it); None: none does."""
        self.kernel = (
            registry.kernel(
                list(self.dynamic_filters), [(e.plugin, e.weight) for e in self._local_scores]
            )
            if self.incremental and registry.kernel is not None
            else None
        )
        """The compiled refresh standing in for the resource plugins (None: numpy)."""
        self._shapes: OrderedDict[tuple[object, ...], _ShapeEntry] = OrderedDict()
        self._derived_order: OrderedDict[int, _ShapeEntry] = OrderedDict()
        """Shapes holding derived scores, least recently given one first."""
        self._constant_scores: dict[tuple[str, tuple[object, ...]], int] = {}
        self._counters = {"full": 0, "incremental": 0}
        self._rejecting = Rejecting(self.filters, self.incremental)
        """Which filters reject each failing shape (for brief failures)."""

    def __repr__(self) -> str:
        return (
            f"Framework({self.profile.scheduler_name!r}, filters={[f.name for f in self.filters]}, "
            f"scores={[(s.plugin.name, s.weight) for s in self.scores]})"
        )

    def stats(self) -> dict[str, int]:
        return {
            "static_cache": len(self._static_cache),
            "shapes": len(self._shapes),
            **self._counters,
        }

    # ------------------------------------------------------------------ queueing

    def events_for(self, plugins: tuple[str, ...]) -> frozenset[ClusterEvent]:
        """Events that may help a pod that ``plugins`` rejected."""
        if any(name.startswith(EXTENDER) for name in plugins):
            return frozenset(ClusterEvent)  # an extender says nothing of what may help
        out: set[ClusterEvent] = set()
        for name, events, _ in self._requeue:
            if name in plugins:
                out |= events
        return frozenset(out) if plugins else EVERY

    def worth_retrying(
        self,
        pod: PodInfo,
        plugins: tuple[str, ...],
        event: ClusterEvent,
        slot: int,
        state: ClusterState,
    ) -> bool:
        if any(name.startswith(EXTENDER) for name in plugins):
            return True
        for name, events, hint in self._requeue:
            if name not in plugins or event not in events:
                continue
            if hint is None or hint.worth_retrying(pod, event, slot, state):
                return True
        return not plugins

    # ------------------------------------------------------------------ filtering

    def _static_mask(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Bools:
        if self._static_version != state.static_version:
            self._static_cache.clear()
            self._static_feasible.clear()
            self._constant_scores.clear()
            self._shapes.clear()
            self._derived_order.clear()
            self._static_version = state.static_version
        mask = self._static_cache.get(pod.static_key)
        if mask is None:
            mask = state.valid
            for f in self.static_filters:
                mask = mask & f.filter(cycle, pod, state)
            if len(self._static_cache) >= STATIC_CACHE_SIZE:
                self._static_cache.clear()
            self._static_cache[pod.static_key] = mask
        return mask

    def room_decides(
        self, pod: PodInfo, plugins: tuple[str, ...], slot: int, state: ClusterState
    ) -> bool | None:
        """See :meth:`engine.model.shard.Hints.room_decides`."""
        if not self.static_feasible(pod, state)[slot]:
            return False
        return all(name in self._room_plugins for name in plugins) or None

    def static_feasible(self, pod: PodInfo, state: ClusterState) -> Bools:
        """Nodes only free resources keep ``pod`` from (what preemption may change).
        Read-only, and the same array while the static mask stands (a wave of
        preemptors compares it by identity: :mod:`engine.plugins.preemption_candidates`)."""
        mask = self._static_mask(CycleState(), pod, state)
        kept = self._static_feasible.get(pod.static_key)
        if kept is not None and kept[0] is mask:
            return kept[1]
        feasible = mask & state.valid
        feasible.flags.writeable = False
        if len(self._static_feasible) >= STATIC_CACHE_SIZE:
            self._static_feasible.clear()
        self._static_feasible[pod.static_key] = (mask, feasible)
        return feasible

    def cluster_wide(self, pod: PodInfo, state: ClusterState) -> bool:
        """Whether a filter that reads pods on other nodes (inter-pod affinity, spread
        constraints) applies to ``pod`` now: then its verdict on a node depends on
        more than that node, and on more than one shard."""
        for f in self.conditional:  # noqa: SIM110 (a loop, not any(): asked for every pod routed)
            if f.applies(pod, state):
                return True
        return False

    def feasible(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, *, local_only: bool = False
    ) -> Bools:
        """Filter verdict over all slots (computed whole, no cache), an array the
        caller owns (it may bar slots in it). ``local_only``: without the filters that
        read pods on other nodes (a shard staging what the coordinator chose on its
        whole view)."""
        static = self._static_mask(cycle, pod, state)
        mask = static
        for f in self.dynamic_filters:
            mask = mask & f.filter(cycle, pod, state)
        if not local_only:
            for f in self.conditional:
                if f.applies(pod, state):
                    mask = mask & f.filter(cycle, pod, state)
        # no filter ANDed in: that is the cached static mask (or ``state.valid``) itself
        return mask.copy() if mask is static else mask

    def feasible_on(
        self,
        cycle: CycleState,
        pod: PodInfo,
        state: ClusterState,
        slot: int,
        *,
        local_only: bool = False,
    ) -> bool:
        """``feasible(cycle, pod, state, local_only=local_only)[slot]``, the filters
        run on that one node where every dynamic filter is local (a placement the
        coordinator directed to a node: one node looked at, not every node of the
        shard); the filters that read other nodes, where they apply, still whole."""
        if not self.incremental:
            return bool(self.feasible(cycle, pod, state, local_only=local_only)[slot])
        static = self._static_mask(cycle, pod, state)
        fits = self._fits_locally(cycle, pod, state, static, slot)
        if not fits or local_only:
            return fits
        for f in self.conditional:
            if f.applies(pod, state) and not f.filter(cycle, pod, state)[slot]:
                return False
        return True

    def _shape_feasible(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState
    ) -> tuple[Bools, _ShapeEntry | None]:
        """Filter verdict, refreshing only the nodes changed since this shape's last
        attempt. Exactly equal to :meth:`feasible` (dynamic filters are local). For a
        pod the filters that read other nodes apply to, their verdict is ANDed to the
        shape's (a new array: the shape's entry keeps the local verdict alone)."""
        if not self.incremental:
            return self.feasible(cycle, pod, state), None
        feasible, entry = self._local_feasible(cycle, pod, state)
        if self.conditional:
            masks: list[Bools] = []
            for f in self.conditional:  # (a loop: most pods none applies to)
                if f.applies(pod, state):
                    masks.append(f.filter(cycle, pod, state))
            if not masks:
                return feasible, entry
            if len(masks) == 1 and not masks[0].flags.writeable:
                # one shared mask: the verdict under it is kept with the shape's scores
                # under it, slot by slot (not ANDed over every node for each pod)
                mask = masks[0]
                under = None
                if state.high_water >= Limits.min_nodes:  # (below, one AND costs less)
                    under = self._masked_scores(entry, mask)
                feasible = feasible & mask if under is None else under.verdict(feasible)
                cycle.write("", STABLE, (feasible, mask, under))
            else:
                for mask in masks:
                    feasible = feasible & mask
        return feasible, entry

    def _local_feasible(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState
    ) -> tuple[Bools, _ShapeEntry]:
        static = self._static_mask(cycle, pod, state)
        entry = self._shapes.get(pod.shape_key)
        changed = None if entry is None else state.changed_since(entry.position)
        if entry is None or changed is None or len(changed) > INCREMENTAL_LIMIT:
            self._counters["full"] += 1
            mask = static
            for f in self.dynamic_filters:
                mask = mask & f.filter(cycle, pod, state)
            if entry is not None:
                self._forget_derived(entry)
            entry = _ShapeEntry(state.journal_end, mask.copy())
            self._shapes[pod.shape_key] = entry
            if len(self._shapes) > SHAPE_CACHE_SIZE:
                self._forget_derived(self._shapes.popitem(last=False)[1])
            return entry.feasible, entry
        self._counters["incremental"] += 1
        self._shapes.move_to_end(pod.shape_key)
        if entry.pending is not None:
            # scores were not refreshed last time (nothing fitted): carry those slots on
            changed = [*changed, *entry.pending.tolist()]
            entry.pending = entry.pending_view = None
        if entry.pending_slots is not None:
            changed = [*changed, *entry.pending_slots]
            entry.pending_slots = None
        kernel = self.kernel
        refresh = (
            bool(changed)
            and kernel is not None
            and entry.local is not None
            and kernel.worth(len(changed), SCALAR_LIMIT)
        )
        at = None  # ``changed`` as an array, made once for the index and the kernel
        follows = None  # the index the kernel keeps in step as it writes
        if changed and (entry.best is not None or entry.derived):
            if entry.best is not None:
                assert entry.masked is not None  # (the index is over it)
                at = np.array(changed, dtype=np.int64)
                if refresh and entry.best.follows(at.shape[0]):
                    follows = entry.best
                else:
                    entry.best.told(at, entry.masked[at])
            # (followed up to a share of the nodes: taking them later, when the pod's
            # mask names these scores again, costs less than building them anew)
            limit = max(INCREMENTAL_LIMIT, state.capacity >> DERIVED_SHIFT)
            for derived in entry.derived.values():
                derived.touch(changed, limit)
        if refresh:
            assert kernel is not None and entry.local is not None and entry.masked is not None
            params = kernel.params(pod.request, state)
            if params is not None and kernel.run(
                changed if at is None else at,
                static,
                state,
                params,
                entry.feasible,
                entry.local,
                entry.masked,
                follows,
            ):
                entry.position = state.journal_end
                return entry.feasible, entry
            if follows is not None:  # not refreshed compiled: told as written later
                assert at is not None
                follows.told(at, entry.masked[at])
        if changed and self._scalar and len(changed) <= SCALAR_LIMIT:
            feasible = entry.feasible
            filters = self.dynamic_filters
            unique = sorted(set(changed))
            for slot in unique:
                feasible[slot] = bool(static[slot]) and all(
                    f.filter_one(pod, state, slot)  # type: ignore[attr-defined]
                    for f in filters
                )
            if entry.local is not None:  # (else the scores are computed whole when needed)
                entry.pending_slots = unique
        elif changed:
            slots = np.array(sorted(set(changed)), dtype=np.int64)
            view = state.view(slots)
            sub = static[slots]
            for f in self.dynamic_filters:
                sub = sub & f.filter(cycle, pod, view)
            entry.feasible[slots] = sub
            if entry.local is not None:
                entry.pending, entry.pending_view = slots, view
        entry.position = state.journal_end
        return entry.feasible, entry

    def _local_masked(
        self,
        cycle: CycleState,
        pod: PodInfo,
        state: ClusterState,
        feasible: Bools,
        entry: _ShapeEntry | None,
        keep: dict[str, Ints] | None,
    ) -> Ints:
        """``where(feasible, weighted local scores, -1)``, kept per shape when possible.
        The result may be the shape's own array: callers must not modify it."""
        if entry is None or entry.local is None or entry.masked is None or keep is not None:
            if keep is None and entry is not None and self._compiled_scores(pod, state, entry):
                return entry.masked  # type: ignore[return-value]
            local = np.zeros(state.capacity, dtype=np.int64)
            for e in self._local_scores:
                weighted = e.plugin.score(cycle, pod, state, feasible) * e.weight
                if keep is not None:
                    keep[e.plugin.name] = full_scores(weighted, state.capacity)
                local += weighted
            masked: Ints = np.where(feasible, local, -1)
            if entry is not None:
                entry.local, entry.masked = local, masked
                entry.pending = entry.pending_view = entry.pending_slots = None
                entry.best = None
                self._forget_derived(entry)
            return masked
        if entry.pending_slots is not None:
            local, masked = entry.local, entry.masked
            scorers = [(e.plugin, e.weight) for e in self._local_scores]
            for slot in entry.pending_slots:
                total = 0
                for plugin, weight in scorers:
                    total += plugin.score_one(pod, state, slot) * weight  # type: ignore[attr-defined]
                local[slot] = total
                masked[slot] = total if feasible[slot] else -1
            entry.pending_slots = None
        slots, view = entry.pending, entry.pending_view
        if slots is not None and view is not None:
            sub = np.zeros(slots.size, dtype=np.int64)
            for e in self._local_scores:
                sub += e.plugin.score(cycle, pod, view, feasible[slots]) * e.weight
            entry.local[slots] = sub
            entry.masked[slots] = np.where(feasible[slots], sub, -1)
            entry.pending = entry.pending_view = None
        return entry.masked

    def _compiled_scores(self, pod: PodInfo, state: ClusterState, entry: _ShapeEntry) -> bool:
        """A shape's first scores on every slot through the compiled kernel (its
        results are the plugins', bit for bit: at 130,000 nodes a few milliseconds
        instead of some twenty for numpy's passes); False where it does not stand in."""
        kernel = self.kernel
        if kernel is None or not kernel.worth(state.capacity, INCREMENTAL_LIMIT):
            return False
        params = kernel.params(pod.request, state)
        if params is None:
            return False
        local = np.zeros(state.capacity, dtype=np.int64)
        masked = np.full(state.capacity, -1, dtype=np.int64)
        # the feasible slots only (a node selector's shape: a fraction of the nodes);
        # the verdict is the shape's already: refreshed over itself, it stays as it is
        slots = np.flatnonzero(entry.feasible)
        if not kernel.run(slots, entry.feasible, state, params, entry.feasible, local, masked):
            return False
        entry.local, entry.masked = local, masked
        entry.pending = entry.pending_view = entry.pending_slots = None
        entry.best = None
        self._forget_derived(entry)
        return True

    def score(
        self,
        cycle: CycleState,
        pod: PodInfo,
        state: ClusterState,
        feasible: Bools,
        keep: dict[str, Ints] | None = None,
        shape: _ShapeEntry | None = None,
        final: Bools | None = None,
    ) -> tuple[Ints, int]:
        """``where(feasible, weighted total, -1)`` over all slots, and the part of the
        total that is the same on every node (kept apart: it cannot change the choice).
        With ``final`` (a subset of ``feasible``: what extenders let through), the
        scores that look beyond one node see ``final``, and the result is masked by it.
        """
        local = feasible if shape is None else shape.feasible
        masked = self._local_masked(cycle, pod, state, local, shape, keep)
        if local is not feasible:  # the shape's scores, where the pod's own filters pass
            stable = cycle.read("", STABLE)
            if shape is not None and keep is None and stable is not None and stable[0] is feasible:
                under = stable[2]  # (kept up to date by the filtering, this attempt)
                masked = self._derived(shape, stable[1]) if under is None else under.masked
            else:
                masked = np.where(feasible, masked, -1)
        if final is not None:
            feasible = final
            masked = np.where(final, masked, -1)
        constant = 0
        extra: Ints | None = None
        for entry in self._global_scores:
            # A static plugin that gives every node the same score gives it again until
            # a node's labels or taints change (then the cache is dropped).
            static = entry.static and keep is None
            if static:
                cache_key = (entry.plugin.name, pod.static_key)
                cached = self._constant_scores.get(cache_key)
                if cached is not None:
                    constant += cached
                    continue
            raw = entry.plugin.score(cycle, pod, state, feasible)
            if entry.normalize:
                raw = entry.plugin.normalize(raw, feasible)  # type: ignore[attr-defined]
            weighted = raw * entry.weight
            if static and isinstance(weighted, int):
                self._constant_scores[cache_key] = weighted
            if keep is not None:
                keep[entry.plugin.name] = full_scores(weighted, state.capacity)
            if isinstance(weighted, int):
                constant += weighted
            else:
                extra = weighted if extra is None else extra + weighted
        if extra is not None:
            masked = np.where(feasible, masked + extra, -1)
        return masked, constant

    def diagnose(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Diagnosis:
        """Attribute every rejected node to the first filter that rejects it."""
        alive = state.valid.copy()
        diagnosis = Diagnosis(nodes=len(state.index))
        for f in self.filters:
            mask = f.filter(cycle, pod, state)
            rejected = alive & ~mask
            if any_set(rejected):
                diagnosis.plugins[f.name] = f.reasons(cycle, pod, state, rejected)
                diagnosis.rejected[f.name] = int(np.count_nonzero(rejected))
            alive &= mask
        diagnosis.feasible = int(np.count_nonzero(alive))
        return diagnosis

    def run_post_filters(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState
    ) -> PostFilterResult:
        """After an attempt found no node: the post-filters in turn (preemption lives
        here) until one nominates a node; they stage what they change in the cycle's
        statement (see :mod:`engine.framework.handle`)."""
        allowed = self.static_feasible(pod, state)
        for f in self.conditional:
            # preemption frees resources only: nodes these rules refuse stay refused
            if f.applies(pod, state):
                allowed = allowed & f.filter(cycle, pod, state)
        for post in self.post_filters:
            result = post.post_filter(cycle, pod, state, allowed)
            if result.status.code == Code.SUCCESS and result.nominated_slot >= 0:
                return PostFilterResult(result.status.with_plugin(post.name), result.nominated_slot)
        return PostFilterResult(Status(Code.UNSCHEDULABLE, ("no post-filter nominated a node",)))

    def run_pre_filters(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Status:
        for plugin in self.pre_filters:
            status = plugin.pre_filter(cycle, pod, state)
            if status is not SUCCESS and not status.ok:  # (SUCCESS: most pods, at once)
                return status.with_plugin(plugin.name)
        return SUCCESS

    def candidates(self, pod: PodInfo, state: ClusterState) -> Bools | None:
        """The nodes that pass the pre-filters and filters (what kube-scheduler sends
        its extenders); None if a pre-filter rejects the pod. Do not modify it."""
        cycle = CycleState()
        if not self.run_pre_filters(cycle, pod, state).ok:
            return None
        return self._shape_feasible(cycle, pod, state)[0]

    def schedule(
        self,
        pod: PodInfo,
        state: ClusterState,
        *,
        explain: bool = False,
        within: Bools | None = None,
        verdict: Verdict | None = None,
        brief: bool | Callable[[], bool] = False,
    ) -> Attempt:
        """Find a node for ``pod``; do not change ``state`` (the caller assumes).
        ``within``: only among these slots (a gang's topology domain). With a
        ``verdict``, the extenders' answers filter after the filters and add to the
        scores, as kube-scheduler's extenders do. ``brief``: a failure may come without
        reasons (see the module); a callable is asked only if the attempt fails."""
        cycle = CycleState()
        status = self.run_pre_filters(cycle, pod, state)
        if not status.ok:
            return Attempt(-1, status, diagnosis=Diagnosis(nodes=len(state.index), status=status))
        if within is not None:
            feasible, shape = self.feasible(cycle, pod, state) & within, None
        elif explain:
            feasible, shape = self.feasible(cycle, pod, state), None
        else:
            feasible, shape = self._shape_feasible(cycle, pod, state)
        if verdict is not None and verdict.error:
            status = Status(Code.ERROR, (verdict.error,), verdict.plugin)
            return Attempt(-1, status, diagnosis=Diagnosis(nodes=len(state.index), status=status))
        if self.profile.percentage_of_nodes_to_score is not None:
            feasible = self._sampled(feasible, pod, state, verdict is not None)
        passed = feasible
        if verdict is not None and verdict.mask is not None:
            feasible = feasible & verdict.mask
        if not any_set(feasible):
            if verdict is None and (brief() if callable(brief) else brief):
                briefly = self._brief_failure(cycle, pod, state)
                if briefly is not None:
                    return briefly
            return self._failure(cycle, pod, state, verdict, passed)
        for pre in self.pre_scores:
            status = pre.pre_score(cycle, pod, state, feasible)
            if not status.ok:
                return Attempt(-1, status.with_plugin(pre.name))
        keep: dict[str, Ints] | None = {} if explain else None
        if feasible is passed:
            masked, constant = self.score(cycle, pod, state, feasible, keep, shape)
        else:  # local scores as kept for the shape, the rest over what the extenders left
            masked, constant = self.score(cycle, pod, state, passed, keep, shape, feasible)
        if verdict is not None and verdict.scores is not None:
            masked = np.where(feasible, masked + verdict.scores, -1)
            if keep is not None:
                keep["extenders"] = verdict.scores
        used = state.high_water
        if shape is None or used < Limits.min_nodes:
            slot = select(masked, used, pod.tiebreak)
        else:
            stable = cycle.read("", STABLE)
            slot = self._select(
                masked, shape, used, pod.tiebreak, None if stable is None else stable[1]
            )
        best = masked.item(slot) + constant
        diagnosis = None
        if explain:
            diagnosis = self.diagnose(cycle, pod, state)
            diagnosis.top = self._top(state, np.where(feasible, masked + constant, -1), keep or {})
        for i, plugin in enumerate(self.reserves):
            status = plugin.reserve(cycle, pod, state, slot)
            if not status.ok:
                for done in reversed(self.reserves[: i + 1]):
                    done.unreserve(cycle, pod, state, slot)
                return Attempt(-1, status.with_plugin(plugin.name), diagnosis=diagnosis)
        for permit in self.permits:
            status = permit.permit(cycle, pod, state, slot)
            if not status.ok:
                for done in reversed(self.reserves):
                    done.unreserve(cycle, pod, state, slot)
                return Attempt(-1, status.with_plugin(permit.name), diagnosis=diagnosis)
        cards = None if pod.gpu is None else self._choose_cards(pod, state, slot)
        return Attempt(slot, SUCCESS, best, diagnosis, cards)

    def _forget_derived(self, shape: _ShapeEntry) -> None:
        """Drop ``shape``'s derived scores, and the order's hold on it (a shape replaced
        or evicted is then freed, as ``DERIVED_TOTAL`` counts)."""
        shape.derived.clear()
        self._derived_order.pop(id(shape), None)

    def _failure(
        self,
        cycle: CycleState,
        pod: PodInfo,
        state: ClusterState,
        verdict: Verdict | None,
        passed: Bools | None,
    ) -> Attempt:
        """The failed attempt, with its full diagnosis (every rejected node's reasons)."""
        failure = self.diagnose(cycle, pod, state)
        if verdict is not None and passed is not None and any_set(passed):
            failure.plugins.update(verdict.rejections)
            for name, reasons in verdict.rejections.items():
                failure.rejected[name] = sum(reasons.values())
            failure.feasible = 0
        plugins = tuple(failure.plugins)
        code = Code.UNSCHEDULABLE
        if plugins and all(
            getattr(self.plugins[n], "unresolvable", False)
            if n in self.plugins
            else verdict_unresolvable(verdict)
            for n in plugins
        ):
            code = Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        status = Status(code, (failure.message(),), ",".join(plugins))
        failure.status = status
        return Attempt(-1, status, diagnosis=failure)

    def _brief_failure(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState
    ) -> Attempt | None:
        """The failed attempt as :meth:`_failure` gives it, but for the reasons: status
        code and plugin, and the diagnosis's plugins (with no reasons), ``rejected`` and
        ``feasible``, from :mod:`engine.framework.rejecting`. None where that cannot
        tell (a filter that reads other nodes applies) or the code is unresolvable
        (nothing will preempt: the caller would complete it at once)."""
        if self.conditional and self.cluster_wide(pod, state):
            return None
        counts = self._rejecting.counts(cycle, pod, state)
        plugins = tuple(f.name for i, f in enumerate(self.filters) if counts[i])
        if plugins and all(getattr(self.plugins[n], "unresolvable", False) for n in plugins):
            return None
        diagnosis = Diagnosis(
            nodes=len(state.index),
            feasible=int(counts[self._rejecting.passed]),
            plugins={name: {} for name in plugins},
            rejected={f.name: int(counts[i]) for i, f in enumerate(self.filters) if counts[i]},
        )
        status = Status(Code.UNSCHEDULABLE, ("",), ",".join(plugins))
        diagnosis.status = status
        return Attempt(-1, status, diagnosis=diagnosis, brief=True)

    def sole_fit(self, pod: PodInfo, state: ClusterState, changed: list[int]) -> int | None:
        """The slot :meth:`schedule` would choose for ``pod``, where its filters rejected
        every node (its pre-filters passing) before the slots ``changed`` changed (or a
        superset): a preemptor's attempt after its victims are evicted. Every filter
        that applies being local, only changed slots can pass now; where exactly one
        does, it is the choice whatever the scores; none: -1. None where that cannot
        tell (a rule that reads other nodes applies, a pre-filter refuses now, several
        changed slots pass, sampling, or a pre-score, reserve or permit plugin could
        act): the caller schedules in full."""
        if (
            not self.incremental
            or self.pre_scores
            or self.reserves
            or self.permits
            or self.profile.percentage_of_nodes_to_score is not None
            or (self.conditional and self.cluster_wide(pod, state))
        ):
            return None
        cycle = CycleState()
        if not self.run_pre_filters(cycle, pod, state).ok:
            return None
        static = self._static_mask(cycle, pod, state)
        found = -1
        for slot in sorted(set(changed)):
            if self._fits_locally(cycle, pod, state, static, slot):
                if found >= 0:
                    return None
                found = slot
        return found

    def _fits_locally(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, static: Bools, slot: int
    ) -> bool:
        """Whether ``slot`` passes the static verdict ``static`` and every dynamic
        filter (all local), looking at that node alone."""
        if not static[slot]:
            return False
        filters = self.dynamic_filters
        if self._scalar:
            return all(f.filter_one(pod, state, slot) for f in filters)  # type: ignore[attr-defined]
        view = state.view(np.array([slot], dtype=np.int64))
        return all(bool(f.filter(cycle, pod, view)[0]) for f in filters)

    def complete(self, pod: PodInfo, state: ClusterState) -> Attempt:
        """The full failed attempt of ``pod`` (as :meth:`schedule` without ``brief``
        gives it) on ``state``, which must be as it was at the brief attempt."""
        cycle = CycleState()
        status = self.run_pre_filters(cycle, pod, state)
        if not status.ok:
            return Attempt(-1, status, diagnosis=Diagnosis(nodes=len(state.index), status=status))
        return self._failure(cycle, pod, state, None, None)

    def _derived_count(self, shape: _ShapeEntry) -> None:
        """Keep at most ``DERIVED_TOTAL`` derived score arrays over all shapes (the
        shapes least recently given one lose theirs first)."""
        order = self._derived_order
        order[id(shape)] = shape
        order.move_to_end(id(shape))
        total = sum(len(s.derived) for s in order.values())
        while total > DERIVED_TOTAL and len(order) > 1:
            _, oldest = order.popitem(last=False)
            total -= len(oldest.derived)
            oldest.derived.clear()

    def _derived(self, shape: _ShapeEntry, mask: Bools) -> Ints:
        """``where(mask, shape.masked, -1)``, kept per shape (see
        :class:`engine.framework.best.MaskedScores`)."""
        assert shape.masked is not None
        derived = shape.derived.get(id(mask))
        if derived is None or derived.slots is None:
            if derived is None and len(shape.derived) >= DERIVED:
                shape.derived.clear()
            derived = shape.derived[id(mask)] = MaskedScores(mask, shape.masked)
            self._derived_count(shape)
        else:
            derived.sync(shape.masked, shape.feasible)
        return derived.masked

    def _masked_scores(self, shape: _ShapeEntry, mask: Bools) -> MaskedScores | None:
        """The shape's scores under ``mask`` (and its verdict under it), up to date;
        None where the shape's scores are not (never taken, or slots left to score)."""
        if shape.masked is None or shape.pending is not None or shape.pending_slots is not None:
            return None
        self._derived(shape, mask)
        return shape.derived[id(mask)]

    @staticmethod
    def _select(
        masked: Ints,
        shape: _ShapeEntry | None,
        used: int,
        tiebreak: int,
        derived_mask: Bools | None = None,
    ) -> int:
        """:func:`select`; through a best-node index when ``masked`` is the shape's own
        cached scores, or those under a shared mask (nothing pod-specific on top: no
        extender, no sample, no score that reads other nodes) on a large shard."""
        if shape is None or used < Limits.min_nodes:
            return select(masked, used, tiebreak)
        if masked is shape.masked:
            index = shape.best
            if index is None or index.scores is not masked:
                index = shape.best = BestIndex(masked)
            return index.select(used, tiebreak)
        derived = shape.derived.get(id(derived_mask)) if derived_mask is not None else None
        if derived is not None and masked is derived.masked:
            return derived.index().select(used, tiebreak)
        return select(masked, used, tiebreak)

    def _sampled(self, feasible: Bools, pod: PodInfo, state: ClusterState, asked: bool) -> Bools:
        """The feasible nodes kube-scheduler would score under the profile's
        ``percentageOfNodesToScore`` (all of them when unset): see
        :mod:`engine.framework.sample`. ``asked``: extenders judge the pod."""
        percentage = self.profile.percentage_of_nodes_to_score
        if percentage is None:
            return feasible
        find = nodes_to_find(percentage, len(state.index))
        if not self.scores and not asked:
            find = 1  # nothing to compare: kube-scheduler stops at the first
        return sample(feasible, state, find, pod.tiebreak)

    def _choose_cards(self, pod: PodInfo, state: ClusterState, slot: int) -> tuple[int, ...] | None:
        if pod.gpu is None:
            return None
        for plugin in self._card_choosers:
            devices = plugin.choose_cards(pod, state, slot)
            if devices is not None:
                return devices
        return None

    def schedule_among(self, pod: PodInfo, state: ClusterState, feasible: Bools) -> int:
        """The slot the profile's scores choose for ``pod`` among ``feasible`` (the
        filters already passed there), or -1 when a pre-score refuses it."""
        cycle = CycleState()
        for pre in self.pre_scores:
            if not pre.pre_score(cycle, pod, state, feasible).ok:
                return -1
        masked, _ = self.score(cycle, pod, state, feasible)
        slot = select(masked, state.high_water, pod.tiebreak)
        return slot if masked[slot] >= 0 else -1

    @staticmethod
    def _top(state: ClusterState, masked: Ints, keep: dict[str, Ints]) -> list[NodeScore]:
        order = np.lexsort((np.arange(masked.shape[0]), -masked))
        out = []
        for slot in order[:TOP_NODES]:
            if masked[slot] < 0:
                break
            out.append(
                NodeScore(
                    node=state.names[slot] or "?",
                    total=int(masked[slot]),
                    plugins={name: int(arr[slot]) for name, arr in keep.items()},
                )
            )
        return out


def verdict_unresolvable(verdict: Verdict | None) -> bool:
    return verdict is not None and verdict.unresolvable
