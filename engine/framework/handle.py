"""What a plugin may read of the engine it runs in (kube-scheduler's ``framework.Handle``).

A plugin that needs more than the pod and the nodes' columns (a quota, the pods running
on a node, a gang) takes the handle when it is built. It reads; it never changes the
state except through the attempt's :class:`~engine.model.statement.Statement`, which
the framework gives it in the cycle (``cycle.read("", STATEMENT)``) and commits or
discards whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol

from engine.model.disruption import DisruptionBudgets
from engine.model.groups import GroupInfo
from engine.model.pods import PodInfo
from engine.model.quota import QuotaTable
from engine.model.state import ClusterState
from events.types import PodSpec

STATEMENT: Final = "statement"
"""Cycle key (under the empty plugin name) of the attempt's statement."""


class Handle(Protocol):
    """The engine's state, as plugins see it."""

    @property
    def state(self) -> ClusterState:
        """The cluster columns (staged changes included)."""
        ...

    @property
    def quotas(self) -> QuotaTable:
        """Elastic quotas and every namespace's usage (staged changes included)."""
        ...

    @property
    def pods(self) -> Mapping[str, PodInfo]:
        """Live pods: pending, assumed or bound."""
        ...

    @property
    def groups(self) -> Mapping[str, GroupInfo]: ...

    def gang_member(self, spec: PodSpec) -> bool:
        """Whether the pod of ``spec`` is a gang's
        member here, to move only with its gang: not a pod in no group, nor one another
        engine placed here as a pod of its own (under a reservation part of its own)."""
        ...

    @property
    def started(self) -> Mapping[str, int]:
        """Placed pod → when it was placed."""
        ...

    @property
    def shapes(self) -> Any:
        """The pod shapes submitted to this engine (an
        :class:`~engine.model.shapes.ShapeCounts`)."""
        ...

    @property
    def budgets(self) -> DisruptionBudgets:
        """The pod disruption budgets."""
        ...

    def disruptions_allowed(self, for_pod: str) -> Mapping[str, int] | None:
        """Per budget, how many of its pods may be taken away now to make room for
        ``for_pod``; None where this engine cannot count them (then no pod a budget
        picks may be taken). Read once per attempt, before anything is staged."""
        ...

    @property
    def placed_total(self) -> int:
        """Pods placed by this engine in all (each ``PodBound`` folded once)."""
        ...

    @property
    def moved_total(self) -> int:
        """Moves of running pods this engine made in all (each ``PodMigrated`` once)."""
        ...

    def move_counts(self, for_pod: str) -> tuple[int, int]:
        """(pods placed, running pods moved) that a move budget in percent of placed
        pods measures when making room for ``for_pod`` (``""``: this engine's own):
        over every shard for a pod the coordinator handed with a plan of moves."""
        ...

    @property
    def migrates(self) -> bool:
        """Whether this engine may move running pods (one that owns its nodes)."""
        ...

    def framework_for(self, pod: PodInfo) -> Any:
        """The :class:`~engine.framework.runtime.Framework` of ``pod``'s profile (None
        when no profile serves it)."""
        ...
