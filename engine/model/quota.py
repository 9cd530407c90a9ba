"""Elastic quotas (``ElasticQuota``: guaranteed ``min``, borrowable up to ``max``).

The rules of kube scheduler-plugins' CapacityScheduling, per resource:

- a namespace never uses more than its ``max``;
- it may use more than its ``min`` only by borrowing what other quotas' ``min`` leaves
  idle: the quotas' total use stays within the sum of their ``min``;
- what is lent can be taken back: a pod within its namespace's ``min`` may preempt
  pods of namespaces above theirs (see ``engine.preemption``).

Namespaces without a quota are not limited. Amounts are canonical integers per resource
name; a request counts ``pods`` too, but quotas only constrain the resources they name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from engine.model.resources import ResourceIndex
from engine.model.state import Request
from events.types import QuotaSpec


@dataclass(slots=True)
class Quota:
    spec: QuotaSpec
    used: dict[str, int] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return self.spec.namespace

    def borrowing(self) -> bool:
        """Uses more than its ``min`` of some resource."""
        return any(self.used.get(r, 0) > self.spec.min.get(r, 0) for r in self.used if self.used[r])

    def over_max_with(self, wanted: Mapping[str, int]) -> str | None:
        for resource, amount in wanted.items():
            limit = self.spec.max.get(resource)
            if limit is not None and self.used.get(resource, 0) + amount > limit:
                return resource
        return None

    def within_min_with(self, wanted: Mapping[str, int]) -> bool:
        return all(
            self.used.get(r, 0) + amount <= self.spec.min.get(r, 0)
            for r, amount in wanted.items()
            if r in self.spec.min or r in self.spec.max
        )


class QuotaTable:
    """Quotas by namespace, with their use kept in step with the cluster state."""

    def __init__(self, resources: ResourceIndex) -> None:
        self.resources = resources
        self.quotas: dict[str, Quota] = {}
        self._usage: dict[str, dict[str, int]] = {}
        """Use of every namespace (with or without a quota), so a quota defined late
        starts from the truth."""

    def __repr__(self) -> str:
        return f"QuotaTable({sorted(self.quotas)})"

    def __bool__(self) -> bool:
        return bool(self.quotas)

    def define(self, spec: QuotaSpec) -> None:
        self.quotas[spec.namespace] = Quota(spec, self._usage.setdefault(spec.namespace, {}))

    def get(self, namespace: str) -> Quota | None:
        return self.quotas.get(namespace)

    def _named(self, request: Request) -> dict[str, int]:
        return {self.resources.name(row): amount for row, amount in request}

    def add(self, namespace: str, request: Request) -> None:
        used = self._usage.setdefault(namespace, {})
        for row, amount in request:
            name = self.resources.name(row)
            used[name] = used.get(name, 0) + amount

    def remove(self, namespace: str, request: Request) -> None:
        used = self._usage.setdefault(namespace, {})
        for row, amount in request:
            name = self.resources.name(row)
            used[name] = used.get(name, 0) - amount

    def admit(self, namespace: str, request: Request) -> tuple[str, bool] | None:
        """Why the quota refuses ``request`` now, and whether taking back lent capacity
        could change that (the pod is within its own ``min``); None if admitted."""
        quota = self.quotas.get(namespace)
        if quota is None:
            return None
        wanted = {
            r: a for r, a in self._named(request).items() if r != "pods" or r in quota.spec.max
        }
        over = quota.over_max_with(wanted)
        if over is not None:
            limit = quota.spec.max[over]
            return (f"elastic quota {namespace}: {over} would exceed its max ({limit})", False)
        for resource, amount in wanted.items():
            if resource not in quota.spec.min and resource not in quota.spec.max:
                continue
            total_min = sum(q.spec.min.get(resource, 0) for q in self.quotas.values())
            total_used = sum(q.used.get(resource, 0) for q in self.quotas.values())
            if total_used + amount > total_min and not quota.within_min_with({resource: amount}):
                return (
                    f"elastic quota {namespace}: no idle guaranteed {resource} to borrow "
                    f"(quotas use {total_used} of {total_min} guaranteed)",
                    False,
                )
            if total_used + amount > total_min:
                return (
                    f"elastic quota {namespace}: its guaranteed {resource} is lent out",
                    True,
                )
        return None

    def dominant_share(self, namespace: str, capacity: Mapping[str, int]) -> float:
        """The namespace's largest share of any cluster resource (DRF)."""
        used = self._usage.get(namespace, {})
        share = 0.0
        for resource, amount in used.items():
            total = capacity.get(resource, 0)
            if total > 0 and amount > 0:
                share = max(share, amount / total)
        return share

    def reclaimable(self, namespace: str) -> bool:
        """Pods of ``namespace`` hold lent capacity that may be taken back."""
        quota = self.quotas.get(namespace)
        return quota is not None and quota.borrowing()

    def check(self) -> Iterable[str]:
        """Quotas above their max (never expected; used by invariant checks)."""
        for quota in self.quotas.values():
            for resource, limit in quota.spec.max.items():
                if quota.used.get(resource, 0) > limit:
                    yield f"{quota.namespace} uses {quota.used[resource]} {resource} > max {limit}"
