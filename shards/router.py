"""The router and the coordinator: one pure fold of the control partition.

With N shards the log has N + 1 partitions: partition ``i`` belongs to shard ``i`` and
partition N is the *control* partition. Ingest (and the cluster's own voice: pods that
finished, nodes lost) appends there; shards only ever read their own partition. The
control fold below turns each control record into *outputs*: records for shard
partitions (the input forwarded to the shard that owns it, reservation requests and
their commits and aborts) and records for the control partition itself (what the
coordinator decides about gangs it holds). The shards' answers (hand-backs, capacity
summaries, reservation replies, outcomes) come back into the control partition as
*relayed* copies (see :mod:`shards.control`), so the fold sees them in a recorded order.

The outputs of record ``k`` depend only on records ``0..k``: that is what lets a
restarted router fold the partition again and append only what is missing (see
:class:`shards.control.ControlWorker`), and lets ``replay --verify`` check it.

**Routing.** A node belongs to a pool: its ``shoal.io/pool`` label, else the first
matching rule of the configuration; a node in no pool is spread by a stable hash of
its name. A pool belongs to the shard the configuration names, else to the shards in
turn by first appearance. A pod goes to the shards its constraints allow (a pinned
node, a ``shoal.io/pool`` selector or affinity, its tenant's pools); among them, to the
one with the most free capacity by the shards' last summaries less what was routed
since. A shard that cannot place it hands it back with the reason; the router tries the
next shard, and once every allowed shard has answered it gives it to the first one as
*final*: that shard keeps it pending, with every shard's answer as the reason.

**Gangs.** A gang goes whole to one shard like a pod. If every shard hands it back, the
coordinator places it across shards with two-phase reservation:

1. *prepare*: split the gang over the fewest shards that (by their summaries) can hold
   it, most free first, and send each part as ``ReservationRequested``;
2. every part granted: ``ReservationCommitted`` to each; any part denied, released or
   not answered within the reservation time-out: ``ReservationAborted`` to the others;
   the gang waits (back-off) and is planned again while its own time-out allows.

**Why no two gangs deadlock.** A shard answers a prepare at once and never waits for
capacity while holding some (see :mod:`engine.reservations`): there is no hold-and-wait,
so no cycle of gangs waiting on each other can form. What remains is livelock (two gangs
each denied because the other holds), which a global order removes: the coordinator
prepares one gang at a time, by priority then arrival, and a gang's next attempt waits
until every part of its previous one is closed. Serialising only concerns gangs too big
for one shard; everything else is placed by the shards concurrently.

**Dependencies** across shards: the router forwards an outcome (succeeded, failed,
a gang's final phase) to every shard that holds a unit depending on it.

**Quotas**: each shard enforces a slice of every ``ElasticQuota``, ``min`` and ``max``
split in proportion to the shard's allocatable capacity, so that the namespace's total
never exceeds its max. A slice is re-cut when the shards' capacity changed before the
namespace's next pod is routed. Borrowing therefore happens within a shard's slice.
"""

from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Final

import msgspec

from engine.model.groups import (
    FAILED,
    PENDING,
    SCHEDULED,
    SUCCEEDED,
    NextRuns,
    claim_next_run,
    hold_for_next_run,
    next_run_reason,
)
from engine.model.pools import POOL_LABEL, Sharding
from events.types import (
    SECOND,
    ClockTicked,
    Envelope,
    Event,
    GroupSpec,
    NodeAdded,
    NodeRemoved,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    NodeSpec,
    NodeUpdated,
    Placement,
    PodAdopted,
    PodBound,
    PodDeleted,
    PodEvicted,
    PodFailed,
    PodGroupStatusChanged,
    PodGroupSubmitted,
    PodHandedBack,
    PodPreempted,
    PodRecalled,
    PodRejected,
    PodRouted,
    PodSpec,
    PodSubmitted,
    PodSucceeded,
    PodUnschedulable,
    PoolHandedOver,
    PoolReassigned,
    PoolReleased,
    QuotaDefined,
    QuotaSpec,
    ReservationAborted,
    ReservationCommitted,
    ReservationDenied,
    ReservationGranted,
    ReservationReleased,
    ReservationRequested,
    SchedulerConfigured,
    ShardSummary,
    SnapshotTaken,
)

ROUTER: Final = "router"
RELAY: Final = "relay"
PREPARING: Final = "preparing"
COMMITTED: Final = "committed"
ABORTING: Final = "aborting"
COORDINATOR: Final = -1
"""``shard`` of the decisions the coordinator makes about gangs it holds."""

Output = tuple[int, Event]
"""(partition, event) for the worker to append, caused by the record just folded."""


@dataclass(slots=True)
class _Shard:
    alloc: dict[str, int] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=dict)
    largest: dict[str, int] = field(default_factory=dict)
    seen: int = -1
    routed: deque[tuple[int, dict[str, int]]] = field(default_factory=deque)
    inflight: dict[str, int] = field(default_factory=dict)
    """Requests routed here after its last summary (``seen``): not yet in ``used``."""
    summarized: bool = False
    nodes: int = 0
    """Nodes the shard had folded at its last summary."""

    def free(self, resource: str) -> int:
        return (
            self.alloc.get(resource, 0)
            - self.used.get(resource, 0)
            - self.inflight.get(resource, 0)
        )

    def charge(self, offset: int, request: dict[str, int]) -> None:
        self.routed.append((offset, request))
        inflight = self.inflight
        for name, amount in request.items():
            inflight[name] = inflight.get(name, 0) + amount

    def summary(self, event: ShardSummary) -> None:
        self.used = dict(event.used)
        self.largest = dict(event.largest)
        self.seen = event.seen
        self.nodes = event.nodes
        self.summarized = True
        routed = self.routed
        inflight = self.inflight
        while routed and routed[0][0] <= event.seen:
            _, request = routed.popleft()
            for name, amount in request.items():
                inflight[name] -= amount


@dataclass(slots=True)
class _Gang:
    key: str
    seq: int
    spec: GroupSpec | None = None
    created_at: int = 0
    members: dict[str, None] = field(default_factory=dict)
    shard: int | None = None
    """Where it was given whole; None while unassigned or held by the coordinator."""
    tried: dict[int, str] = field(default_factory=dict)
    spanning: bool = False
    phase: str = PENDING
    reason: str = ""
    attempts: int = 0
    rid: str = ""
    parts: dict[int, tuple[str, ...]] = field(default_factory=dict)
    open_parts: dict[int, None] = field(default_factory=dict)
    """Shards whose part of the current or last attempt is not closed yet."""
    granted: dict[int, None] = field(default_factory=dict)
    stage: str = ""
    """Of the current attempt: preparing, committed, aborting; empty: none open."""
    prepared_at: int = 0
    retry_at: int = 0
    retry_after: int = -1
    """Retry only once a summary newer than this one (a count) has arrived."""
    succeeded: int = 0
    failed: int = 0
    reported: tuple[str, int, str] | None = None

    @property
    def priority(self) -> int:
        return self.spec.priority if self.spec is not None else 0


def _relay_source(producer: str, shards: int) -> int | None:
    """The shard partition a relayed copy came from (None: not a valid relay)."""
    text = producer.removeprefix(f"{RELAY}-")
    if text == producer or not text.isdigit():
        return None
    source = int(text)
    return source if source < shards else None


def _request(spec: PodSpec) -> dict[str, int]:
    request = {name: amount for name, amount in spec.requests.items() if amount > 0}
    request["pods"] = request.get("pods", 0) + 1
    return request


class Control:
    """Router and coordinator state; ``apply`` one control record, get its outputs."""

    def __init__(self, sharding: Sharding) -> None:
        self.sharding = sharding
        self.n = sharding.shards
        self.control = sharding.shards
        """The control partition's number."""
        self.now = 0
        self.shards = [_Shard() for _ in range(self.n)]
        self._all = list(range(self.n))
        self.pool_shard: dict[str, int] = dict(sharding.pools)
        self._pools_seen = 0
        self._exclusive = frozenset(p for _, pools in sharding.tenants for p in pools)
        self.pool_of_name: dict[str, str] = {}
        self.node_specs: dict[str, NodeSpec] = {}
        self.moving: dict[str, tuple[str, ...]] = {}
        """Pools handed over by their old owner and not yet taken over: their nodes."""
        self.node_shard: dict[str, int] = {}
        self.node_alloc: dict[str, dict[str, int]] = {}
        self.pods: dict[str, PodSpec] = {}
        """Pods routed and not finished."""
        self.pod_shard: dict[str, int] = {}
        self.tried: dict[str, dict[int, str]] = {}
        self.resolvable: dict[str, dict[int, None]] = {}
        """Pod or gang → shards that refused it only for want of free capacity now."""
        self.kept: dict[str, int] = {}
        """Pods every shard refused → the shard keeping them (pending there); recalled
        when another shard reports room for them."""
        self.recall_after: dict[str, tuple[int, int]] = {}
        """Pod → (the time before which it is not recalled again, the back-off that
        follows): each recall of a pod waits twice as long as the one before, up to
        ``max_retry_backoff``, so that a pod the roomy shard still cannot place (its
        room is an estimate) does not go back and forth on every summary."""
        self.gangs: dict[str, _Gang] = {}
        self.spanning: dict[str, _Gang] = {}
        """Gangs placed (or to be placed) across shards by the coordinator."""
        self.outcomes: dict[str, str] = {}
        self.finished_uids: dict[str, str] = {}
        """Finished pods → the uid of the pod that finished under that name: a pod of
        the same name and another uid is another pod (``Engine.reincarnated``)."""
        self.next_runs: NextRuns = {}
        """Gangs whose name a PodGroup of another uid claimed while pods of theirs were
        live → that PodGroup and the pods that came for it: routed once the gang is over
        (``Engine.next_runs``), so that no shard sees them before."""
        self.dependents: dict[str, dict[int, None]] = {}
        """Pod or gang → shards holding units that depend on it."""
        self.quotas: dict[str, QuotaSpec] = {}
        self.quota_slices: dict[str, list[QuotaSpec]] = {}
        self._capacity_changed = False
        self._selector_shards: dict[tuple[tuple[str, str], ...], list[int]] = {}
        """A node selector → the shards with a node it matches (cleared whenever a node
        comes, goes, moves or changes labels)."""
        self.config: SchedulerConfigured | None = None
        self.relayed = [-1] * self.n
        """Per shard partition: the offset of the last record relayed into control."""
        self.inflight: str = ""
        """The spanning gang being prepared or aborted (one at a time), or empty."""
        self.summaries = 0
        """Summaries folded so far: a failed gang is retried only after a new one."""
        self.counters = {
            "prepared": 0,
            "committed": 0,
            "aborted": 0,
            "handbacks": 0,
            "recalls": 0,
        }
        self._seq = 0
        self._out: list[Output] = []

    def __repr__(self) -> str:
        return f"Control(shards={self.n}, pods={len(self.pods)}, gangs={len(self.gangs)})"

    # ------------------------------------------------------------------ fold

    def apply(self, env: Envelope) -> list[Output]:
        """Fold one control record; return what it causes."""
        if isinstance(env.event, SnapshotTaken):
            return []  # the coordinator's saved state: folding it changes nothing
        self.now = max(self.now, env.time)
        if env.producer == ROUTER:
            return []  # its own decisions: already applied when made
        out = self._out = []
        event = env.event
        if env.stream == RELAY:
            source = _relay_source(env.producer, self.n)
            if source is None or env.causation <= self.relayed[source]:
                return out  # not a copy this router made (or one it has seen)
            self.relayed[source] = env.causation
            self._report(event, source, env.offset)
        else:
            self._input(event, env.offset)
        if self.next_runs:
            self._start_next_runs(env.offset)
        self._drive()
        return out

    def _start_next_runs(self, offset: int) -> None:
        """Route the runs waiting for gangs that are over now: a fresh gang under the
        waiting PodGroup, with the pods that came for it, in their order."""
        for key in sorted(self.next_runs):
            gang = self.gangs.get(key)
            if gang is not None and not self._gang_over(gang):
                continue
            spec, waiting = self.next_runs.pop(key)
            if gang is not None:
                self._renew_gang(gang)
            self._group_submitted(spec, offset)
            for pod in waiting:
                self._submitted(pod, offset)

    def _send(self, shard: int, event: Event) -> None:
        self._out.append((shard, event))

    def _decide(self, event: Event) -> None:
        self._out.append((self.control, event))

    def _input(self, event: Event, offset: int) -> None:
        match event:
            case PodSubmitted(pod=spec):
                self._submitted(spec, offset)
            case PodGroupSubmitted(group=spec):
                self._group_submitted(spec, offset)
            case NodeAdded(node=spec) | NodeUpdated(node=spec):
                self._node(spec, isinstance(event, NodeAdded))
            case NodeRemoved(name=name):
                self._selector_shards.clear()
                self.pool_of_name.pop(name, None)
                self.node_specs.pop(name, None)
                shard = self.node_shard.pop(name, None)
                if shard is not None:
                    self._uncount(name, shard)
                    self._send(shard, event)
            case PodSucceeded(pod=key) | PodFailed(pod=key) | PodDeleted(pod=key):
                self._finished(key, event)
            case PodBound():
                self._observed_bound(event)
            case QuotaDefined(quota=quota):
                self.quotas[quota.namespace] = quota
                self._slice_quotas()
            case PoolReassigned(pool=pool, shard=shard):
                self._reassign(pool, shard)
            case SchedulerConfigured():
                self.config = event
                for shard in range(self.n):
                    self._send(shard, event)
            case ClockTicked():
                pass
            case _:
                pass

    # ------------------------------------------------------------------ nodes

    def pool_of(self, spec: NodeSpec) -> str:
        pool = spec.labels.get(POOL_LABEL)
        if pool:
            return pool
        for rule in self.sharding.rules:
            if all(spec.labels.get(k) == v for k, v in rule.match):
                return rule.pool
        return ""

    def shard_of_pool(self, pool: str) -> int:
        shard = self.pool_shard.get(pool)
        if shard is None:
            shard = self.pool_shard[pool] = self._pools_seen % self.n
            self._pools_seen += 1
        return shard

    def _node(self, spec: NodeSpec, added: bool) -> None:
        pool = self.pool_of(spec)
        if pool:
            shard = self.shard_of_pool(pool)
            if spec.labels.get(POOL_LABEL) != pool:
                spec = NodeSpec(
                    name=spec.name,
                    allocatable=spec.allocatable,
                    labels={**spec.labels, POOL_LABEL: pool},
                    taints=spec.taints,
                    unschedulable=spec.unschedulable,
                )
        else:
            shard = zlib.crc32(spec.name.encode()) % self.n
        old = self.node_shard.get(spec.name)
        before = self.node_specs.get(spec.name)
        if old != shard or before is None or before.labels != spec.labels:
            self._selector_shards.clear()
        if old is not None and old != shard:
            # moved to another pool: the old owner loses it, the new one gains it
            self._uncount(spec.name, old)
            self._send(old, NodeRemoved(name=spec.name))
            added = True
        elif old is not None:
            self._uncount(spec.name, old)
        self.pool_of_name[spec.name] = pool
        self.node_specs[spec.name] = spec
        self._count(spec, shard)
        self._send(shard, NodeAdded(node=spec) if added else NodeUpdated(node=spec))

    def _reassign(self, pool: str, shard: int) -> None:
        """Move a pool: the old owner hands its nodes over (with what runs there), then
        the new owner takes them (:meth:`_take_over`). New work for the pool goes to the
        new owner at once."""
        if not 0 <= shard < self.n:
            return  # ingest validates; a record naming no shard changes nothing
        old = self.pool_shard.get(pool)
        self.pool_shard[pool] = shard
        if old is None or old == shard:
            return
        nodes = tuple(sorted(n for n, p in self.pool_of_name.items() if p == pool))
        for name in nodes:
            self._uncount(name, old)
            del self.node_shard[name]
        self.moving[pool] = nodes
        self._send(old, PoolReleased(pool=pool, nodes=nodes, to=shard))

    def _take_over(self, event: PoolHandedOver) -> None:
        nodes = self.moving.pop(event.pool, None)
        if nodes is None:
            return
        shard = event.to
        self._selector_shards.clear()
        for name in nodes:
            spec = self.node_specs.get(name)
            if spec is None:
                continue
            self._count(spec, shard)
            self._send(shard, NodeAdded(node=spec))
        for placement in event.placements:
            key = placement.pod.key
            if key in self.pods:
                self.pod_shard[key] = shard
            self._send(shard, PodAdopted(placement=placement))

    def _count(self, spec: NodeSpec, shard: int) -> None:
        """``spec`` belongs to ``shard`` from now on: its capacity counts there."""
        self.node_shard[spec.name] = shard
        self.node_alloc[spec.name] = dict(spec.allocatable)
        alloc = self.shards[shard].alloc
        for resource, amount in spec.allocatable.items():
            alloc[resource] = alloc.get(resource, 0) + amount
        self._capacity_changed = True

    def _uncount(self, name: str, shard: int) -> None:
        alloc = self.shards[shard].alloc
        for resource, amount in self.node_alloc.pop(name, {}).items():
            alloc[resource] = alloc.get(resource, 0) - amount
        self._capacity_changed = True

    # ------------------------------------------------------------------ quotas

    def _slice_quotas(self) -> None:
        """Slice every quota again (a quota's ``min`` is packed around the others'), and
        tell each shard the slices that changed."""
        for name, slices in self._slices().items():
            if slices != self.quota_slices.get(name):
                self.quota_slices[name] = slices
                for shard, piece in enumerate(slices):
                    self._send(shard, QuotaDefined(quota=piece))

    def _slices(self) -> dict[str, list[QuotaSpec]]:
        """Each quota cut into one slice per shard; the slices add up to the quota.

        A guarantee split over shards guarantees nothing to a gang: each shard reclaims
        only within its slice, so a gang needing the whole ``min`` could not get it back
        anywhere. So each quota's ``min`` is *packed*: quotas in order of their largest
        share of the cluster's capacity (then name), each into the shards with the most
        capacity its earlier neighbours left, as whole as fits, the rest proportionally
        (when the ``min``s add up to more than there is). ``max - min`` is spread over
        the shards in proportion to their capacity, on top of each shard's ``min``."""
        left = {r: [s.alloc.get(r, 0) for s in self.shards] for s in self.shards for r in s.alloc}

        def share(quota: QuotaSpec) -> tuple[float, str]:
            fractions = [amount / max(sum(left.get(r, ())), 1) for r, amount in quota.min.items()]
            return (-max(fractions, default=0.0), quota.namespace)

        out: dict[str, list[QuotaSpec]] = {}
        for quota in sorted(self.quotas.values(), key=share):
            mins = self._pack(quota.min, left)
            maxes: dict[str, list[int]] = {}
            for resource, total in quota.max.items():
                base = mins.get(resource, [0] * self.n)
                extra = self._split(resource, max(total - sum(base), 0))
                maxes[resource] = [b + e for b, e in zip(base, extra, strict=True)]
            out[quota.namespace] = [
                QuotaSpec(
                    namespace=quota.namespace,
                    name=quota.name,
                    min={r: parts[shard] for r, parts in mins.items()},
                    max={r: parts[shard] for r, parts in maxes.items()},
                )
                for shard in range(self.n)
            ]
        return out

    def _pack(self, amounts: dict[str, int], left: dict[str, list[int]]) -> dict[str, list[int]]:
        """``amounts`` over the shards, whole where they fit: shards in order of how much
        of the request their capacity ``left`` holds (then index); ``left`` is used up."""
        n = self.n

        def room(shard: int) -> float:
            return min(
                (left.get(r, [0] * n)[shard] / a for r, a in amounts.items() if a > 0),
                default=0.0,
            )

        order = sorted(range(n), key=lambda shard: (-room(shard), shard))
        out: dict[str, list[int]] = {}
        for resource, total in amounts.items():
            parts = [0] * n
            free = left.setdefault(resource, [0] * n)
            need = total
            for shard in order:
                take = min(need, max(free[shard], 0))
                parts[shard] += take
                free[shard] -= take
                need -= take
            if need > 0:  # more guaranteed than there is: the rest by capacity
                for shard, amount in enumerate(self._split(resource, need)):
                    parts[shard] += amount
            out[resource] = parts
        return out

    def _split(self, resource: str, total: int) -> list[int]:
        """``total`` in proportion to each shard's allocatable ``resource``; the
        remainder to the largest shares (lowest shard first on ties)."""
        weights = [s.alloc.get(resource, 0) for s in self.shards]
        whole = sum(weights)
        if whole <= 0:
            weights, whole = [1] * self.n, self.n
        parts = [total * w // whole for w in weights]
        left = total - sum(parts)
        for shard in sorted(range(self.n), key=lambda i: (-weights[i], i))[:left]:
            parts[shard] += 1
        return parts

    def _reslice(self, namespace: str) -> None:
        """Before routing a pod of ``namespace``: slice again if capacity changed, or if
        its quota was defined before any capacity was known."""
        if self._capacity_changed:
            self._capacity_changed = False
            if self.quotas:
                self._slice_quotas()
        elif namespace in self.quotas and namespace not in self.quota_slices:
            self._slice_quotas()

    # ------------------------------------------------------------------ pods

    def _tenant_pools(self, namespace: str) -> tuple[str, ...] | None:
        for owner, pools in self.sharding.tenants:
            if owner == namespace:
                return pools
        return None

    def allowed(self, spec: PodSpec) -> list[int]:
        """Shards the pod's constraints allow, in shard order."""
        shards = self._allowed_pools(spec)
        if spec.node_selector and not spec.node_name:
            matching = self._matching(spec.node_selector)
            narrowed = [s for s in shards if s in matching]
            # no shard has a matching node: every allowed shard will say why
            return narrowed or shards
        return shards

    def _matching(self, selector: dict[str, str]) -> list[int]:
        """The shards with at least one node whose labels ``selector`` matches."""
        key = tuple(sorted(selector.items()))
        found = self._selector_shards.get(key)
        if found is None:
            shards: set[int] = set()
            for name, spec in self.node_specs.items():
                shard = self.node_shard.get(name)
                if shard is not None and shard not in shards:
                    labels = spec.labels
                    if all(labels.get(k) == v for k, v in key):
                        shards.add(shard)
            found = self._selector_shards[key] = sorted(shards)
        return found

    def _allowed_pools(self, spec: PodSpec) -> list[int]:
        """Shards the pod's pool constraints (and its tenant's pools) allow."""
        if (
            not spec.node_name
            and not self._exclusive
            and not spec.required_affinity
            and POOL_LABEL not in spec.node_selector
        ):
            return self._all  # the common case, kept cheap
        if spec.node_name:
            shard = self.node_shard.get(spec.node_name)
            return [shard] if shard is not None else list(range(self.n))
        pools: set[str] | None = None
        wanted = spec.node_selector.get(POOL_LABEL)
        if wanted is not None:
            pools = {wanted}
        terms = spec.required_affinity or ()
        if terms and all(
            any(r.key == POOL_LABEL and r.operator == "In" for r in t.match_expressions)
            for t in terms
        ):
            named = {
                v
                for t in terms
                for r in t.match_expressions
                if r.key == POOL_LABEL and r.operator == "In"
                for v in r.values
            }
            pools = named if pools is None else pools & named
        owned = self._tenant_pools(spec.namespace)
        if owned is not None:
            pools = set(owned) if pools is None else pools & set(owned)
        if pools is None:
            return self._open_shards
        return sorted({self.shard_of_pool(p) for p in sorted(pools)}) or list(range(self.n))

    @property
    def _open_shards(self) -> list[int]:
        """Shards a pod without pool constraints may go to: all but those that own only
        tenants' exclusive pools (nodes spread by hash keep every shard open)."""
        if not self._exclusive:
            return list(range(self.n))
        if self.node_shard and any(not self.pool_of_name.get(n) for n in self.node_shard):
            return list(range(self.n))
        shared = {s for p, s in self.pool_shard.items() if p not in self._exclusive}
        return sorted(shared) or list(range(self.n))

    def fenced(self, spec: PodSpec) -> PodSpec:
        """``spec`` held to its tenant's pools, or kept off every tenant's pools."""
        if not self._exclusive:
            return spec
        owned = self._tenant_pools(spec.namespace)
        if owned is not None:
            requirement = NodeSelectorRequirement(key=POOL_LABEL, operator="In", values=owned)
        else:
            requirement = NodeSelectorRequirement(
                key=POOL_LABEL, operator="NotIn", values=tuple(sorted(self._exclusive))
            )
        terms = spec.required_affinity or (NodeSelectorTerm(),)
        fenced_terms = tuple(
            msgspec.structs.replace(t, match_expressions=(*t.match_expressions, requirement))
            for t in terms
        )
        return msgspec.structs.replace(spec, required_affinity=fenced_terms)

    def _score(self, shard: int, request: dict[str, int]) -> tuple[bool, float]:
        """(fits by the estimate, the smallest free fraction among requested resources)."""
        state = self.shards[shard]
        alloc_of, used_of, inflight_of = state.alloc.get, state.used.get, state.inflight.get
        largest_of = state.largest.get if state.summarized else None
        fits = True
        worst = 1.0
        for name, amount in request.items():  # hot: once per pod and shard
            alloc = alloc_of(name, 0)
            free = alloc - used_of(name, 0) - inflight_of(name, 0)
            if free < amount or (largest_of is not None and largest_of(name, 0) < amount):
                fits = False
            if alloc <= 0:
                worst = 0.0
            elif free < worst * alloc:
                worst = free / alloc
        return fits, worst

    def choose(self, candidates: list[int], request: dict[str, int]) -> int:
        """The candidate that fits with the most room; if none fits, the roomiest (the
        first of equals)."""
        best = candidates[0]
        best_fits = False
        best_worst = -2.0
        score = self._score
        for shard in candidates:
            fits, worst = score(shard, request)
            if fits > best_fits or (fits == best_fits and worst > best_worst):
                best, best_fits, best_worst = shard, fits, worst
        return best

    def _submitted(self, spec: PodSpec, offset: int) -> None:
        key = spec.key
        if key in self.pods or (key in self.outcomes and not self._another_pod(spec)):
            return
        held = hold_for_next_run(self.next_runs, spec)
        if held is not None:  # for the gang's next run, once this one is over
            if held:
                reason = next_run_reason(spec.group)
                self._decide(PodUnschedulable(pod=key, attempt=0, reason=reason, shard=COORDINATOR))
            return
        if key in self.outcomes:
            del self.outcomes[key]  # another pod under the name: the outcome was the other's
            self.finished_uids.pop(key, None)
        over = self.gangs.get(spec.group) if spec.group else None
        if over is not None and self._gang_over(over):
            self._renew_gang(over)  # before this pod counts as live
        self.pods[key] = spec
        if spec.group:
            gang = self._gang(spec.group)
            gang.members[key] = None
            if gang.spanning:
                if gang.phase == SCHEDULED and gang.parts:
                    # beyond the committed parts: an extra member, kept by the first part
                    self._route(spec, offset, [min(gang.parts)], final=True)
                return
            if gang.shard is not None:
                self._route(spec, offset, [gang.shard], final=False)
                return
            self._assign_gang(gang, offset)
            return
        self._route(spec, offset, self.allowed(spec))

    def _another_pod(self, spec: PodSpec) -> bool:
        """A pod named like one that finished, with another uid: another pod (the rule
        of ``Engine.another_pod``)."""
        return bool(spec.uid) and self.finished_uids.get(spec.key) != spec.uid

    def _route(
        self,
        spec: PodSpec,
        offset: int,
        candidates: list[int],
        *,
        final: bool | None = None,
        answers: tuple[str, ...] = (),
    ) -> None:
        key = spec.key
        tried = self.tried.get(key)
        if tried:
            untried = [s for s in candidates if s not in tried]
            left = untried or candidates
        else:
            untried = left = candidates  # a pod's first hop: the common case
        request = _request(spec)
        shard = self.choose(left, request)
        if final is None:
            final = len(untried) <= 1
        self._reslice(spec.namespace)
        self.pod_shard[key] = shard
        self.shards[shard].charge(offset, request)
        for dep in spec.depends_on:
            self._depend(dep, shard)
        self._send(
            shard,
            PodRouted(
                pod=self.fenced(spec), hops=len(tried) if tried else 0, final=final, answers=answers
            ),
        )

    def _depend(self, dep: str, shard: int) -> None:
        self.dependents.setdefault(dep, {})[shard] = None
        outcome = self.outcomes.get(dep)
        if outcome is not None:
            self._tell_outcome(dep, outcome, only=shard)

    def _tell_outcome(self, key: str, outcome: str, *, only: int | None = None) -> None:
        shards = [only] if only is not None else list(self.dependents.get(key, {}))
        for shard in shards:
            if key in self.gangs:
                event: Event = PodGroupStatusChanged(group=key, phase=outcome, shard=COORDINATOR)
            elif outcome == SUCCEEDED:
                event = PodSucceeded(pod=key)
            else:
                event = PodFailed(pod=key, reason="failed on another shard")
            self._send(shard, event)

    def _observed_bound(self, event: PodBound) -> None:
        """A binding seen in the cluster (ours, or another scheduler's): the shard that
        owns the node accounts for it. A single pod routed to another shard moves there:
        the shard it was routed to forgets it, the owner adopts it as it is. (A gang
        member stays with its gang's shard, which accounts for it as one shard does.)"""
        key = event.pod
        spec = self.pods.get(key)
        if spec is None:
            return
        routed = self.pod_shard.get(key)
        owner = self.node_shard.get(event.node)
        if owner is None or owner == routed or spec.group:
            if routed is not None:
                self._send(routed, event)
            return
        if routed is not None:
            self._send(routed, PodDeleted(pod=key))
        self.pod_shard[key] = owner
        self.tried.pop(key, None)
        self._send(
            owner,
            PodAdopted(
                placement=Placement(pod=spec, node=event.node, decision_id=event.decision_id)
            ),
        )

    def _finished(self, key: str, event: Event) -> None:
        shard = self.pod_shard.pop(key, None)
        spec = self.pods.pop(key, None)
        self.tried.pop(key, None)
        self.kept.pop(key, None)
        self.recall_after.pop(key, None)
        self.resolvable.pop(key, None)
        if shard is not None:
            self._send(shard, event)
        outcome = SUCCEEDED if isinstance(event, PodSucceeded) else FAILED
        if spec is None:
            for _, waiting in self.next_runs.values():  # gone before its run started
                waiting[:] = [p for p in waiting if p.key != key]
        self._outcome(key, outcome, spec, skip=shard)

    def _outcome(self, key: str, outcome: str, spec: PodSpec | None, skip: int | None) -> None:
        if key in self.outcomes:
            return
        self.outcomes[key] = outcome
        if spec is not None and spec.uid:
            self.finished_uids[key] = spec.uid
        for shard in self.dependents.get(key, {}):
            if shard != skip:
                self._tell_outcome(key, outcome, only=shard)
        if spec is not None and spec.group in self.gangs:
            gang = self.gangs[spec.group]
            if outcome == SUCCEEDED:
                gang.succeeded += 1
            else:
                gang.failed += 1
            if gang.spanning:
                self._spanning_member_finished(gang, outcome)

    # ------------------------------------------------------------------ reports

    def _report(self, event: Event, shard: int, offset: int) -> None:
        match event:
            case PoolHandedOver():
                self._take_over(event)
            case ShardSummary():
                self.shards[shard].summary(event)
                self.summaries += 1
                if self.kept:
                    self._recall_for(shard)
            case PodHandedBack(group="", pod=key):
                if event.resolvable:
                    self.resolvable.setdefault(key, {})[shard] = None
                self._pod_handed_back(key, shard, event.reason, offset)
            case PodHandedBack(group=key):
                if event.resolvable:
                    self.resolvable.setdefault(key, {})[shard] = None
                self._gang_handed_back(key, shard, event.reason, offset)
            case ReservationGranted() | ReservationDenied() | ReservationReleased():
                self._answer(event, shard)
            case PodRejected(pod=key) | PodPreempted(pod=key) | PodEvicted(pod=key):
                if self.pod_shard.get(key) == shard:
                    del self.pod_shard[key]
                    self._outcome(key, FAILED, self.pods.pop(key, None), skip=shard)
            case PodGroupStatusChanged(group=key, phase=phase):
                gang = self.gangs.get(key)
                if gang is not None and gang.shard == shard and phase in (SUCCEEDED, FAILED):
                    self._outcome(key, phase, None, skip=shard)
            case _:
                pass

    def _recall_for(self, shard: int) -> None:
        """``shard`` reported its room: ask the keepers of pods every shard had refused
        to hand back those that fit it by the estimate (in the order they were kept, as
        many as the room holds); each is recalled once per keeping, and not before its
        back-off has passed (see ``recall_after``)."""
        room = self.shards[shard]
        budget = {name: room.free(name) for name in room.alloc}
        largest = room.largest
        for key, keeper in list(self.kept.items()):
            if budget.get("pods", 0) < 1:
                break  # no room for another pod: nothing more can be recalled here
            spec = self.pods.get(key)
            if spec is None or self.pod_shard.get(key) != keeper:
                del self.kept[key]
                continue
            if keeper == shard:
                continue
            not_before, backoff = self.recall_after.get(key, (0, 0))
            if self.now < not_before or shard not in self.allowed(spec):
                continue
            request = _request(spec)
            if any(
                budget.get(name, 0) < amount or largest.get(name, 0) < amount
                for name, amount in request.items()
            ):
                continue
            for name, amount in request.items():
                budget[name] -= amount
            del self.kept[key]
            sharding = self.sharding
            backoff = min(max(backoff * 2, sharding.retry_backoff), sharding.max_retry_backoff)
            self.recall_after[key] = (self.now + backoff, backoff)
            self.counters["recalls"] += 1
            self._send(keeper, PodRecalled(pod=key))

    def _pod_handed_back(self, key: str, shard: int, reason: str, offset: int) -> None:
        spec = self.pods.get(key)
        if spec is None or self.pod_shard.get(key) != shard:
            return  # stale: it was routed elsewhere since
        self.counters["handbacks"] += 1
        self.kept.pop(key, None)
        tried = self.tried.setdefault(key, {})
        tried[shard] = reason
        candidates = self.allowed(spec)
        left = [s for s in candidates if s not in tried]
        answers = self._answers(tried)
        if left:
            self._route(spec, offset, candidates, answers=answers)
        else:
            self.tried[key] = {}
            keepers = self._keepers(key, candidates)
            first = self.choose(keepers, _request(spec))
            self._route(spec, offset, [first], final=True, answers=answers)
        if len(candidates) > 1 and len(left) <= 1:
            # the shard it went to keeps it (every other one refused it): recall it
            # from there when another reports room
            self.kept[key] = self.pod_shard[key]

    # ------------------------------------------------------------------ gangs

    def _gang(self, key: str) -> _Gang:
        gang = self.gangs.get(key)
        if gang is None:
            gang = self.gangs[key] = _Gang(key, seq=self._seq, created_at=self.now)
            self._seq += 1
        return gang

    def _gang_over(self, gang: _Gang) -> bool:
        """A gang a PodGroup object declared (it has a uid) that had pods, none of them
        live any more, and no reservation under way: its name may be another group's
        (the rule of ``engine.model.groups.group_is_over``)."""
        return (
            gang.spec is not None
            and bool(gang.spec.uid)
            and bool(gang.members)
            and gang.stage not in (PREPARING, ABORTING)
            and self.inflight != gang.key
            and not any(member in self.pods for member in gang.members)
        )

    def _renew_gang(self, old: _Gang) -> _Gang:
        """A fresh gang under ``old``'s name (see ``Engine.renew_group``); it counts its
        attempts on from ``old``'s, so that reservation ids stay unique."""
        key = old.key
        gang = self.gangs[key] = _Gang(key, seq=self._seq, created_at=self.now)
        self._seq += 1
        gang.attempts = old.attempts
        self.spanning.pop(key, None)
        self.outcomes.pop(key, None)
        return gang

    def _group_submitted(self, spec: GroupSpec, offset: int) -> None:
        gang = self._gang(spec.key)
        if gang.spec is not None:
            if not spec.uid or spec.uid == gang.spec.uid:
                return  # the same group told again (or one without an object)
            if not self._gang_over(gang):
                # pods of the gang's run still live (or wait): the new PodGroup, and the
                # pods that come for it, wait for that run to be over
                claim_next_run(self.next_runs, spec)
                return
            gang = self._renew_gang(gang)
        gang.spec = spec
        gang.created_at = self.now
        if gang.spanning:
            return
        if gang.shard is not None:
            self._send(gang.shard, PodGroupSubmitted(group=spec, created_at=gang.created_at))
            return
        self._assign_gang(gang, offset)

    def _gang_request(self, gang: _Gang) -> dict[str, int]:
        members = [self.pods[m] for m in gang.members if m in self.pods]
        need = gang.spec.min_member if gang.spec is not None else len(members)
        total: dict[str, int] = {}
        for spec in members[: max(need, 1)]:
            for name, amount in _request(spec).items():
                total[name] = total.get(name, 0) + amount
        return total

    def _gang_candidates(self, gang: _Gang) -> list[int]:
        members = [self.pods[m] for m in gang.members if m in self.pods]
        allowed = set(range(self.n))
        for spec in members:
            allowed &= set(self.allowed(spec))
        return sorted(allowed) or list(range(self.n))

    def _assign_gang(self, gang: _Gang, offset: int) -> None:
        allowed = self._gang_candidates(gang)
        candidates = [s for s in allowed if s not in gang.tried]
        request = self._gang_request(gang)
        final = False
        if not candidates:
            # every shard refused it now; one whose capacity could hold it keeps it (it
            # waits there as on a single shard); only a gang bigger than any shard spans
            holding = [s for s in allowed if self._could_hold(s, request)]
            if not holding:
                self._go_spanning(gang)
                return
            candidates, final = self._keepers(gang.key, holding), True
        shard = self.choose(candidates, request)
        gang.shard = shard
        if gang.spec is not None:
            self._send(shard, PodGroupSubmitted(group=gang.spec, created_at=gang.created_at))
        for member in gang.members:
            spec = self.pods.get(member)
            if spec is not None:
                self.pod_shard[member] = shard
                self.shards[shard].charge(offset, _request(spec))
                for dep in spec.depends_on:
                    self._depend(dep, shard)
                self._send(
                    shard,
                    PodRouted(
                        pod=self.fenced(spec),
                        hops=len(gang.tried),
                        final=final,
                        answers=self._answers(gang.tried) if final else (),
                    ),
                )
        if gang.spec is not None:
            for dep in gang.spec.depends_on:
                self._depend(dep, shard)

    def _keepers(self, key: str, candidates: list[int]) -> list[int]:
        """Where to keep what every shard refused: those that refused it only for want
        of free capacity (it may fit there later), else any candidate."""
        resolvable = self.resolvable.pop(key, {})
        return [s for s in candidates if s in resolvable] or candidates

    def _could_hold(self, shard: int, request: dict[str, int]) -> bool:
        """Could the shard's allocatable capacity hold ``request`` if it were free?"""
        alloc = self.shards[shard].alloc
        return all(alloc.get(name, 0) >= amount for name, amount in request.items())

    @staticmethod
    def _answers(tried: dict[int, str]) -> tuple[str, ...]:
        return tuple(f"shard {s}: {r}" for s, r in sorted(tried.items()))

    def _gang_handed_back(self, key: str, shard: int, reason: str, offset: int) -> None:
        gang = self.gangs.get(key)
        if gang is None or gang.shard != shard:
            return
        self.counters["handbacks"] += 1
        gang.tried[shard] = reason
        gang.shard = None
        for member in gang.members:
            self.pod_shard.pop(member, None)
        self._assign_gang(gang, offset)

    def _go_spanning(self, gang: _Gang) -> None:
        gang.spanning = True
        self.spanning[gang.key] = gang
        gang.shard = None
        gang.retry_at = self.now
        # the shard that handed it back summarises its capacity in the same pass, right
        # after: plan with that, not with what was charged to it before
        gang.retry_after = self.summaries
        answers = "; ".join(f"shard {s}: {r}" for s, r in sorted(gang.tried.items()))
        self._status(
            gang, PENDING, f"no single shard can hold it ({answers}); placing it across shards"
        )

    def _status(self, gang: _Gang, phase: str, reason: str) -> None:
        gang.phase, gang.reason = phase, reason
        scheduled = sum(len(p) for p in gang.parts.values()) if phase == SCHEDULED else 0
        status = (phase, scheduled, reason)
        if status != gang.reported and gang.spec is not None:
            gang.reported = status
            self._decide(
                PodGroupStatusChanged(
                    group=gang.key,
                    phase=phase,
                    scheduled=scheduled,
                    reason=reason,
                    shard=COORDINATOR,
                )
            )
        if phase == PENDING and reason:
            for member in gang.members:
                if member in self.pods:
                    self._decide(
                        PodUnschedulable(
                            pod=member, attempt=gang.attempts, reason=reason, shard=COORDINATOR
                        )
                    )

    def _drive(self) -> None:
        """Coordinator step: the prepare time-out, then the next spanning gang."""
        if not self._coordinating:
            return  # nothing to coordinate: the common case, on every record
        if self.inflight:
            gang = self.gangs[self.inflight]
            if gang.stage == PREPARING and (
                self.now >= gang.prepared_at + self.sharding.reservation_timeout
            ):
                self._abort(gang, "not every part answered within the reservation time-out")
            if gang.stage in (PREPARING, ABORTING):
                return
            self.inflight = ""
        for gang in self._spanning_in_order():
            if self._timed_out(gang) or gang.stage or not self._may_retry(gang):
                continue
            if self._prepare(gang):
                self.inflight = gang.key
                return

    def _may_retry(self, gang: _Gang) -> bool:
        return gang.retry_at <= self.now and self.summaries > gang.retry_after

    @property
    def _coordinating(self) -> bool:
        """A cross-shard gang is being prepared or aborted, or waits to be."""
        return bool(self.inflight) or (bool(self.spanning) and self._spanning_pending)

    def routes_by_capacity(self) -> bool:
        """Whether a pod without constraints (no gang, node name, selector, affinity or
        dependency) goes to the roomiest shard with nothing else for the fold to do: no
        tenant pools, no cross-shard gang being coordinated, no capacity change to slice
        quotas for first (see :mod:`shards.fastroute`)."""
        return not (self._exclusive or self._coordinating or self._capacity_changed)

    @property
    def _spanning_pending(self) -> bool:
        return any(g.spanning and g.phase == PENDING for g in self.spanning.values())

    def _spanning_in_order(self) -> list[_Gang]:
        pending = [g for g in self.spanning.values() if g.phase == PENDING]
        pending.sort(key=lambda g: (-g.priority, g.seq))
        return pending

    def _timed_out(self, gang: _Gang) -> bool:
        spec = gang.spec
        if spec is None or spec.timeout is None or self.now < gang.created_at + spec.timeout:
            return False
        if gang.stage == PREPARING:
            self._abort(gang, "the pod group timed out")
        seconds = spec.timeout / SECOND
        reason = (
            f"pod group {gang.key} timed out: fewer than {spec.min_member} members placed "
            f"within {seconds:g}s: {gang.reason}"
        )
        self._status(gang, FAILED, reason)
        for member in list(gang.members):
            if member in self.pods:
                self.pods.pop(member)
                self.outcomes[member] = FAILED
                self._decide(PodRejected(pod=member, reason=reason, shard=COORDINATOR))
        self._outcome(gang.key, FAILED, None, skip=None)
        return True

    def _prepare(self, gang: _Gang) -> bool:
        members = [m for m in gang.members if m in self.pods]
        need = gang.spec.min_member if gang.spec is not None else 0
        if gang.spec is None or len(members) < need:
            return False
        shape: dict[str, int] = {}
        for member in members:
            for name, amount in _request(self.pods[member]).items():
                shape[name] = max(shape.get(name, 0), amount)
        fits = []
        for shard in self._gang_candidates(gang):
            state = self.shards[shard]
            count = min(max(state.free(name), 0) // amount for name, amount in shape.items())
            fits.append((count, shard))
        fits.sort(key=lambda cs: (-cs[0], cs[1]))
        chosen: list[tuple[int, int]] = []
        total = 0
        for count, shard in fits:
            if total >= len(members) or count <= 0:
                break
            take = min(count, len(members) - total)
            chosen.append((shard, take))
            total += take
        gang.attempts += 1
        if total < need:
            detail = ", ".join(f"shard {s}: {c}" for c, s in sorted(fits, key=lambda cs: cs[1]))
            self._status(
                gang,
                PENDING,
                f"pod group {gang.key}: {total} of minMember {need} members fit across "
                f"shards ({detail})",
            )
            self._back_off(gang)
            return False
        gang.rid = f"{gang.key}#{gang.attempts}"
        gang.stage = PREPARING
        gang.parts = {}
        gang.granted = {}
        gang.prepared_at = self.now
        start = 0
        expires = self.now + self.sharding.reservation_timeout
        for shard, take in chosen:
            part = tuple(members[start : start + take])
            start += take
            gang.parts[shard] = part
            gang.open_parts[shard] = None
            spec = gang.spec
            part_spec = GroupSpec(
                namespace=spec.namespace,
                name=spec.name,
                min_member=len(part),
                priority=spec.priority,
                priority_class=spec.priority_class,
                queue=spec.queue,
                source=spec.source,
                uid=spec.uid,
            )
            for member in part:
                self.pod_shard[member] = shard
            self._send(
                shard,
                ReservationRequested(
                    rid=gang.rid,
                    group=part_spec,
                    pods=tuple(self.fenced(self.pods[m]) for m in part),
                    expires_at=expires,
                ),
            )
        self.counters["prepared"] += 1
        return True

    def _back_off(self, gang: _Gang) -> None:
        gang.retry_after = self.summaries
        exponent = min(gang.attempts - 1, 16)
        delay = min(self.sharding.retry_backoff * (1 << exponent), self.sharding.max_retry_backoff)
        gang.retry_at = self.now + delay

    def _answer(
        self, event: ReservationGranted | ReservationDenied | ReservationReleased, shard: int
    ) -> None:
        gang = self.gangs.get(event.group)
        if gang is None or event.rid != gang.rid or shard not in gang.open_parts:
            return
        if isinstance(event, ReservationGranted):
            if gang.stage != PREPARING:
                return
            gang.granted[shard] = None
            if len(gang.granted) == len(gang.parts):
                for part in sorted(gang.parts):
                    self._send(part, ReservationCommitted(rid=gang.rid))
                gang.stage = COMMITTED
                self.counters["committed"] += 1
                self._status(gang, SCHEDULED, "")
            return
        del gang.open_parts[shard]
        gang.granted.pop(shard, None)
        if gang.stage in (PREPARING, COMMITTED):
            self._abort(gang, f"shard {shard}: {event.reason}")
        if gang.stage == ABORTING and not gang.open_parts:
            gang.stage = ""

    def _abort(self, gang: _Gang, reason: str) -> None:
        """Abort every open part; the gang is planned again once all are closed."""
        for shard in sorted(gang.open_parts):
            self._send(shard, ReservationAborted(rid=gang.rid, reason=reason))
        self.counters["aborted"] += 1
        gang.granted = {}
        gang.stage = ABORTING if gang.open_parts else ""
        if gang.phase in (PENDING, SCHEDULED):
            for member in gang.members:
                if gang.phase == SCHEDULED:
                    self.pod_shard.pop(member, None)
            self._status(
                gang, PENDING, f"pod group {gang.key}: attempt {gang.attempts} aborted ({reason})"
            )
            self._back_off(gang)

    def _spanning_member_finished(self, gang: _Gang, outcome: str) -> None:
        if gang.phase != SCHEDULED:
            return
        if outcome == FAILED:
            self._status(gang, FAILED, "a member failed")
            self._outcome(gang.key, FAILED, None, skip=None)
        elif gang.succeeded >= len(gang.members):
            self._status(gang, SUCCEEDED, "")
            self._outcome(gang.key, SUCCEEDED, None, skip=None)

    # ------------------------------------------------------------------ time

    def next_wakeup(self) -> int | None:
        """When the coordinator would act without new records (a retry, a time-out)."""
        times: list[int] = []
        if self.inflight:
            gang = self.gangs[self.inflight]
            if gang.phase == PENDING and gang.rid:
                times.append(gang.prepared_at + self.sharding.reservation_timeout)
        for gang in self._spanning_in_order():
            if not gang.open_parts and self.summaries > gang.retry_after:
                times.append(max(gang.retry_at, self.now))
            if gang.spec is not None and gang.spec.timeout is not None:
                times.append(gang.created_at + gang.spec.timeout)
        future = [t for t in times if t > self.now]
        return min(future) if future else None

    def stats(self) -> dict[str, int]:
        return {**self.counters, "routed_pods": len(self.pod_shard)}
