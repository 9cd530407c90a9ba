"""Resource names and their rows in the columnar state.

The first rows are fixed (cpu, memory, pods, ephemeral-storage); extended resources
(``nvidia.com/gpu``, ``hugepages-2Mi``...) get the next row the first time any node or
pod names them. Rows are never reused, so an index stays valid for the life of a shard.
"""

from __future__ import annotations

from typing import Final

from engine.model.devices import CardNeed

CPU: Final = 0
MEMORY: Final = 1
PODS: Final = 2
EPHEMERAL: Final = 3
BASE_RESOURCES: Final = ("cpu", "memory", "pods", "ephemeral-storage")

DEFAULT_MILLI_CPU_REQUEST: Final = 100
"""kube-scheduler scores a pod without a cpu request as if it asked for 100m."""
DEFAULT_MEMORY_REQUEST: Final = 200 * 1024 * 1024
"""... and one without a memory request as if it asked for 200Mi."""


class ResourceIndex:
    """Maps resource names to row numbers; append-only."""

    def __init__(self) -> None:
        self._rows: dict[str, int] = {name: i for i, name in enumerate(BASE_RESOURCES)}
        self._names: list[str] = list(BASE_RESOURCES)
        self.card_needs: dict[int, CardNeed] = {}
        """Rows that count a node's cards satisfying a need (see :mod:`engine.model.cards`)."""

    def __repr__(self) -> str:
        return f"ResourceIndex({self._names})"

    def __len__(self) -> int:
        return len(self._names)

    def row(self, name: str) -> int:
        """The row of ``name``, registering it if new."""
        row = self._rows.get(name)
        if row is None:
            row = len(self._names)
            self._rows[name] = row
            self._names.append(name)
        return row

    def card_row(self, need: CardNeed) -> int:
        """The row counting cards that satisfy ``need``, registering it if new."""
        row = self.row(need.label())
        self.card_needs[row] = need
        return row

    def get(self, name: str) -> int | None:
        """The row of ``name``, or None if no node or pod has named it yet."""
        return self._rows.get(name)

    def name(self, row: int) -> str:
        return self._names[row]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._names)
