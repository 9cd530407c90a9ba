"""Per-attempt scratch state, keys namespaced by plugin."""

from __future__ import annotations

from typing import Any


class CycleState:
    """Data a plugin computes in one phase and reads in a later one of the same attempt.

    Keys are ``(plugin name, key)`` so plugins cannot collide. ``clone`` gives an
    independent copy for what-if runs (preemption); values are shared, so plugins store
    immutable values or copy on write.
    """

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data: dict[tuple[str, str], Any] = {}

    def __repr__(self) -> str:
        return f"CycleState({sorted(self._data)})"

    def write(self, plugin: str, key: str, value: Any) -> None:
        self._data[(plugin, key)] = value

    def read(self, plugin: str, key: str, default: Any = None) -> Any:
        return self._data.get((plugin, key), default)

    def clone(self) -> CycleState:
        new = CycleState()
        new._data = dict(self._data)
        return new
