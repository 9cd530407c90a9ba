"""Sums over a whole scenario that must stay within the engine's 64-bit columns.

One value at a time is bounded where it is read (``objects.py``, ``quantity.py``); what
is bounded here is what many of them add up to (the reasoning is in ``limits.py``): each
resource over all nodes, the latest arrival plus every runtime, and the number of
objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from events.errors import InputError
from events.types import SECOND, NodeSpec
from shards.inputs.limits import MAX_OBJECTS, MAX_QUANTITY, MAX_SCENARIO_NANOSECONDS
from shards.inputs.objects import ARRIVE_AT, RUNTIME
from shards.inputs.quantity import format_quantity


@dataclass
class ScenarioTotals:
    """Running sums of one scenario; each ``add`` raises :class:`InputError` naming the
    field of the object that went past a bound (the caller adds file and document)."""

    allocatable: dict[str, int] = field(default_factory=dict)
    latest_arrival: int = 0
    runtimes: int = 0
    objects: int = 0

    def add_object(self) -> None:
        self.objects += 1
        if self.objects > MAX_OBJECTS:
            raise InputError(f"a scenario may hold at most {MAX_OBJECTS} objects")

    def add_node(self, node: NodeSpec) -> None:
        for resource, amount in sorted(node.allocatable.items()):
            total = self.allocatable.get(resource, 0) + amount
            if total > MAX_QUANTITY:
                raise InputError(
                    f"the nodes' {resource} adds up to more than "
                    f"{format_quantity(resource, MAX_QUANTITY)}, the most a scenario may hold",
                    location=f"status.allocatable.{resource}",
                )
            self.allocatable[resource] = total

    def add_times(self, arrival: int, runtime: int | None) -> None:
        latest = max(self.latest_arrival, arrival)
        runtimes = self.runtimes + (runtime or 0)
        if latest + runtimes > MAX_SCENARIO_NANOSECONDS:
            field_ = RUNTIME if runtime else ARRIVE_AT
            raise InputError(
                f"the latest arrival plus all runtimes exceed "
                f"{MAX_SCENARIO_NANOSECONDS // SECOND} seconds, the longest a scenario may run",
                location=f'metadata.annotations["{field_}"]',
            )
        self.latest_arrival, self.runtimes = latest, runtimes
