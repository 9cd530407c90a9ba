"""Room held for a moved pod's replacement (the rescheduler, in Kubernetes).

A Kubernetes pod cannot move: the rescheduler's ``PodMigrated`` is carried out by
evicting the pod (the binder says so with ``MigrationEvicted``), and its controller
creates a replacement, a new pod with the same owner. So that the replacement lands
where the plan said, when the evicted pod is gone its room on the planned node stays
taken, under the owner's name, until a pod of that owner comes (it is placed there, if
its filters allow) or ``HOLD_SECONDS`` pass (the room is freed). In a simulated cluster
pods move themselves and nothing is held.

A hold is a placement in the cluster columns under the key ``hold:<ns>/<owner>#<n>``
(with the evicted pod's request and priority), so every filter sees the room taken and
preemption may take it as it would the pod's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from events.types import SECOND

HOLD_SECONDS: Final = 120
HOLD_PREFIX: Final = "hold:"


@dataclass(slots=True)
class Hold:
    key: str
    """The placement's key in the cluster columns."""
    slot: int
    until: int
    """Log time (ns) at which the room is freed if no replacement took it."""


def hold_until(now: int) -> int:
    return now + HOLD_SECONDS * SECOND


def owner_of(namespace: str, owner: str) -> str:
    return f"{namespace}/{owner}"
