"""The bindings a binder's poll has in flight (``shards.kube.binder``).

A binding goes to the API server as soon as there is room (at most ``size`` at once),
not in lockstep groups: one slow answer holds up nothing but its own slot. Whatever
must come after a binding (a record about its pod or node, an eviction) waits until the
window settles; the results are kept in log order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from events.types import (
    Envelope,
    Event,
    NodeAdded,
    NodeRemoved,
    NodeUpdated,
    PodAdopted,
    PodBound,
    PodDeleted,
    PodFailed,
    PodRouted,
    PodSubmitted,
    PodSucceeded,
    ReservationRequested,
)


class BindWindow:
    """Bindings in flight, at most ``size``, each started as soon as there is room, and
    every result kept in log order."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.running: dict[asyncio.Task[list[Event]], tuple[str, str]] = {}
        self.subjects: set[str] = set()
        """The pods and nodes of the bindings in flight."""
        self._results: list[tuple[Envelope, asyncio.Task[list[Event]] | list[Event]]] = []

    def __repr__(self) -> str:
        return f"BindWindow(size={self.size}, running={len(self.running)})"

    def start(self, env: Envelope, event: PodBound, work: Awaitable[list[Event]]) -> None:
        task = asyncio.ensure_future(work)
        self.running[task] = (event.pod, event.node)
        self.subjects.update((event.pod, event.node))
        self._results.append((env, task))

    def done(self, env: Envelope, caused: list[Event]) -> None:
        self._results.append((env, caused))

    async def room(self) -> None:
        while len(self.running) >= self.size:
            finished, _ = await asyncio.wait(self.running, return_when=asyncio.FIRST_COMPLETED)
            self._forget(finished)

    async def settle(self) -> None:
        if self.running:
            finished, _ = await asyncio.wait(self.running)
            self._forget(finished)

    def _forget(self, finished: set[asyncio.Task[list[Event]]]) -> None:
        for task in finished:
            del self.running[task]
        self.subjects = {subject for both in self.running.values() for subject in both}

    def cancel(self) -> None:
        for task in self.running:
            task.cancel()

    def results(self) -> list[tuple[Envelope, list[Event]]]:
        """Each record's events, in log order; a binding that failed raises here."""
        out: list[tuple[Envelope, list[Event]]] = []
        for env, result in self._results:
            out.append((env, result.result() if isinstance(result, asyncio.Task) else result))
        return out


def subjects_of(event: Event) -> set[str]:
    """The pods and nodes whose binding an input's lesson could change."""
    match event:
        case PodSubmitted(pod=spec) | PodRouted(pod=spec):
            return {spec.key}
        case PodAdopted(placement=placement):
            return {placement.pod.key}
        case ReservationRequested(pods=specs):
            return {spec.key for spec in specs}
        case PodDeleted(pod=key) | PodSucceeded(pod=key) | PodFailed(pod=key):
            return {key}
        case NodeAdded(node=node) | NodeUpdated(node=node):
            return {node.name}
        case NodeRemoved(name=name):
            return {name}
    return set()
