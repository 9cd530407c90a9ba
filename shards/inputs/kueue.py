"""Kueue's queues (``kueue.x-k8s.io/v1beta1`` or ``v1beta2``) as shoal's elastic quotas.

shoal's quotas are per namespace (:mod:`engine.model.quota`: each namespace guaranteed
its ``min``, borrowing idle guarantees of others up to its ``max``, all of them
together within the sum of the ``min``s). Kueue's objects map onto them so:

- a ``LocalQueue`` (namespaced; ``spec.clusterQueue``) gives its namespace the quota of
  the ``ClusterQueue`` it names, from when both exist (``shoal.io/arrive-at``);
- a ``ClusterQueue``'s ``nominalQuota`` of a resource, added up over its flavors, is
  the ``min``; with a cohort (``spec.cohort``, or ``cohortName`` in v1beta2) the
  ``max`` is nominal plus ``borrowingLimit`` (added up likewise), unbounded where a
  flavor states no limit (borrowing then stops at what the other queues leave idle);
  without a cohort the queue cannot borrow, and ``max`` is its nominal quota;
- pods (and workload objects) name their LocalQueue by the label
  ``kueue.x-k8s.io/queue-name``.

Where the two models differ, a warning says so: a ClusterQueue that LocalQueues of
several namespaces share (shoal cannot share one quota between namespaces: only the
first namespace is held to it), several cohorts (shoal has one pool), several flavors
of a resource (their quotas are added up; the flavors' node labels are not put in the
pods' node selectors), ``lendingLimit``, Kueue's own preemption and queueing
strategies, a pod whose label names no LocalQueue, and pods without the label in a
namespace with a queue (Kueue would leave them alone; shoal counts them). Kueue
admits a whole workload's requests at once; shoal admits pod by pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from events.errors import InputError
from events.types import QuotaSpec
from shards.inputs.fields import _list
from shards.inputs.limits import MAX_QUANTITY, shown
from shards.inputs.objects import _map, _name, _string_map
from shards.inputs.quantity import canonical

VERSIONS: Final = ("kueue.x-k8s.io/v1beta1", "kueue.x-k8s.io/v1beta2")
QUEUE_KINDS: Final = ("ClusterQueue", "LocalQueue", "ResourceFlavor")
KINDS: Final = {(version, kind) for version in VERSIONS for kind in QUEUE_KINDS}
QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
_CLUSTER_QUEUE_WARNED: Final = {
    "namespaceSelector": "the LocalQueues that name it say which namespaces use it",
    "queueingStrategy": "pods are taken in shoal's queue order (priority, then arrival)",
    "preemption": "shoal's quota reclaim applies (a namespace within its nominal quota "
    "takes back what others borrow; its own lower-priority pods make room otherwise)",
    "flavorFungibility": "flavors are not modelled: their quotas are added up",
    "stopPolicy": "the queue is never stopped",
    "admissionChecks": "admission checks are not simulated",
    "admissionChecksStrategy": "admission checks are not simulated",
    "admissionScope": "admission is per namespace's quota",
    "fairSharing": "borrowing follows shoal's quota rules, not fair sharing weights",
}
_FLAVOR_WARNED: Final = {
    "nodeLabels": "the flavor's node labels are not added to the pods' node selectors",
    "nodeTaints": "the flavor's taints are not checked against the pods' tolerations",
    "tolerations": "the flavor's tolerations are not added to the pods",
    "topologyName": "topology-aware scheduling reads a Topology object, not a flavor's",
}


@dataclass(frozen=True, slots=True)
class ClusterQueue:
    name: str
    cohort: str
    nominal: dict[str, int]
    borrowing: dict[str, int | None]
    """Per resource: the borrowing limit added up over its flavors; None: unbounded."""

    def quota(self, namespace: str) -> QuotaSpec:
        maximum: dict[str, int] = {}
        for resource, amount in self.nominal.items():
            limit = self.borrowing.get(resource, None) if self.cohort else 0
            if limit is not None:
                maximum[resource] = min(amount + limit, MAX_QUANTITY)
        return QuotaSpec(namespace=namespace, name=self.name, min=self.nominal, max=maximum)


@dataclass
class KueueQueues:
    """The Kueue objects of a scenario, read in a first pass in document order; each
    is known by a key its reader chooses, and warnings are (key, field, message)."""

    cluster_queues: dict[str, tuple[ClusterQueue, int]] = field(default_factory=dict)
    local_queues: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    """(namespace, name) → (ClusterQueue, document key), in document order."""
    warnings: list[tuple[int, str, str]] = field(default_factory=list)
    chosen: dict[int, QuotaSpec] = field(default_factory=dict)
    """LocalQueue's key → the quota it gives its namespace."""

    def __bool__(self) -> bool:
        return bool(self.cluster_queues or self.local_queues)

    def add(self, index: int, obj: Mapping[str, Any]) -> None:
        kind = obj["kind"]
        meta = _map(obj.get("metadata"), "metadata", required=True)
        name = _name(meta, "metadata")
        spec = _map(obj.get("spec"), "spec")
        if kind == "ResourceFlavor":
            self._fields(index, spec, (), _FLAVOR_WARNED, "ResourceFlavor")
        elif kind == "LocalQueue":
            namespace = _str_field(meta.get("namespace", "default"), "metadata.namespace")
            self._fields(index, spec, ("clusterQueue",), {}, "LocalQueue", ("stopPolicy",))
            target = _str_field(spec.get("clusterQueue"), "spec.clusterQueue")
            if (namespace, name) in self.local_queues:
                raise InputError(
                    f"duplicate LocalQueue {shown(f'{namespace}/{name}')}", location="metadata.name"
                )
            self.local_queues[(namespace, name)] = (target, index)
        else:
            if name in self.cluster_queues:
                raise InputError(f"duplicate ClusterQueue {shown(name)}", location="metadata.name")
            self.cluster_queues[name] = (self._cluster_queue(index, name, spec), index)

    def _fields(
        self,
        index: int,
        spec: Mapping[str, Any],
        acted: tuple[str, ...],
        warned: Mapping[str, str],
        kind: str,
        inert: tuple[str, ...] = (),
    ) -> None:
        known = (*acted, *warned, *inert)
        for key in spec:
            if key not in known:
                raise InputError(
                    f"unknown field (a {kind} has: {', '.join(sorted(known))})",
                    location=f"spec.{key}",
                )
            if key in warned and spec[key] not in (None, [], {}, ""):
                self.warnings.append((index, f"spec.{key}", f"not acted on: {warned[key]}"))

    def _cluster_queue(self, index: int, name: str, spec: Mapping[str, Any]) -> ClusterQueue:
        self._fields(
            index, spec, ("cohort", "cohortName", "resourceGroups"), _CLUSTER_QUEUE_WARNED, ""
        )
        cohort = _str_field(spec.get("cohort", spec.get("cohortName", "")), "spec.cohort")
        nominal: dict[str, int] = {}
        borrowing: dict[str, int | None] = {}
        for g, raw_group in enumerate(_list(spec.get("resourceGroups"), "spec.resourceGroups")):
            where = f"spec.resourceGroups[{g}]"
            group = _map(raw_group, where, required=True)
            covered = _list(group.get("coveredResources"), f"{where}.coveredResources")
            flavors = _list(group.get("flavors"), f"{where}.flavors")
            if not flavors:
                raise InputError("needs at least one flavor", location=f"{where}.flavors")
            if len(flavors) > 1:
                self.warnings.append(
                    (
                        index,
                        f"{where}.flavors",
                        "not acted on: flavors are not modelled: their quotas are added up",
                    )
                )
            for f, raw_flavor in enumerate(flavors):
                loc = f"{where}.flavors[{f}]"
                flavor = _map(raw_flavor, loc, required=True)
                _str_field(flavor.get("name"), f"{loc}.name")
                for r, raw_resource in enumerate(
                    _list(flavor.get("resources"), f"{loc}.resources")
                ):
                    at = f"{loc}.resources[{r}]"
                    resource, amount, limit = self._resource(index, at, raw_resource, covered)
                    nominal[resource] = nominal.get(resource, 0) + amount
                    if limit is None:
                        borrowing[resource] = None  # unbounded: one flavor states no limit
                    elif resource not in borrowing or borrowing[resource] is not None:
                        borrowing[resource] = (borrowing.get(resource) or 0) + limit
        for resource, amount in nominal.items():
            if amount > MAX_QUANTITY:
                raise InputError(
                    f"the nominal quotas of {resource} add up to more than {MAX_QUANTITY}",
                    location="spec.resourceGroups",
                )
        return ClusterQueue(name=name, cohort=cohort, nominal=nominal, borrowing=borrowing)

    def _resource(
        self, index: int, where: str, raw: Any, covered: list[Any]
    ) -> tuple[str, int, int | None]:
        """(resource, nominal quota, borrowing limit or None) of one flavor's resource."""
        item = _map(raw, where, required=True)
        for key in item:
            if key not in ("name", "nominalQuota", "borrowingLimit", "lendingLimit"):
                raise InputError(
                    "unknown field (name, nominalQuota, borrowingLimit, lendingLimit)",
                    location=f"{where}.{key}",
                )
        resource = _str_field(item.get("name"), f"{where}.name")
        if covered and resource not in covered:
            raise InputError(
                f"{shown(resource)} is not among the group's coveredResources",
                location=f"{where}.name",
            )
        if item.get("lendingLimit") is not None:
            self.warnings.append(
                (
                    index,
                    f"{where}.lendingLimit",
                    "not acted on: every queue's unused nominal quota may be borrowed",
                )
            )
        amount = _quantity(resource, item.get("nominalQuota"), f"{where}.nominalQuota")
        raw_limit = item.get("borrowingLimit")
        limit = (
            None if raw_limit is None else _quantity(resource, raw_limit, f"{where}.borrowingLimit")
        )
        return resource, amount, limit

    def resolve(self) -> None:
        """Choose each namespace's quota (the first LocalQueue, in document order, whose
        ClusterQueue exists and serves no other namespace) and warn for the rest."""
        serves: dict[str, str] = {}
        namespaces: dict[str, str] = {}
        cohorts: dict[str, str] = {}
        for name, (queue, index) in self.cluster_queues.items():
            if queue.cohort and cohorts and queue.cohort not in cohorts:
                first = next(iter(cohorts.items()))
                self.warnings.append(
                    (
                        index,
                        "spec.cohort",
                        f"not acted on: cohorts are not kept apart (shoal has one pool): it "
                        f"borrows with {first[1]} of cohort {first[0]}",
                    )
                )
            if queue.cohort:
                cohorts.setdefault(queue.cohort, name)
        for (namespace, _), (target, index) in self.local_queues.items():  # document order
            found = self.cluster_queues.get(target)
            why = ""
            if found is None:
                why = f"names ClusterQueue {shown(target)}, which the scenario does not define"
            elif serves.get(target, namespace) != namespace:
                why = (
                    f"ClusterQueue {shown(target)} already serves namespace "
                    f"{shown(serves[target])}; shoal's quotas are per namespace, so this "
                    "namespace's pods are not held to it"
                )
            elif namespaces.get(namespace, target) != target:
                why = (
                    f"namespace {shown(namespace)} already has ClusterQueue "
                    f"{shown(namespaces[namespace])}; shoal gives a namespace one quota"
                )
            if why:
                self.warnings.append((index, "spec.clusterQueue", f"not acted on: {why}"))
                continue
            assert found is not None
            if namespace not in namespaces:
                self.chosen[index] = found[0].quota(namespace)
            serves[target] = namespace
            namespaces[namespace] = target

    def queue_warning(self, namespace: str, queue: str | None) -> str | None:
        """What a pod (or workload) of ``namespace`` with ``queue`` in its queue-name
        label (None: no label) is warned of, or None."""
        if queue is None:
            if any(q.namespace == namespace for q in self.chosen.values()):
                return (
                    f"a pod without the label {QUEUE_LABEL} in namespace {shown(namespace)}: "
                    "Kueue would not manage it; shoal counts it against the namespace's "
                    "quota (quotas are per namespace)"
                )
            return None
        known = self.local_queues.get((namespace, queue))
        if known is None:
            return (
                f"not acted on: names LocalQueue {shown(queue)}, which the scenario does not "
                f"define in namespace {shown(namespace)}"
            )
        return None


def _str_field(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"must be a string, got {shown(value)}", location=where)
    return value


def _quantity(resource: str, amount: Any, where: str) -> int:
    if amount is None:
        raise InputError("missing quantity", location=where)
    try:
        return canonical(resource, amount)
    except InputError as exc:
        raise InputError(exc.message, location=where) from None


def queue_label(obj: Mapping[str, Any]) -> tuple[str, str | None]:
    """(namespace, the queue-name label or None) of a pod or workload object."""
    meta = _map(obj.get("metadata"), "metadata")
    namespace = meta.get("namespace", "default")
    labels = _string_map(meta.get("labels"), "metadata.labels")
    return str(namespace), labels.get(QUEUE_LABEL)
