"""What an engine asked HTTP extenders and what they answered (:mod:`engine.extenders`).

A pass that attempts a pod whose profile uses extenders, with no answer for it yet,
does not call anyone: it records an :class:`Ask` (the pod, the extenders, the nodes that
passed the built-in filters) and leaves the pod out of the queue, parked, not polled.
The runtime takes the new asks after the pass (:meth:`ExtenderBook.take`), calls the
extenders and appends their answers to the log (``ExtenderAnswered``). Folding the last
answer an ask waits for puts its unit back in the queue; its next attempt uses the
answers (:mod:`engine.passes.extenders`), once.

Asks are numbered per engine, in the order the passes make them, so replay numbers them
alike, and a late answer to an older ask of a pod is not taken for a newer one's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from events.types import ExtenderAnswered


@dataclass(slots=True)
class Ask:
    seq: int
    pod: str
    unit: str
    """What to wake once answered: the pod, or its gang (``@namespace/name``)."""
    extenders: tuple[str, ...]
    """``urlPrefix`` of each extender to ask, in configuration order."""
    nodes: tuple[str, ...]
    answers: dict[str, ExtenderAnswered] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.answers) == len(self.extenders)


class ExtenderBook:
    """An engine's asks: made and not yet taken by the runtime, waiting for answers,
    and answered (until the pod's next attempt uses them)."""

    def __init__(self) -> None:
        self.count = 0
        self.outbox: list[Ask] = []
        self.waiting: dict[str, Ask] = {}
        self.ready: dict[str, Ask] = {}

    def __repr__(self) -> str:
        return f"ExtenderBook(asked={self.count}, waiting={len(self.waiting)})"

    def stats(self) -> dict[str, int]:
        return {"extender_asks": self.count, "extender_waiting": len(self.waiting)}

    def ask(self, pod: str, unit: str, extenders: tuple[str, ...], nodes: tuple[str, ...]) -> Ask:
        self.count += 1
        ask = Ask(self.count, pod, unit, extenders, nodes)
        self.waiting[pod] = ask
        self.ready.pop(pod, None)
        self.outbox.append(ask)
        return ask

    @property
    def in_flight(self) -> bool:
        """Asks made and not yet used: a snapshot now would lose them."""
        return bool(self.outbox or self.waiting or self.ready)

    def take(self) -> list[Ask]:
        """The asks made since the last call (for the runtime to send)."""
        out, self.outbox = self.outbox, []
        return out

    def unanswered(self) -> None:
        """After a recovery (a replay of the log): keep in the outbox only the asks still
        waiting for an answer, to be sent (again)."""
        self.outbox = [a for a in self.outbox if self.waiting.get(a.pod) is a]

    def answered(self, event: ExtenderAnswered) -> list[str]:
        """Fold an answer; the units it completes (to put back in the queue)."""
        wake = []
        for i, pod in enumerate(event.pods):
            ask = self.waiting.get(pod)
            seq = event.asked[i] if i < len(event.asked) else -1
            if ask is None or ask.seq != seq or event.extender not in ask.extenders:
                continue  # late, or for an ask since replaced
            ask.answers[event.extender] = event
            if ask.complete:
                del self.waiting[pod]
                self.ready[pod] = ask
                wake.append(ask.unit)
        return wake

    def forget(self, pod: str) -> None:
        self.waiting.pop(pod, None)
        self.ready.pop(pod, None)
