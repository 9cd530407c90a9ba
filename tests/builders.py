"""Fluent builders for nodes, pods and envelopes: ``make_pod("a").cpu("2").gpu(4)``."""

from __future__ import annotations

from typing import Any

from events.types import (
    SECOND,
    Envelope,
    Event,
    HostPort,
    LabelSelector,
    NodeAdded,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    NodeSpec,
    PodAffinityTerm,
    PodSpec,
    PodSubmitted,
    PreferredSchedulingTerm,
    Taint,
    Toleration,
    TopologySpreadConstraint,
    WeightedPodAffinityTerm,
)
from shards.coordinator.coordinator import RELAY
from shards.inputs.quantity import canonical


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self.name = name
        self._alloc: dict[str, int] = {"cpu": 4000, "memory": 8 << 30, "pods": 110}
        self._labels: dict[str, str] = {}
        self._taints: list[Taint] = []
        self._unschedulable = False

    def cpu(self, q: str | int) -> NodeBuilder:
        self._alloc["cpu"] = canonical("cpu", q)
        return self

    def memory(self, q: str | int) -> NodeBuilder:
        self._alloc["memory"] = canonical("memory", q)
        return self

    def pods(self, n: int) -> NodeBuilder:
        self._alloc["pods"] = n
        return self

    def gpu(self, n: int) -> NodeBuilder:
        self._alloc["nvidia.com/gpu"] = n
        return self

    def resource(self, name: str, q: str | int) -> NodeBuilder:
        self._alloc[name] = canonical(name, q)
        return self

    def label(self, key: str, value: str) -> NodeBuilder:
        self._labels[key] = value
        return self

    def taint(self, key: str, value: str = "", effect: str = "NoSchedule") -> NodeBuilder:
        self._taints.append(Taint(key=key, value=value, effect=effect))
        return self

    def cordoned(self) -> NodeBuilder:
        self._unschedulable = True
        return self

    def annotate(self, **annotations: str) -> NodeBuilder:
        self._annotations = {**getattr(self, "_annotations", {}), **annotations}
        return self

    def spec(self) -> NodeSpec:
        return NodeSpec(
            name=self.name,
            allocatable=dict(self._alloc),
            labels=dict(self._labels),
            taints=tuple(self._taints),
            unschedulable=self._unschedulable,
            annotations=dict(getattr(self, "_annotations", {})),
        )

    def added(self) -> NodeAdded:
        return NodeAdded(node=self.spec())


class PodBuilder:
    def __init__(self, name: str, namespace: str = "default") -> None:
        self.fields: dict[str, Any] = {"namespace": namespace, "name": name, "requests": {}}

    def cpu(self, q: str | int) -> PodBuilder:
        self.fields["requests"]["cpu"] = canonical("cpu", q)
        return self

    def memory(self, q: str | int) -> PodBuilder:
        self.fields["requests"]["memory"] = canonical("memory", q)
        return self

    def gpu(self, n: int) -> PodBuilder:
        self.fields["requests"]["nvidia.com/gpu"] = n
        return self

    def priority(self, value: int) -> PodBuilder:
        self.fields["priority"] = value
        return self

    def group(self, group: str) -> PodBuilder:
        """Member of the pod group ``group`` (``namespace/name``)."""
        self.fields["group"] = group
        return self

    def uid(self, uid: str) -> PodBuilder:
        self.fields["uid"] = uid
        return self

    def runtime(self, seconds: float) -> PodBuilder:
        self.fields["runtime"] = round(seconds * SECOND)
        return self

    def selector(self, **labels: str) -> PodBuilder:
        self.fields["node_selector"] = dict(labels)
        return self

    def on(self, node: str) -> PodBuilder:
        self.fields["node_name"] = node
        return self

    def tolerate(
        self, key: str = "", operator: str = "Exists", value: str = "", effect: str = ""
    ) -> PodBuilder:
        tols = list(self.fields.get("tolerations", ()))
        tols.append(Toleration(key=key, operator=operator, value=value, effect=effect))
        self.fields["tolerations"] = tuple(tols)
        return self

    def require(self, key: str, operator: str, *values: str) -> PodBuilder:
        term = NodeSelectorTerm(
            match_expressions=(NodeSelectorRequirement(key=key, operator=operator, values=values),)
        )
        terms = self.fields.get("required_affinity") or ()
        self.fields["required_affinity"] = (*terms, term)
        return self

    def prefer(self, weight: int, key: str, operator: str, *values: str) -> PodBuilder:
        term = PreferredSchedulingTerm(
            weight=weight,
            preference=NodeSelectorTerm(
                match_expressions=(
                    NodeSelectorRequirement(key=key, operator=operator, values=values),
                )
            ),
        )
        self.fields["preferred_affinity"] = (*self.fields.get("preferred_affinity", ()), term)
        return self

    def member(self, group: str) -> PodBuilder:
        self.fields["group"] = group
        return self

    def scheduler(self, name: str) -> PodBuilder:
        self.fields["scheduler_name"] = name
        return self

    def host_port(self, port: int, protocol: str = "TCP", ip: str = "0.0.0.0") -> PodBuilder:
        ports = {*self.fields.get("host_ports", ()), HostPort(port=port, protocol=protocol, ip=ip)}
        self.fields["host_ports"] = tuple(sorted(ports, key=lambda p: (p.protocol, p.ip, p.port)))
        return self

    def labels(self, **labels: str) -> PodBuilder:
        self.fields["labels"] = {**self.fields.get("labels", {}), **labels}
        return self

    def _term(self, topology: str, match: dict[str, str]) -> PodAffinityTerm:
        return PodAffinityTerm(
            topology_key=topology,
            selector=LabelSelector(match_labels=match),
            namespaces=(self.fields["namespace"],),
        )

    def affine(self, topology: str, **match: str) -> PodBuilder:
        """A required pod affinity term: pods labelled ``match`` in the same domain."""
        terms = self.fields.get("pod_affinity", ())
        self.fields["pod_affinity"] = (*terms, self._term(topology, match))
        return self

    def anti(self, topology: str, **match: str) -> PodBuilder:
        """A required pod anti-affinity term."""
        terms = self.fields.get("pod_anti_affinity", ())
        self.fields["pod_anti_affinity"] = (*terms, self._term(topology, match))
        return self

    def prefer_pods(
        self, weight: int, topology: str, *, anti: bool = False, **match: str
    ) -> PodBuilder:
        """A preferred pod (anti-)affinity term."""
        field = "pod_anti_affinity_preferred" if anti else "pod_affinity_preferred"
        term = WeightedPodAffinityTerm(weight=weight, term=self._term(topology, match))
        self.fields[field] = (*self.fields.get(field, ()), term)
        return self

    def spread(
        self,
        topology: str,
        max_skew: int = 1,
        when: str = "DoNotSchedule",
        min_domains: int = 1,
        **match: str,
    ) -> PodBuilder:
        constraint = TopologySpreadConstraint(
            max_skew=max_skew,
            topology_key=topology,
            when_unsatisfiable=when,
            selector=LabelSelector(match_labels=match),
            min_domains=min_domains,
        )
        self.fields["spread_constraints"] = (
            *self.fields.get("spread_constraints", ()),
            constraint,
        )
        return self

    def spec(self) -> PodSpec:
        return PodSpec(**self.fields)

    def submitted(self) -> PodSubmitted:
        return PodSubmitted(pod=self.spec())


def make_node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def make_pod(name: str, namespace: str = "default") -> PodBuilder:
    return PodBuilder(name, namespace)


def env(event: Event, time: float = 0, producer: str = "test", offset: int = -1) -> Envelope:
    return Envelope(event=event, time=round(time * SECOND), producer=producer, offset=offset)


def relayed(event: Event, shard: int, offset: int, *, time: int = 0) -> Envelope:
    """A shard's report as the coordinator copies it into the control partition (at
    ``offset``, caused by the shard's record of the same offset)."""
    return Envelope(
        event=event,
        offset=offset,
        time=time,
        stream=RELAY,
        producer=f"relay-{shard}",
        causation=offset,
    )
