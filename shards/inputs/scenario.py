"""Scenario files: multi-document YAML of Kubernetes objects → timed events.

Kinds read: ``v1 Node``, ``v1 Pod``, ``v1 List`` (its items), ``scheduling.k8s.io/v1
PriorityClass``, ``KubeSchedulerConfiguration``, ``policy/v1`` (and ``v1beta1``)
``PodDisruptionBudget`` (:mod:`shards.inputs.disruption`), the pod-group and quota kinds of
:mod:`shards.inputs.groups`, Kueue's ``ClusterQueue``, ``LocalQueue`` and
``ResourceFlavor`` (:mod:`shards.inputs.kueue`: namespaces' quotas), DRA's
``resource.k8s.io/v1`` DeviceClass, ResourceSlice, ResourceClaim and
ResourceClaimTemplate (:mod:`shards.inputs.dra`: GPUs as cards) and the workload
objects of :mod:`shards.inputs.workloads`, Volcano's Job among them (replaced by the
pods, and pod group, their controllers create). ``shoal.io/arrive-at`` (seconds)
sets when an object appears; document order breaks ties, across files in the order
given. Every error names the file, the document and the field; a field read but not
acted on is a warning (:attr:`Scenario.warnings`), named the same way.

The sharding documents are read by :mod:`shards.inputs.sharding`, Kueue's queues by
:mod:`shards.inputs.kueue`, and kinds shoal does not read are sorted out by
:mod:`shards.inputs.kinds` (skipped with a warning, or refused).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

import msgspec

from engine.config import API_VERSIONS as CONFIG_VERSIONS
from engine.config import KIND as CONFIG_KIND
from engine.config import SchedulerConfig, parse_config
from engine.extenders import policy_to_config
from events.errors import InputError
from events.types import (
    DisruptionBudgetSet,
    Event,
    GroupSpec,
    NodeAdded,
    PodGroupSubmitted,
    PodSpec,
    PodSubmitted,
    QuotaDefined,
)
from shards.inputs.disruption import KIND as BUDGET_KIND
from shards.inputs.disruption import VERSIONS as BUDGET_VERSIONS
from shards.inputs.disruption import disruption_budget
from shards.inputs.dra import KINDS as DRA_KINDS
from shards.inputs.dra import ClaimPending, DraCatalog
from shards.inputs.groups import (
    DEPENDS_ON,
    GROUP_KINDS,
    QUOTA_VERSIONS,
    WORKLOAD_VERSIONS,
    dependencies,
    dependency_cycle,
    elastic_quota,
    group_membership,
    group_warnings,
    pod_group,
    workload_warnings,
)
from shards.inputs.kinds import skip_warning, unknown_kind_message
from shards.inputs.kueue import KINDS as KUEUE_KINDS
from shards.inputs.kueue import QUEUE_LABEL, KueueQueues, queue_label
from shards.inputs.limits import MAX_OBJECTS, cut, shown
from shards.inputs.objects import OWNER_SELECTOR, arrival, node_spec, pod_spec, priority_class
from shards.inputs.podfields import check_spelling, gated, unused_fields
from shards.inputs.progress import Progress
from shards.inputs.sharding import (
    SHARDING_KIND,
    SHARDING_VERSION,
    parse_sharding,
    pool_reassignment,
)
from shards.inputs.sharding import ShardingSpec as ShardingSpec  # noqa: PLC0414 (re-exported)
from shards.inputs.topology import (
    KUEUE_VERSIONS,
    VOLCANO_VERSION,
    TopologyObjects,
    is_topology_object,
    pod_warnings,
    topology_fields,
    with_topology,
)
from shards.inputs.totals import ScenarioTotals
from shards.inputs.workloads import WORKLOAD_KINDS, NodeArrival, expand
from shards.inputs.yamlfile import read_documents

KINDS: Final = {
    ("v1", "Node"),
    ("v1", "Pod"),
    ("v1", "List"),
    ("scheduling.k8s.io/v1", "PriorityClass"),
    *((version, CONFIG_KIND) for version in CONFIG_VERSIONS),
    *((version, "PodGroup") for version in GROUP_KINDS),
    *((version, "Workload") for version in WORKLOAD_VERSIONS),
    *WORKLOAD_KINDS,
    *((version, "ElasticQuota") for version in QUOTA_VERSIONS),
    *((version, BUDGET_KIND) for version in BUDGET_VERSIONS),
    (SHARDING_VERSION, SHARDING_KIND),
    (SHARDING_VERSION, "PoolReassignment"),
    *((version, "Topology") for version in KUEUE_VERSIONS),
    (VOLCANO_VERSION, "HyperNode"),
    *KUEUE_KINDS,
    *DRA_KINDS,
}


@dataclass(frozen=True, slots=True)
class TimedEvent:
    time: int
    order: int
    event: Event


@dataclass
class Scenario:
    events: list[TimedEvent] = field(default_factory=list)
    config: SchedulerConfig | None = None
    sharding: ShardingSpec | None = None
    priority_classes: dict[str, int] = field(default_factory=dict)
    nodes: int = 0
    pods: int = 0
    groups: int = 0
    quotas: int = 0
    warnings: list[str] = field(default_factory=list)
    """Fields read but not acted on, each naming file, document and field."""
    topology: TopologyObjects = field(default_factory=TopologyObjects)
    """Kueue ``Topology`` and Volcano ``HyperNode`` objects (the levels of the run's
    configuration: :func:`shards.inputs.topology.with_topology`)."""
    topology_refs: list[tuple[str, str]] = field(default_factory=list)
    """(level, where) of every topology level a pod group names, checked against the
    configuration the run uses (:func:`check_topology`)."""


@dataclass(frozen=True, slots=True)
class _Doc:
    path: str
    number: int
    obj: Mapping[str, Any]
    parent: str = ""
    """For a pod a workload object created: that object's kind and name."""
    at: int | None = None
    """For such a pod: when it arrives (ns), instead of its annotation."""
    skipped: str = ""
    """Why a document of a kind shoal does not read is skipped (the warning), if it is
    (:mod:`shards.inputs.kinds`)."""

    def where(self, field_: str = "") -> str:
        meta = self.obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        kind = self.obj.get("kind", "object")
        label = cut(kind, 80) if isinstance(kind, str) else shown(kind)
        if isinstance(name, str):
            label = f"{label} {cut(name, 80)}"
        if self.parent:
            label = f"{self.parent}, its {label}"
        head = f"{self.path}: document {self.number} ({label})"
        return f"{head}: {field_}" if field_ else head


def _read_documents(path: str, progress: Progress | None = None) -> Iterator[_Doc]:
    def told(done: int, total: int) -> None:
        assert progress is not None
        progress(f"reading {cut(path, 80)}", done, total, "characters")

    for number, raw in read_documents(path, progress=None if progress is None else told):
        if raw is None:
            continue
        if not isinstance(raw, Mapping):
            raise InputError(
                f"must be a Kubernetes object (a mapping), got {type(raw).__name__}",
                location=f"{path}: document {number}",
            )
        try:
            yield from _expand(path, number, raw)
        except RecursionError:
            raise InputError(
                "lists nested too deeply", location=f"{path}: document {number}"
            ) from None


def _expand(path: str, number: int, raw: Mapping[str, Any]) -> Iterator[_Doc]:
    doc = _Doc(path, number, raw)
    version, kind = raw.get("apiVersion"), raw.get("kind")
    if not isinstance(version, str) or not isinstance(kind, str) or (version, kind) not in KINDS:
        warning = skip_warning(version, kind, KINDS)
        if warning is None:
            raise InputError(unknown_kind_message(version, kind, KINDS), location=doc.where())
        yield replace(doc, skipped=warning)
        return
    key = (version, kind)
    if key == ("v1", "List"):
        items = raw.get("items")
        if not isinstance(items, list):
            raise InputError("must be a list", location=doc.where("items"))
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise InputError("must be a mapping", location=doc.where(f"items[{i}]"))
            yield from _expand(f"{path}: document {number} items[{i}]", number, item)
        return
    yield doc


def _located(doc: _Doc, exc: InputError) -> InputError:
    return InputError(exc.message, location=doc.where(exc.location.lstrip(".")))


def load_scenario(paths: list[str], progress: Progress | None = None) -> Scenario:
    """Read scenario files; raise :class:`InputError` naming file, document and field,
    on one line of bounded length. ``progress`` hears of each step (reading each file,
    expanding workloads, checking the objects)."""
    try:
        return _load_scenario(paths, progress)
    except InputError as exc:
        raise _tidy(exc) from None


def _tidy(exc: InputError) -> InputError:
    """The error on one line, its message and location each cut to a bounded length."""
    return InputError(cut(exc.message), location=cut(exc.location))


def _load_scenario(paths: list[str], progress: Progress | None = None) -> Scenario:
    docs = [doc for path in paths for doc in _read_documents(path, progress)]
    totals = ScenarioTotals()
    scenario = Scenario()
    scenario.warnings += (f"{d.where()}: {d.skipped}" for d in docs if d.skipped)
    docs = [d for d in docs if not d.skipped]
    queues = KueueQueues()
    dra = DraCatalog()
    claimed: dict[str, str] = {}
    """ResourceClaim → the pod that uses it."""
    classes: dict[str, int] = {}
    default_class: tuple[str, int] | None = None
    for doc in docs:
        kind = doc.obj.get("kind")
        try:
            if kind == "PriorityClass":
                name, value, is_default = priority_class(doc.obj)
                if name in classes:
                    raise InputError(
                        f"duplicate priority class {shown(name)}", location="metadata.name"
                    )
                classes[name] = value
                if is_default:
                    if default_class is not None:
                        raise InputError(
                            f"a second global default (first: {shown(default_class[0])})",
                            location="globalDefault",
                        )
                    default_class = (name, value)
            elif kind == SHARDING_KIND:
                if scenario.sharding is not None:
                    raise InputError(f"only one {SHARDING_KIND} is allowed")
                scenario.sharding = replace(parse_sharding(doc.obj), where=doc.where())
            elif kind == CONFIG_KIND:
                if scenario.config is not None:
                    raise InputError("only one KubeSchedulerConfiguration is allowed")
                scenario.config = parse_config(doc.obj, "")
                validate_plugins(scenario.config)
                scenario.warnings += (doc.where(w) for w in scenario.config.warnings)
            elif is_topology_object(doc.obj):
                scenario.topology.add(doc.obj)
            elif (doc.obj.get("apiVersion"), kind) in KUEUE_KINDS:
                queues.add(id(doc.obj), doc.obj)
            elif (doc.obj.get("apiVersion"), kind) in DRA_KINDS:
                dra.add(doc.obj)
        except InputError as exc:
            raise _located(doc, exc) from None
    _queue_warnings(docs, queues, scenario.warnings)
    try:
        scenario.config = with_topology(scenario.config, scenario.topology)
    except InputError as exc:
        config_doc = next((d for d in docs if d.obj.get("kind") == CONFIG_KIND), docs[0])
        raise _located(config_doc, exc) from None
    scenario.priority_classes = dict(classes)
    if default_class is not None:
        classes[""] = default_class[1]
    docs = _with_workload_pods(docs, classes, scenario.warnings, progress)
    seen_nodes: set[str] = set()
    seen_pods: set[str] = set()
    warned: set[tuple[str, str]] = set()
    """(workload, field) already warned about (once per workload, not per replica)."""
    groups: dict[str, tuple[GroupSpec, _Doc]] = {}
    implicit: dict[str, int] = {}
    quotas: set[str] = set()
    budgets: set[str] = set()
    members: dict[str, list[str]] = {}
    waits: dict[str, tuple[str, ...]] = {}
    where_of: dict[str, _Doc] = {}
    for order, doc in enumerate(docs):
        kind = doc.obj.get("kind")
        if progress is not None:
            progress("checking objects", order + 1, len(docs), "objects")
        try:
            totals.add_object()
            if kind == "PodGroup":
                group = pod_group(doc.obj, classes)
                if group.key in groups:
                    raise InputError(
                        f"duplicate pod group {shown(group.key)}", location="metadata.name"
                    )
                groups[group.key] = (group, doc)
                scenario.warnings += (doc.where(f) + f": {m}" for f, m in group_warnings(doc.obj))
                waits[group.key] = group.depends_on
                fields = topology_fields(doc.obj)
                for level in (group.topology_required, group.topology_preferred):
                    if level:
                        scenario.topology_refs.append((level, doc.where(", ".join(fields))))
                where_of[group.key] = doc
                event: Event = PodGroupSubmitted(group=group)
                scenario.groups += 1
            elif kind in {"ElasticQuota", "LocalQueue"}:
                chosen = queues.chosen.get(id(doc.obj))
                if kind == "LocalQueue" and chosen is None:
                    continue  # not acted on: a warning says why
                quota = elastic_quota(doc.obj) if chosen is None else chosen
                if quota.namespace in quotas:
                    raise InputError(
                        f"a second quota for namespace {shown(quota.namespace)} (an "
                        "ElasticQuota, or a Kueue LocalQueue's ClusterQueue)",
                        location="metadata.namespace",
                    )
                quotas.add(quota.namespace)
                event = QuotaDefined(quota=quota)
                scenario.quotas += 1
            elif kind == BUDGET_KIND:
                budget, unused = disruption_budget(doc.obj)
                if budget.key in budgets:
                    raise InputError(
                        f"duplicate PodDisruptionBudget {shown(budget.key)}",
                        location="metadata.name",
                    )
                budgets.add(budget.key)
                scenario.warnings += (doc.where(f) + f": {m}" for f, m in unused)
                event = DisruptionBudgetSet(budget=budget)
            elif kind == "PoolReassignment":
                event = pool_reassignment(doc.obj)
            elif kind == "Node":
                node = dra.node(node_spec(doc.obj))
                if node.name in seen_nodes:
                    raise InputError(f"duplicate node {shown(node.name)}", location="metadata.name")
                seen_nodes.add(node.name)
                totals.add_node(node)
                event = NodeAdded(node=node)
                scenario.nodes += 1
            elif kind == "Pod":
                if OWNER_SELECTOR in doc.obj and not doc.parent:
                    raise InputError("not a field of a Pod", location=OWNER_SELECTOR)
                pod = pod_spec(doc.obj, classes)
                if pod.key in seen_pods:
                    raise InputError(f"duplicate pod {shown(pod.key)}", location="metadata.name")
                seen_pods.add(pod.key)
                raw_spec = doc.obj.get("spec")
                raw_spec = raw_spec if isinstance(raw_spec, Mapping) else {}
                check_spelling(raw_spec)
                for field_, message in unused_fields(raw_spec):
                    if not doc.parent or (doc.parent, field_) not in warned:
                        warned.add((doc.parent, field_))
                        scenario.warnings.append(doc.where(field_) + f": {message}")
                if gated(raw_spec):
                    scenario.warnings.append(
                        doc.where("spec.schedulingGates")
                        + ": the pod waits until its scheduling gates are removed, which a "
                        "scenario cannot do: it is not scheduled"
                    )
                    continue
                pod = _with_claims(dra, pod, raw_spec, claimed)
                group_key, minimum = group_membership(doc.obj)
                pod = msgspec.structs.replace(
                    pod, group=group_key, depends_on=dependencies(pod.annotations, pod.namespace)
                )
                if group_key:
                    members.setdefault(group_key, []).append(pod.key)
                if minimum is not None:
                    first = implicit.setdefault(group_key, minimum)
                    if first != minimum:
                        raise InputError(
                            f"min-available {minimum} differs from {first} on an earlier member",
                            location="metadata.labels",
                        )
                scenario.warnings += (
                    doc.where(f) + f": {m}" for f, m in pod_warnings(pod.annotations)
                )
                waits[pod.key] = pod.depends_on
                where_of[pod.key] = doc
                event = PodSubmitted(pod=pod)
                scenario.pods += 1
            elif kind == "Workload":
                scenario.warnings += (
                    doc.where(f) + f": {m}" for f, m in workload_warnings(doc.obj)
                )
                continue
            else:
                continue
            at = doc.at if doc.at is not None else arrival(doc.obj, "metadata.annotations")
            totals.add_times(at, event.pod.runtime if isinstance(event, PodSubmitted) else None)
            scenario.events.append(TimedEvent(at, order, event))
        except InputError as exc:
            raise _located(doc, exc) from None
    _implicit_groups(scenario, groups, implicit)
    cycle = dependency_cycle(waits, members)
    if cycle is not None:
        message, declared_by = cycle
        raise InputError(
            message,
            location=where_of[declared_by].where(f'metadata.annotations["{DEPENDS_ON}"]')
            if declared_by in where_of
            else "",
        )
    # a group is known before its members that arrive at the same instant
    scenario.events.sort(
        key=lambda e: (e.time, e.order, not isinstance(e.event, PodGroupSubmitted))
    )
    return scenario


def _with_claims(
    dra: DraCatalog, pod: PodSpec, raw_spec: Mapping[str, Any], claimed: dict[str, str]
) -> PodSpec:
    """``pod`` asking for the devices of its DRA claims (:mod:`shards.inputs.dra`); a
    claim serves one pod."""
    try:
        pod, names = dra.pod(pod, raw_spec, instantiate=True)
    except ClaimPending as exc:
        raise InputError(f"{exc} is not in the scenario", location="spec.resourceClaims") from None
    for name in names:
        other = claimed.setdefault(f"{pod.namespace}/{name}", pod.key)
        if other != pod.key:
            raise InputError(
                f"ResourceClaim {name} is used by pod {other} too; shoal gives a claim to one pod",
                location="spec.resourceClaims",
            )
    return pod


def _queue_warnings(docs: list[_Doc], queues: KueueQueues, warnings: list[str]) -> None:
    """Warnings for Kueue objects and for the queue-name labels of pods and workload
    objects, once per namespace and queue (:mod:`shards.inputs.kueue`)."""
    if queues:
        queues.resolve()
        by_id = {id(d.obj): d for d in docs}
        warnings += (by_id[i].where(f) + f": {m}" for i, f, m in queues.warnings)
    told: set[tuple[str, str | None]] = set()
    for doc in docs:
        if doc.obj.get("kind") != "Pod" and (
            (doc.obj.get("apiVersion"), doc.obj.get("kind")) not in WORKLOAD_KINDS
        ):
            continue
        try:
            namespace, queue = queue_label(doc.obj)
        except InputError as exc:
            raise _located(doc, exc) from None
        if (namespace, queue) in told:
            continue
        if queues:
            message = queues.queue_warning(namespace, queue)
        elif queue is not None:
            message = "not acted on: the scenario defines no Kueue LocalQueue"
        else:
            message = None
        if message is not None:
            told.add((namespace, queue))
            field_ = f"metadata.labels.{QUEUE_LABEL}" if queue is not None else "metadata.labels"
            warnings.append(f"{doc.where(field_)}: {message}")


def _with_workload_pods(
    docs: list[_Doc],
    classes: dict[str, int],
    warnings: list[str],
    progress: Progress | None = None,
) -> list[_Doc]:
    """``docs`` with each workload object (Deployment, StatefulSet, Job...) replaced by the
    pods its controller creates (see :mod:`shards.inputs.workloads`)."""
    if not any((d.obj.get("apiVersion"), d.obj.get("kind")) in WORKLOAD_KINDS for d in docs):
        return docs
    nodes: list[NodeArrival] = []
    if any(d.obj.get("kind") == "DaemonSet" for d in docs):
        for doc in docs:
            if doc.obj.get("kind") == "Node":
                try:
                    spec = node_spec(doc.obj)
                    nodes.append(NodeArrival(spec, arrival(doc.obj, "metadata.annotations")))
                except InputError as exc:
                    raise _located(doc, exc) from None
    out: list[_Doc] = []
    for i, doc in enumerate(docs):
        if progress is not None:
            progress("creating the workloads' pods", i + 1, len(docs), "objects")
        if (doc.obj.get("apiVersion"), doc.obj.get("kind")) not in WORKLOAD_KINDS:
            out.append(doc)
            continue
        try:
            at = arrival(doc.obj, "metadata.annotations")
            made = expand(doc.obj, at, classes, nodes, MAX_OBJECTS - len(docs) - len(out))
        except InputError as exc:
            raise _located(doc, exc) from None
        warnings += (doc.where(f) + f": {m}" for f, m in made.warnings)
        parent = f"{doc.obj['kind']} {cut(str(doc.obj['metadata']['name']), 80)}"
        out += (_Doc(doc.path, doc.number, pod, parent, when) for pod, when in made.pods)
    return out


def _implicit_groups(
    scenario: Scenario,
    groups: dict[str, tuple[GroupSpec, _Doc]],
    implicit: dict[str, int],
) -> None:
    """Groups declared only by the older labels: one event, when their first member
    arrives (and none where a PodGroup object exists: the object wins)."""
    first_member: dict[str, TimedEvent] = {}
    for timed in scenario.events:
        if isinstance(timed.event, PodSubmitted) and timed.event.pod.group:
            known = first_member.get(timed.event.pod.group)
            if known is None or (timed.time, timed.order) < (known.time, known.order):
                first_member[timed.event.pod.group] = timed
    for key, minimum in implicit.items():
        if key in groups:
            continue
        namespace, name = key.split("/", 1)
        first = first_member[key]
        spec = GroupSpec(namespace=namespace, name=name, min_member=minimum, source="labels")
        scenario.events.append(TimedEvent(first.time, first.order, PodGroupSubmitted(group=spec)))
        scenario.groups += 1


def load_sharding(path: str) -> ShardingSpec:
    """Read a file holding one ``ShardingConfiguration`` document (``--sharding``)."""
    try:
        return _load_sharding(path)
    except InputError as exc:
        raise _tidy(exc) from None


def _load_sharding(path: str) -> ShardingSpec:
    docs = list(_read_documents(path))
    if len(docs) != 1 or docs[0].obj.get("kind") != SHARDING_KIND:
        raise InputError(f"must hold exactly one {SHARDING_KIND} document", location=path)
    try:
        return replace(parse_sharding(docs[0].obj), where=docs[0].where())
    except InputError as exc:
        raise _located(docs[0], exc) from None


def load_config(path: str) -> SchedulerConfig:
    """Read a ``KubeSchedulerConfiguration`` file (``--config``)."""
    try:
        return _load_config(path)
    except InputError as exc:
        raise _tidy(exc) from None


def _load_config(path: str) -> SchedulerConfig:
    raws = [(n, raw) for n, raw in read_documents(path) if raw is not None]
    if len(raws) == 1 and isinstance(raws[0][1], Mapping) and raws[0][1].get("kind") == "Policy":
        number, raw = raws[0]
        where = f"{path}: document {number} (Policy)"
        try:
            if raw.get("apiVersion", "v1") != "v1":
                raise InputError("apiVersion must be v1", location="apiVersion")
            converted, warned = policy_to_config(dict(raw), "")
            config = parse_config(converted, "")
            validate_plugins(config)
        except InputError as exc:
            field_ = exc.location.lstrip(".")
            raise InputError(exc.message, location=f"{where}: {field_}") from None
        return replace(config, warnings=tuple(w.lstrip(".") for w in (*warned, *config.warnings)))
    docs = list(_read_documents(path))
    configs = [d for d in docs if d.obj.get("kind") == CONFIG_KIND]
    if len(configs) != 1 or len(docs) != 1:
        raise InputError(
            f"must hold exactly one {CONFIG_KIND} (or legacy Policy) document", location=path
        )
    try:
        config = parse_config(configs[0].obj, "")
        validate_plugins(config)
        return config
    except InputError as exc:
        raise _located(configs[0], exc) from None


def check_topology(config: SchedulerConfig | None, scenario: Scenario) -> None:
    """Every topology level a pod group names is one the configuration declares."""
    topology = config.topology if config is not None else None
    for level, where in scenario.topology_refs:
        if topology is None or topology.resolve(level) is None:
            declared = topology.describe() if topology is not None else "none"
            raise InputError(
                f"names topology level {shown(level)}, which is not declared "
                f"(levels: {declared}; declare them in the configuration's topology, "
                "a Kueue Topology or Volcano HyperNodes)",
                location=where,
            )


def validate_plugins(config: SchedulerConfig) -> None:
    """Instantiate every profile's plugins (user plugins loaded from their packages):
    unknown names and bad args fail here."""
    from engine.engine import Engine
    from shards.plugins import for_config

    Engine(config, registry=for_config(config).registry)
