"""What the steps of a pass see: the pass's state and services, and the port to the
engine's place.

A pass (:class:`engine.passes.run.SchedulingPass`) runs its steps in one fixed order
(:mod:`engine.passes.run`); each step (:mod:`engine.passes.pods`,
:mod:`engine.passes.gangs`, :mod:`engine.passes.reservations`, ...) is handed a
:class:`PassContext`, never the pass itself, as kube-scheduler's plugins are handed a
cycle state and a handle. So the steps depend on this module only, never on the runner
that orders them, and the runner imports the steps: the imports run one way.

:class:`Dispatch` is where a pass's decisions go (:mod:`engine.passes.dispatch`).
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from engine.framework.profiles import Profiles
from engine.framework.results import Attempt, Verdict
from engine.model.groups import GroupInfo
from engine.model.pods import PodInfo
from engine.model.shard import ShardModel
from engine.model.state import Ints
from engine.model.statement import Statement
from events.types import Answer, Event, PodUnbound

Placed = list[tuple[PodInfo, int, int]]
"""(pod, slot, score) of each pod an attempt placed."""


class Route(Enum):
    """What becomes of a unit the queue hands the pass."""

    ATTEMPT = "attempt"
    """Decide it here: filter, score, preempt if need be."""
    HANDED = "handed"
    """Handed to someone who will place it (it left the queue)."""
    WAIT = "wait"
    """Not now: back to the head of the queue, and the pass stops there."""


class PassContext(Protocol):
    """The state and services of one pass that its steps use."""

    e: ShardModel
    """The engine's model the pass decides on."""
    profiles: Profiles
    dispatch: Dispatch
    explain: str | None
    """The pod whose attempts are explained, if any."""
    out: list[Event]
    """What the pass decided, in order."""
    failed: dict[tuple[object, ...], Attempt]
    """Failures of non-gang attempts by pod shape, this pass."""
    unmovable: dict[tuple[object, ...], str]
    """Pod shapes for which the rescheduler found no plan this pass."""
    extender_nodes: dict[tuple[object, ...], tuple[str, ...] | None]
    extender_verdicts: dict[tuple[object, ...], Verdict]
    unit: str
    """The unit being attempted."""
    devices: dict[str, tuple[int, ...]]
    """Pod → the GPU cards its attempt chose, until bound."""

    def freed(self, slots: list[int]) -> None:
        """Room was freed on ``slots``."""
        ...

    def say(self, keys: list[str], reason: str) -> None:
        """Tell why pods wait, once per pod and reason."""
        ...

    def group_priority(self, group: GroupInfo) -> int: ...

    def unit_pods(self, unit: str) -> list[PodInfo]:
        """The pods a unit would place."""
        ...

    def record(self, pod: PodInfo, attempt: Attempt) -> None:
        """Keep ``attempt`` of ``pod`` if it is the pod explained."""
        ...

    def unschedulable(
        self,
        pod: PodInfo,
        reason: str,
        plugins: tuple[str, ...],
        rejections: dict[str, int] | None = None,
        unit: str | None = None,
        answer: Answer | None = None,
    ) -> None:
        """``pod`` found no node (``answer``: its unit's, else composed for the pod)."""
        ...

    def answer(
        self,
        pod: PodInfo,
        reason: str,
        plugins: tuple[str, ...],
        rejections: dict[str, int],
        unit: str | None = None,
    ) -> Answer:
        """The answer for a waiting ``pod`` (of gang ``unit``, if given)."""
        ...


class Dispatch(Protocol):
    waits: bool
    """Whether units are routed: :meth:`route` is asked before each one and may answer
    :attr:`Route.WAIT` (the pass then looks at the head of the queue before taking it).
    False: the pass attempts every unit itself, and :meth:`route` is never asked."""

    def route(self, p: PassContext, unit: str) -> Route:
        """Before unit ``unit`` (a pod key, or ``@group``) is attempted. May hand it on
        (then it must take it out of the queue and mark it dispatched in the model)."""
        ...

    def commit(self, p: PassContext, statement: Statement | None, placed: Placed) -> bool:
        """Make a successful attempt (a pod, or a whole gang) happen: the evictions
        ``statement`` staged, then ``placed`` (pod, slot, score). With a statement, the
        placements are already assumed in the state by it; without one (a pod that
        simply fits), nothing is staged yet. True: placed; False: only the evictions
        are under way, and the unit waits for them (it must not be queued meanwhile)."""
        ...

    def unbound(self, p: PassContext, event: PodUnbound) -> None:
        """A placement this engine made is taken back (a gang rolled back after a failed
        bind); the state already forgot it."""
        ...

    def rolled_back(self, p: PassContext, group: str, reason: str) -> None:
        """Gang ``group`` was rolled back (Pending again; each placed member was taken
        back first, through :meth:`unbound`). Members of it handed on alone while it ran
        and not answered yet must be let go too, by whoever they were handed to: they
        wait with the gang now. Called once per rollback, after the gang is Pending."""
        ...

    def first(self, p: PassContext) -> list[str]:
        """Units to attempt before the queue, in order (a preemptor whose victims are
        gone: the room they left is its own, as when one scheduler evicts and places in
        one step)."""
        ...

    def done(self, p: PassContext) -> None:
        """The pass has attempted what it will this time (its queue is empty, or it
        waits): what the dispatch decided together and still holds staged is carried
        out now, before the pass reports. Called once per pass."""
        ...

    def slot_owners(self) -> Ints | None:
        """Per slot, the shard that owns its node (negative: none; the array may be
        shorter than the state's slots), or None where this engine owns every node.
        Among equally good topology domains, one owned by fewer shards is preferred."""
        ...
