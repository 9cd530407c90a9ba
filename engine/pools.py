"""How nodes fall into pools, pools onto shards, and which pools tenants own.

A ``ShardingConfiguration`` (or the defaults) recorded at the head of a run's log
(``ShardingConfigured``), so that every component, and replay, folds it the same way.
The rules hold at any number of shards, one included: a tenant's exclusive pools are
its own whether they are spread over four shards or all on one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from events.types import SECOND

POOL_LABEL: Final = "shoal.io/pool"
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
        )
