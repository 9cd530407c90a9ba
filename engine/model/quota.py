"""Elastic quotas (scheduler-plugins' ``ElasticQuota``), as CapacityScheduling reads them.

A namespace with a quota is guaranteed its ``min`` and may use up to its ``max``, but
quota'd namespaces together never use more of a resource than their ``min``s add up to:
a namespace goes beyond its own ``min`` only by borrowing what others leave idle. So a
pod is admitted when, for each resource it asks for that its quota names:

- its namespace stays within its ``max``, and
- every quota naming the resource together stays within the sum of their ``min``.

A quota constrains only the resources it names (in ``min`` or ``max``); ``pods`` counts
only when ``max`` names it. When the sum is exceeded and the pod's namespace is still
within its own ``min`` (with the pod), the pod may take back what others borrow beyond
theirs (the reclaim, in ``engine.plugins.preemption``); otherwise only the namespace's
own lower-priority pods can make room.

Usage is kept for every namespace, quota or not, so that a quota defined late starts
from the truth.

**GPUs.** Every request that takes a card counts in ``nvidia.com/gpu`` (the rule is
:func:`engine.model.devices.quota_milli`): whole cards and HAMi vGPUs (whatever their
``gpucores``/``gpumem``: CapacityScheduling counts the requested ``nvidia.com/gpu``)
one card each, a milli-card share (``shoal.io/gpu-milli``, Koordinator's
``gpu-core`` below 100) its part of a card. So the table keeps ``nvidia.com/gpu`` in
milli-cards (:data:`GPU_SCALE` times the quota's own unit, compared with ``min`` and
``max`` scaled alike); a quota may also name ``shoal.io/gpu-milli``, the same count in
milli-cards. The resources that describe a share (``nvidia.com/gpucores``,
``koordinator.sh/gpu-core``...) are not counted by name (they are never requests of
their own): ``nvidia.com/gpu`` is how a quota bounds them. A quota's max is never
exceeded, however the cards are shared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from engine.model.devices import GPU, SHOAL_MILLI, WHOLE, quota_milli
from engine.model.resources import ResourceIndex
from engine.model.state import Request
from events.types import QuotaSpec

GPU_SCALE: Final = WHOLE
"""The table counts ``nvidia.com/gpu`` in milli-cards: a quota's amount times this."""
_CHARGED: Final = 4096
"""Requests whose charge a quota table keeps; beyond, it starts again."""


def scale(resource: str) -> int:
    """Units of the table per unit of a quota's ``min``/``max`` of ``resource``."""
    return GPU_SCALE if resource == GPU else 1


def shown(resource: str, amount: int) -> str:
    """``amount`` of the table in a quota's units (``1.5`` cards)."""
    if resource == GPU:
        return f"{amount / GPU_SCALE:g}"
    return str(amount)


def quantity(resource: str, amount: int) -> str:
    """``amount`` of the table as a quota's ``min``/``max`` spells it: cards (``1.5``),
    CPU as cores or millicores (``2``, ``500m``), memory in ``Gi``/``Mi`` where whole
    (else bytes), anything else as the number."""
    if resource == GPU:
        return shown(resource, amount)
    if resource == "cpu":
        return f"{amount // 1000}" if amount % 1000 == 0 else f"{amount}m"
    if resource == "memory" and amount:
        for suffix, size in (("Gi", 2**30), ("Mi", 2**20)):
            if amount % size == 0:
                return f"{amount // size}{suffix}"
    return str(amount)


@dataclass(slots=True)
class Quota:
    spec: QuotaSpec
    used: dict[str, int] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return self.spec.namespace

    def names(self, resource: str) -> bool:
        return resource in self.spec.min or resource in self.spec.max

    def max_of(self, resource: str) -> int | None:
        """The ``max`` of ``resource`` in the table's units (None: no max)."""
        limit = self.spec.max.get(resource)
        return None if limit is None else limit * scale(resource)

    def min_of(self, resource: str) -> int:
        """The ``min`` of ``resource`` in the table's units (0 when not named)."""
        return self.spec.min.get(resource, 0) * scale(resource)

    def over_max_with(self, wanted: Mapping[str, int]) -> str | None:
        for resource, amount in wanted.items():
            limit = self.max_of(resource)
            if limit is not None and self.used.get(resource, 0) + amount > limit:
                return resource
        return None

    def within_min_with(self, wanted: Mapping[str, int]) -> bool:
        """With ``wanted`` on top, still within ``min`` in every resource it names."""
        return all(
            self.used.get(r, 0) + amount <= self.min_of(r)
            for r, amount in wanted.items()
            if self.names(r)
        )

    def borrowing(self, resources: Iterable[str] | None = None) -> bool:
        """Uses more than its ``min`` of some resource (of ``resources``, if given)."""
        names = self.used if resources is None else resources
        return any(self.used.get(r, 0) > self.min_of(r) for r in names if self.names(r))


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a quota refuses a pod now."""

    reason: str
    resources: tuple[str, ...]
    """The resources short (over the namespace's max, or over the sum of the mins)."""
    reclaim: bool
    """The pod's namespace is within its own ``min`` with the pod: it may take back what
    others borrow. Otherwise only its own lower-priority pods can make room."""


class QuotaTable:
    """Quotas by namespace, with their use kept in step with the cluster state."""

    def __init__(self, resources: ResourceIndex) -> None:
        self.resources = resources
        self.quotas: dict[str, Quota] = {}
        self._usage: dict[str, dict[str, int]] = {}
        """Use of every namespace (with or without a quota), so a quota defined late
        starts from the truth."""
        self._charged: dict[Request, dict[str, int]] = {}
        """:meth:`named` per request, as :meth:`add` and :meth:`remove` charge it (pods
        of one template share their request), for ``_charged_at`` resources."""
        self._charged_at = (-1, -1)

    def __repr__(self) -> str:
        return f"QuotaTable({sorted(self.quotas)})"

    def __bool__(self) -> bool:
        return bool(self.quotas)

    def define(self, spec: QuotaSpec) -> None:
        self.quotas[spec.namespace] = Quota(spec, self._usage.setdefault(spec.namespace, {}))

    def get(self, namespace: str) -> Quota | None:
        return self.quotas.get(namespace)

    def named(self, request: Request) -> dict[str, int]:
        """What ``request`` counts in quotas, by resource name: its rows, with its GPU
        cards (whole or shares) in milli-cards as ``nvidia.com/gpu`` and
        ``shoal.io/gpu-milli`` (see the module docstring)."""
        resources = self.resources
        needs = resources.card_needs
        gpu_row = resources.get(GPU)
        out: dict[str, int] = {}
        milli = 0
        if not needs:
            # no card rows (no pod has asked for cards): the loop below without them
            # (asked for every pod the coordinator hands over)
            name = resources.name
            for row, amount in request:
                if row == gpu_row:
                    milli += amount * GPU_SCALE
                else:
                    out[name(row)] = amount
            if milli:
                out[GPU] = milli
                out[SHOAL_MILLI] = milli
            return out
        cards = any(row in needs for row, _ in request)
        for row, amount in request:
            need = needs.get(row)
            if need is not None:
                milli += quota_milli(need, amount)
            elif row == gpu_row:
                if not cards:  # (a request built without its card row: tools, tests)
                    milli += amount * GPU_SCALE
            else:
                out[resources.name(row)] = amount
        if milli:
            out[GPU] = milli
            out[SHOAL_MILLI] = milli
        return out

    def _charge(self, request: Request) -> dict[str, int]:
        """:meth:`named` of ``request``, kept while no resource row or card need is
        registered (they are what it reads); read-only."""
        resources = self.resources
        at = (len(resources), len(resources.card_needs))
        charged = self._charged
        if at != self._charged_at:
            charged.clear()
            self._charged_at = at
        found = charged.get(request)
        if found is None:
            if len(charged) >= _CHARGED:
                charged.clear()
            found = charged[request] = self.named(request)
        return found

    def add(self, namespace: str, request: Request, count: int = 1) -> None:
        """Charge ``count`` pods of ``request`` to ``namespace``."""
        used = self._usage.setdefault(namespace, {})
        for name, amount in self._charge(request).items():
            used[name] = used.get(name, 0) + (amount if count == 1 else amount * count)

    def remove(self, namespace: str, request: Request) -> None:
        used = self._usage.setdefault(namespace, {})
        for name, amount in self._charge(request).items():
            used[name] = used.get(name, 0) - amount

    def wanted(self, quota: Quota, request: Request) -> dict[str, int]:
        """What of ``request`` ``quota`` counts: the resources it names (``pods`` only
        when its ``max`` names it)."""
        return {
            r: a
            for r, a in self.named(request).items()
            if quota.names(r) and (r != "pods" or r in quota.spec.max)
        }

    def aggregate(self, resource: str) -> tuple[int, int]:
        """(used, min) summed over the quotas that name ``resource``."""
        used = guaranteed = 0
        for quota in self.quotas.values():
            if quota.names(resource):
                used += quota.used.get(resource, 0)
                guaranteed += quota.min_of(resource)
        return used, guaranteed

    def short(self, wanted: Mapping[str, int]) -> dict[str, int]:
        """How far ``wanted`` on top would take each resource beyond the sum of mins."""
        out = {}
        for resource, amount in wanted.items():
            used, guaranteed = self.aggregate(resource)
            if used + amount > guaranteed:
                out[resource] = used + amount - guaranteed
        return out

    def admit(self, namespace: str, request: Request) -> Refusal | None:
        """Why the quota refuses ``request`` now (None: admitted)."""
        quota = self.quotas.get(namespace)
        if quota is None:
            return None
        wanted = self.wanted(quota, request)
        over = quota.over_max_with(wanted)
        if over is not None:
            limit = quota.spec.max[over]
            return Refusal(
                f"elastic quota {namespace}: {over} would exceed its max ({limit})",
                (over,),
                False,
            )
        short = self.short(wanted)
        if not short:
            return None
        resource = next(iter(short))
        if quota.within_min_with(wanted):
            return Refusal(
                f"elastic quota {namespace}: its guaranteed {resource} is lent out",
                tuple(short),
                True,
            )
        used, guaranteed = self.aggregate(resource)
        return Refusal(
            f"elastic quota {namespace}: no idle guaranteed {resource} to borrow "
            f"(quotas use {shown(resource, used)} of {shown(resource, guaranteed)} guaranteed)",
            tuple(short),
            False,
        )

    def within_min(self, namespace: str, request: Request) -> bool:
        """Whether ``namespace`` has a quota and stays within its ``min`` with ``request``
        (such a pod may reclaim what others borrow)."""
        quota = self.quotas.get(namespace)
        return quota is not None and quota.within_min_with(self.wanted(quota, request))

    def dominant_share(self, namespace: str, capacity: Mapping[str, int]) -> float:
        """The namespace's largest share of any cluster resource (DRF)."""
        used = self._usage.get(namespace, {})
        share = 0.0
        for resource, amount in used.items():
            total = capacity.get(resource, 0) * scale(resource)
            if total > 0 and amount > 0 and resource != SHOAL_MILLI:
                share = max(share, amount / total)
        return share

    def check(self) -> Iterable[str]:
        """Quotas above their max (never expected; used by invariant checks)."""
        for quota in self.quotas.values():
            for resource, limit in quota.spec.max.items():
                used = quota.used.get(resource, 0)
                if used > limit * scale(resource):
                    yield f"{quota.namespace} uses {shown(resource, used)} {resource} > max {limit}"
