"""Which shard owns which node: pools onto shards, nodes into pools.

A node's pool is its ``shoal.io/pool`` label, or the first pool rule its labels match
(:class:`engine.model.pools.Pools`); a node in no pool is spread by a stable hash of its
name. A pool belongs to the shard the sharding configuration pins it to, else to the
shards in turn by first appearance. An operator may move a pool to another shard
(``PoolReassigned``): the old owner hands its nodes over, with what runs there, and the
new owner takes them (``PoolReleased`` → ``PoolHandedOver`` → ``PodAdopted``).

The coordinator keeps every node in its own view (an engine over the whole cluster);
:attr:`Routing.slot_shard` says which shard owns each of that view's slots, so that
counting a pod's feasible nodes per shard is one vectorised step.
"""

from __future__ import annotations

import zlib

import numpy as np
import numpy.typing as npt

from engine.model.pools import POOL_LABEL, Sharding
from events.types import NodeSpec

NONE = -1
"""``slot_shard`` of a slot that holds no node (or one no shard owns while it moves)."""


class Routing:
    def __init__(self, sharding: Sharding) -> None:
        self.n = sharding.shards
        self.pool_shard: dict[str, int] = dict(sharding.pools)
        self.pools_seen = 0
        self.node_shard: dict[str, int] = {}
        self.node_pool: dict[str, str] = {}
        self.moving: dict[str, tuple[str, ...]] = {}
        """Pools handed over by their old owner and not yet taken over: their nodes."""
        self.slot_shard: npt.NDArray[np.int64] = np.full(64, NONE, dtype=np.int64)

    def __repr__(self) -> str:
        return f"Routing(shards={self.n}, nodes={len(self.node_shard)})"

    def shard_of_pool(self, pool: str) -> int:
        shard = self.pool_shard.get(pool)
        if shard is None:
            shard = self.pool_shard[pool] = self.pools_seen % self.n
            self.pools_seen += 1
        return shard

    def shard_for(self, spec: NodeSpec) -> int:
        """The shard that owns ``spec`` (labelled with its pool, if it has one)."""
        pool = spec.labels.get(POOL_LABEL, "")
        if pool:
            return self.shard_of_pool(pool)
        return zlib.crc32(spec.name.encode()) % self.n

    def own(self, spec: NodeSpec, shard: int, slot: int) -> None:
        self.node_shard[spec.name] = shard
        self.node_pool[spec.name] = spec.labels.get(POOL_LABEL, "")
        self._set_slot(slot, shard)

    def forget(self, name: str, slot: int | None) -> int | None:
        """``name`` is gone; the shard that owned it."""
        self.node_pool.pop(name, None)
        if slot is not None:
            self._set_slot(slot, NONE)
        return self.node_shard.pop(name, None)

    def _set_slot(self, slot: int, shard: int) -> None:
        if slot >= self.slot_shard.shape[0]:
            grown = np.full(max(slot + 1, 2 * self.slot_shard.shape[0]), NONE, dtype=np.int64)
            grown[: self.slot_shard.shape[0]] = self.slot_shard
            self.slot_shard = grown
        self.slot_shard[slot] = shard

    def reassign(self, pool: str, shard: int) -> tuple[int, tuple[str, ...]] | None:
        """Move ``pool`` to ``shard``: (its old owner, its nodes) when nodes must be handed
        over; new work for the pool goes to the new owner at once."""
        if not 0 <= shard < self.n:
            return None  # ingest validates; a record naming no shard changes nothing
        old = self.pool_shard.get(pool)
        self.pool_shard[pool] = shard
        if old is None or old == shard:
            return None
        nodes = tuple(sorted(n for n, p in self.node_pool.items() if p == pool))
        for name in nodes:
            del self.node_shard[name]
        self.moving[pool] = nodes
        return old, nodes
