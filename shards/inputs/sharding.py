"""The sharding documents of a scenario: ``ShardingConfiguration`` (node pools, their
shards, tenants' pools) and ``PoolReassignment`` (a pool moved to another shard at a
time), both ``shoal.io/v1alpha1``. Errors name the field; the caller prefixes file and
document."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

from engine.model.pools import MAX_SHARDS, PoolRule, Sharding
from events.errors import InputError
from events.types import SECOND, PoolReassigned
from shards.inputs.limits import shown

SHARDING_VERSION: Final = "shoal.io/v1alpha1"
SHARDING_KIND: Final = "ShardingConfiguration"


@dataclass(frozen=True, slots=True)
class ShardingSpec:
    """A ``ShardingConfiguration`` document: pools, their shards, tenants' pools."""

    pools: tuple[tuple[str, int | None, tuple[tuple[str, str], ...]], ...] = ()
    """(pool, shard or None for "spread", node labels that put a node in it)."""
    tenants: tuple[tuple[str, tuple[str, ...]], ...] = ()
    reservation_timeout: int | None = None
    where: str = SHARDING_KIND
    """Where it was read (file and document), to name in errors."""

    def sharding(self, shards: int) -> Sharding:
        """The router's configuration for ``shards`` shards; a pool pinned to a shard
        that does not exist is an input error."""
        for i, (name, shard, _) in enumerate(self.pools):
            if shard is not None and shard >= shards:
                raise InputError(
                    f"pool {shown(name)} is assigned to shard {shard}, but there are {shards} "
                    f"(shards 0..{shards - 1})",
                    location=f"{self.where}: pools[{i}].shard",
                )
        extra = (
            {}
            if self.reservation_timeout is None
            else {"reservation_timeout": self.reservation_timeout}
        )
        return Sharding(
            shards=shards,
            pools=tuple((name, shard) for name, shard, _ in self.pools if shard is not None),
            rules=tuple(PoolRule(match, name) for name, _, match in self.pools if match),
            tenants=self.tenants,
            **extra,
        )


def parse_sharding(raw: Mapping[str, Any]) -> ShardingSpec:
    """Validate a ``ShardingConfiguration``::

    apiVersion: shoal.io/v1alpha1
    kind: ShardingConfiguration
    pools:
    - name: a100            # nodes labelled shoal.io/pool=a100 belong to it, and
      shard: 0              # (optional) pinned to shard 0; else spread in turn
      nodeSelector:         # (optional) ...and so do nodes with these labels
        gpu-model: a100
    tenants:
    - namespace: research   # research's pods run only on these pools, and nobody
      pools: [a100]         # else's pods run there
    reservationTimeoutSeconds: 30
    """
    _only(
        raw, ("apiVersion", "kind", "metadata", "pools", "tenants", "reservationTimeoutSeconds"), ""
    )
    pools: list[tuple[str, int | None, tuple[tuple[str, str], ...]]] = []
    names: set[str] = set()
    raw_pools = raw.get("pools", [])
    if not isinstance(raw_pools, list):
        raise InputError("must be a list", location="pools")
    for i, item in enumerate(raw_pools):
        where = f"pools[{i}]"
        if not isinstance(item, Mapping):
            raise InputError("must be a mapping", location=where)
        _only(item, ("name", "shard", "nodeSelector"), where)
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise InputError("needs a name", location=f"{where}.name")
        if name in names:
            raise InputError(f"duplicate pool {shown(name)}", location=f"{where}.name")
        names.add(name)
        shard = item.get("shard")
        if shard is not None and not _is_shard(shard):
            raise InputError(_SHARD_NUMBER, location=f"{where}.shard")
        selector = item.get("nodeSelector", {})
        if not isinstance(selector, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
        ):
            raise InputError("must map label keys to values", location=f"{where}.nodeSelector")
        pools.append((name, shard, tuple(sorted(selector.items()))))
    tenants: list[tuple[str, tuple[str, ...]]] = []
    raw_tenants = raw.get("tenants", [])
    if not isinstance(raw_tenants, list):
        raise InputError("must be a list", location="tenants")
    owned: dict[str, str] = {}
    for i, item in enumerate(raw_tenants):
        where = f"tenants[{i}]"
        if not isinstance(item, Mapping):
            raise InputError("must be a mapping", location=where)
        _only(item, ("namespace", "pools"), where)
        namespace = item.get("namespace")
        wanted = item.get("pools")
        if not isinstance(namespace, str) or not namespace:
            raise InputError("needs a namespace", location=f"{where}.namespace")
        if (
            not isinstance(wanted, list)
            or not wanted
            or not all(isinstance(p, str) for p in wanted)
        ):
            raise InputError("must be a non-empty list of pool names", location=f"{where}.pools")
        for pool in wanted:
            if pool in owned:
                raise InputError(
                    f"pool {shown(pool)} is already owned by {shown(owned[pool])}",
                    location=f"{where}.pools",
                )
            owned[pool] = namespace
        tenants.append((namespace, tuple(wanted)))
    timeout = raw.get("reservationTimeoutSeconds")
    if timeout is not None and (
        not isinstance(timeout, int | float)
        or isinstance(timeout, bool)
        or not 1 / SECOND <= timeout <= 3600
    ):
        raise InputError(
            "must be a number of seconds in (0, 3600]", location="reservationTimeoutSeconds"
        )
    return ShardingSpec(
        pools=tuple(pools),
        tenants=tuple(tenants),
        reservation_timeout=None if timeout is None else max(int(timeout * SECOND), 1),
    )


_SHARD_NUMBER: Final = f"must be a shard number, 0 to {MAX_SHARDS - 1}"


def _is_shard(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_SHARDS


def _only(raw: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    """Refuse a field shoal would otherwise ignore (a typo must not pass silently)."""
    for key in raw:
        if key not in known:
            location = f"{where}.{key}" if where else str(key)
            raise InputError(f"unknown field (known: {', '.join(known)})", location=location)


def pool_reassignment(raw: Mapping[str, Any]) -> PoolReassigned:
    """``kind: PoolReassignment`` (``spec: {pool: a100, shard: 1}``; the
    ``shoal.io/arrive-at`` annotation says when): move a node pool to another shard."""
    spec = raw.get("spec")
    if not isinstance(spec, Mapping):
        raise InputError("must be a mapping", location="spec")
    _only(spec, ("pool", "shard"), "spec")
    pool, shard = spec.get("pool"), spec.get("shard")
    if not isinstance(pool, str) or not pool:
        raise InputError("needs a pool name", location="spec.pool")
    if not _is_shard(shard):
        raise InputError(_SHARD_NUMBER, location="spec.shard")
    return PoolReassigned(pool=pool, shard=shard)
