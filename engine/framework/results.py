"""What an attempt yields: the chosen node, or why none; and how the node is chosen."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.framework.status import Status
from engine.model.state import Bools, Ints


@dataclass(frozen=True, slots=True)
class NodeScore:
    node: str
    total: int
    plugins: dict[str, int]
    """Each score plugin's weighted contribution."""


@dataclass(slots=True)
class Diagnosis:
    """Why an attempt went the way it did (kept for failures and for ``--explain``)."""

    nodes: int = 0
    feasible: int = 0
    plugins: dict[str, dict[str, int]] = field(default_factory=dict)
    """Filter plugin → reason → nodes (first failing plugin per node; a node may count
    under several reasons of that plugin, as in kube-scheduler's messages)."""
    rejected: dict[str, int] = field(default_factory=dict)
    """Filter plugin → nodes it was the first to reject."""
    top: list[NodeScore] = field(default_factory=list)
    status: Status | None = None

    def rejections(self) -> dict[str, int]:
        merged: dict[str, int] = {}
        for reasons in self.plugins.values():
            for reason, count in reasons.items():
                merged[reason] = merged.get(reason, 0) + count
        return merged

    def message(self) -> str:
        """kube-scheduler's ``FailedScheduling`` message shape."""
        if self.status is not None and not self.plugins:
            return self.status.message()
        parts = sorted(f"{count} {reason}" for reason, count in self.rejections().items())
        head = f"0/{self.nodes} nodes are available"
        return f"{head}: {', '.join(parts)}." if parts else f"{head}."


@dataclass(slots=True)
class Verdict:
    """What HTTP extenders answered for one attempt of a pod (built by
    :mod:`engine.passes.extenders` from the answers recorded in the log)."""

    mask: Bools | None = None
    """Nodes every filter extender let through (None: no filter extender)."""
    scores: Ints | None = None
    """The extenders' scores, weighted and scaled to plugin scores (None: none)."""
    rejections: dict[str, dict[str, int]] = field(default_factory=dict)
    """Extender name → reason → nodes it rejected."""
    unresolvable: bool = False
    """Every node an extender rejected, it rejected as unresolvable."""
    error: str = ""
    """A failure of an extender that is not ignorable: the attempt fails with it."""
    plugin: str = ""
    """The extender that failed (``error``)."""


@dataclass(slots=True)
class Attempt:
    slot: int
    status: Status
    score: int = 0
    diagnosis: Diagnosis | None = None
    devices: tuple[int, ...] | None = None
    """The GPU cards a score plugin chose on ``slot`` (None: the state's default
    choice, :meth:`engine.model.cards.Cards.choose`)."""
    brief: bool = False
    """A failure without reasons: the status's message and the diagnosis's reasons
    are empty until :meth:`engine.framework.runtime.Framework.complete` gives them."""


def select(masked: Ints, used: int, tiebreak: int) -> int:
    """The best slot: highest score; among equals, the first at or after a rotation
    given by ``tiebreak`` (a stable hash of the pod's name), wrapping around. Equal
    nodes are thus spread over pods, and every replay picks the same one."""
    live = masked[:used]
    start = tiebreak % used
    after = int(live[start:].argmax()) + start
    if start == 0:
        return after
    before = int(live[:start].argmax())
    return after if live[after] >= live[before] else before


def full_scores(scores: Ints | int, size: int) -> Ints:
    if isinstance(scores, int):
        return np.full(size, scores, dtype=np.int64)
    return scores
