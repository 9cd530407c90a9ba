"""Snapshots of an engine's state: bytes that restore it exactly.

A shard folds its whole partition to rebuild its state; with a snapshot it restores the
state as it was after one recorded pass and folds only the records after it. The
snapshot is *state*, not a cache: everything an engine keeps between passes is in it
(cluster columns, queue and back-off heaps, quotas, pods, groups, reservations, the
counters that number decisions), except what is rebuilt from the configuration (the
plugin frameworks and the caches they keep, which never change a result).

Format: msgpack of a tagged tree. Containers and objects carry their kind so that lists
stay lists and tuples tuples, dicts keep their order (iteration order is part of the
state: it decides ties), and an object referenced twice (the resource index shared by
the cluster state and the quota table, say) is restored once and shared again. Sets are
written in a canonical order, so equal states give equal bytes and replay can compare a
recorded snapshot with the state it re-derives.

Decoding trusts nothing: only the engine's own state classes and the event structs can
be built, numpy arrays only of plain numeric dtypes and of consistent size, and any
inconsistency is a :class:`SnapshotError` (the caller then folds the log from the start).

Why one module of over 500 lines: the encoder and the decoder are two halves of one
format (the tagged tree); kept together, a change to one is seen beside the other.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import gc
import hashlib
import json
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

import msgspec
import numpy as np

import events.types as event_types
from engine.config import SchedulerConfig, parse_config
from engine.engine import Engine
from engine.framework.registry import Registry
from engine.model.cards import Cards
from engine.model.changes import ClusterEvent
from engine.model.devices import CardNeed, GpuRequest
from engine.model.disruption import DisruptionBudgets
from engine.model.groups import GroupInfo, GroupPhase
from engine.model.pods import PodInfo, pod_info
from engine.model.pools import PoolRule, Pools
from engine.model.queue import SchedulingQueue, _Entry
from engine.model.quota import Quota, QuotaTable
from engine.model.reservations import Reservation, ReservationState
from engine.model.resources import ResourceIndex
from engine.model.retention import Deadlines, Retired
from engine.model.shapes import ShapeCounts
from engine.model.state import ClusterState, PlacedPod
from events.errors import InputError
from events.types import SnapshotTaken

FORMAT: Final = 17
"""Bumped whenever the state classes change shape: a snapshot of another format is
refused (and its component folds its partition from the start instead). 5: nodes keep
their annotations (``ClusterState.node_annotations``). 6: GPU cards (``Cards``, the
devices of ``PlacedPod``, ``ResourceIndex.card_needs``). 7: pod disruption budgets
(``DisruptionBudgets``, ``routed_disruptions``). 8: quotas count GPU cards in
milli-cards, shares included (``QuotaTable``); ``CardNeed.vgpu``; ``planned`` keeps
each member's node. 10: ``Reservation.plain`` (a part of pods in no gang). 11:
``Reservation.devices`` (the GPU cards the coordinator chose), ``ShapeCounts.told`` (a
shard's learnt shapes are the coordinator's), ``ShardModel.awaited`` (preemptors whose
evictions' room a shard holds). 12: ``ShardModel.planned_cards`` (the GPU cards planned
for a gang's members after its evictions). 13: ``Reservation.leaving`` and ``lifted`` (the
pods a plan of moves takes from the shard that holds the part). 14: the coordinator's
``moves_after`` (a plan's moves within a shard, sent once its moves across are done),
``Reservation.moved_by`` (the gang member each move of a part makes room for). 15:
``ShardModel.routed_counts`` (the placed and moved pods a move budget measures, counted
over every shard); the coordinator's ``consolidation_due`` and ``decided_since`` (it
consolidates for the shards), and the GPU cards of ``moves_after``; pods handed to the
node the coordinator chose (``ShardModel.routed_nodes``, the coordinator's
``directed``). 16: no ``ShardModel.awaited`` (a shard under a coordinator no longer
moves pods on its own, so it no longer holds an eviction's room for its pod). 17:
``PodInfo`` has no ``extra`` (a dict per pod that nothing read); ``PodInfo``,
``PlacedPod``, the queue's entries and the coordinator's flights are msgspec structs
the cyclic collector does not track (their attributes are written in the order of
their slots, by name)."""
CHUNK_BYTES: Final = 256 * 1024
MAX_STATE_BYTES: Final = 1 << 31
STATE_CLASSES: Final[dict[str, type]] = {
    cls.__qualname__: cls
    for cls in (
        ClusterState,
        Cards,
        ShapeCounts,
        CardNeed,
        GpuRequest,
        PlacedPod,
        ResourceIndex,
        SchedulingQueue,
        _Entry,
        QuotaTable,
        Quota,
        DisruptionBudgets,
        PodInfo,
        GroupInfo,
        Reservation,
        Pools,
        PoolRule,
        Retired,
        Deadlines,
    )
}
"""The only classes a snapshot may build (besides event structs and containers)."""
VALUES: Final[frozenset[type]] = frozenset({CardNeed, GpuRequest})
"""Immutable value classes, written by value each time they occur (never as references):
whether two places hold one object or two equal ones (a constant, or one derived again
on restore) must not change the bytes."""
ENUMS: Final[dict[str, type[enum.Enum]]] = {
    cls.__qualname__: cls for cls in (ClusterEvent, GroupPhase, ReservationState)
}
STRUCTS: Final[dict[str, type[msgspec.Struct]]] = {
    name: obj
    for name, obj in vars(event_types).items()
    if isinstance(obj, type) and issubclass(obj, msgspec.Struct) and obj is not msgspec.Struct
}
DTYPES: Final = frozenset(
    np.dtype(t).str for t in ("bool", "int8", "int16", "int32", "int64", "float32", "float64")
)
DERIVED: Final[dict[type, frozenset[str]]] = {
    PodInfo: frozenset({"request", "static_key", "shape_key", "gpu"}),
}
"""Attributes left out of a snapshot and derived again on restore (from the pod's spec:
cheaper than writing thousands of nested tuples)."""
NOT_STATE: Final = frozenset(
    {"config", "profiles", "hints", "_registry", "dispatch", "explain", "explanations", "unfolded"}
    | {"extenders"}
)
"""Engine attributes rebuilt from the configuration (and the component that runs the
engine), or diagnostics of one replay. ``extenders`` (asks in flight): format 5 has no
place for them, so the components write no snapshot while an ask is in flight."""
MAX_DEPTH: Final = 64


@dataclass(frozen=True)
class Allowed:
    """What one kind of snapshot may hold besides containers, scalars, numpy arrays and
    event structs: its state classes (by name), enums, and attributes derived again on
    restore instead of written."""

    classes: Mapping[str, type]
    enums: Mapping[str, type[enum.Enum]] = field(default_factory=dict)
    derived: Mapping[type, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, *classes: type, enums: tuple[type[enum.Enum], ...] = ()) -> Allowed:
        return cls({c.__qualname__: c for c in classes}, {e.__qualname__: e for e in enums})


ENGINE: Final = Allowed(STATE_CLASSES, ENUMS, DERIVED)
_SCALARS: Final = (str, int, float, bool, type(None), bytes)
_SCALAR_TYPES: Final = frozenset(_SCALARS)


class SnapshotError(ValueError):
    """A snapshot that cannot be restored (corrupt, foreign, or of another format)."""


# --------------------------------------------------------------------------- encode


class _Encoder:
    def __init__(self, allowed: Allowed) -> None:
        self.allowed = allowed
        self.memo: dict[int, int] = {}
        self.keep: list[object] = []  # ids stay unique while the walk runs
        self.constants: dict[int, list[Any]] = {}
        """Constant arrays written so far, by id, with their nodes."""
        self.layouts: dict[type, _Layout | None] = {}
        """Per type met: how its objects are written as ``O`` nodes, or None for a type
        some other branch handles (a snapshot holds a hundred thousand pods: looking
        each one's attributes up through its class's MRO was most of the time)."""

    def _ref(self, obj: object) -> int | None:
        """The reference number of ``obj`` if it was written already; else register it."""
        key = id(obj)
        ref = self.memo.get(key)
        if ref is None:
            self.memo[key] = len(self.memo)
            self.keep.append(obj)
        return ref

    def encode(self, obj: Any) -> Any:
        kind = type(obj)
        if kind in _SCALAR_TYPES:
            return obj
        layouts = self.layouts
        layout = layouts[kind] if kind in layouts else self._layout(kind)
        if layout is not None:
            if kind in VALUES:
                return ["O", layout.name, self._attributes(obj, layout)]
            ref = self._ref(obj)
            if ref is not None:
                return ["R", ref]
            return ["O", layout.name, self._attributes(obj, layout)]
        if kind is tuple:
            if _SCALAR_TYPES.issuperset(map(type, obj)):
                return ["T", list(obj)]
            encode = self.encode
            return ["T", [v if type(v) in _SCALAR_TYPES else encode(v) for v in obj]]
        if kind is np.ndarray and _is_constant(obj):
            return self._constant(obj)
        if kind is dict:
            ref = self._ref(obj)
            if ref is not None:
                return ["R", ref]
            encode = self.encode
            return [
                "D",
                [
                    [
                        k if type(k) in _SCALAR_TYPES else encode(k),
                        v if type(v) in _SCALAR_TYPES else encode(v),
                    ]
                    for k, v in obj.items()
                ],
            ]
        if isinstance(obj, np.generic):
            return ["n", obj.dtype.str, obj.tobytes()]
        if isinstance(obj, msgspec.Struct):
            name = type(obj).__name__
            if STRUCTS.get(name) is not type(obj):
                raise TypeError(f"not a snapshot struct: {type(obj)!r}")
            return ["S", name, msgspec.msgpack.encode(obj)]
        if isinstance(obj, frozenset):
            return ["F", self._sorted(obj)]
        if isinstance(obj, enum.Enum):
            if self.allowed.enums.get(type(obj).__qualname__) is not type(obj):
                raise TypeError(f"not a snapshot enum: {type(obj)!r}")
            return ["V", type(obj).__qualname__, obj.value]
        if isinstance(obj, np.ndarray) and _is_constant(obj):
            return self._constant(obj)  # of a subclass of ndarray
        ref = self._ref(obj)
        if ref is not None:
            return ["R", ref]
        if kind is list:
            encode = self.encode
            return ["L", [v if type(v) in _SCALAR_TYPES else encode(v) for v in obj]]
        if isinstance(obj, dict):
            raise TypeError(f"not a snapshot mapping: {kind!r}")
        if isinstance(obj, set):
            return ["E", self._sorted(obj)]
        if isinstance(obj, collections.deque):
            return ["Q", [self.encode(v) for v in obj], obj.maxlen]
        if isinstance(obj, np.ndarray):
            if obj.dtype.str not in DTYPES:
                raise TypeError(f"not a snapshot array dtype: {obj.dtype}")
            if obj.base is not None:
                return self._view(obj)
            if not obj.flags.c_contiguous:
                raise TypeError("not a snapshot array: not C-contiguous")
            return ["N", obj.dtype.str, list(obj.shape), obj.tobytes()]
        raise TypeError(f"not a snapshot class: {kind.__module__}.{kind.__qualname__}")

    def _constant(self, array: np.ndarray[Any, Any]) -> list[Any]:
        """A constant (shared by pods of one shape, never written) as a value, so that
        equal states give equal bytes however their constants came to be shared; built
        once per object and the node reused (a pod each holds one)."""
        node = self.constants.get(id(array))
        if node is None:
            node = ["C", array.dtype.str, list(array.shape), array.tobytes()]
            self.constants[id(array)] = node
            self.keep.append(array)
        return node

    def _layout(self, kind: type) -> _Layout | None:
        """How objects of ``kind`` are written, if they are state objects (an allowed
        class that no other branch of :meth:`encode` takes); remembered per type."""
        layout = None
        allowed = self.allowed.classes.get(kind.__qualname__) is kind
        if allowed and (issubclass(kind, msgspec.Struct) or not issubclass(kind, _NOT_OBJECTS)):
            derived = self.allowed.derived.get(kind) or frozenset()
            slots = tuple(
                name
                for cls in kind.__mro__
                for name in _own_slots(cls)
                if name not in {"__weakref__", "__dict__"} and name not in derived
            )
            has_dict = any("__dict__" in vars(cls) for cls in kind.__mro__)
            layout = _Layout(kind.__qualname__, slots, has_dict, derived)
        self.layouts[kind] = layout
        return layout

    def _attributes(self, obj: object, layout: _Layout) -> list[list[Any]]:
        """An object's attributes as ``[name, encoded]`` pairs: those in its
        ``__dict__`` first, then its slots along the MRO (unset ones left out), less the
        derived ones."""
        encode = self.encode
        out: list[list[Any]] = []
        if layout.has_dict and hasattr(obj, "__dict__"):
            derived = layout.derived
            out.extend(
                [k, v if type(v) in _SCALAR_TYPES else encode(v)]
                for k, v in vars(obj).items()
                if k not in derived
            )
        missing = _MISSING
        for name in layout.slots:
            v = getattr(obj, name, missing)
            if v is not missing:
                out.append([name, v if type(v) in _SCALAR_TYPES else encode(v)])
        return out

    def _view(self, view: np.ndarray[Any, Any]) -> list[Any]:
        """A view stays a view of the same array (``ClusterState``'s columns are views
        of one stacked array: writing through one must show through the other)."""
        root = view.base
        while isinstance(root, np.ndarray) and root.base is not None:
            root = root.base
        if not isinstance(root, np.ndarray):
            raise TypeError("not a snapshot array: a view of a foreign buffer")
        offset = view.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        return [
            "W",
            self.encode(root),
            view.dtype.str,
            list(view.shape),
            list(view.strides),
            offset,
        ]

    def _sorted(self, items: Any) -> list[Any]:
        encoded = [self.encode(v) for v in items]
        return sorted(encoded, key=msgspec.msgpack.encode)


def _is_constant(array: np.ndarray[Any, Any]) -> bool:
    """A read-only array that owns its C-contiguous data of a plain dtype."""
    return (
        not array.flags.writeable
        and array.base is None
        and array.flags.c_contiguous
        and array.dtype.str in DTYPES
    )


def _blank(cls: type) -> object:
    """An object of state class ``cls`` with no state yet (its attributes are set next):
    a msgspec struct is built with None for every field it requires, as
    ``object.__new__`` cannot make one."""
    if issubclass(cls, msgspec.Struct):
        fields = cls.__struct_fields__
        return cls(*[None] * (len(fields) - len(cls.__struct_defaults__)))
    obj: object = object.__new__(cls)
    return obj


def _own_slots(cls: type) -> tuple[str, ...]:
    """The slots ``cls`` itself declares (not those it inherits: each class of the MRO
    names its own, and an inherited one would be written twice)."""
    slots = vars(cls).get("__slots__", ())
    return (slots,) if isinstance(slots, str) else tuple(slots)


@dataclass(frozen=True, slots=True)
class _Layout:
    """How the encoder writes one state class's objects."""

    name: str
    slots: tuple[str, ...]
    has_dict: bool
    derived: frozenset[str]


_MISSING: Final = object()
_NOT_OBJECTS: Final = (
    tuple,
    dict,
    list,
    set,
    frozenset,
    collections.deque,
    np.generic,
    np.ndarray,
    msgspec.Struct,
    enum.Enum,
    *_SCALARS,
)
"""Types :meth:`_Encoder.encode` writes by their own rules, never as ``O`` nodes."""


def rederive(decoder: _Decoder, engine: Engine) -> None:
    """Fill in what :data:`DERIVED` left out, as the engine first derived it."""
    resources = engine.state.resources
    for obj in decoder.created:
        if type(obj) is PodInfo:
            spec = getattr(obj, "spec", None)
            seq = getattr(obj, "seq", None)
            if not isinstance(spec, event_types.PodSpec) or not isinstance(seq, int):
                raise SnapshotError("a pod without its spec")
            fresh = pod_info(spec, resources, seq)
            obj.request, obj.static_key, obj.shape_key, obj.gpu = (
                fresh.request,
                fresh.static_key,
                fresh.shape_key,
                fresh.gpu,
            )


def encode_state(engine: Engine) -> bytes:
    """The engine's state as bytes; equal states give equal bytes."""
    engine.queue.compact()
    engine.deadlines.compact()
    state = [(k, v) for k, v in vars(engine).items() if k not in NOT_STATE]
    header = {"shard": engine.shard, "config": config_source(engine.config)}
    return encode_tree(header, state, ENGINE)


def encode_tree(
    header: Mapping[str, Any], state: Sequence[tuple[str, Any]], allowed: Allowed
) -> bytes:
    """``state`` (attribute, value pairs) and plain ``header`` fields as snapshot bytes."""
    with _collector_paused():
        encoder = _Encoder(allowed)
        tree = {**header, "format": FORMAT, "state": [[k, encoder.encode(v)] for k, v in state]}
        return msgspec.msgpack.encode(tree)


def encode_trees(
    header: Callable[[bytes], Mapping[str, Any]],
    state: Sequence[tuple[str, Any]],
    more: Sequence[tuple[str, Any]],
    allowed: Allowed,
) -> tuple[bytes, bytes]:
    """``alone = encode_tree({}, state)`` and ``encode_tree(header(alone), [*state,
    *more])``: the same bytes as those two calls give, with ``state`` encoded once (a
    coordinator's snapshot holds its state and a digest of it: at 130,000 nodes each
    encoding took seconds)."""
    with _collector_paused():
        encoder = _Encoder(allowed)
        encoded = [[k, encoder.encode(v)] for k, v in state]
        alone = msgspec.msgpack.encode({"format": FORMAT, "state": encoded})
        encoded += [[k, encoder.encode(v)] for k, v in more]
        tree = {**header(alone), "format": FORMAT, "state": encoded}
        return alone, msgspec.msgpack.encode(tree)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic collector paused while a snapshot's tree is built: the tree is
    millions of small lists that all survive until it is written (so every collection
    would rescan them, and the whole state with them), and none of them is in a cycle
    (reference counting frees them). At 20,000 pods this halved the time."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def decode_tree(data: bytes) -> dict[str, Any]:
    """The header fields of snapshot bytes, ``state`` still encoded."""
    try:
        tree = msgspec.msgpack.decode(data)
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"unreadable: {exc}") from None
    if not isinstance(tree, dict) or tree.get("format") != FORMAT:
        raise SnapshotError(f"not a format {FORMAT} snapshot")
    if not isinstance(tree.get("state"), list):
        raise SnapshotError("malformed state")
    return tree


def decode_state(
    tree: Mapping[str, Any], allowed: Allowed, like: object, not_state: frozenset[str]
) -> tuple[dict[str, Any], _Decoder]:
    """The attributes a snapshot holds for an object shaped like ``like`` (every one of
    its attributes but ``not_state``, each of the same kind), decoded."""
    expected = {k for k in vars(like) if k not in not_state}
    decoder = _Decoder(allowed)
    restored: dict[str, Any] = {}
    try:
        for pair in tree["state"]:
            if not isinstance(pair, list) or len(pair) != 2 or pair[0] not in expected:
                raise SnapshotError(f"unexpected attribute {pair!r:.60}")
            restored[pair[0]] = decoder.decode(pair[1])
    except RecursionError:
        raise SnapshotError("nested too deeply") from None
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        if isinstance(exc, SnapshotError):
            raise
        raise SnapshotError(f"inconsistent: {exc}") from None
    missing = expected - set(restored)
    if missing:
        raise SnapshotError(f"missing state: {', '.join(sorted(missing))}")
    for key, value in restored.items():
        before = getattr(like, key)
        if type(value) is not type(before) and before is not None:
            raise SnapshotError(f"attribute {key!r} has the wrong kind")
    return restored, decoder


def digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def snapshot_events(
    engine: Engine, position: int, *, component: str, chunk: int = CHUNK_BYTES
) -> list[SnapshotTaken]:
    """The engine's state as the parts of one snapshot."""
    return snapshot_parts(encode_state(engine), position, component=component, chunk=chunk)


def snapshot_parts(
    raw: bytes, position: int, *, component: str, chunk: int = CHUNK_BYTES
) -> list[SnapshotTaken]:
    """Snapshot bytes as the parts of one snapshot (compressed, ``chunk`` bytes each:
    small enough for any log's record size limit)."""
    packed = zlib.compress(raw, 1)
    pieces = [packed[i : i + chunk] for i in range(0, len(packed), chunk)] or [b""]
    sha = digest(raw)
    return [
        SnapshotTaken(
            component=component,
            position=position,
            part=i,
            parts=len(pieces),
            digest=sha,
            data=piece,
        )
        for i, piece in enumerate(pieces)
    ]


def assemble(parts: Sequence[SnapshotTaken]) -> bytes:
    """The uncompressed state of a complete snapshot (its parts in order)."""
    if not parts:
        raise SnapshotError("no parts")
    first = parts[0]
    if [p.part for p in parts] != list(range(first.parts)) or any(
        (p.parts, p.digest, p.component, p.position)
        != (first.parts, first.digest, first.component, first.position)
        for p in parts
    ):
        raise SnapshotError("its parts do not belong together")
    try:
        raw = zlib.decompressobj().decompress(b"".join(p.data for p in parts), MAX_STATE_BYTES)
    except zlib.error as exc:
        raise SnapshotError(f"unreadable: {exc}") from None
    if digest(raw) != first.digest:
        raise SnapshotError("its state does not match its digest")
    return raw


def format_of(parts: Sequence[SnapshotTaken]) -> int | None:
    """The format a complete snapshot was written in (None: unreadable)."""
    try:
        tree = msgspec.msgpack.decode(assemble(parts))
    except (SnapshotError, msgspec.DecodeError):
        return None
    fmt = tree.get("format") if isinstance(tree, dict) else None
    return fmt if isinstance(fmt, int) else None


def config_source(config: SchedulerConfig) -> str:
    source = config.source
    return json.dumps(source, sort_keys=True, default=str) if source else ""


# --------------------------------------------------------------------------- decode


class _Decoder:
    def __init__(self, allowed: Allowed) -> None:
        self.allowed = allowed
        self.refs: list[object] = []
        self.constants: dict[tuple[str, str, bytes], np.ndarray[Any, Any]] = {}
        self.created: list[object] = []

    def decode(self, node: Any, depth: int = 0) -> Any:
        if isinstance(node, _SCALARS):
            return node
        if depth > MAX_DEPTH:
            raise SnapshotError("nested too deeply")
        if not isinstance(node, list) or not node or not isinstance(node[0], str):
            raise SnapshotError(f"malformed node {type(node).__name__}")
        tag = node[0]
        handler = self._handlers.get(tag)
        if handler is None:
            raise SnapshotError(f"unknown node kind {tag!r}")
        return handler(self, node, depth + 1)

    def _items(self, node: Any, depth: int) -> list[Any]:
        if len(node) < 2 or not isinstance(node[1], list):
            raise SnapshotError(f"malformed {node[0]!r} node")
        return [self.decode(v, depth) for v in node[1]]

    def _register(self, obj: object) -> None:
        self.refs.append(obj)

    def _list(self, node: Any, depth: int) -> list[Any]:
        out: list[Any] = []
        self._register(out)
        out.extend(self._items(node, depth))
        return out

    def _dict(self, node: Any, depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        self._register(out)
        if len(node) != 2 or not isinstance(node[1], list):
            raise SnapshotError("malformed mapping")
        for pair in node[1]:
            if not isinstance(pair, list) or len(pair) != 2:
                raise SnapshotError("malformed mapping entry")
            key = self.decode(pair[0], depth)
            if isinstance(key, list | dict | set):
                raise SnapshotError("unhashable mapping key")
            out[key] = self.decode(pair[1], depth)
        return out

    def _set(self, node: Any, depth: int) -> set[Any]:
        out: set[Any] = set()
        self._register(out)
        out.update(self._items(node, depth))
        return out

    def _deque(self, node: Any, depth: int) -> collections.deque[Any]:
        if len(node) != 3 or not (node[2] is None or isinstance(node[2], int)):
            raise SnapshotError("malformed deque")
        out: collections.deque[Any] = collections.deque(maxlen=node[2])
        self._register(out)
        out.extend(self._items(node, depth))
        return out

    def _array(self, node: Any, depth: int) -> np.ndarray[Any, Any]:
        out = self._make_array(node)
        self._register(out)
        return out

    @staticmethod
    def _make_array(node: Any) -> np.ndarray[Any, Any]:
        if len(node) != 4 or node[1] not in DTYPES or not isinstance(node[3], bytes):
            raise SnapshotError("malformed array")
        shape = node[2]
        if not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
        ):
            raise SnapshotError("malformed array shape")
        dtype = np.dtype(node[1])
        size = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if size * dtype.itemsize != len(node[3]):
            raise SnapshotError("array size does not match its shape")
        return np.frombuffer(node[3], dtype=dtype).reshape(shape).copy()

    def _constant(self, node: Any, depth: int) -> np.ndarray[Any, Any]:
        if len(node) != 4 or not isinstance(node[3], bytes):
            raise SnapshotError("malformed constant array")
        key = (node[1], str(node[2]), node[3])
        out = self.constants.get(key)
        if out is None:
            out = self._make_array(node)
            out.flags.writeable = False
            self.constants[key] = out
        return out

    def _view(self, node: Any, depth: int) -> np.ndarray[Any, Any]:
        if len(node) != 6 or node[2] not in DTYPES:
            raise SnapshotError("malformed array view")
        base = self.decode(node[1], depth)
        shape, strides, offset = node[3], node[4], node[5]
        if (
            not isinstance(base, np.ndarray)
            or not isinstance(shape, list)
            or not isinstance(strides, list)
            or len(shape) != len(strides)
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in [*shape, *strides])
            or not isinstance(offset, int)
        ):
            raise SnapshotError("malformed array view")
        try:  # numpy checks that the view lies inside its base
            out = np.ndarray(
                tuple(shape), np.dtype(node[2]), buffer=base, offset=offset, strides=tuple(strides)
            )
        except (ValueError, TypeError) as exc:
            raise SnapshotError(f"array view outside its base: {exc}") from None
        self._register(out)
        return out

    def _object(self, node: Any, depth: int) -> object:
        if len(node) != 3 or not isinstance(node[2], list):
            raise SnapshotError("malformed object")
        cls = self.allowed.classes.get(node[1]) if isinstance(node[1], str) else None
        if cls is None:
            raise SnapshotError(f"not a snapshot class: {node[1]!r}")
        obj = _blank(cls)
        put = setattr if isinstance(obj, msgspec.Struct) else object.__setattr__
        if cls not in VALUES:  # values are written by value, never referred to
            self._register(obj)
        self.created.append(obj)
        for pair in node[2]:
            if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], str):
                raise SnapshotError("malformed attribute")
            if pair[0].startswith("__"):
                raise SnapshotError(f"attribute {pair[0]!r} is not state")
            try:
                put(obj, pair[0], self.decode(pair[1], depth))
            except AttributeError as exc:
                raise SnapshotError(f"{node[1]} has no attribute {pair[0]!r}") from exc
        return obj

    def _ref(self, node: Any, depth: int) -> object:
        if len(node) != 2 or not isinstance(node[1], int) or not 0 <= node[1] < len(self.refs):
            raise SnapshotError("dangling reference")
        return self.refs[node[1]]

    def _tuple(self, node: Any, depth: int) -> tuple[Any, ...]:
        return tuple(self._items(node, depth))

    def _frozenset(self, node: Any, depth: int) -> frozenset[Any]:
        return frozenset(self._items(node, depth))

    def _struct(self, node: Any, depth: int) -> msgspec.Struct:
        cls = STRUCTS.get(node[1]) if len(node) == 3 and isinstance(node[1], str) else None
        if cls is None or not isinstance(node[2], bytes):
            raise SnapshotError("malformed struct")
        try:
            return msgspec.msgpack.decode(node[2], type=cls)
        except msgspec.DecodeError as exc:
            raise SnapshotError(f"malformed {node[1]}: {exc}") from None

    def _enum(self, node: Any, depth: int) -> enum.Enum:
        cls = (
            self.allowed.enums.get(node[1]) if len(node) == 3 and isinstance(node[1], str) else None
        )
        if cls is None:
            raise SnapshotError("malformed enum member")
        try:
            return cls(node[2])
        except ValueError:
            raise SnapshotError(f"no {node[1]} member {node[2]!r}") from None

    def _scalar(self, node: Any, depth: int) -> Any:
        if len(node) != 3 or node[1] not in DTYPES or not isinstance(node[2], bytes):
            raise SnapshotError("malformed scalar")
        dtype = np.dtype(node[1])
        if len(node[2]) != dtype.itemsize:
            raise SnapshotError("malformed scalar")
        return np.frombuffer(node[2], dtype=dtype)[0]

    _handlers: ClassVar[dict[str, Callable[[_Decoder, Any, int], Any]]] = {
        "L": _list,
        "D": _dict,
        "E": _set,
        "Q": _deque,
        "N": _array,
        "W": _view,
        "C": _constant,
        "O": _object,
        "R": _ref,
        "T": _tuple,
        "F": _frozenset,
        "S": _struct,
        "n": _scalar,
        "V": _enum,
    }


def restore(
    data: bytes,
    config: SchedulerConfig | None = None,
    *,
    shard: int = 0,
    registry: Registry | None = None,
) -> Engine:
    """An engine in the state ``data`` (from :func:`encode_state`) describes.

    ``config`` is used when the snapshot's engine ran on a configuration that was not
    read from a document (the defaults, or one given in code), as a restarted shard
    given the same one would."""
    tree = decode_tree(data)
    if tree.get("shard") != shard:
        raise SnapshotError(f"a snapshot of shard {tree.get('shard')!r}, not of shard {shard}")
    source = tree.get("config")
    if not isinstance(source, str):
        raise SnapshotError("malformed configuration")
    if source:
        try:
            config = parse_config(json.loads(source), "snapshot")
        except (ValueError, InputError) as exc:
            raise SnapshotError(f"its configuration is invalid: {exc}") from None
    engine = Engine(config, shard=shard, registry=registry)
    restored, decoder = decode_state(tree, ENGINE, engine, NOT_STATE)
    for key, value in restored.items():
        setattr(engine, key, value)
    if not isinstance(engine.state, ClusterState) or not isinstance(
        engine.state.resources, ResourceIndex
    ):
        raise SnapshotError("malformed cluster state")
    try:
        rederive(decoder, engine)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        if isinstance(exc, SnapshotError):
            raise
        raise SnapshotError(f"inconsistent pod: {exc}") from None
    return engine
