"""The cluster's objects as shoal events: what ingest has told of each kind, and what a
change to one object tells (no I/O; :class:`shards.kube.ingest.KubeIngest` lists and
watches the objects, hands each change to a handler here, and appends what it returns).

Kinds: Nodes; Pods (unbound ones whose ``schedulerName`` one of the profiles serves,
and bound ones of any scheduler, for accounting); PriorityClasses (pods need them);
the pod-group kinds of scheduler-plugins, and Kubernetes', Volcano's, KAI's and
Tencent's PodGroups (:meth:`Translator._pod_group`, at the version the server serves:
``shards.kube.groups``), and the groups the older coscheduling labels on pods declare
(told once, with their first member, as ``simulate`` does); ElasticQuotas;
PodDisruptionBudgets (at the version :attr:`Translator.budget_versions` names); DRA's
ResourceSlices, DeviceClasses and ResourceClaims (:mod:`shards.kube.draingest`). An
object the scheduler cannot accept is skipped with a warning naming it and the field,
and counted (``rejected``); nothing else is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import msgspec

from events.errors import InputError
from events.types import (
    BudgetSpec,
    DisruptionBudgetDeleted,
    DisruptionBudgetSet,
    Event,
    GroupSpec,
    NodeAdded,
    NodeRemoved,
    NodeSpec,
    NodeUpdated,
    PodBound,
    PodDeleted,
    PodFailed,
    PodGroupSubmitted,
    PodRejected,
    PodSubmitted,
    PodSucceeded,
    QuotaDefined,
)
from shards.inputs.disruption import KIND as BUDGET_KIND
from shards.inputs.disruption import disruption_budget
from shards.inputs.groups import (
    GROUP_KINDS,
    LABELS,
    dependencies,
    elastic_quota,
    group_membership,
    group_warnings,
    pod_group,
)
from shards.inputs.objects import node_spec, pod_spec, priority_class
from shards.inputs.podfields import gated, unused_fields
from shards.kube.devices import cards_of
from shards.kube.draingest import KINDS as DRA_KINDS
from shards.kube.draingest import DraIngest
from shards.kube.reflector import JSON

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER = "default-scheduler"


class Translator:
    """What ingest has told of the cluster's objects; each ``_KIND(kind, obj)`` handler
    takes one change (``kind``: ``ADDED``, ``MODIFIED`` or ``DELETED``) to an object and
    returns the events it tells (none: nothing the scheduler sees changed)."""

    def __init__(self, scheduler_names: Iterable[str] = (DEFAULT_SCHEDULER,)) -> None:
        self.served = set(scheduler_names)
        self.nodes: dict[str, NodeSpec] = {}
        self.pods: dict[str, str] = {}
        """Pod → node it is bound to (``""`` while pending)."""
        self.finished: set[str] = set()
        self.refused: set[str] = set()
        """Pods refused at admission (ignored until deleted)."""
        self.groups: dict[str, str] = {}
        """The pod groups told (``namespace/name``) → the dialect that declared each
        (``labels``: the older coscheduling labels on its pods)."""
        self.label_minimum: dict[str, int] = {}
        """The ``min-available`` of each group told from its pods' labels."""
        self.quotas: dict[str, JSON] = {}
        self.budgets: dict[str, BudgetSpec] = {}
        """The PodDisruptionBudgets told, by ``namespace/name``."""
        self.budget_versions: tuple[str, ...] = ("v1",)
        """The PodDisruptionBudget version asked (``v1``, then ``v1beta1`` for good
        where that is not served)."""
        self.classes: dict[str, int] = {}
        self.dra = DraIngest()
        """DRA slices, classes and claims (watched where the server serves them)."""
        self.rejected: list[str] = []

    def __repr__(self) -> str:
        return f"Translator(nodes={len(self.nodes)}, pods={len(self.pods)})"

    def _reject(self, what: str, exc: InputError) -> list[Event]:
        message = f"{what}: {exc}"
        self.rejected.append(message)
        log.warning("object rejected: %s", message)
        return []

    def _refuse_pod(self, key: str, meta: JSON, exc: InputError) -> list[Event]:
        """A pod refused at admission: reported, and recorded as rejected (the binder
        writes the ``FailedScheduling`` Event on it); its later updates are ignored
        until it is deleted."""
        self._reject(f"Pod {key}", exc)
        self.refused.add(key)
        return [
            PodRejected(
                pod=key,
                reason=f"refused at admission: {exc}"[:1000],
                uid=str(meta.get("uid") or ""),
            )
        ]

    # ------------------------------------------------------------------ kinds

    def _priority_class(self, kind: str, obj: JSON) -> list[Event]:
        name = (obj.get("metadata") or {}).get("name", "")
        if kind == "DELETED":
            self.classes.pop(name, None)
            return []
        try:
            name, value, default = priority_class(obj)
        except InputError as exc:
            return self._reject(f"PriorityClass {name}", exc)
        self.classes[name] = value
        if default:
            self.classes[""] = value
        return []

    def _node(self, kind: str, obj: JSON) -> list[Event]:
        name = (obj.get("metadata") or {}).get("name", "")
        if kind == "DELETED":
            self.dra.node_gone(name)
            return [NodeRemoved(name=name)] if self.nodes.pop(name, None) is not None else []
        try:
            spec = self.dra.node(node_spec(obj))
        except InputError as exc:
            return self._reject(f"Node {name}", exc)
        return self._told(spec)

    def _told(self, spec: NodeSpec) -> list[Event]:
        name = spec.name
        previous = self.nodes.get(name)
        if previous == spec:
            return []
        self.nodes[name] = spec
        return [NodeAdded(node=spec)] if previous is None else [NodeUpdated(node=spec)]

    def _pod_group(
        self, kind: str, obj: JSON, api_version: str = "scheduling.x-k8s.io/v1alpha1"
    ) -> list[Event]:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
        source = GROUP_KINDS[api_version]
        if kind == "DELETED":
            if self.groups.get(key) == source:
                del self.groups[key]  # one created again under its name is told anew
            return []
        if key in self.groups:
            if self.groups[key] == source:
                return []
            first = (
                "a group of that name declared by its pods' labels"
                if self.groups[key] == LABELS
                else f"a {self.groups[key]} PodGroup of that name"
            )
            problem = InputError(
                f"{first} is already scheduled; pods join a group by its name, so this "
                "one is left out"
            )
            return self._reject(f"{source} PodGroup {key}", problem)
        obj = {**obj, "apiVersion": api_version}
        try:
            group = pod_group(obj, self.classes)
            warnings = group_warnings(obj)
        except InputError as exc:
            return self._reject(f"PodGroup {key}", exc)
        for where, message in warnings:
            log.warning("%s PodGroup %s: %s: %s", source, key, where, message)
        self.groups[key] = source
        return [PodGroupSubmitted(group=group)]

    def _labelled_group(self, key: str, minimum: int | None) -> list[Event]:
        """The group a pod names by the older coscheduling labels (no object), with
        ``min-available``: told once, with its first member, unless a PodGroup object of
        that name was told first (the object wins, as in ``simulate``). A member whose
        ``min-available`` differs from the first member's is refused, as ``simulate``
        refuses the scenario."""
        if minimum is None:
            return []
        known = self.groups.get(key)
        if known is None:
            self.groups[key] = LABELS
            self.label_minimum[key] = minimum
            namespace, name = key.split("/", 1)
            spec = GroupSpec(namespace=namespace, name=name, min_member=minimum, source=LABELS)
            return [PodGroupSubmitted(group=spec)]
        first = self.label_minimum.get(key, minimum)
        if known == LABELS and first != minimum:
            raise InputError(
                f"min-available {minimum} differs from {first} on an earlier member",
                location="metadata.labels",
            )
        return []

    def _quota(self, kind: str, obj: JSON) -> list[Event]:
        meta = obj.get("metadata") or {}
        if kind == "DELETED":
            return []
        try:
            return [QuotaDefined(quota=elastic_quota(obj))]
        except InputError as exc:
            return self._reject(f"ElasticQuota {meta.get('namespace')}/{meta.get('name')}", exc)

    def _budget(self, kind: str, obj: JSON) -> list[Event]:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
        if kind == "DELETED":
            known = self.budgets.pop(key, None) is not None
            return [DisruptionBudgetDeleted(budget=key)] if known else []
        version = f"policy/{self.budget_versions[0]}"
        try:
            budget, _ = disruption_budget({**obj, "apiVersion": version, "kind": BUDGET_KIND})
        except InputError as exc:
            return self._reject(f"PodDisruptionBudget {key}", exc)
        if self.budgets.get(key) == budget:
            return []  # its status changed (the disruption controller's count), not it
        self.budgets[key] = budget
        return [DisruptionBudgetSet(budget=budget)]

    def _pod(self, kind: str, obj: JSON) -> list[Event]:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        key = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
        node = spec.get("nodeName") or ""
        phase = (obj.get("status") or {}).get("phase") or "Pending"
        if kind == "DELETED":
            self.finished.discard(key)
            self.refused.discard(key)
            self.dra.forget_pod(key)
            return [PodDeleted(pod=key)] if self.pods.pop(key, None) is not None else []
        if key in self.finished or key in self.refused:
            return []
        if key not in self.pods:
            served = (spec.get("schedulerName") or DEFAULT_SCHEDULER) in self.served
            if phase in ("Succeeded", "Failed") or (not node and not served):
                return []
            if not node and gated(spec):
                return []  # not to be scheduled until its gates are removed (an update)
            try:
                parsed = pod_spec(obj, self.classes)
                group, minimum = group_membership(obj)
                parsed = msgspec.structs.replace(
                    parsed,
                    group=group,
                    node_name="",
                    depends_on=dependencies(parsed.annotations, parsed.namespace),
                )
                claimed = self.dra.pod(key, parsed, obj, bound=bool(node))
            except InputError as exc:
                return self._refuse_pod(key, meta, exc)
            if claimed is None:
                return []  # waits for its DRA claims (shards/kube/draingest.py)
            try:
                told = self._labelled_group(group, minimum)
            except InputError as exc:
                return self._refuse_pod(key, meta, exc)
            parsed = claimed
            if not node:
                for field, message in unused_fields(spec):
                    log.warning("pod %s: %s: %s", key, field, message)
            self.pods[key] = node
            events: list[Event] = [*told, PodSubmitted(pod=parsed)]
            if node:
                observed = self._observed(key, node, meta)
                events.append(self.dra.observed(observed, parsed, self.nodes.get(node)))
            return events
        events = []
        if node and not self.pods[key]:
            self.pods[key] = node
            events.append(self._observed(key, node, meta))
        if phase == "Succeeded":
            self.finished.add(key)
            events.append(PodSucceeded(pod=key, node=node))
        elif phase == "Failed":
            self.finished.add(key)
            events.append(
                PodFailed(pod=key, node=node, reason=(obj.get("status") or {}).get("reason", ""))
            )
        return events

    @staticmethod
    def _observed(key: str, node: str, meta: JSON) -> PodBound:
        """A pod found bound in the cluster (by us or anyone): the shards account for it,
        on the GPU cards its annotations name (none named: the engine charges the cards
        with the most room, so that what runs is counted)."""
        return PodBound(
            pod=key,
            node=node,
            decision_id=f"observed:{meta.get('uid', key)}",
            attempt=0,
            devices=cards_of(meta.get("annotations") or {}),
        )

    def _dra(self, plural: str, kind: str, obj: JSON) -> list[Event]:
        """A DRA object: the nodes whose devices it changes told again, the pods that
        waited for it tried again (:mod:`shards.kube.draingest`)."""
        try:
            nodes, pods = self.dra.changed(plural, kind, obj)
        except InputError as exc:
            name = (obj.get("metadata") or {}).get("name", "")
            return self._reject(f"{DRA_KINDS[plural]} {name}", exc)
        events: list[Event] = []
        for name in nodes:
            try:
                events += self._told(self.dra.node(self.dra.base[name]))
            except InputError as exc:
                events += self._reject(f"Node {name}", exc)
        for key in pods:
            waiting = self.dra.waiting.get(key)
            if waiting is not None:
                events += self._pod("MODIFIED", waiting)
        return events
