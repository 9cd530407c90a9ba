"""Records no column can hold: refused by every fold, the same way, before they change
anything.

A record that decodes can still carry values the engine's int64 columns (and their sums
over a cluster) cannot hold: a node of 2^63 milli-CPUs, a pod asking more than any node
could ever have, a priority beyond 64 bits. Input is bounded where it enters (scenario
documents, Kubernetes objects), but a log may hold what another writer put there, and a
record that makes the fold raise would stop its reader at the same offset on every
restart. :func:`refusal` names what is wrong with such a record; the engine and the
coordinator skip it (the component records a ``RecordQuarantined``), and replay skips
it the same way, so the state stays a pure function of the log.
"""

from __future__ import annotations

from typing import Final

from engine.model.devices import MAX_NODE_CARDS, GpuRequestError, gpu_request, node_cards
from events.types import (
    Envelope,
    Event,
    GroupSpec,
    NodeAdded,
    NodeSpec,
    NodeUpdated,
    PodGroupSubmitted,
    PodRouted,
    PodSpec,
    PodSubmitted,
    ReservationRequested,
)

MAX_QUANTITY: Final = 2**54
"""The largest quantity of a resource a node may have or a pod may ask (about 1.8e16: 16
PiB of memory in bytes, 18 billion cores in milli-CPUs). Input is held to the same
bound, and its sums too (``shards/inputs/limits.py`` says why that keeps every column
and score within int64); a record beyond it is one no input could have made."""
MAX_PRIORITY: Final = 1 << 62
"""Priorities lie within ±this (Kubernetes's are int32)."""
MAX_TIME: Final = 1 << 62
"""Log times (ns) lie within 0..this (the year 2116)."""
MAX_MEMBERS: Final = 1 << 31
"""A gang's minMember and a resource bound on a group: at most this many."""


CHECKED: Final = frozenset(
    {NodeAdded, NodeUpdated, PodSubmitted, PodRouted, PodGroupSubmitted, ReservationRequested}
)
"""The kinds :func:`refusal` looks into (the others carry nothing a column holds)."""


def refused(envelope: Envelope) -> str | None:
    """Why the record ``envelope`` cannot be folded (its time, or :func:`refusal` of its
    event), or None. Callers on the hot path test ``type(event) in CHECKED`` and the
    time range first, and call this only then."""
    if not 0 <= envelope.time <= MAX_TIME:
        return f"time {envelope.time} ns is outside 0..{MAX_TIME}"
    return refusal(envelope.event)


def refusal(event: Event) -> str | None:
    """Why ``event`` cannot be folded, or None when it can."""
    match event:
        case NodeAdded(node=node) | NodeUpdated(node=node):
            return _node(node)
        case PodSubmitted(pod=pod) | PodRouted(pod=pod):
            return _pod(pod)
        case PodGroupSubmitted(group=group):
            return _group(group)
        case ReservationRequested(group=group, pods=pods):
            return _group(group) or next((r for r in map(_pod, pods) if r), None)
    return None


def _quantities(what: str, values: dict[str, int]) -> str | None:
    for name, value in values.items():
        if not 0 <= value <= MAX_QUANTITY:
            return f"{what} {name}={value} is outside 0..{MAX_QUANTITY}"
    return None


def _node(node: NodeSpec) -> str | None:
    cards, _ = node_cards(node.allocatable, node.labels)
    if cards > MAX_NODE_CARDS:
        return f"node {node.name} has {cards} GPU cards, more than {MAX_NODE_CARDS}"
    return _quantities(f"node {node.name} allocatable", node.allocatable)


def _pod(pod: PodSpec) -> str | None:
    if not -MAX_PRIORITY <= pod.priority <= MAX_PRIORITY:
        return f"pod {pod.key} priority {pod.priority} is outside ±{MAX_PRIORITY}"
    if pod.runtime is not None and not 0 <= pod.runtime <= MAX_TIME:
        return f"pod {pod.key} runtime {pod.runtime} ns is out of range"
    requests = pod.requests
    for value in requests.values():  # (a loop: this runs for every pod submitted)
        if not 0 <= value <= MAX_QUANTITY:
            return _quantities(f"pod {pod.key} requests", requests)
    try:
        gpu_request(pod.requests)
    except GpuRequestError as exc:
        return f"pod {pod.key} GPU request: {exc}"
    return None


def _group(group: GroupSpec) -> str | None:
    if not 0 <= group.min_member <= MAX_MEMBERS:
        return f"group {group.namespace}/{group.name} minMember {group.min_member} is out of range"
    return _quantities(f"group {group.namespace}/{group.name} minResources", group.min_resources)
