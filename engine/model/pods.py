"""A pod as the engine holds it: the submitted spec plus what is derived once from it."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

from engine.model.resources import PODS, ResourceIndex
from engine.model.state import Request
from events.types import PodSpec


@dataclass(slots=True, eq=False)
class PodInfo:
    """Engine-side view of a pod.

    ``static_key`` identifies everything that decides which nodes a pod may use apart
    from free resources (node name, selector, affinity, tolerations, host ports); ``shape_key`` adds
    the request. Pods with equal keys are an equivalence class: what is computed for one
    holds for all of them.
    """

    spec: PodSpec
    key: str
    request: Request
    seq: int
    static_key: tuple[Any, ...]
    shape_key: tuple[Any, ...]
    tiebreak: int
    attempts: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def priority(self) -> int:
        return self.spec.priority

    def __repr__(self) -> str:
        return f"PodInfo({self.key!r}, priority={self.priority}, attempts={self.attempts})"


def make_request(spec: PodSpec, resources: ResourceIndex) -> Request:
    """The pod's requests as sorted ``(row, amount)`` pairs, ``pods: 1`` included."""
    amounts: dict[int, int] = {PODS: 1}
    for name, amount in spec.requests.items():
        if amount > 0:
            amounts[resources.row(name)] = amount
    return tuple(sorted(amounts.items()))


def pod_info(spec: PodSpec, resources: ResourceIndex, seq: int) -> PodInfo:
    """Derive a :class:`PodInfo` from a submitted spec."""
    request = make_request(spec, resources)
    static_key = (
        spec.node_name,
        tuple(sorted(spec.node_selector.items())),
        spec.required_affinity,
        spec.preferred_affinity,
        spec.tolerations,
        spec.host_ports,
    )
    key = spec.key
    return PodInfo(
        spec=spec,
        key=key,
        request=request,
        seq=seq,
        static_key=static_key,
        shape_key=(request, static_key),
        tiebreak=zlib.crc32(key.encode()),
    )
