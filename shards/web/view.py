"""What the live view shows, as JSON: a snapshot of the engines of a run and of its
report (``shards.report``), the same for a replayed log and a running service.

A snapshot (``GET /api/state``) is one object:

- ``nodes``: per node, its shard, cpu and memory (allocatable, requested), and its GPU
  cards: each card's free compute (milli-cards) and memory (per mille) and the pods
  holding it with their shares. A card is ``idle`` (all free), ``shared`` (part taken),
  ``full``, or ``stranded``: it has compute free but its node cannot feed another pod
  on it (see :func:`stranded_slots`);
- ``queue``: every pod not bound, not finished: its phase, its answer (the report's
  ``reason``, as ``simulate --json`` gives it), attempts, group, shard, the plugins that
  rejected it last and the sub-queue it waits in;
- ``groups``: the pod groups (gangs) as the report folds them;
- ``quotas``: per namespace, each resource its quota names: used, min, max and what it
  borrows beyond its min (``nvidia.com/gpu`` in cards);
- ``decisions``: the most recent decisions of the log, newest last;
- ``summary``: the report's counts.

Everything here reads; nothing changes an engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec
import numpy as np

from engine.engine import Engine
from engine.model.devices import GPU, WHOLE
from engine.model.quota import GPU_SCALE
from engine.model.resources import CPU, MEMORY
from events.types import SECOND, Envelope, Event, PodBound, QuotaDefined, QuotaSpec
from shards.report import RunReport

RECENT: Final = 30
"""Decisions a snapshot lists (the most recent)."""
MAX_NODES: Final = 500
"""Nodes a snapshot lists at most (the page is for people, not for 20,000 rows)."""
MAX_QUEUE: Final = 500


def _gpu_request_of(engine: Engine, key: str) -> tuple[int, int, int] | None:
    """(cpu, memory, milli-GPU per card) a pending pod asks for, if it asks for cards."""
    pod = engine.pods.get(key)
    if pod is None or pod.gpu is None:
        return None
    request = dict(pod.request)
    return request.get(CPU, 0), request.get(MEMORY, 0), pod.gpu.need.milli


def stranded_slots(engine: Engine, pending: Iterable[str]) -> set[int]:
    """Slots whose free GPU compute cannot be used: the node has less cpu or memory
    free than the smallest of the pending GPU pods asks for (with no GPU pod pending:
    no cpu or no memory free at all)."""
    state = engine.state
    asks = [a for a in (_gpu_request_of(engine, k) for k in pending) if a is not None]
    cpu_need = min((a[0] for a in asks), default=1)
    mem_need = min((a[1] for a in asks), default=1)
    idle = state.cards.idle()
    free = state.free
    out: set[int] = set()
    n = min(len(idle), len(state.valid))
    for slot in np.flatnonzero(state.valid[:n] & (idle[:n] > 0)):
        if free[CPU, slot] < cpu_need or free[MEMORY, slot] < mem_need:
            out.add(int(slot))
    return out


def _cards(engine: Engine, slot: int, stranded: bool) -> list[dict[str, Any]]:
    state = engine.state
    cards = state.cards
    count = int(cards.count[slot])
    holders: list[list[dict[str, Any]]] = [[] for _ in range(count)]
    for key in state.node_pods[slot]:
        placed = state.pods[key]
        milli = placed.gpu.need.milli if placed.gpu is not None else WHOLE
        for card in placed.devices:
            if card < count:
                holders[card].append({"pod": key, "milli": milli})
    out = []
    for card in range(count):
        free = int(cards.free[slot, card])
        if free >= WHOLE:
            status = "stranded" if stranded else "idle"
        elif free <= 0:
            status = "full"
        else:
            status = "stranded" if stranded else "shared"
        out.append(
            {
                "index": card,
                "free_milli": max(free, 0),
                "free_memory_permille": max(int(cards.memory[slot, card]), 0),
                "status": status,
                "holders": holders[card],
            }
        )
    return out


def nodes_json(engines: Sequence[Engine], pending: Sequence[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for engine in engines:
        state = engine.state
        stranded = stranded_slots(engine, [k for k in pending if k in engine.pods])
        for name, slot in state.index.items():
            if not state.valid[slot]:
                continue
            out.append(
                {
                    "name": name,
                    "shard": engine.shard,
                    "unschedulable": bool(state.unschedulable[slot]),
                    "cpu": {
                        "alloc": int(state.alloc[CPU, slot]),
                        "used": int(state.used[CPU, slot]),
                    },
                    "memory": {
                        "alloc": int(state.alloc[MEMORY, slot]),
                        "used": int(state.used[MEMORY, slot]),
                    },
                    "pods": sorted(state.node_pods[slot]),
                    "cards": _cards(engine, slot, slot in stranded),
                }
            )
    out.sort(key=lambda n: n["name"])
    return out[:MAX_NODES]


def queue_json(engines: Sequence[Engine], report: RunReport) -> list[dict[str, Any]]:
    out = []
    for key, view in sorted(report.pods.items()):
        if view.phase != "Pending":
            continue
        item: dict[str, Any] = {
            "pod": key,
            "phase": view.phase,
            "reason": view.reason,
            "attempts": view.attempts,
            "shard": view.shard,
        }
        for engine in engines:
            pod = engine.pods.get(key)
            if pod is None:
                continue
            item["group"] = pod.spec.group or None
            item["priority"] = pod.priority
            item["plugins"] = list(engine.queue.reason_plugins(key))
            item["waits_in"] = engine.queue.where(key) or engine.waiting.get(key)
            if pod.gpu is not None:
                item["gpu"] = {"cards": pod.gpu.cards, "milli": pod.gpu.need.milli}
            break
        out.append(item)
    return out[:MAX_QUEUE]


def quota_specs(records: Iterable[Envelope]) -> dict[str, QuotaSpec]:
    """The quotas ``records`` define, by namespace (the last definition holds)."""
    return {
        env.event.quota.namespace: env.event.quota
        for env in records
        if isinstance(env.event, QuotaDefined)
    }


def quotas_json(engines: Sequence[Engine], specs: Mapping[str, QuotaSpec]) -> list[dict[str, Any]]:
    """Each quota of ``specs`` with its use: what the pods placed on the shards' nodes
    count in it (``QuotaTable.named``: cards in milli-cards), summed over the shards."""
    used: dict[str, dict[str, int]] = {}
    for engine in engines:
        for key, placed in engine.state.pods.items():
            namespace = key.split("/", 1)[0]
            if namespace not in specs:
                continue
            into = used.setdefault(namespace, {})
            for resource, amount in engine.quotas.named(placed.request).items():
                into[resource] = into.get(resource, 0) + amount
    out = []
    for namespace, spec in sorted(specs.items()):
        resources = []
        for name in sorted({*spec.min, *spec.max}):
            scale = GPU_SCALE if name == GPU else 1
            amount = used.get(namespace, {}).get(name, 0)
            minimum = spec.min.get(name, 0)
            resources.append(
                {
                    "name": name,
                    "used": amount / scale if scale > 1 else amount,
                    "min": minimum,
                    "max": spec.max.get(name),
                    "borrowed": max(0, amount - minimum * scale) / scale
                    if scale > 1
                    else max(0, amount - minimum),
                }
            )
        out.append({"namespace": namespace, "name": spec.name, "resources": resources})
    return out


def describe(event: Event) -> str:
    """A decision in a line: its kind and the fields people look for."""
    data = msgspec.structs.asdict(event)
    parts = [type(event).__name__]
    for field in ("pod", "group", "node", "to_node", "by", "reason"):
        value = data.get(field)
        if value:
            parts.append(f"{field}={value}")
    if isinstance(event, PodBound) and event.devices:
        parts.append(f"cards={','.join(map(str, event.devices))}")
    return " ".join(parts)


def decisions_json(decisions: Iterable[Envelope]) -> list[dict[str, Any]]:
    return [
        {
            "offset": env.offset,
            "partition": env.partition,
            "time_seconds": env.time / SECOND,
            "producer": env.producer,
            "kind": type(env.event).__name__,
            "text": describe(env.event),
        }
        for env in list(decisions)[-RECENT:]
    ]


def snapshot(
    engines: Sequence[Engine],
    report: RunReport,
    decisions: Iterable[Envelope],
    quotas: Mapping[str, QuotaSpec],
    **extra: Any,
) -> dict[str, Any]:
    """The live view's state (the module docstring): ``engines`` hold the nodes (one
    per shard), ``report`` the pods and groups, ``decisions`` the log's decisions in
    order (the last :data:`RECENT` are shown), ``quotas`` the quotas defined."""
    queue = queue_json(engines, report)
    return {
        **extra,
        "time_seconds": report.last_time / SECOND,
        "nodes": nodes_json(engines, [item["pod"] for item in queue]),
        "queue": queue,
        "groups": [{"name": key, **g.to_json()} for key, g in sorted(report.groups.items())],
        "quotas": quotas_json(engines, quotas),
        "decisions": decisions_json(decisions),
        "summary": report.counts(),
    }
