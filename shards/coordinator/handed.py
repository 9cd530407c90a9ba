"""What the coordinator handed to shards and has not heard back about: its flights.

A unit handed to a shard is a *flight* (:class:`~shards.coordinator.flights.Flight`)
until the shard answers: its quota is charged in the view meanwhile, and what each
shard has pending (``pending``: how its columns change by the pods handed to it;
``inflight``: how many) counts it, so that the next hand-over knows what a shard
certainly still holds. A placement reported lands it (:meth:`Handed.land`), and so
does a hand-back or the pod's end.

**Cost per pod handed over**: one :class:`Flight` and two dict entries; the counts
per shard and the quota change once per run of identical pods and shard
(:meth:`Handed.fly_run`), and fall once per request and report
(:meth:`Handed._uncount`), not per pod.

**Flown again.** A unit is in ``flights`` only while it is out of the queue: handing
it over takes it out, and every path that puts it back (a hand-back, an aborted claim,
a gang recalled, the pod's end) lands its flight first; a flight past the time-out
stays recorded, and nothing queues its unit again. So a unit is never flown while a
flight of it is recorded, and :meth:`Handed.fly` and :meth:`Handed.fly_run` hold to
that: a unit flown again raises :class:`~engine.model.groups.TransitionError` (a bug,
not input; its shard's pending rows, in-flight count and quota charge would count it
twice).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine.model.groups import PENDING, TransitionError
from engine.model.pods import PodInfo
from engine.model.state import Request, request_delta
from shards.coordinator.flights import UNKNOWN, Flight, label_key
from shards.coordinator.ledger import Ledger


class Handed(Ledger):
    """The coordinator's flights (see the module's docstring)."""

    def fly(
        self, unit: str, shard: int, pods: list[PodInfo], rid: str = "", *, moves: bool = False
    ) -> None:
        """``pods`` (unit ``unit``) were handed to ``shard``; their quota is charged in
        the view until the shard answers. ``moves``: for a plan of moves there (the
        pods it moves may fill any node of the shard, so its labels count as
        :data:`UNKNOWN`: no inter-pod rule is counted on the view meanwhile)."""
        flying = self.flying_labels()
        if len(pods) == 1 and not moves:  # (most flights: a plain pod)
            one = pods[0]
            flight = Flight(
                unit,
                shard,
                self.now,
                (one.key,),
                (one.request,),
                (one.spec.namespace,),
                rid,
                (label_key(one.spec.namespace, one.spec.labels),),
            )
        else:
            flight = Flight(
                unit,
                shard,
                self.now,
                tuple(pod.key for pod in pods),
                tuple(pod.request for pod in pods),
                tuple(pod.spec.namespace for pod in pods),
                rid,
                (UNKNOWN,) * len(pods)
                if moves
                else tuple(label_key(pod.spec.namespace, pod.spec.labels) for pod in pods),
                moves,
            )
        if unit in self.flights:
            raise _flown_again(self.flights[unit], shard)
        self.flights[unit] = flight  # (kept in the order made: see next_wakeup)
        self.engine.dispatched[unit] = str(shard)
        self._pending(flight, +1)
        self.count_flying(flying, flight, +1)

    def fly_run(self, pods: list[PodInfo], shards: list[int], decisions: list[str]) -> None:
        """A run of identical plain pods (one request, one namespace) was handed over,
        ``pods[i]`` to ``shards[i]`` under ``decisions[i]``: one flight each (the
        shard answers per pod), but what each shard has pending and the quota charge
        change once per shard, by how many pods went there (not once per pod)."""
        lead = pods[0]
        request = lead.request
        namespace = lead.spec.namespace
        requests = (request,)
        namespaces = (namespace,)
        labels = (label_key(namespace, lead.spec.labels),)  # (identical pods: one key)
        flying = self.flying_labels()
        now = self.now
        flights = self.flights
        dispatched = self.engine.dispatched
        own = self.decisions
        per_shard = [0] * self.n
        names = [str(shard) for shard in range(self.n)]
        for pod, shard, decision in zip(pods, shards, decisions, strict=True):
            key = pod.key
            if key in flights:
                raise _flown_again(flights[key], shard)
            flights[key] = Flight(key, shard, now, (key,), requests, namespaces, "", labels)
            dispatched[key] = names[shard]
            own[key] = decision
            per_shard[shard] += 1
        flying[labels[0]] = flying.get(labels[0], 0) + len(pods)
        pending = self._pending_rows()
        delta = request_delta(request, pending.shape[2])
        for shard, count in enumerate(per_shard):
            if count:
                pending[shard] += delta * count
                self.inflight[shard] += count
        self.engine.quotas.add(namespace, request, len(pods))

    def _pending(self, flight: Flight, sign: int, quota: bool = True) -> None:
        """Count ``flight`` in (``sign`` +1) or out of (-1) what its shard has pending,
        and its quota charged (``quota`` False: the charge stays, for a placement)."""
        here = self._pending_rows()[flight.shard]  # (4, rows), contiguous
        quotas = self.engine.quotas
        for request, namespace in zip(flight.requests, flight.namespaces, strict=True):
            delta = request_delta(request, here.shape[1])  # (shared with the columns)
            if sign > 0:
                here += delta
                quotas.add(namespace, request)
            else:
                here -= delta
                if quota:
                    quotas.remove(namespace, request)
        self.inflight[flight.shard] += sign * len(flight.pods)

    def land(self, unit: str, placed: bool = False) -> Flight | None:
        """The shard answered about ``unit`` (or its pods are gone): it is no longer under
        way, and its quota no longer charged (a placement charges it again), unless
        ``placed``: the caller places every pod of it at once and keeps the charge."""
        flying = self.flying_labels()
        flight = self.flights.pop(unit, None)
        if flight is None:
            return None
        self.count_flying(flying, flight, -1)
        self.engine.dispatched.pop(unit, None)
        self._pending(flight, -1, quota=not placed)
        return flight

    def _uncount(self, shard: int, landed: dict[Request, int], pods: int) -> None:
        """``pods`` pods handed to ``shard`` were placed, asking for ``landed`` (request
        → how many): no longer pending there (their quota charge stays)."""
        here = self._pending_rows()[shard]
        rows = here.shape[1]
        for request, count in landed.items():
            delta = request_delta(request, rows)
            if count == 1:
                here -= delta
            else:
                here -= delta * count
        self.inflight[shard] -= pods

    def under_way(self, shard: int) -> npt.NDArray[np.int64]:
        """What the pods under way to ``shard`` ask for, summed per resource row (the
        view's rows at least; read, never kept)."""
        rows: npt.NDArray[np.int64] = self._pending_rows()[shard, 1]
        return rows

    def _pending_rows(self) -> npt.NDArray[np.int64]:
        """``pending``, grown to the view's resource rows."""
        rows = len(self.engine.state.resources)
        pending = self.pending
        if pending.shape[2] < rows:
            grown = np.zeros((self.n, 4, rows), dtype=np.int64)
            grown[:, :, : pending.shape[2]] = pending
            self.pending = pending = grown
        return pending

    def _gone(self, key: str) -> None:
        """Pod ``key`` is finishing (or was deleted): forget what was under way for it.
        (Its claim is forgotten with the last of its pods.)"""
        if key in self.flights:
            self.land(key)
        self.directed.pop(key, None)
        self.decisions.pop(key, None)
        self.hard.pop(key, None)
        self.moves_refused.pop(key, None)
        self._left_part(key)
        self._unclaim(key)
        if key in self.evicting:
            self._victim_gone(key)

    def recall(self, group: str, reason: str) -> None:
        """Gang ``group`` is Pending again (rolled back, or a part of it aborted): its
        members handed to a shard alone while it ran (each under a part of its own),
        not answered yet, are let go there too, as its placed members are: their parts
        are aborted (a shard that has bound one already unbinds it) and each waits with
        the gang, which waits until those shards have let go
        (:meth:`ShardDispatch._still_held`). Left to run, such a member would run the
        gang in part; and once the gang timed out (its pending members rejected) the
        shard would hold a pod the coordinator has forgotten."""
        info = self.engine.groups.get(group)
        if info is None or info.phase != PENDING:
            return
        for member in list(info.members):
            flight = self.flights.get(member)
            if flight is None or not flight.rid:
                continue
            self.land(member)
            claim = self.claims.get(flight.rid)
            if claim is not None:
                self._let_go(claim, reason)


def _flown_again(flight: Flight, shard: int) -> TransitionError:
    """The error of ``flight``'s unit flown to ``shard`` while ``flight`` is recorded
    (see "Flown again" in the module's docstring)."""
    return TransitionError(
        f"flight of {flight.unit}: flown to shard {shard} while in flight to shard {flight.shard}"
    )
