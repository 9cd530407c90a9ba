"""Columnar cluster state of one shard, folded from events.

Nodes live in *slots*: column ``j`` of every array describes the node in slot ``j``.
Per resource row ``r``: ``alloc[r, j]`` (allocatable), ``used[r, j]`` (requested by
pods bound or assumed there) and ``free[r, j] = alloc - used``, kept in step so that a
fit check is a single comparison over all nodes. Labels are integer codes per label key
(``-1`` = absent) and taints a boolean row per distinct taint, so that selectors,
affinity and tolerations are vectorised too.

Host ports bound by the pods placed on each node are a count row per
``(protocol, port)`` and address (``host_ports``), written by :meth:`assume` and
:meth:`forget` with the resource columns; placing or releasing a pod that binds one
bumps ``static_version`` (the NodePorts filter is static: cached until then). Few pods
bind host ports, so caches are seldom dropped for them.

Slots of removed nodes are reused lowest-first, so slot order (the tie-break order) is a
function of the event sequence alone.

GPU cards are a second table keyed by slot (:class:`~engine.model.cards.Cards`), kept
beside ``alloc``/``used`` and copied with them: a node's cards come from its
``nvidia.com/gpu`` allocatable, the cards a pod takes are chosen when it is assumed (or
given, as recorded), and the rows that count cards satisfying each need are rewritten
from the table whenever a node's cards change (see :mod:`engine.model.cards`).

Why one module of over 500 lines: the columns and every operation that writes them
keep ``free = alloc - used`` and the label and taint codes in step; split, an
operation could change one column without the other.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Final

import msgspec
import numpy as np
import numpy.typing as npt

from engine.model.cards import Cards
from engine.model.devices import CardNeed, GpuRequest, node_cards
from engine.model.resources import (
    CPU,
    DEFAULT_MEMORY_REQUEST,
    DEFAULT_MILLI_CPU_REQUEST,
    MEMORY,
    ResourceIndex,
)
from events.types import HostPort, NodeSpec, Taint

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
Codes = npt.NDArray[np.int32]
Floats = npt.NDArray[np.float64]

ABSENT: Final = -1
_INITIAL_CAPACITY: Final = 64
_JOURNAL_LIMIT: Final = 1 << 16
_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
_SPARSE: Final = 16
"""Placements fewer than this share of the slots are counted per node by sorting them
(:meth:`ClusterState.assume_all`), more by counting over every slot."""

Request = tuple[tuple[int, int], ...]
"""A pod's requests as sorted ``(row, amount)`` pairs; always includes ``pods: 1``."""


class PlacedPod(msgspec.Struct, gc=False):
    """A pod bound or assumed on a node. Never changed once made (a pod that moves gets
    another). A msgspec struct (built in C: a frozen dataclass took 1.0 µs, a plain one
    0.2, once per placement in every process) that the cyclic collector does not track
    (``gc=False``: it holds numbers, tuples and a shared array, never a cycle), as
    :class:`~engine.model.pods.PodInfo`."""

    slot: int
    request: Request
    delta: npt.NDArray[np.int64]
    """What the pod adds to the stacked columns of its node (shared, never mutated)."""
    priority: int = 0
    ports: tuple[HostPort, ...] = ()
    """Host ports the pod binds there."""
    devices: tuple[int, ...] = ()
    """The GPU cards it holds there (indices on its node)."""
    gpu: GpuRequest | None = None
    """What it takes on each of them."""


_DELTAS: dict[tuple[Request, int], npt.NDArray[np.int64]] = {}


def _uses(request: Request) -> bool:
    """Whether ``request`` asks for anything: ``request_delta(request, rows)[1].any()``
    (requests are never negative) in a few bytecodes, not a numpy reduction per pod."""
    for _, amount in request:  # noqa: SIM110 (no generator per placed pod)
        if amount:
            return True
    return False


def any_set(mask: Bools) -> bool:
    """Whether any element of ``mask`` is set: ``mask.any()`` at a third of the cost on
    the small arrays of the hot path (argmax stops at the first set element and skips
    the reduction machinery)."""
    return mask.size > 0 and bool(mask[mask.argmax()])


ColumnAdd = Callable[
    [npt.NDArray[np.int64], npt.NDArray[np.int64], int, npt.NDArray[np.int64], int], None
]
"""``add(columns, by_priority, slot, delta, sign)``: ``columns[:, :, slot] += sign *
delta`` and ``by_priority[:, slot] += sign * delta[1]``."""
_compiled_add: ColumnAdd | None = None


def use_compiled_columns(add: ColumnAdd | None) -> None:
    """Let ``assume`` and ``forget`` update a node's column with a compiled loop (a
    fifth of numpy's cost for one column); :mod:`engine.plugins.kernels` installs it when it
    loads numba. None: numpy. Integer additions either way, so the same state."""
    global _compiled_add  # noqa: PLW0603 - one switch for the whole process
    _compiled_add = add


def request_delta(request: Request, rows: int) -> npt.NDArray[np.int64]:
    """The (4, rows) change a pod makes to alloc/used/free/nonzero_used, cached per
    request shape (pods of one shape share it)."""
    key = (request, rows)
    delta = _DELTAS.get(key)
    if delta is None:
        if len(_DELTAS) > 65536:
            _DELTAS.clear()
        delta = np.zeros((4, rows), dtype=np.int64)
        for row, amount in request:
            delta[1, row] += amount
            delta[2, row] -= amount
        for row, amount in scored_request(request):
            delta[3, row] += amount
        delta.flags.writeable = False
        _DELTAS[key] = delta
    return delta


def nonzero(request: Request) -> tuple[int, int]:
    """cpu and memory as kube-scheduler's scorers see them (defaults for zero)."""
    cpu = memory = 0
    for row, amount in request:
        if row == CPU:
            cpu = amount
        elif row == MEMORY:
            memory = amount
    return (cpu or DEFAULT_MILLI_CPU_REQUEST, memory or DEFAULT_MEMORY_REQUEST)


def scored_request(request: Request) -> Request:
    """The request as scorers count it: cpu and memory never zero."""
    cpu, memory = nonzero(request)
    rest = [(row, amount) for row, amount in request if row not in (CPU, MEMORY)]
    return tuple(sorted([(CPU, cpu), (MEMORY, memory), *rest]))


class ClusterState:
    """Nodes and their committed resources, as numpy columns."""

    def __init__(self, resources: ResourceIndex | None = None) -> None:
        self.resources = resources or ResourceIndex()
        cap = _INITIAL_CAPACITY
        rows = len(self.resources)
        self.names: list[str | None] = [None] * cap
        self.index: dict[str, int] = {}
        self.valid: Bools = np.zeros(cap, dtype=np.bool_)
        self.unschedulable: Bools = np.zeros(cap, dtype=np.bool_)
        self._columns: npt.NDArray[np.int64] = np.zeros((4, rows, cap), dtype=np.int64)
        """``alloc``, ``used``, ``free`` and ``nonzero_used`` stacked, so that gathering
        some slots' resource columns is one operation (see :meth:`view`)."""
        self.alloc: Ints
        self.used: Ints
        self.free: Ints
        self.nonzero_used: Ints
        """Like ``used``, but counting cpu and memory with kube-scheduler's non-zero
        defaults (what the resource scorers see)."""
        self._bind_columns()
        self.used_by_priority: dict[int, Ints] = {}
        """Priority → ``used`` by the pods of that priority (what preemption may free)."""
        self._level_pods: dict[int, int] = {}
        """Priority → placed pods of that priority that use anything: a level is
        dropped when it reaches none (what ``used_by_priority[p].any()`` says, without
        a pass over every node per eviction)."""
        self.label_columns: dict[str, Codes] = {}
        self.label_values: dict[str, dict[str, int]] = {}
        self._label_numeric: dict[str, Floats] = {}
        self.taint_codes: dict[Taint, int] = {}
        self.taint_rows: list[Bools] = []
        self.node_labels: list[dict[str, str]] = [{} for _ in range(cap)]
        self.node_annotations: list[dict[str, str]] = [{} for _ in range(cap)]
        """Per slot, the node's annotations (read by user plugins only; not columns)."""
        self.node_taints: list[tuple[Taint, ...]] = [() for _ in range(cap)]
        self.pods: dict[str, PlacedPod] = {}
        self.node_pods: list[dict[str, None]] = [{} for _ in range(cap)]
        self.host_ports: dict[tuple[str, int], dict[str, Ints]] = {}
        """``(protocol, port)`` → bound address → per slot, how many placed pods bind it
        (``0.0.0.0``: every address of the node)."""
        self._free_slots: list[int] = []
        self._next_slot = 0
        self.static_version = 0
        """Bumped whenever labels, taints, schedulability or the node set change."""
        self.journal: list[int] = []
        """Slots whose resources changed, in order; ``journal_base`` is the position of
        ``journal[0]`` (older entries are dropped)."""
        self.journal_base = 0
        self.cards = Cards(cap)
        """Every node's GPU cards (see :mod:`engine.model.cards`)."""

    def __repr__(self) -> str:
        return f"ClusterState(nodes={len(self.index)}, pods={len(self.pods)})"

    def stats(self) -> dict[str, int]:
        return {
            "nodes": len(self.index),
            "pods": len(self.pods),
            "slots": self.capacity,
            "resources": len(self.resources),
            "label_keys": len(self.label_columns),
            "taints": len(self.taint_codes),
        }

    @property
    def capacity(self) -> int:
        return int(self.valid.shape[0])

    @property
    def high_water(self) -> int:
        """One past the highest slot ever used: slots beyond hold no node."""
        return max(self._next_slot, 1)

    # ------------------------------------------------------------------ growth

    def _bind_columns(self) -> None:
        columns = self._columns
        self.alloc, self.used, self.free, self.nonzero_used = (
            columns[0],
            columns[1],
            columns[2],
            columns[3],
        )

    def ensure_rows(self) -> None:
        """Grow the resource arrays to cover every registered resource row (and fill
        the rows of card needs registered since)."""
        rows = len(self.resources)
        have = self._columns.shape[1]
        if rows > have:
            grown = np.zeros((4, rows, self._columns.shape[2]), dtype=np.int64)
            grown[:, :have] = self._columns
            self._columns = grown
            self._bind_columns()
            for level, used in self.used_by_priority.items():
                self.used_by_priority[level] = np.vstack(
                    [used, np.zeros((rows - have, used.shape[1]), dtype=np.int64)]
                )
        needs = self.resources.card_needs
        if len(needs) != len(self.cards.rows):
            for row, need in needs.items():
                if row not in self.cards.rows:
                    self.cards.add_row(row, need)
            self._count_cards(slice(None))

    def _count_cards(self, slots: Ints | slice) -> None:
        """Rewrite the card-need rows of ``slots`` from the card table."""
        if not self.cards.rows:
            return
        rows, counts = self.cards.counts(slots)
        count = self.cards.count[slots]
        columns = self._columns
        if isinstance(slots, slice):
            columns[0, rows, :] = count
            columns[2, rows, :] = counts
            columns[1, rows, :] = count - counts
        else:
            columns[0, rows[:, None], slots] = count
            columns[2, rows[:, None], slots] = counts
            columns[1, rows[:, None], slots] = count - counts

    def _grow(self) -> None:
        old = self.capacity
        new = old * 2

        def widen(arr: npt.NDArray[np.generic], fill: int | bool = 0) -> npt.NDArray[np.generic]:
            shape = (*arr.shape[:-1], new)
            out = np.full(shape, fill, dtype=arr.dtype)
            out[..., :old] = arr
            return out

        self.valid = widen(self.valid, False)  # type: ignore[assignment]
        self.unschedulable = widen(self.unschedulable, False)  # type: ignore[assignment]
        self._columns = widen(self._columns)  # type: ignore[assignment]
        self._bind_columns()
        for level, used in self.used_by_priority.items():
            self.used_by_priority[level] = widen(used)  # type: ignore[assignment]
        for key, col in self.label_columns.items():
            self.label_columns[key] = widen(col, ABSENT)  # type: ignore[assignment]
        self._label_numeric.clear()
        self.taint_rows = [widen(row, False) for row in self.taint_rows]  # type: ignore[misc]
        self.names.extend([None] * old)
        self.node_labels.extend({} for _ in range(old))
        self.node_annotations.extend({} for _ in range(old))
        self.node_taints.extend(() for _ in range(old))
        self.node_pods.extend({} for _ in range(old))
        for by_ip in self.host_ports.values():
            for ip, row in by_ip.items():
                by_ip[ip] = widen(row)  # type: ignore[assignment]
        self.cards.grow(new)

    def _take_slot(self) -> int:
        if self._free_slots:
            return heapq.heappop(self._free_slots)
        if self._next_slot >= self.capacity:
            self._grow()
        slot = self._next_slot
        self._next_slot += 1
        return slot

    # ------------------------------------------------------------------ nodes

    def add_node(self, spec: NodeSpec) -> int:
        """Add a node (or replace it if the name is known); return its slot."""
        if spec.name in self.index:
            return self.update_node(spec)
        slot = self._take_slot()
        self.names[slot] = spec.name
        self.index[spec.name] = slot
        self.valid[slot] = True
        self._write_node(slot, spec)
        return slot

    def update_node(self, spec: NodeSpec) -> int:
        """Replace a known node's attributes; pods on it stay."""
        slot = self.index.get(spec.name)
        if slot is None:
            return self.add_node(spec)
        self._write_node(slot, spec)
        return slot

    def _write_node(self, slot: int, spec: NodeSpec) -> None:
        rows = [self.resources.row(name) for name in spec.allocatable]
        self.ensure_rows()
        self.alloc[:, slot] = 0
        for row, amount in zip(rows, spec.allocatable.values(), strict=True):
            self.alloc[row, slot] = amount
        self.free[:, slot] = self.alloc[:, slot] - self.used[:, slot]
        self._write_cards(slot, spec)
        self.unschedulable[slot] = spec.unschedulable
        for key, col in self.label_columns.items():
            if key not in spec.labels:
                col[slot] = ABSENT
        for key, value in spec.labels.items():
            column = self._label_column(key)
            column[slot] = self._label_code(key, value)
        for key in spec.labels:
            self._label_numeric.pop(key, None)
        for key in self.node_labels[slot]:
            self._label_numeric.pop(key, None)
        self.node_labels[slot] = dict(spec.labels)
        self.node_annotations[slot] = dict(spec.annotations)
        for taint_row in self.taint_rows:
            taint_row[slot] = False
        for taint in spec.taints:
            self._taint_row(taint)[slot] = True
        self.node_taints[slot] = tuple(spec.taints)
        self.static_version += 1
        self._touch(slot)

    def _write_cards(self, slot: int, spec: NodeSpec) -> None:
        """The node's cards as its spec says, with its pods' shares charged again."""
        count, mib = node_cards(spec.allocatable, spec.labels)
        cards = self.cards
        if not count and not cards.count[slot]:
            self._count_cards(np.array([slot]))
            return
        cards.set_node(slot, count, mib)
        for key in self.node_pods[slot]:
            placed = self.pods[key]
            if placed.gpu is not None:
                cards.take(slot, placed.devices, placed.gpu, 1)
        self._count_cards(np.array([slot]))

    def remove_node(self, name: str) -> list[str]:
        """Remove a node; return the pods that were placed on it (now forgotten)."""
        slot = self.index.pop(name, None)
        if slot is None:
            return []
        lost = list(self.node_pods[slot])
        for key in lost:
            self.forget(key)
        self.names[slot] = None
        self.valid[slot] = False
        self.unschedulable[slot] = False
        self._columns[:, :, slot] = 0
        self.cards.clear(slot)
        for col in self.label_columns.values():
            col[slot] = ABSENT
        for row in self.taint_rows:
            row[slot] = False
        for key in self.node_labels[slot]:
            self._label_numeric.pop(key, None)
        self.node_labels[slot] = {}
        self.node_annotations[slot] = {}
        self.node_taints[slot] = ()
        heapq.heappush(self._free_slots, slot)
        self.static_version += 1
        self._touch(slot)
        return lost

    # ------------------------------------------------------------------ pods

    def assume(
        self,
        key: str,
        slot: int,
        request: Request,
        priority: int = 0,
        ports: tuple[HostPort, ...] = (),
        devices: tuple[int, ...] | None = None,
    ) -> None:
        """Commit ``request`` (and host ``ports``) on ``slot`` for pod ``key``
        (idempotent for the same slot). GPU cards: ``devices`` when given (a decision
        replayed as recorded), else chosen here (:meth:`Cards.choose`)."""
        placed = self.pods.get(key)
        if placed is not None:
            if placed.slot == slot:
                return
            self.forget(key)
        resources = self.resources
        if len(resources) != self._columns.shape[1] or len(resources.card_needs) != len(
            self.cards.rows
        ):
            self.ensure_rows()  # rows registered by a pod not submitted (tests, tools)
        gpu = self.gpu_of(request) if self.cards.rows else None
        if gpu is None:
            delta = request_delta(request, self._columns.shape[1])
            self.pods[key] = PlacedPod(slot, request, delta, priority, ports)
        else:
            scalar = tuple(item for item in request if item[0] not in self.cards.rows)
            delta = request_delta(scalar, self._columns.shape[1])
            if devices is None:
                devices = self.cards.choose(slot, gpu)
            self.pods[key] = PlacedPod(slot, request, delta, priority, ports, devices, gpu)
        self.node_pods[slot][key] = None
        if ports:
            self._count_ports(ports, slot, 1)
        self._touch(slot)
        by_priority = self.used_by_priority.get(priority)
        if by_priority is None:
            by_priority = np.zeros_like(self.used)
            self.used_by_priority[priority] = by_priority
        if _uses(request) if gpu is None else delta[1].any():
            self._level_pods[priority] = self._level_pods.get(priority, 0) + 1
        add = _compiled_add
        if add is not None:
            add(self._columns, by_priority, slot, delta, 1)
        else:
            self._columns[:, :, slot] += delta
            by_priority[:, slot] += delta[1]
        if gpu is not None:
            assert devices is not None
            self.cards.take(slot, devices, gpu, 1)
            self._count_cards(np.array([slot]))

    def assume_all(self, placements: Sequence[tuple[str, int, Request, int]]) -> None:
        """:meth:`assume` for each ``(key, slot, request, priority)`` in order, for pods
        not placed yet, without host ports or GPU cards (the caller checks): each is
        recorded in its place in the order, and the columns change once per request,
        priority and node, by how many of those pods landed there, not once per pod
        (the same sums: integer columns)."""
        if not placements:
            return
        resources = self.resources
        if len(resources) != self._columns.shape[1] or len(resources.card_needs) != len(
            self.cards.rows
        ):
            self.ensure_rows()
        rows = self._columns.shape[1]
        pods = self.pods
        node_pods = self.node_pods
        touch = self._touch
        runs: dict[tuple[Request, int], list[int]] = {}
        # per request object (pods of one template share theirs) and priority: its
        # delta and its run, looked up by identity, not by hashing the request again
        # per pod (the requests stay alive in ``placements`` meanwhile)
        known: dict[tuple[int, int], tuple[npt.NDArray[np.int64], list[int]]] = {}
        for key, slot, request, priority in placements:
            found = known.get((id(request), priority))
            if found is None:
                delta = request_delta(request, rows)
                run = runs.get((request, priority))
                if run is None:
                    run = runs[(request, priority)] = []
                    if priority not in self.used_by_priority:
                        self.used_by_priority[priority] = np.zeros_like(self.used)
                found = known[(id(request), priority)] = (delta, run)
            delta, run = found
            pods[key] = PlacedPod(slot, request, delta, priority)
            node_pods[slot][key] = None
            touch(slot)
            run.append(slot)
        for (request, priority), slots in runs.items():
            delta = request_delta(request, rows)
            if delta[1].any():
                self._level_pods[priority] = self._level_pods.get(priority, 0) + len(slots)
            at = np.asarray(slots, dtype=np.int64)
            if len(slots) * _SPARSE < self.high_water:
                # a few nodes of many: sorted, not counted over every slot up to the
                # highest (at 130,000 nodes that was most of this fold)
                landed, times = np.unique(at, return_counts=True)
            else:
                counts = np.bincount(at)
                landed = np.flatnonzero(counts)
                times = counts[landed]
            self._columns[:, :, landed] += delta[:, :, None] * times
            self.used_by_priority[priority][:, landed] += delta[1][:, None] * times

    def cards_if_free(
        self, slot: int, request: Request, devices: tuple[int, ...] | None
    ) -> tuple[int, ...] | None:
        """``devices`` (GPU cards another engine chose for ``request`` on ``slot``) if
        each still has room for it there, else None (the state chooses)."""
        if not devices:
            return None
        gpu = self.gpu_of(request)
        return devices if gpu is not None and self.cards.free_for(slot, gpu, devices) else None

    def gpu_of(self, request: Request) -> GpuRequest | None:
        """The GPU cards ``request`` asks for (from its card-need row), or None."""
        rows = self.cards.rows
        for row, amount in request:
            need = rows.get(row)
            if need is not None:
                return _gpu(amount, need)
        return None

    def forget(self, key: str) -> int | None:
        """Release pod ``key``'s resources; return its slot (None if not placed)."""
        placed = self.pods.pop(key, None)
        if placed is None:
            return None
        slot = placed.slot
        self.node_pods[slot].pop(key, None)
        if placed.ports:
            self._count_ports(placed.ports, slot, -1)
        self._touch(slot)
        delta = placed.delta
        rows = self._columns.shape[1]
        if delta.shape[1] < rows:  # resources registered since the pod was placed
            wider = np.zeros((delta.shape[0], rows), dtype=delta.dtype)
            wider[:, : delta.shape[1]] = delta
            delta = wider
        by_priority = self.used_by_priority[placed.priority]
        add = _compiled_add
        if add is not None:
            add(self._columns, by_priority, slot, delta, -1)
        else:
            self._columns[:, :, slot] -= delta
            by_priority[:, slot] -= delta[1]
        uses = _uses(placed.request) if placed.gpu is None else delta[1].any()
        left = self._level_pods.get(placed.priority, 0) - (1 if uses else 0)
        if left > 0:
            self._level_pods[placed.priority] = left
        else:  # (requests are never negative: no pod using anything is left)
            self._level_pods.pop(placed.priority, None)
            del self.used_by_priority[placed.priority]
        if placed.gpu is not None:
            self.cards.take(slot, placed.devices, placed.gpu, -1)
            self._count_cards(np.array([slot]))
        return slot

    def _count_ports(self, ports: tuple[HostPort, ...], slot: int, sign: int) -> None:
        for port in ports:
            by_ip = self.host_ports.setdefault((port.protocol, port.port), {})
            row = by_ip.get(port.ip)
            if row is None:
                row = by_ip[port.ip] = np.zeros(self.capacity, dtype=np.int64)
            row[slot] += sign
            if sign < 0 and not row.any():
                del by_ip[port.ip]
                if not by_ip:
                    del self.host_ports[(port.protocol, port.port)]
        self.static_version += 1

    def evictable_below(self, priority: int) -> Ints:
        """Resources used per node by pods of priority lower than ``priority`` (the
        ``pods`` row counts them): what priority preemption could free."""
        out = np.zeros_like(self.used)
        for level, used in self.used_by_priority.items():
            if level < priority:
                out += used
        return out

    def _touch(self, slot: int) -> None:
        journal = self.journal
        journal.append(slot)
        if len(journal) > _JOURNAL_LIMIT:
            drop = len(journal) // 2
            del journal[:drop]
            self.journal_base += drop

    @property
    def journal_end(self) -> int:
        """Position just past the newest journal entry."""
        return self.journal_base + len(self.journal)

    def changed_since(self, position: int) -> list[int] | None:
        """Slots changed since journal ``position`` (None if that is no longer known)."""
        if position < self.journal_base:
            return None
        return self.journal[position - self.journal_base :]

    def view(self, slots: Ints) -> ClusterState:
        """The resource columns of ``slots`` only, gathered on first use: for *local*
        plugins, which may read ``resources``, ``capacity``, ``valid``,
        ``unschedulable``, ``alloc``, ``used``, ``free`` and ``nonzero_used`` only."""
        return SlotView(self, slots)

    def fits(self, request: Request, slot: int) -> bool:
        """True when ``request`` fits in ``slot``'s free resources."""
        free = self.free
        return bool(self.valid[slot]) and all(free[row, slot] >= amount for row, amount in request)

    # ------------------------------------------------------------------ labels and taints

    def _label_column(self, key: str) -> Codes:
        col = self.label_columns.get(key)
        if col is None:
            col = np.full(self.capacity, ABSENT, dtype=np.int32)
            self.label_columns[key] = col
            self.label_values[key] = {}
        return col

    def _label_code(self, key: str, value: str) -> int:
        values = self.label_values[key]
        code = values.get(value)
        if code is None:
            code = len(values)
            values[value] = code
        return code

    def label_code(self, key: str, value: str) -> int | None:
        """The code of ``key=value``, or None if no node ever had it."""
        values = self.label_values.get(key)
        return None if values is None else values.get(value)

    def label_numeric(self, key: str) -> Floats:
        """Label ``key`` parsed as an integer per node (NaN where absent or not a number)."""
        cached = self._label_numeric.get(key)
        if cached is not None:
            return cached
        out = np.full(self.capacity, np.nan)
        col = self.label_columns.get(key)
        if col is not None:
            lookup = np.full(len(self.label_values[key]) + 1, np.nan)
            for value, code in self.label_values[key].items():
                if _INTEGER.fullmatch(value):
                    lookup[code] = int(value)
            present = col >= 0
            out[present] = lookup[col[present]]
        self._label_numeric[key] = out
        return out

    def _taint_row(self, taint: Taint) -> Bools:
        code = self.taint_codes.get(taint)
        if code is None:
            code = len(self.taint_rows)
            self.taint_codes[taint] = code
            self.taint_rows.append(np.zeros(self.capacity, dtype=np.bool_))
        return self.taint_rows[code]

    # ------------------------------------------------------------------ staging

    def copy(self) -> ClusterState:
        """An independent copy for staging what-if decisions (arrays copied)."""
        new = ClusterState.__new__(ClusterState)
        new.resources = self.resources
        new.names = list(self.names)
        new.index = dict(self.index)
        new.valid = self.valid.copy()
        new.unschedulable = self.unschedulable.copy()
        new._columns = self._columns.copy()
        new._bind_columns()
        new.used_by_priority = {k: v.copy() for k, v in self.used_by_priority.items()}
        new._level_pods = dict(self._level_pods)
        new.label_columns = {k: v.copy() for k, v in self.label_columns.items()}
        new.label_values = {k: dict(v) for k, v in self.label_values.items()}
        new._label_numeric = {}
        new.taint_codes = dict(self.taint_codes)
        new.taint_rows = [row.copy() for row in self.taint_rows]
        new.node_labels = list(self.node_labels)
        new.node_annotations = list(self.node_annotations)
        new.node_taints = list(self.node_taints)
        new.pods = dict(self.pods)
        new.node_pods = [dict(p) for p in self.node_pods]
        new.host_ports = {
            key: {ip: row.copy() for ip, row in by_ip.items()}
            for key, by_ip in self.host_ports.items()
        }
        new._free_slots = list(self._free_slots)
        new._next_slot = self._next_slot
        new.static_version = self.static_version
        new.journal = list(self.journal)
        new.journal_base = self.journal_base
        new.cards = self.cards.copy()
        return new

    def check_invariants(self) -> None:
        """Assert the bookkeeping is consistent (used by tests and ``replay --verify``)."""
        assert np.array_equal(self.free, self.alloc - self.used), "free != alloc - used"
        card_rows = self.cards.rows
        scalar = [r for r in range(self.used.shape[0]) if r not in card_rows]
        used = np.zeros_like(self.used)
        for placed in self.pods.values():
            for row, amount in placed.request:
                used[row, placed.slot] += amount
        assert np.array_equal(used[scalar], self.used[scalar]), "used does not match placed pods"
        nonzero_used = np.zeros_like(self.nonzero_used)
        for placed in self.pods.values():
            for row, amount in scored_request(placed.request):
                if row not in card_rows:
                    nonzero_used[row, placed.slot] += amount
        assert np.array_equal(nonzero_used, self.nonzero_used), "nonzero_used is off"
        by_priority = sum(self.used_by_priority.values(), np.zeros_like(self.used))
        assert np.array_equal(by_priority[scalar], self.used[scalar]), "used_by_priority is off"
        for level, level_used in self.used_by_priority.items():
            using = self._level_pods.get(level, 0) > 0
            assert using == bool(level_used.any()), f"priority {level}: pods using it are off"
        self._check_cards()
        bound: dict[tuple[str, int, str], Ints] = {}
        for placed in self.pods.values():
            for port in placed.ports:
                binds = bound.setdefault(
                    (port.protocol, port.port, port.ip), np.zeros(self.capacity, dtype=np.int64)
                )
                binds[placed.slot] += 1
        counted = {
            (protocol, port, ip): binds
            for (protocol, port), by_ip in self.host_ports.items()
            for ip, binds in by_ip.items()
        }
        assert bound.keys() == counted.keys(), "host_ports lists other ports"
        assert all(np.array_equal(bound[k], counted[k]) for k in bound), "host_ports is off"

    def _check_cards(self) -> None:
        """No card over-committed; the card table and the need rows match the pods."""
        cards = self.cards
        expect_free = np.where(
            np.arange(cards.width)[None, :] < cards.count[:, None], 1000, -1
        ).astype(np.int64)
        expect_memory = expect_free.copy()
        for placed in self.pods.values():
            if placed.gpu is None:
                continue
            slot = placed.slot
            memory = placed.gpu.memory_on(int(cards.mib[slot]))
            for card in placed.devices:
                if card < cards.count[slot]:
                    expect_free[slot, card] -= placed.gpu.need.milli
                    expect_memory[slot, card] -= memory
        assert np.array_equal(expect_free, cards.free), "card compute does not match pods"
        assert np.array_equal(expect_memory, cards.memory), "card memory does not match pods"
        existing = np.arange(cards.width)[None, :] < cards.count[:, None]
        assert (cards.free[existing] >= 0).all(), "a card's compute is over-committed"
        assert (cards.memory[existing] >= 0).all(), "a card's memory is over-committed"
        if cards.rows:
            rows, counts = cards.counts(slice(None))
            assert np.array_equal(self.free[rows], counts), "card-need rows are stale"


def held_devices(state: ClusterState, keys: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """The GPU cards each of ``keys`` holds, for those placed that hold any."""
    out: dict[str, tuple[int, ...]] = {}
    for key in keys:
        placed = state.pods.get(key)
        if placed is not None and placed.devices:
            out[key] = placed.devices
    return out


def _gpu(cards: int, need: CardNeed) -> GpuRequest:
    return GpuRequest(cards, need, "")


_VIEW_COLUMNS: Final = frozenset(
    {"valid", "unschedulable", "alloc", "used", "free", "nonzero_used"}
)


class SlotView(ClusterState):
    """Some slots' resource columns, gathered lazily (see :meth:`ClusterState.view`)."""

    def __init__(self, state: ClusterState, slots: Ints) -> None:  # no super(): a view
        self.resources = state.resources
        self._state = state
        self._slots = slots

    def __repr__(self) -> str:
        return f"SlotView(slots={self._slots.size})"

    @property
    def capacity(self) -> int:
        return int(self._slots.size)

    def __getattr__(self, name: str) -> npt.NDArray[np.generic]:
        if name not in _VIEW_COLUMNS:
            raise AttributeError(f"{name!r} is not available on a slot view (local plugins only)")
        if name in ("valid", "unschedulable"):
            column: npt.NDArray[np.generic] = getattr(self._state, name)[self._slots]
            setattr(self, name, column)
            return column
        self._columns = np.take(self._state._columns, self._slots, axis=2)
        self._bind_columns()
        result: npt.NDArray[np.generic] = getattr(self, name)
        return result
