"""What the coordinator has asked of shards and not yet heard back about.

*Flights* are units handed to a shard to place (a pod, or a gang as one reservation):
until the shard answers, the coordinator does not know which nodes they took, so its
view of that shard is short of them. *Claims* are reservations the coordinator made
itself, on nodes it chose (its view already has them): one part per shard, prepared,
then committed or aborted whole. *Evictions* are the victims of a preemption it planned:
the preemptor waits until every one is reported gone.

A claim's stages (:class:`Stage`), as a transition table; :data:`TRANSITIONS` is the
same table in code and :meth:`Claim.advance` refuses any other move::

    preparing ── every part granted ─────────────────────────────► committed
    preparing ── a part denied or released, or the time-out ──────► aborting
    committed ── a part released (aborted, or broken) ────────────► aborting
    aborting ── every part closed ────────────────────────────────► (forgotten)
    committed ── every pod of the claim finished ─────────────────► (forgotten)

A part that is the whole reservation (``at_once``) commits itself when granted: the
claim goes from preparing to committed without a ``ReservationCommitted``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

import msgspec

from engine.model.groups import TransitionError
from engine.model.state import Request

LabelKey = tuple[str, tuple[tuple[str, str], ...]]
"""A pod's namespace and its labels, sorted."""
UNKNOWN: Final[LabelKey] = ("", (("", ""),))
"""The labels of a pod recorded without them (matches every selector)."""


def label_key(namespace: str, labels: dict[str, str]) -> LabelKey:
    return (namespace, tuple(sorted(labels.items())))


class Stage(StrEnum):
    PREPARING = "preparing"
    COMMITTED = "committed"
    ABORTING = "aborting"


PREPARING: Final = Stage.PREPARING
COMMITTED: Final = Stage.COMMITTED
ABORTING: Final = Stage.ABORTING

TRANSITIONS: Final[frozenset[tuple[Stage, Stage]]] = frozenset(
    {(PREPARING, COMMITTED), (PREPARING, ABORTING), (COMMITTED, ABORTING)}
)


class Flight(msgspec.Struct, gc=False):
    """A unit handed to ``shard`` to place (``rid``: a gang, as a reservation). A msgspec
    struct (built in C, one per pod handed over) the cyclic collector does not track
    (``gc=False``: strings, numbers and tuples, never a cycle)."""

    unit: str
    shard: int
    since: int
    pods: tuple[str, ...]
    requests: tuple[Request, ...]
    """What each pod asked for (what the shard's view of its use is short of)."""
    namespaces: tuple[str, ...]
    rid: str = ""
    labels: tuple[LabelKey, ...] = ()
    """Each pod's namespace and labels (:func:`label_key`): whether a flying pod may
    count for a spread constraint the coordinator decides by (see
    :meth:`shards.coordinator.ledger.Ledger.flying_match`)."""
    moves: bool = False
    """Handed for a plan of moves there: a hand-back counts as a refusal of moves (see
    :data:`MAX_MOVES_REFUSED`)."""


@dataclass(slots=True)
class Claim:
    """A reservation over one or more shards (a gang's, or a pod's)."""

    rid: str
    unit: str
    parts: dict[int, tuple[str, ...]]
    """Shard → the pods of its part."""
    since: int
    directed: bool
    """The coordinator chose the nodes (else: a gang handed to a shard whole)."""
    stage: Stage = PREPARING
    open: dict[int, None] = field(default_factory=dict)
    """Shards whose part is not closed yet."""
    granted: dict[int, None] = field(default_factory=dict)
    left: dict[int, dict[str, None]] = field(default_factory=dict)
    """Shard → the pods of its part still held there. A part none of whose pods is
    left (they finished, or failed to bind) is over on its shard, as the shard folds
    it: nothing there to abort or release, no answer to wait for."""

    def __post_init__(self) -> None:
        if not self.left:
            self.left = {shard: dict.fromkeys(pods) for shard, pods in self.parts.items()}

    def __repr__(self) -> str:
        return f"Claim({self.rid!r}, {self.stage.value}, parts={sorted(self.parts)})"

    def advance(self, stage: Stage) -> None:
        if stage != self.stage and (self.stage, stage) not in TRANSITIONS:
            raise TransitionError(f"claim {self.rid}: {self.stage.value} -> {stage.value}")
        self.stage = stage

    @property
    def pods(self) -> tuple[str, ...]:
        return tuple(pod for part in self.parts.values() for pod in part)


MOVES: Final = "/moves#"
"""In the rid of a part that takes in pods moved for a unit (the rescheduler across
shards): ``<unit>/moves#<seq>``."""
MAX_MOVES_REFUSED: Final = 2
"""Refusals after which a unit's plans of moves are not tried again: a part of such moves
denied, or the unit handed back by the shard it was handed to for a plan of moves there
(that shard's engine found no plan: it sees its own pods only, and tries the same
search, so this is rare, but it must not go on for ever)."""
