"""How nodes fall into pools, pools onto shards, and which pools tenants own.

A ``ShardingConfiguration`` (or the defaults) recorded at the head of a run's log
(``ShardingConfigured``), so that every component, and replay, folds it the same way.
The rules hold at any number of shards, one included: a tenant's exclusive pools are
its own whether they are spread over four shards or all on one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Final

import msgspec

from events.types import SECOND, NodeSelectorRequirement, NodeSelectorTerm, NodeSpec, PodSpec

POOL_LABEL: Final = "shoal.io/pool"
PROTOCOL: Final = 2
"""The coordinator protocol a sharding runs (recorded with it). 1: the router of
earlier versions, which forwarded pods to shards that scheduled on their own; 2: the
coordinator, which decides on its view of every shard and hands over only what one
shard certainly places as one scheduler would. A log of another protocol replays and
reports, but its decisions cannot be re-derived, and no service continues it."""

MAX_SHARDS: Final = 64
"""More shards than this is surely a typo (each is a process and a partition)."""


@dataclass(frozen=True, slots=True)
class PoolRule:
    """Nodes whose labels include every pair of ``match`` belong to ``pool``."""

    match: tuple[tuple[str, str], ...]
    pool: str


@dataclass(frozen=True, slots=True)
class Sharding:
    """How nodes fall into pools and pools onto shards; the coordinator's timing."""

    shards: int
    pools: tuple[tuple[str, int], ...] = ()
    """Pool → shard, as configured; other pools are spread by first appearance."""
    rules: tuple[PoolRule, ...] = ()
    tenants: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Namespace → the pools it owns exclusively."""
    reservation_timeout: int = 30 * SECOND
    retry_backoff: int = 1 * SECOND
    max_retry_backoff: int = 30 * SECOND
    protocol: int = PROTOCOL

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError("at least one shard")

    def to_json(self) -> str:
        return json.dumps(
            {
                "shards": self.shards,
                "pools": [list(p) for p in self.pools],
                "rules": [
                    {"match": [list(m) for m in r.match], "pool": r.pool} for r in self.rules
                ],
                "tenants": [[ns, list(pools)] for ns, pools in self.tenants],
                "reservation_timeout": self.reservation_timeout,
                "retry_backoff": self.retry_backoff,
                "max_retry_backoff": self.max_retry_backoff,
                "protocol": self.protocol,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Sharding:
        raw = json.loads(text)
        return cls(
            shards=int(raw["shards"]),
            pools=tuple((str(p), int(s)) for p, s in raw.get("pools", ())),
            rules=tuple(
                PoolRule(tuple((str(k), str(v)) for k, v in r["match"]), str(r["pool"]))
                for r in raw.get("rules", ())
            ),
            tenants=tuple(
                (str(ns), tuple(map(str, pools))) for ns, pools in raw.get("tenants", ())
            ),
            reservation_timeout=int(raw.get("reservation_timeout", 30 * SECOND)),
            retry_backoff=int(raw.get("retry_backoff", SECOND)),
            max_retry_backoff=int(raw.get("max_retry_backoff", 30 * SECOND)),
            protocol=int(raw.get("protocol", 1)),  # recorded since protocol 2
        )


@dataclass(slots=True)
class Pools:
    """The rules of a sharding that hold on every shard, one included: which pool a node
    is in (its ``shoal.io/pool`` label, else the first rule that matches its labels), and
    the pools tenants own. A node is told with its pool as a label; a pod is held to its
    tenant's pools, or kept off every tenant's pools, by a required node-affinity term on
    that label, so every filter, score and explanation sees the rule as it sees any
    other affinity."""

    rules: tuple[PoolRule, ...] = ()
    tenants: dict[str, tuple[str, ...]] = field(default_factory=dict)
    exclusive: tuple[str, ...] = ()
    """Every pool some tenant owns, sorted."""

    @classmethod
    def of(cls, sharding: Sharding) -> Pools:
        tenants = dict(sharding.tenants)
        owned = sorted({pool for pools in tenants.values() for pool in pools})
        return cls(sharding.rules, tenants, tuple(owned))

    def pool_of(self, spec: NodeSpec) -> str:
        pool = spec.labels.get(POOL_LABEL)
        if pool:
            return pool
        for rule in self.rules:
            if all(spec.labels.get(k) == v for k, v in rule.match):
                return rule.pool
        return ""

    def labelled(self, spec: NodeSpec) -> NodeSpec:
        """``spec`` with its pool as the ``shoal.io/pool`` label (if a rule gives one)."""
        if not self.rules:
            return spec
        pool = self.pool_of(spec)
        if not pool or spec.labels.get(POOL_LABEL) == pool:
            return spec
        return msgspec.structs.replace(spec, labels={**spec.labels, POOL_LABEL: pool})

    def fenced(self, spec: PodSpec) -> PodSpec:
        """``spec`` held to its tenant's pools, or kept off every tenant's pools."""
        if not self.exclusive:
            return spec
        owned = self.tenants.get(spec.namespace)
        if owned is not None:
            requirement = NodeSelectorRequirement(key=POOL_LABEL, operator="In", values=owned)
        else:
            requirement = NodeSelectorRequirement(
                key=POOL_LABEL, operator="NotIn", values=self.exclusive
            )
        terms = spec.required_affinity or (NodeSelectorTerm(),)
        fenced_terms = tuple(
            msgspec.structs.replace(t, match_expressions=(*t.match_expressions, requirement))
            for t in terms
        )
        return msgspec.structs.replace(spec, required_affinity=fenced_terms)
