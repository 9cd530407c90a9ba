"""Event types: immutable, past-tense facts in one closed tagged union.

Every event is a frozen, keyword-only msgspec Struct with a short explicit tag. The
payload travels inside an :class:`Envelope` that carries where and when it happened
(stream, partition, offset, simulated time) and why (causation).

Compatibility rules (append-only schema):

- new event kinds get new tags; a tag is never reused;
- new fields are appended with defaults, so old records still decode;
- unknown fields are ignored on decode (no ``forbid_unknown_fields``), so an old reader
  can read a newer log.

Every struct here is declared ``gc=False``: the cyclic collector does not track it.
A struct of facts is frozen and holds only strings, numbers, tuples, dicts of those and
other such structs, so it cannot be part of a reference cycle, and the collector need
not visit it: every process keeps each pod's spec (and the coordinator and shards decode
several records per pod), so with tracking on each young collection and, for pods that
stay, each older one walked them all (about 3.5% of one shard's instructions per pod,
the coordinator's collections 40% less CPU at 5,000 nodes). Nothing may put a struct
into a dict or list that the struct itself holds.

Quantities are canonical integers: cpu in millicores, memory and storage in bytes,
``pods`` and extended resources (``nvidia.com/gpu``) in units. Times are integer
nanoseconds of simulated (or, in service, wall) time.

Why one module of over 500 lines: the closed tagged union is the log's schema; every
event kind is declared here, beside its tag, so that a tag is never reused and a
reader sees the whole schema in one place.
"""

from __future__ import annotations

from typing import Final

import msgspec

SECOND: Final = 1_000_000_000
"""Nanoseconds in one second: event times are integers in nanoseconds."""


class _Fact(msgspec.Struct, gc=False, frozen=True, kw_only=True, tag_field="type"):
    """Base of every event payload."""


# --------------------------------------------------------------------------- shapes


class Taint(msgspec.Struct, gc=False, frozen=True, kw_only=True):
    """A node taint (``NoSchedule``, ``PreferNoSchedule`` or ``NoExecute``)."""

    key: str
    value: str = ""
    effect: str


class Toleration(msgspec.Struct, gc=False, frozen=True, kw_only=True):
    """A pod toleration; empty ``key`` with ``Exists`` tolerates every taint."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""


class NodeSelectorRequirement(msgspec.Struct, gc=False, frozen=True, kw_only=True):
    """One ``matchExpressions`` (or ``matchFields``) entry of a node selector term."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


class NodeSelectorTerm(msgspec.Struct, gc=False, frozen=True, kw_only=True):
    """Requirements that are ANDed; terms of a selector are ORed."""

    match_expressions: tuple[NodeSelectorRequirement, ...] = ()
    match_fields: tuple[NodeSelectorRequirement, ...] = ()


class PreferredSchedulingTerm(msgspec.Struct, gc=False, frozen=True, kw_only=True):
    """A weighted preferred node-affinity term (weight 1..100)."""

    weight: int
    preference: NodeSelectorTerm


class HostPort(msgspec.Struct, gc=False, frozen=True, kw_only=True, omit_defaults=True):
    """A host port a pod's container binds (``ports[].hostPort``), as kube-scheduler's
    NodePorts plugin sees it: ``ip`` ``0.0.0.0`` (the default) binds every address of
    the node, so it overlaps every other ``ip`` for the same port and protocol."""

    port: int
    protocol: str = "TCP"
    ip: str = "0.0.0.0"


class LabelSelectorRequirement(
    msgspec.Struct, gc=False, frozen=True, kw_only=True, omit_defaults=True
):
    """One ``matchExpressions`` entry of a label selector (``In``, ``NotIn``,
    ``Exists``, ``DoesNotExist``)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


class LabelSelector(msgspec.Struct, gc=False, frozen=True, kw_only=True, omit_defaults=True):
    """A ``metav1.LabelSelector``: every ``match_labels`` pair and every expression
    must hold; an empty selector matches every pod."""

    match_labels: dict[str, str] = {}
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()


class PodAffinityTerm(msgspec.Struct, gc=False, frozen=True, kw_only=True, omit_defaults=True):
    """A pod (anti-)affinity term, as kube-scheduler processes it: ``selector`` (None:
    matches no pod) with ``matchLabelKeys`` / ``mismatchLabelKeys`` already merged in
    (as the API server does), the namespaces it looks in (``namespaces``; with
    ``all_namespaces`` every namespace: an empty ``namespaceSelector``), and the
    topology key."""

    topology_key: str
    selector: LabelSelector | None = None
    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False


class WeightedPodAffinityTerm(msgspec.Struct, gc=False, frozen=True, kw_only=True):
    """A preferred pod (anti-)affinity term with its weight (1..100)."""

    weight: int
    term: PodAffinityTerm


class TopologySpreadConstraint(
    msgspec.Struct, gc=False, frozen=True, kw_only=True, omit_defaults=True
):
    """A ``topologySpreadConstraints`` entry, ``matchLabelKeys`` merged into
    ``selector`` as kube-scheduler merges them."""

    max_skew: int
    topology_key: str
    when_unsatisfiable: str
    selector: LabelSelector | None = None
    min_domains: int = 1
    node_affinity_policy: str = "Honor"
    node_taints_policy: str = "Ignore"


class DeviceRef(msgspec.Struct, gc=False, frozen=True, kw_only=True):
    """One DRA device, as a ResourceSlice publishes it and an allocation names it."""

    driver: str
    pool: str
    device: str


class ClaimRequest(msgspec.Struct, gc=False, frozen=True, kw_only=True):
    """One request of a pod's ResourceClaim: ``count`` whole cards of its node
    (:mod:`engine.model.dra`)."""

    claim: str
    """The ResourceClaim's name (in the pod's namespace)."""
    request: str
    count: int
    uid: str = ""
    """The ResourceClaim's uid (empty: not known)."""


class PodSpec(msgspec.Struct, gc=False, frozen=True, kw_only=True, omit_defaults=True):
    """What the scheduler needs to know about a pod, already validated and canonical.
    Encoded without the fields left at their defaults (most of them, for most pods):
    records are half the size and decode faster."""

    namespace: str
    name: str
    uid: str = ""
    requests: dict[str, int] = {}
    priority: int = 0
    priority_class: str = ""
    preemption_policy: str = "PreemptLowerPriority"
    scheduler_name: str = ""
    node_name: str = ""
    node_selector: dict[str, str] = {}
    required_affinity: tuple[NodeSelectorTerm, ...] | None = None
    preferred_affinity: tuple[PreferredSchedulingTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    runtime: int | None = None
    """Nanoseconds the pod runs once bound before it succeeds (simulation only)."""
    group: str = ""
    """``namespace/name`` of the pod group (gang) the pod belongs to, if any."""
    depends_on: tuple[str, ...] = ()
    """``namespace/name`` of pods or groups that must succeed before this pod runs."""
    fails: bool = False
    """Simulation only: the pod fails, rather than succeeds, when its runtime ends."""
    host_ports: tuple[HostPort, ...] = ()
    """Host ports the pod binds on its node (containers and sidecars, sorted): no two
    pods on one node may bind overlapping ones (the NodePorts filter)."""
    pod_affinity: tuple[PodAffinityTerm, ...] = ()
    """``affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution``."""
    pod_affinity_preferred: tuple[WeightedPodAffinityTerm, ...] = ()
    pod_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    """``affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution``."""
    pod_anti_affinity_preferred: tuple[WeightedPodAffinityTerm, ...] = ()
    spread_constraints: tuple[TopologySpreadConstraint, ...] = ()
    """``topologySpreadConstraints`` (InterPodAffinity and PodTopologySpread)."""
    owner_selector: LabelSelector | None = None
    """The selector of the ReplicaSet or StatefulSet that made the pod, where known:
    what the profile's default spread constraints select (kube-scheduler's
    ``DefaultSelector``); None: no default constraints apply."""
    owner: str = ""
    """Its controller (``KIND/NAME`` of the ``ownerReferences`` entry with
    ``controller: true``), or empty: a moved pod's node is held for its replacement."""
    claims: tuple[ClaimRequest, ...] = ()
    """Its DRA claims' requests, in order: its ``nvidia.com/gpu`` request is their sum,
    and its cards go to them in this order (:mod:`engine.model.dra`)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class GroupSpec(msgspec.Struct, gc=False, frozen=True, kw_only=True):
    """A pod group (gang): at least ``min_member`` members run together or none do."""

    namespace: str
    name: str
    min_member: int
    min_resources: dict[str, int] = {}
    timeout: int | None = None
    """Nanoseconds after creation by which ``min_member`` must be bound, else it fails."""
    priority: int = 0
    priority_class: str = ""
    queue: str = ""
    depends_on: tuple[str, ...] = ()
    source: str = ""
    """Which convention declared it: ``scheduler-plugins``, ``volcano``, ``tencent``,
    ``labels`` (no object: the older pod-group labels)."""
    uid: str = ""
    """The PodGroup object's uid (empty without one): a group deleted and created
    again under its name is another object, with another uid."""
    topology_required: str = ""
    """A topology level (its name, node label or tier) whose one domain must hold every
    member (``engine.model.topology``); empty: none."""
    topology_preferred: str = ""
    """A topology level to keep the members in, as few of its domains as possible."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class QuotaSpec(msgspec.Struct, gc=False, frozen=True, kw_only=True):
    """An elastic quota of a namespace: ``min`` guaranteed, borrowable up to ``max``."""

    namespace: str
    name: str
    min: dict[str, int] = {}
    max: dict[str, int] = {}


class BudgetSpec(msgspec.Struct, gc=False, frozen=True, kw_only=True, omit_defaults=True):
    """A ``PodDisruptionBudget``: of the pods of ``namespace`` that ``selector`` picks
    (None: none), at least ``min_available`` stay bound, or at most ``max_unavailable``
    are not, each an int or a percent (``"50%"``) of those pods, rounded up as the
    disruption controller rounds them (:mod:`engine.model.disruption`). Neither set:
    ``min_available`` 1 (the API's default)."""

    namespace: str
    name: str
    selector: LabelSelector | None = None
    min_available: int | str | None = None
    max_unavailable: int | str | None = None
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class NodeSpec(msgspec.Struct, gc=False, frozen=True, kw_only=True):
    """A node as the scheduler sees it."""

    name: str
    allocatable: dict[str, int]
    labels: dict[str, str] = {}
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    annotations: dict[str, str] = {}
    """The node's annotations: data for user plugins (a measured network speed, the
    leaf switch a node hangs off), never read by the built-in plugins."""
    devices: tuple[DeviceRef, ...] = ()
    """Its DRA devices (from ResourceSlices), card ``i`` being ``devices[i]``; its
    ``nvidia.com/gpu`` counts them (:mod:`engine.model.dra`)."""


# ----------------------------------------------------------------- cluster inputs


class NodeAdded(_Fact, frozen=True, kw_only=True, tag="node+"):
    node: NodeSpec


class NodeUpdated(_Fact, frozen=True, kw_only=True, tag="node~"):
    """Full replacement of a node's schedulable attributes."""

    node: NodeSpec


class NodeRemoved(_Fact, frozen=True, kw_only=True, tag="node-"):
    name: str


class PodSubmitted(_Fact, frozen=True, kw_only=True, tag="pod+"):
    pod: PodSpec


class PodDeleted(_Fact, frozen=True, kw_only=True, tag="pod-"):
    pod: str
    """``namespace/name``."""


class PodSucceeded(_Fact, frozen=True, kw_only=True, tag="pod.ok"):
    pod: str
    node: str = ""


class PodFailed(_Fact, frozen=True, kw_only=True, tag="pod.fail"):
    pod: str
    node: str = ""
    reason: str = ""


class PluginUsed(msgspec.Struct, gc=False, frozen=True, kw_only=True):
    """A plugin from another package (entry-point group ``shoal.plugins``) that a
    configuration names: its name, and the distribution and version it came from."""

    name: str
    distribution: str
    version: str


class SchedulerConfigured(_Fact, frozen=True, kw_only=True, tag="config"):
    """The scheduler configuration a run used (``KubeSchedulerConfiguration`` as JSON;
    empty for the defaults). The first record of a run, so a log replays by itself."""

    config: str = ""
    plugins: tuple[PluginUsed, ...] = ()
    """The plugins from other packages the configuration names (none: built-ins only),
    so that ``replay --verify`` loads the same ones or says which differ."""


class ShardingConfigured(_Fact, frozen=True, kw_only=True, tag="sharding"):
    """How a run with several shards maps nodes to pools and pools to shards (JSON of
    ``shards.router.Sharding``); the first record of the control partition, so that
    replay folds it the same way."""

    config: str


class PodGroupSubmitted(_Fact, frozen=True, kw_only=True, tag="group+"):
    group: GroupSpec
    created_at: int = -1
    """When the group was first submitted (its timeout counts from then); -1: the
    envelope's time. Set when the router hands a group to another shard."""


class QuotaDefined(_Fact, frozen=True, kw_only=True, tag="quota"):
    """An ``ElasticQuota`` was created or replaced."""

    quota: QuotaSpec


class DisruptionBudgetSet(_Fact, frozen=True, kw_only=True, tag="pdb"):
    """A ``PodDisruptionBudget`` was created or replaced."""

    budget: BudgetSpec


class DisruptionBudgetDeleted(_Fact, frozen=True, kw_only=True, tag="pdb-"):
    """A ``PodDisruptionBudget`` is gone."""

    budget: str
    """``namespace/name``."""


class PositionRecorded(_Fact, frozen=True, kw_only=True, tag="pos"):
    """A component applied everything before ``position``; after a restart it resumes
    there instead of applying the log again from the start."""

    component: str
    position: int


class ClockTicked(_Fact, frozen=True, kw_only=True, tag="tick"):
    """Time passed with nothing else happening; the envelope carries the time."""


class TermBegan(_Fact, frozen=True, kw_only=True, tag="term"):
    """A leader's term began: ``holder`` took the Lease ``fence`` with ``epoch``
    (``events.fence``). The leader appends it to each partition it writes before any
    other record of its term, so that from here on every reader drops what an older
    term of the same fence appends late. Folding it changes nothing but the time."""

    fence: str
    epoch: int
    holder: str = ""


class RecordFenced(_Fact, frozen=True, kw_only=True, tag="fenced"):
    """What a reader sees in place of a record that a deposed leader appended late (its
    epoch is below one its partition already holds for its fence; ``events.fence``):
    ``kind`` the event's type it had, ``highest`` the epoch that fenced it. Never
    appended; folding it changes nothing."""

    kind: str
    highest: int


class RecordQuarantined(_Fact, frozen=True, kw_only=True, tag="quarantine"):
    """A record of this partition, at ``offset``, that a component could not decode or
    could not apply (values no column can hold), and skipped: ``reason`` says why. The
    component goes on with the records after it; replay skips the record the same way
    and shows this one. Folding it changes nothing."""

    offset: int
    reason: str
    component: str


class SnapshotTaken(_Fact, frozen=True, kw_only=True, tag="snapshot"):
    """Part of a component's state (``engine/snapshot.py``), written after one of its
    passes so that a restart restores it instead of folding the partition from the
    start. Neither an input nor a decision: folding it changes nothing.

    The envelope's ``causation`` is the input of the pass the state follows; records
    below ``position`` were folded, and so were the component's own records below the
    first part. ``digest`` (SHA-256 of the uncompressed state) is the same in every part;
    a snapshot missing a part, or whose parts do not add up to the digest, is ignored.
    """

    component: str
    position: int
    part: int
    parts: int
    digest: str
    data: bytes


# ------------------------------------------------ routing and reservations (inputs)
#
# With several shards the log has one partition per shard plus a control partition
# (the last one). Ingest appends cluster inputs to the control partition; the router
# (a fold of it) forwards each to the shard that owns it. These kinds exist only as
# forwarded records in shard partitions.


class PodRouted(_Fact, frozen=True, kw_only=True, tag="route"):
    """The coordinator hands ``pod`` to this shard to place: the shard places it at once,
    on the node its profile chooses, with ``decision_id``, or hands it back (it never
    keeps it waiting). (``hops``, ``final`` and ``answers`` are what the router of
    earlier versions sent; they are read, and mean nothing now.)"""

    pod: PodSpec
    decision_id: str = ""
    hops: int = 0
    final: bool = False
    answers: tuple[str, ...] = ()
    disruptions: dict[str, int] | None = None
    """How many more pods each disruption budget lets go (budget key → count), as the
    coordinator counted them over every shard when it handed the pod over for a plan
    of moves within this shard; None: not counted (a pod a budget covers is then not
    moved here)."""
    counted: tuple[int, int] | None = None
    """For a plan of moves within this shard: the pods placed and the running pods moved
    so far over every shard, as the coordinator counted them; a move budget in percent
    of placed pods (the rescheduler's ``budget``) is measured against these for this
    pod, as one scheduler measures it. None: against this shard's own counts."""
    node: str = ""
    """The node the coordinator chose on its view of every shard (as one scheduler
    would): the shard places the pod there, on GPU cards ``devices`` where each still
    has room (else its own choice of cards there), or hands it back; empty: the shard
    chooses among its nodes."""
    devices: tuple[int, ...] = ()


class PodRecalled(_Fact, frozen=True, kw_only=True, tag="recall"):
    """Written by the router of earlier versions (shards no longer keep pods they cannot
    place); kept so that their logs still decode."""

    pod: str


class PoolReassigned(_Fact, frozen=True, kw_only=True, tag="pool~"):
    """An operator moves node pool ``pool`` to shard ``shard`` (control partition)."""

    pool: str
    shard: int


class PoolReleased(_Fact, frozen=True, kw_only=True, tag="pool-"):
    """To the old owner: hand over ``nodes`` (pool ``pool``) and what runs on them."""

    pool: str
    nodes: tuple[str, ...]
    to: int


class Placement(msgspec.Struct, gc=False, frozen=True, kw_only=True):
    """A pod bound to a node by a decision, as it moves with its node to a new shard."""

    pod: PodSpec
    node: str
    decision_id: str
    devices: tuple[int, ...] = ()
    """Its GPU cards there (see ``PodBound.devices``)."""


class PodAdopted(_Fact, frozen=True, kw_only=True, tag="adopt"):
    """To the new owner: a pod already bound on a node it now owns."""

    placement: Placement


class ReservationRequested(_Fact, frozen=True, kw_only=True, tag="rsv?"):
    """Prepare: stage ``pods`` (part ``rid`` of gang ``group``) all together and hold them
    until committed, aborted, or ``expires_at``. ``placements``: the node of each pod,
    as the coordinator chose it (empty: the shard chooses, as for a gang it is handed
    whole); ``victims``: pods to evict first → the pod they make room for. ``at_once``:
    the part is the whole reservation, so commit as soon as it is staged. ``moves``:
    pods of the part that run on another shard's node now (pod → that node): moved here
    to make room for ``moved_for`` (the rescheduler across shards), so committed as
    ``PodMigrated``, not ``PodBound``."""

    rid: str
    group: GroupSpec
    pods: tuple[PodSpec, ...]
    expires_at: int
    placements: dict[str, str] = {}
    victims: dict[str, str] = {}
    at_once: bool = False
    moves: dict[str, str] = {}
    moved_for: str = ""
    moved_by: dict[str, str] = {}
    """Pods of ``moves`` made room for another pod than ``moved_for`` → that pod (a
    gang's member whose place needed the move; the pod the ``PodMigrated`` names)."""
    disruptions: dict[str, int] | None = None
    """For a gang handed whole to be placed with moves within this shard: the
    disruptions each budget allows, counted over every shard (as ``PodRouted``'s)."""
    counted: tuple[int, int] | None = None
    """For a gang handed whole to be placed with moves within this shard: the pods
    placed and moved over every shard (as ``PodRouted``'s)."""
    plain: bool = False
    """Every pod of the part is a pod of its own, in no gang (the part's group exists
    only to hold it): once committed, the shard moves it as any pod of its own
    (consolidation, defragmentation). False: as a gang's member (and for logs written
    before the field)."""
    devices: dict[str, tuple[int, ...]] = {}
    """The GPU cards the coordinator's profile chose for a pod of ``placements`` (a GPU
    policy's choice of card, which reads the whole workload's shapes): taken there if
    still free, as one scheduler takes them. Empty (logs written before the field, or
    no policy chose): the shard chooses, best fit."""
    leaving: dict[str, str] = {}
    """Pods of this shard that the same plan of moves takes to other shards (pod → its
    node here): their room counts as free while the part is held (the pods ``moves``
    brings in may need it), they are gone from here once it is committed, and they run
    here again if it is let go. Only in a part that is not ``at_once`` (every part of
    the plan is committed together)."""


class WorkloadShapes(_Fact, frozen=True, kw_only=True, tag="shapes"):
    """To every shard, from the coordinator: the pod shapes it has learnt (each
    ``(cpu milli, milli-GPU per card, cards, GPU models, count)``, as
    :class:`engine.model.shapes.ShapeCounts` takes them), sent when they change (at
    totals that are powers of two or multiples of 1,024 pods: a few records in all). A
    shard sees only the pods it holds, so a policy that reads the workload's shapes (a
    GPU policy, consolidation) learns from these instead, as one scheduler would."""

    learned: tuple[tuple[int, int, int, tuple[str, ...], int], ...]


class PreemptionRequested(_Fact, frozen=True, kw_only=True, tag="preempt?"):
    """The coordinator's preemption plan for the pods on this shard: evict ``victims``
    (pod → the pod or gang they make room for). The preemptor is placed once the
    coordinator has heard they are gone."""

    victims: dict[str, str]


class ReservationCommitted(_Fact, frozen=True, kw_only=True, tag="rsv.commit"):
    """Commit: turn the held placements of ``rid`` into bindings."""

    rid: str


class ReservationAborted(_Fact, frozen=True, kw_only=True, tag="rsv.abort"):
    """Abort: release whatever ``rid`` holds (and unbind it if it was committed)."""

    rid: str
    reason: str = ""


# ------------------------------------------------------- decisions and their fate


class PodBound(_Fact, frozen=True, kw_only=True, tag="bind"):
    """A shard decided to place ``pod`` on ``node`` (optimistically assumed)."""

    pod: str
    node: str
    decision_id: str
    attempt: int
    shard: int = 0
    score: int = 0
    devices: tuple[int, ...] = ()
    """The GPU cards the pod takes on ``node`` (indices); empty for no GPU."""


class Answer(msgspec.Struct, gc=False, frozen=True, kw_only=True, omit_defaults=True):
    """Why a waiting unit waits, for the person who can change it: the dominant
    reason with its numbers (``summary``), a few facts behind it (``evidence``) and
    what to do (``next_step``). ``kind`` names the reason (``quota-max``, ``taint``,
    ``gpu-cards``...; see :mod:`engine.passes.answers`)."""

    kind: str
    summary: str
    evidence: tuple[str, ...] = ()
    next_step: str = ""

    def text(self) -> str:
        """One line: the summary, then the next step."""
        return f"{self.summary}: {self.next_step}" if self.next_step else self.summary


class PodUnschedulable(_Fact, frozen=True, kw_only=True, tag="unsched"):
    """A scheduling attempt found no node.

    ``rejections`` counts nodes by reason (``"Insufficient cpu": 12``), the shape of
    kube-scheduler's ``FailedScheduling`` message; ``plugins`` names the filters that
    rejected at least one node.
    """

    pod: str
    attempt: int
    reason: str
    rejections: dict[str, int] = {}
    plugins: tuple[str, ...] = ()
    shard: int = 0
    answer: Answer | None = None
    """The answer for the person waiting (composed by the engine; None in logs written
    before answers existed)."""


class BindFailed(_Fact, frozen=True, kw_only=True, tag="bind.fail"):
    """The binder could not apply a ``PodBound``; the decision is rolled back."""

    pod: str
    node: str
    decision_id: str
    reason: str


class PodEvicted(_Fact, frozen=True, kw_only=True, tag="evict"):
    pod: str
    node: str
    reason: str
    decision_id: str = ""
    shard: int = 0


class PodPreempted(_Fact, frozen=True, kw_only=True, tag="preempt"):
    pod: str
    node: str
    by: str
    decision_id: str = ""
    shard: int = 0


class PodMigrated(_Fact, frozen=True, kw_only=True, tag="migrate"):
    """A running pod moved from ``from_node`` to ``to_node`` to make room for ``by``
    (the rescheduler): it restarts there under ``decision_id``, on ``devices``."""

    pod: str
    from_node: str
    to_node: str
    by: str
    decision_id: str
    shard: int = 0
    devices: tuple[int, ...] = ()


class MigrationEvicted(_Fact, frozen=True, kw_only=True, tag="migrate.evicted"):
    """The binder carried out ``PodMigrated`` ``decision_id`` as an eviction (a
    Kubernetes pod cannot move): when the pod is gone, the node it was moved to is held
    for the replacement its controller creates."""

    pod: str
    to_node: str
    decision_id: str


class PodGroupStatusChanged(_Fact, frozen=True, kw_only=True, tag="group~"):
    """A pod group changed phase (Pending, Scheduled, Succeeded, Failed)."""

    group: str
    phase: str
    scheduled: int = 0
    reason: str = ""
    shard: int = 0


class PodRejected(_Fact, frozen=True, kw_only=True, tag="reject"):
    """The scheduler gave up on a pod for good (its group timed out, a dependency
    failed), or ingest refused it at admission (a value out of range: ``uid`` is then
    the object's, for the Event on it); it will not be retried."""

    pod: str
    reason: str
    shard: int = 0
    uid: str = ""


class PodUnbound(_Fact, frozen=True, kw_only=True, tag="unbind"):
    """A placement is taken back (its gang fell below ``minMember`` after a failed
    bind, or a cross-shard reservation was aborted): the pod is pending again."""

    pod: str
    node: str
    decision_id: str
    reason: str
    shard: int = 0


class PoolHandedOver(_Fact, frozen=True, kw_only=True, tag="pool.over"):
    """The old owner let pool ``pool`` go: its nodes and the pods bound on them."""

    pool: str
    nodes: tuple[str, ...]
    placements: tuple[Placement, ...]
    to: int
    shard: int = 0


class PodHandedBack(_Fact, frozen=True, kw_only=True, tag="handback"):
    """A shard could not place ``pod`` (or, with ``group``, that whole gang), or a pod
    the coordinator placed there failed to bind, and gives it back to the coordinator
    with the reason; it forgets it."""

    pod: str = ""
    group: str = ""
    reason: str
    shard: int = 0
    resolvable: bool = False
    """Some node failed only for want of free capacity (or quota): it may fit here
    later, so this shard is a good one to keep it if no other takes it."""
    decision_id: str = ""
    """A pod the coordinator had placed, whose bind failed: the decision that failed
    (its reservation, if a part held it, is in it)."""


class ShardSummary(_Fact, frozen=True, kw_only=True, tag="summary"):
    """What a shard tells the coordinator after a pass: ``placed``, the pods it was handed
    and placed since its last summary (pod → node); ``seen``, the control offset of the
    last record the coordinator forwarded that it had folded. (The capacity totals are
    what shards of earlier versions sent; the coordinator now keeps every node itself.)"""

    shard: int
    seen: int
    placed: dict[str, str] = {}
    nodes: int = 0
    allocatable: dict[str, int] = {}
    used: dict[str, int] = {}
    largest: dict[str, int] = {}
    pending: int = 0
    devices: dict[str, tuple[int, ...]] = {}
    """For pods of ``placed`` that hold GPU cards: which (so the coordinator's view
    holds the same cards)."""


class ReservationGranted(_Fact, frozen=True, kw_only=True, tag="rsv+"):
    """The shard staged every pod of ``rid`` and holds them: pod → node."""

    rid: str
    group: str
    placements: dict[str, str]
    shard: int = 0
    devices: dict[str, tuple[int, ...]] = {}
    """The GPU cards of the pods of ``placements`` that hold any."""


class ReservationDenied(_Fact, frozen=True, kw_only=True, tag="rsv-"):
    rid: str
    group: str
    reason: str
    shard: int = 0


class ReservationReleased(_Fact, frozen=True, kw_only=True, tag="rsv.rel"):
    """The shard let ``rid`` go: aborted, expired (``reason`` says which), or broken by
    a failed bind of one of its pods."""

    rid: str
    group: str
    reason: str
    shard: int = 0


class ExtenderAnswered(_Fact, frozen=True, kw_only=True, tag="extender"):
    """What an HTTP extender answered about ``pods`` (pods of one shape, asked once) on
    ``nodes`` (the nodes sent), recorded by the component that asked, so that the engine
    reads the answer from the log and replay needs no extender running.

    ``passed`` is None when no filter verb was called (every node sent passes);
    ``failed`` and ``unresolvable`` map node → reason (``FailedNodes`` and
    ``FailedAndUnresolvableNodes``); ``scores`` the raw ``HostPriorityList`` (0..10, not
    yet weighted). ``error`` (a time-out, a refused connection, an HTTP status, a
    malformed answer, the answer's ``Error``) makes the rest void: the engine then
    skips an ignorable extender and fails the attempt otherwise."""

    extender: str
    """The extender's ``urlPrefix``."""
    pods: tuple[str, ...]
    nodes: tuple[str, ...] = ()
    passed: tuple[str, ...] | None = None
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    scores: dict[str, int] = {}
    error: str = ""
    asked: tuple[int, ...] = ()
    """Per pod, the ask this answers (the asking engine's count): an answer to an older
    ask of a pod, arriving late, is not taken for a newer one's."""


Event = (
    NodeAdded
    | NodeUpdated
    | NodeRemoved
    | PodSubmitted
    | PodDeleted
    | PodSucceeded
    | PodFailed
    | ClockTicked
    | PositionRecorded
    | SchedulerConfigured
    | PodBound
    | PodUnschedulable
    | BindFailed
    | PodEvicted
    | PodPreempted
    | PodMigrated
    | MigrationEvicted
    | PodGroupSubmitted
    | QuotaDefined
    | DisruptionBudgetSet
    | DisruptionBudgetDeleted
    | PodGroupStatusChanged
    | PodRejected
    | ShardingConfigured
    | PodRouted
    | PodRecalled
    | PoolReassigned
    | PoolReleased
    | PodAdopted
    | PoolHandedOver
    | ReservationRequested
    | WorkloadShapes
    | PreemptionRequested
    | ReservationCommitted
    | ReservationAborted
    | PodUnbound
    | PodHandedBack
    | ShardSummary
    | ReservationGranted
    | ReservationDenied
    | ReservationReleased
    | SnapshotTaken
    | RecordQuarantined
    | ExtenderAnswered
    | TermBegan
    | RecordFenced
)
"""The closed union of every event kind."""

DECISIONS: Final = (
    PodBound,
    PodUnschedulable,
    PodEvicted,
    PodPreempted,
    PodMigrated,
    PodGroupStatusChanged,
    PodRejected,
    PodUnbound,
    PodHandedBack,
    ShardSummary,
    ReservationGranted,
    ReservationDenied,
    ReservationReleased,
    PoolHandedOver,
)
"""Event kinds a shard derives; replay re-derives and compares them."""

REPORTS: Final = (
    PodHandedBack,
    PoolHandedOver,
    ShardSummary,
    ReservationGranted,
    ReservationDenied,
    ReservationReleased,
    PodGroupStatusChanged,
    PodRejected,
    PodPreempted,
    PodMigrated,
    PodEvicted,
    PodUnbound,
)
"""Shard-partition kinds the router relays into the control partition: what it must
know of the shards' work (answers, capacity, outcomes)."""


class Envelope(msgspec.Struct, gc=False, frozen=True, kw_only=True):
    """Where, when and why an event happened.

    ``offset`` is assigned by the log on append (``-1`` before). ``causation`` is the
    offset of the last input a decision was derived from (``-1`` for inputs).
    ``producer`` names the component that appended it (``ingest``, ``shard-0``,
    ``binder``, ``cluster``). ``fence`` and ``epoch``: the Lease and term of the leader
    that appended it (``events.fence``; empty and 0 for writers that lead nothing): a
    log refuses, and a reader drops, a record whose epoch is below one already seen for
    its fence.
    """

    event: Event
    time: int = 0
    stream: str = "cluster"
    partition: int = 0
    offset: int = -1
    causation: int = -1
    event_id: str = ""
    producer: str = ""
    fence: str = ""
    epoch: int = 0


def is_decision(event: Event) -> bool:
    """True for kinds that shards derive (and replay re-derives)."""
    return isinstance(event, DECISIONS)


_OUTPUTS: Final = (*DECISIONS, SnapshotTaken)


def is_output_of(env: Envelope, producer: str) -> bool:
    """True for what ``producer`` (a shard) wrote from its own passes: its decisions and
    its snapshots. Everything else in its partition is an input to it."""
    return env.producer == producer and isinstance(env.event, _OUTPUTS)
