"""Plugins from other packages: a class becomes a registry factory, with typed args.

A user plugin is a class with a ``name`` (the one a configuration names) implementing
the phase Protocols of :mod:`engine.framework.interfaces` it needs. Two optional parts:

- ``Args``: a ``msgspec.Struct`` (or dataclass) type; the profile's ``pluginConfig``
  args are decoded into it (unknown fields refused if the Struct says
  ``forbid_unknown_fields=True``; a wrong type is an error naming the field). Without
  ``Args``, a plugin takes no args.
- its ``__init__`` takes ``args`` (the decoded ``Args``) and/or ``handle`` (what it may
  read of the engine beyond the pod and the nodes' columns, :mod:`engine.framework.handle`)
  as keywords, as it declares them.

The vectorised contract is the default: a filter returns a mask over all the shard's
slots, a score an array (or one int for every node). A class that defines
``filter_node(pod, node)`` and/or ``score_node(pod, node)`` instead (per node, with a
:class:`NodeView`) is wrapped in :class:`PerNodeFilter` / :class:`PerNodeScore`, which
loop over the nodes in Python: simple to write, and slower by about the number of nodes
(a Python call per node where a vectorised plugin does one numpy operation).

Nothing here loads anything: the runtime (``shards/``) finds the classes (entry points,
which is I/O) and registers :func:`plugin_factory` of each.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import msgspec
import numpy as np

from engine.framework.cycle import CycleState
from engine.framework.handle import Handle
from engine.framework.interfaces import (
    ALL_EVENTS,
    FilterPlugin,
    Plugin,
    PostFilterPlugin,
    PreFilterPlugin,
    PreScorePlugin,
    ReservePlugin,
    ScorePlugin,
)
from engine.framework.registry import PluginFactory
from engine.model.changes import ClusterEvent
from engine.model.pods import PodInfo
from engine.model.state import Bools, ClusterState, Ints
from events.errors import InputError
from events.types import Taint

_PHASES: tuple[tuple[str, type, tuple[str, ...]], ...] = (
    ("pre_filter", PreFilterPlugin, ()),
    ("filter", FilterPlugin, ("static", "unresolvable", "local", "reasons", "events")),
    ("post_filter", PostFilterPlugin, ()),
    ("pre_score", PreScorePlugin, ()),
    ("score", ScorePlugin, ("local",)),
    ("reserve", ReservePlugin, ("unreserve",)),
)
_AT = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as a per-node plugin sees it (built for each call)."""

    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool
    allocatable: Mapping[str, int]
    free: Mapping[str, int]


def node_view(state: ClusterState, slot: int) -> NodeView:
    names = state.resources.names
    rows = range(min(len(names), state.alloc.shape[0]))
    return NodeView(
        name=state.names[slot] or "",
        labels=MappingProxyType(state.node_labels[slot]),
        annotations=MappingProxyType(state.node_annotations[slot]),
        taints=state.node_taints[slot],
        unschedulable=bool(state.unschedulable[slot]),
        allocatable={names[r]: int(state.alloc[r, slot]) for r in rows},
        free={names[r]: int(state.free[r, slot]) for r in rows},
    )


class _PerNode:
    """What the per-node adapters share: the wrapped plugin and the slots to visit."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.static: bool = bool(getattr(inner, "static", False))
        self.unresolvable: bool = bool(getattr(inner, "unresolvable", False))
        self.local = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    @staticmethod
    def _slots(state: ClusterState, among: Bools | None = None) -> list[int]:
        top = state.high_water
        mask = state.valid[:top] if among is None else state.valid[:top] & among[:top]
        return [int(s) for s in np.flatnonzero(mask)]


class PerNodeFilter(_PerNode):
    """A filter written per node (``filter_node(pod, node) -> bool``), run over every
    node in a Python loop. Neither static nor local (recomputed on every attempt) unless
    the plugin says ``static = True`` (its verdict depends only on the pod and the
    node's name, labels, annotations and taints, never on free resources)."""

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Bools:
        out = np.zeros(state.capacity, dtype=np.bool_)
        for slot in self._slots(state):
            out[slot] = bool(self.inner.filter_node(pod, node_view(state, slot)))
        return out

    def reasons(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, rejected: Bools
    ) -> dict[str, int]:
        reason = str(getattr(self.inner, "reason", f"rejected by {self.name}"))
        return {reason: int(rejected.sum())}

    def events(self) -> frozenset[ClusterEvent]:
        return ALL_EVENTS


class PerNodeScore(_PerNode):
    """A score written per node (``score_node(pod, node) -> int``, 0..100; values
    outside are clipped), run over the feasible nodes in a Python loop."""

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools) -> Ints:
        out = np.zeros(state.capacity, dtype=np.int64)
        for slot in self._slots(state, feasible):
            out[slot] = min(max(int(self.inner.score_node(pod, node_view(state, slot))), 0), 100)
        return out


class PerNodeBoth(PerNodeFilter, PerNodeScore):
    """Both ``filter_node`` and ``score_node``."""


def _per_node(inner: Any) -> Plugin:
    has_filter, has_score = hasattr(inner, "filter_node"), hasattr(inner, "score_node")
    if has_filter and has_score:
        return PerNodeBoth(inner)
    return PerNodeFilter(inner) if has_filter else PerNodeScore(inner)


def decode_args(cls: type, args: Mapping[str, Any], where: str) -> Any:
    """``args`` decoded into ``cls.Args`` (None without one); an error names the field."""
    spec = getattr(cls, "Args", None)
    if spec is None:
        if args:
            raise InputError(f"takes no args, got {sorted(args)}", location=where)
        return None
    try:
        return msgspec.convert(dict(args), spec, strict=True)
    except msgspec.ValidationError as exc:
        match = _AT.match(str(exc))
        assert match is not None
        path = (match.group("path") or "").lstrip(".")
        field = f"args.{path}" if path else "args"
        raise InputError(match.group("message"), location=f"{where}: {field}") from None


def plugin_factory(cls: type, name: str) -> PluginFactory:
    """A registry factory for the user plugin class ``cls`` registered as ``name``."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]

    def factory(args: Mapping[str, Any], where: str, handle: Handle) -> Plugin:
        decoded = decode_args(cls, args, where)
        kwargs: dict[str, Any] = {}
        if "args" in params:
            kwargs["args"] = decoded
        if "handle" in params:
            kwargs["handle"] = handle
        instance = cls(**kwargs)
        if getattr(instance, "name", None) != name:
            raise InputError(
                f"the plugin class {cls.__qualname__} is named "
                f"{getattr(instance, 'name', None)!r}, not {name!r}",
                location=where,
            )
        if hasattr(instance, "filter_node") or hasattr(instance, "score_node"):
            return _per_node(instance)
        implemented = False
        for method, proto, needs in _PHASES:
            if not hasattr(instance, method):
                continue
            missing = [attr for attr in needs if not hasattr(instance, attr)]
            if missing:
                raise InputError(
                    f"the plugin class {cls.__qualname__} has {method}() but not "
                    f"{', '.join(missing)} (see engine/framework/interfaces.py)",
                    location=where,
                )
            implemented = implemented or isinstance(instance, proto)
        if not implemented and not hasattr(instance, "permit"):
            raise InputError(
                f"the plugin class {cls.__qualname__} implements no extension point",
                location=where,
            )
        plugin: Plugin = instance
        return plugin

    return factory
