"""A pod as the engine holds it: the submitted spec plus what is derived once from it."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import msgspec

from engine.model.devices import (
    SHARE_RESOURCES,
    GpuRequest,
    GpuRequestError,
    gpu_request,
    scalar_requests,
)
from engine.model.resources import PODS, ResourceIndex
from engine.model.state import Request
from events.types import PodSpec


class PodInfo(msgspec.Struct, gc=False, eq=False):
    """Engine-side view of a pod.

    ``static_key`` identifies everything that decides which nodes a pod may use apart
    from free resources (node name, selector, affinity, tolerations, host ports); ``shape_key`` adds
    the request. Pods with equal keys are an equivalence class: what is computed for one
    holds for all of them.

    A msgspec struct, compared by identity, that Python's cyclic collector does not
    track (``gc=False``: it holds its spec and derived tuples, never a cycle): every
    process keeps one per pod, and the collector walked them all at each collection
    (with ``PlacedPod``, about 8% of the coordinator's CPU per plain pod in process).
    """

    spec: PodSpec
    key: str
    request: Request
    seq: int
    static_key: tuple[Any, ...]
    shape_key: tuple[Any, ...]
    tiebreak: int
    attempts: int = 0
    gpu: GpuRequest | None = None
    """Its GPU cards (whole or shares), when it asks for any."""

    @property
    def priority(self) -> int:
        return self.spec.priority

    def __repr__(self) -> str:
        return f"PodInfo({self.key!r}, priority={self.priority}, attempts={self.attempts})"


def pod_gpu(spec: PodSpec) -> GpuRequest | None:
    """The pod's GPU request (None: none, or one the input checks refuse, which never
    reaches an engine: see :mod:`engine.refusals`)."""
    try:
        return gpu_request(spec.requests)
    except GpuRequestError:
        return None


def make_request(spec: PodSpec, resources: ResourceIndex, gpu: GpuRequest | None = None) -> Request:
    """The pod's requests as sorted ``(row, amount)`` pairs, ``pods: 1`` included; GPU
    cards as the row of their need (see :mod:`engine.model.cards`). ``gpu``: the pod's
    GPU request when already derived."""
    if gpu is None:
        gpu = pod_gpu(spec)
    return _request(spec.requests, resources, gpu)


def _request(
    requests: Mapping[str, int], resources: ResourceIndex, gpu: GpuRequest | None
) -> Request:
    """:func:`make_request` with the pod's GPU request derived already (None: none)."""
    if gpu is None and requests.keys().isdisjoint(SHARE_RESOURCES):
        scalars: Mapping[str, int] = requests  # (most pods: no copy to make)
    else:
        scalars = scalar_requests(requests, gpu)
    amounts: dict[int, int] = {PODS: 1}
    for name, amount in scalars.items():
        if amount > 0:
            amounts[resources.row(name)] = amount
    if gpu is not None:
        amounts[resources.card_row(gpu.need)] = gpu.cards
    return tuple(sorted(amounts.items()))


def pod_info(spec: PodSpec, resources: ResourceIndex, seq: int) -> PodInfo:
    """Derive a :class:`PodInfo` from a submitted spec."""
    gpu = pod_gpu(spec)
    request = _request(spec.requests, resources, gpu)  # (derived once, not twice)
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
        gpu=gpu,
    )
