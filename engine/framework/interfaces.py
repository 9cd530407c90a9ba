"""One small Protocol per extension point; a plugin implements only the phases it needs.

Filters and scores work on *all node slots of the shard at once*: they receive the
columnar :class:`~engine.model.state.ClusterState` and return numpy arrays indexed by slot.
Values at slots that are not valid nodes are ignored by the framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from engine.framework.cycle import CycleState
from engine.framework.status import Status
from engine.model.changes import EVERY, ClusterEvent
from engine.model.pods import PodInfo
from engine.model.state import Bools, ClusterState, Ints

ALL_EVENTS = EVERY


@runtime_checkable
class Plugin(Protocol):
    """Every plugin has a unique name, stamped on the statuses it returns."""

    name: str


@runtime_checkable
class PreFilterPlugin(Plugin, Protocol):
    def pre_filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Status:
        """Check the pod alone before any node is looked at; may write ``cycle``.

        A rejection here rejects the attempt without running filters. Called once per
        attempt.
        """
        ...


@runtime_checkable
class FilterPlugin(Plugin, Protocol):
    static: bool
    """True when the result depends only on the pod's spec and the nodes' names, labels,
    taints and schedulability (never on free resources): the framework then caches the
    mask per pod shape until a node changes."""

    unresolvable: bool
    """True when preemption cannot undo this plugin's rejections."""

    local: bool
    """True when the verdict for a node depends only on that node's resource columns
    (``alloc``, ``used``, ``free``, ``nonzero_used``, ``valid``): the framework may then
    evaluate it on a gathered subset of slots (``ClusterState.view``) and must get
    exactly what a full evaluation gives there."""

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Bools:
        """Return a boolean mask over all slots: True where ``pod`` may run.

        Must not modify ``state``. May assume pre-filter ran in the same ``cycle``.
        """
        ...

    def reasons(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, rejected: Bools
    ) -> dict[str, int]:
        """Count the ``rejected`` slots by human-readable reason.

        Called only to explain an attempt (not on the hot path). Every rejected slot
        counts under at least one reason; a slot short of two resources counts twice,
        as in kube-scheduler's ``FailedScheduling`` messages.
        """
        ...

    def events(self) -> frozenset[ClusterEvent]:
        """Cluster events after which a pod this plugin rejected is worth retrying."""
        ...


@runtime_checkable
class QueueingHintPlugin(Plugin, Protocol):
    def worth_retrying(
        self, pod: PodInfo, event: ClusterEvent, slot: int, state: ClusterState
    ) -> bool:
        """Finer than ``events()``: could ``event`` on node ``slot`` let ``pod`` pass this
        plugin? Must be cheap and may err on the side of True."""
        ...


@dataclass(frozen=True, slots=True)
class PostFilterResult:
    status: Status
    nominated_slot: int = -1


@runtime_checkable
class PostFilterPlugin(Plugin, Protocol):
    def post_filter(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools
    ) -> PostFilterResult:
        """Called when no node passed the filters (preemption lives here)."""
        ...


@runtime_checkable
class PreScorePlugin(Plugin, Protocol):
    def pre_score(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools
    ) -> Status:
        """Prepare data for ``score`` once per attempt; ``feasible`` is the filter result."""
        ...


@runtime_checkable
class ScorePlugin(Plugin, Protocol):
    local: bool
    """True when a node's score depends only on that node's resource columns and the
    pod (no normalisation across nodes, nothing from ``pre_score``): scores of a pod
    shape are then kept between attempts and recomputed only for changed nodes."""

    def score(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Bools
    ) -> Ints | int:
        """Raw scores for all slots (only feasible ones are read), or one plain int when
        every node gets the same score (the framework then skips the array work)."""
        ...


@runtime_checkable
class NormalizeScorePlugin(ScorePlugin, Protocol):
    def normalize(self, scores: Ints | int, feasible: Bools) -> Ints | int:
        """Map raw scores of the feasible slots onto 0..100 (after ``score``); a plain
        int stands for the same score on every node."""
        ...


@runtime_checkable
class CardChooserPlugin(ScorePlugin, Protocol):
    def choose_cards(self, pod: PodInfo, state: ClusterState, slot: int) -> tuple[int, ...] | None:
        """The GPU cards ``pod`` should take on ``slot`` (the node the attempt chose,
        after this plugin scored it in the same attempt), or None to leave the choice to
        the state (:meth:`engine.model.cards.Cards.choose`). Must be deterministic and
        name cards that satisfy the pod's need; the framework asks the score plugins in
        profile order and takes the first answer. The choice is recorded in
        ``PodBound.devices`` and replayed as recorded."""
        ...


@runtime_checkable
class PotentialPlugin(ScorePlugin, Protocol):
    def potential(self, state: ClusterState, slots: Ints) -> Ints:
        """Per slot of ``slots``, the node's fragmentation as this plugin's score counts it
        (an integer, lower is better): the change of its sum over the nodes a decision
        touches is the cost the plugin's score puts on that decision. What the
        rescheduler compares its plans by (:mod:`engine.plugins.rescheduler`); must be
        deterministic and read nothing but ``state``."""
        ...

    def largest_room(self, state: ClusterState, slots: Ints) -> Ints:
        """Per slot of ``slots``, how many of the largest pods this plugin expects could
        start on it now, together. Consolidation never makes a move that leaves fewer of
        its two nodes able to start one (:mod:`engine.passes.consolidate`);
        deterministic, reads nothing but ``state``."""
        ...


@runtime_checkable
class ReservePlugin(Plugin, Protocol):
    def reserve(self, cycle: CycleState, pod: PodInfo, state: ClusterState, slot: int) -> Status:
        """The pod is about to be assumed on ``slot``; a failure undoes the attempt."""
        ...

    def unreserve(self, cycle: CycleState, pod: PodInfo, state: ClusterState, slot: int) -> None:
        """Undo ``reserve``; must be idempotent and must not fail."""
        ...


@runtime_checkable
class PermitPlugin(Plugin, Protocol):
    def permit(self, cycle: CycleState, pod: PodInfo, state: ClusterState, slot: int) -> Status:
        """Last word before the decision is emitted: success, or a rejection that
        un-reserves and requeues the pod."""
        ...
