"""What the coordinator keeps between records, and the bookkeeping that keeps it whole.

:class:`Ledger` holds the coordinator's state: its view (one engine over every shard's
nodes), what each shard was asked and has not answered (flights, claims, evictions),
the units a shard handed back, and the records a pass will append. Its methods keep
that state consistent when a pod finishes, a claim ends or a unit goes back to the
queue; they decide nothing. The coordinator is built in layers, each a subclass of the
one before, each module importing only those below it (no cycle)::

    Ledger (this module) < Handed (flights: handed.py) < Reports (shards' reports:
    reports.py) < Inputs (ingest's records: inputs.py) < Coordinator (the pass:
    coordinator.py)

**Cost per pod**: nothing of its own per plain pod; what each layer costs is at the
top of its module, and the whole in :mod:`shards.coordinator.coordinator`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar

import numpy as np
import numpy.typing as npt

from engine.config import SchedulerConfig
from engine.engine import Engine
from engine.framework.registry import Registry
from engine.model.changes import ClusterEvent
from engine.model.groups import PENDING, is_group_unit
from engine.model.podtable import selector_matches
from engine.model.pools import Sharding
from engine.model.state import Bools
from events.types import (
    SECOND,
    Event,
    LabelSelector,
    ReservationAborted,
    ShardingConfigured,
)
from shards import plugins
from shards.coordinator.due import Due
from shards.coordinator.flights import (
    ABORTING,
    COMMITTED,
    PREPARING,
    UNKNOWN,
    Claim,
    Flight,
    LabelKey,
)
from shards.coordinator.routing import Routing

ISSUE_ALLOWANCE: Final = SECOND // 500
"""Time added to the time-out of a request a pass issues to a shard, for each request
the pass issued to that shard before it (:meth:`Ledger.issue`): 2 ms, several times
what a shard spends taking on a directed part (about 0.1 ms of CPU), for a shard that
shares its core with others. 39,000 placements of one pass over 8 shards give the last
to each shard about 10 s more."""
ROUTER: Final = "router"

Selecting = tuple[tuple[str, ...] | None, LabelSelector | None]
"""Which pods a constraint counts: their namespaces (None: every one) and a label
selector (None: none)."""
"""The producer of the coordinator's records (in every partition)."""
RELAY: Final = "relay"
COORDINATOR: Final = -1
"""``shard`` of the decisions the coordinator makes itself."""

Output = tuple[int, Event]
"""(partition, event) for the worker to append after a pass."""
Move = tuple[str, int, int, str]
"""A pod moved, from slot, to slot, and the pod it makes room for."""
Moving = tuple[int, list[Move]]
"""A shard, and the moves it is asked to make."""
T = TypeVar("T")


def relay_source(producer: str, shards: int) -> int | None:
    """The shard partition a relayed copy came from (None: not a valid relay)."""
    text = producer.removeprefix(f"{RELAY}-")
    if text == producer or not (text.isascii() and text.isdigit()):
        return None
    source = int(text)
    return source if source < shards else None


class Ledger:
    """The coordinator's state and its bookkeeping (see the module's docstring)."""

    def __init__(
        self,
        sharding: Sharding,
        config: SchedulerConfig | None = None,
        registry: Registry | None = None,
    ) -> None:
        """``registry``: the plugins (default: the built-ins and every user plugin
        installed, for the configurations the log records may name any)."""
        if registry is None:
            registry = plugins.installed().registry
        self.sharding = sharding
        self.n = sharding.shards
        self.control = sharding.shards
        """The control partition's number."""
        self.engine = Engine(config, shard=COORDINATOR, registry=registry)
        """The view (its dispatch, :class:`ShardDispatch`, is set by the coordinator)."""
        self.engine.sharded(ShardingConfigured(config=sharding.to_json()))
        self.routing = Routing(sharding)
        self.flights: dict[str, Flight] = {}
        """Units handed to a shard, not answered yet (by unit)."""
        self.inflight = [0] * self.n
        """Pods handed to each shard and not answered yet."""
        rows = len(self.engine.state.resources)
        self.pending: npt.NDArray[np.int64] = np.zeros((self.n, 4, rows), dtype=np.int64)
        """Requests handed to each shard and not answered yet, as the shard's columns
        change by them (alloc, used, free and non-zero used; rows by shards)."""
        self.decisions: dict[str, str] = {}
        """Pods handed over → the decision id the shard places them under."""
        self.directed: dict[str, int] = {}
        """Pods handed to a shard with the node the view chose for them
        (``PodRouted.node``) → that shard, until it reports them placed or hands them
        back: placed in the view from the moment they were decided."""
        self.claims: dict[str, Claim] = {}
        self.claim_of: dict[str, str] = {}
        """Pod → the claim (reservation) it was placed under."""
        self.held_by: dict[str, dict[str, None]] = {}
        """Pod → the claims whose parts hold it on their shards (until it finishes, or
        fails to bind there; an abort does not end it: the shard answers that)."""
        self.nominated: dict[str, tuple[int, dict[str, None]]] = {}
        """Units whose preemption is under way → (since, victims not yet gone)."""
        self.evicting: dict[str, str] = {}
        """Victim → the unit it makes room for."""
        self.moves_after: dict[str, tuple[str, list[Moving], dict[str, tuple[int, ...]]]] = {}
        """Unit → its plan's second step: (the pod it is made for, per shard the moves
        within that shard that wait for the plan's other moved pods to leave, the GPU
        cards the view chose for the moved pods), sent once those are reported gone
        (:meth:`ShardDispatch._moves_after`)."""
        self.consolidation_due = False
        """An input was folded since the view last looked for moves to consolidate: one
        engine consolidates after each pass, and runs a pass for each instant it is
        given inputs (:meth:`ShardDispatch._move_on_its_own`)."""
        self.decided_since = False
        """A pass decided something (handed, claimed, evicted, failed a unit) since the
        view last looked for moves to consolidate: as one engine's pass that decided
        something, a search that finds nothing then waits for a change."""
        self.moved_since: dict[str, None] = {}
        """Pods reported moved for a pod (a plan of moves) since the view last looked for
        moves to consolidate: not moved again by that search, as one engine's pass
        moves no pod twice."""
        self.pass_from = 0
        """Where the running pass's own records begin in ``_out`` (what was folded
        before it forwarded the rest). Not state: set as each pass begins."""
        self.hard: dict[str, None] = {}
        """Units a shard handed back: decided here next time, not handed over again."""
        self.ready: list[str] = []
        """Preemptors whose victims are all gone: attempted first at the next pass (the
        room is theirs, as when one scheduler evicts and places in one step)."""
        self.relayed = [-1] * self.n
        """Per shard partition: the offset of the last record relayed into control."""
        self.shard_nodes = [0] * self.n
        """The nodes each shard said it had, in its last summary."""
        self.now = 0
        self.issued = [0] * self.n
        """Per shard, the requests (parts of claims, evictions) this pass has issued to
        it so far (:meth:`issue`). Not state: set to zeros as each pass begins."""
        self.seq = 0
        self.counters = {
            "handed": 0,
            "batches": 0,
            "decided": 0,
            "early": 0,
            "handbacks": 0,
            "prepared": 0,
            "committed": 0,
            "aborted": 0,
            "evictions": 0,
            "migrations_handed": 0,
            "migrations_across": 0,
            "directed": 0,
            "moved_on_its_own": 0,
        }
        self.moves_refused: dict[str, int] = {}
        """Unit → how many times a shard refused a plan of moves for it: to take in pods
        moved for it, or to place it by moves (after ``MAX_MOVES_REFUSED``, its plans of
        moves are not tried again)."""
        self._out: list[Output] = []
        self._cache: dict[tuple[object, ...], Any] = {}
        self._cache_at = (-1, -1)
        self._preparing: dict[str, Claim] = {}
        """The claims that may still be preparing (a superset, pruned as read: a claim
        never goes back to preparing), so that each pass and wake-up reads those, not
        every claim: a pod decided here keeps its committed claim while it runs, and
        with spread pods among plain ones (``loadtest scale --templates 20``) there are
        thousands, read at every pass. Not state: made again from ``claims``."""
        self._preparing_of: dict[str, Claim] | None = None
        """The ``claims`` that ``_preparing`` was made from (another after a restore)."""
        self._due: Due | None = None
        """The earliest time-outs of the preparing claims and of the nominations
        (:meth:`due`). Not state: made again from ``claims`` and ``nominated``."""
        self._flying: dict[LabelKey, int] = {}
        """How many flying pods have each namespace and labels (:meth:`flying_match`).
        Not state: made again from ``flights``."""
        self._flying_of: dict[str, Flight] | None = None
        """The ``flights`` that ``_flying`` was made from (another after a restore)."""
        self.folded_in_bulk = 0
        """Submissions folded in bulk (:meth:`Inputs.apply_all`; not state: a replay
        folds each record alone, to the same state)."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(shards={self.n}, pods={len(self.engine.pods)}, "
            f"flights={len(self.flights)}, claims={len(self.claims)})"
        )

    def stats(self) -> dict[str, int]:
        return {**self.counters, "flights": len(self.flights), "claims": len(self.claims)}

    def send(self, partition: int, event: Event) -> None:
        self._out.append((partition, event))

    def out_since(self, start: int | None = None) -> list[Output]:
        """What was sent since ``start`` (default: since the running pass began)."""
        return self._out[self.pass_from if start is None else start :]

    def send_all(self, outputs: list[Output]) -> None:
        """:meth:`send` each of ``outputs`` (partition, event), in order."""
        self._out += outputs

    def next_seqs(self, count: int) -> int:
        """The first of ``count`` numbers in a row that :meth:`next_seq` would give."""
        first = self.seq + 1
        self.seq += count
        return first

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    @property
    def reservation_timeout(self) -> int:
        """How long a reservation may hold capacity before it commits: Coscheduling's
        ``permitWaitingTimeSeconds`` where the configuration states it, else the
        sharding's ``reservationTimeoutSeconds``."""
        stated = self.engine.config.reservation_timeout_seconds
        return self.sharding.reservation_timeout if stated is None else stated * SECOND

    def issue(self, shards: Iterable[int]) -> int:
        """The time a request issued now to ``shards`` (a claim's parts, a preemption's
        evictions) is timed from: the pass's time, plus :data:`ISSUE_ALLOWANCE` for
        each request the pass issued before it to the same shard (the most, over
        ``shards``). The view's time is that of the records folded, so it stands still
        while a pass runs, and a shard takes on what it is sent in order: a pass that
        issues thousands of requests (a wave of preemptions, placed in one pass) sends
        the last of them long after that time, and each shard answers them one after
        another. Without the allowance, answers stamped after the time-out (counted
        from the pass's time) would find their claims timed out, each aborted and
        decided again. Counted per pass from what it issued: replay gives the same."""
        issued = self.issued
        ahead = 0
        for shard in shards:
            ahead = max(ahead, issued[shard])
            issued[shard] += 1
        return self.now + ahead * ISSUE_ALLOWANCE

    def expiry(self, since: int) -> int:
        """When the shard lets go a part issued at ``since`` (:meth:`issue`) that is not
        committed: the claim's own time-out."""
        return since + self.reservation_timeout

    def fresh(self, since: int) -> bool:
        return self.now < since + self.reservation_timeout

    def flights_under_way(self) -> bool:
        """Handed units not answered (and not so old that their shard is presumed
        gone): the view is short of where they went."""
        return any(self.fresh(f.since) for f in self.flights.values())

    def flying_labels(self) -> dict[LabelKey, int]:
        """How many flying pods have each namespace and labels; a flight recorded
        without its pods' labels (a snapshot of an earlier version) counts under
        :data:`UNKNOWN`, which matches every selector. Ask before changing
        ``flights`` (it is made from them when they were replaced)."""
        if self._flying_of is not self.flights:
            counts: dict[LabelKey, int] = {}
            for flight in self.flights.values():
                for key in _label_keys(flight):
                    counts[key] = counts.get(key, 0) + 1
            self._flying, self._flying_of = counts, self.flights
        return self._flying

    def count_flying(self, counts: dict[LabelKey, int], flight: Flight, sign: int) -> None:
        """Count ``flight``'s pods in (``sign`` +1) or out of (-1; -N: N flights with
        the same labels) ``counts`` (:meth:`flying_labels`, asked before ``flights``
        changed)."""
        for key in _label_keys(flight):
            left = counts.get(key, 0) + sign
            if left:
                counts[key] = left
            else:
                del counts[key]

    def flying_match(self, selectors: list[Selecting], also: Iterable[LabelKey] = ()) -> bool:
        """Whether a flying pod (handed to a shard; where it lands is not known yet), or
        one with namespace and labels among ``also``, may match one of ``selectors``
        (namespaces, None for every one; label selector): then a constraint with one
        of them cannot be counted on the view."""
        for ns, labels in itertools.chain(self.flying_labels(), also):
            if (ns, labels) == UNKNOWN:
                return True
            values: dict[str, str] | None = None
            for namespaces, selector in selectors:
                if namespaces is not None and ns not in namespaces:
                    continue
                if values is None:
                    values = dict(labels)
                if selector_matches(selector, values):
                    return True
        return False

    def nominations_under_way(self) -> bool:
        return any(self.fresh(since) for since, _ in self.nominated.values())

    def cached(self, key: tuple[object, ...], compute: Callable[[], T]) -> T:
        """``compute()``, remembered until the view's nodes or placements change."""
        state = self.engine.state
        at = (state.journal_end, state.static_version)
        if at != self._cache_at:
            self._cache.clear()
            self._cache_at = at
        if key not in self._cache:
            self._cache[key] = compute()
        value: T = self._cache[key]
        return value

    def ownership_changed(self) -> None:
        """Nodes changed shards (a pool handed over or taken over): what ``cached``
        remembers per shard no longer holds, though the nodes and placements did not
        change."""
        self._cache.clear()
        self._cache_at = (-1, -1)

    def feasible_counts(self, feasible: Bools) -> list[int]:
        """How many of each shard's nodes ``feasible`` marks."""
        top = self.engine.state.high_water
        owner = self.routing.slot_shard[:top]
        picked = owner[feasible[:top] & (owner >= 0)]
        return [int(c) for c in np.bincount(picked, minlength=self.n)[: self.n]]

    def preparing(self) -> list[Claim]:
        """The claims still preparing, in the order of ``claims``."""
        if self._preparing_of is not self.claims:
            self._preparing = {r: c for r, c in self.claims.items() if c.stage == PREPARING}
            self._preparing_of = self.claims
        claims = self.claims
        over = [
            rid
            for rid, claim in self._preparing.items()
            if claim.stage != PREPARING or claims.get(rid) is not claim
        ]
        for rid in over:
            del self._preparing[rid]
        return list(self._preparing.values())

    def due(self) -> Due:
        """The earliest time-outs of what is under way (made again from ``claims``
        and ``nominated`` where those are others: after a restore)."""
        due = self._due
        if due is None or due.claims is not self.claims or due.nominated is not self.nominated:
            due = self._due = Due(self.claims, self.nominated)
        return due

    def claim(self, claim: Claim) -> None:
        if self._preparing_of is not self.claims:
            self.preparing()  # (made from ``claims`` first; not pruned per claim: a
            # run of preemptors makes thousands of claims in one pass)
        self.claims[claim.rid] = claim
        if claim.stage == PREPARING:
            self._preparing[claim.rid] = claim
            self.due().claimed(claim)
        for pod in claim.pods:
            self.held_by.setdefault(pod, {})[claim.rid] = None

    def nominate(self, unit: str, victims: list[str], shards: Iterable[int]) -> None:
        """``unit`` waits for ``victims`` to be gone from ``shards`` (asked of them in
        this pass)."""
        self.moves_after.pop(unit, None)  # (a plan before this one)
        entry = self.nominated[unit] = (self.issue(shards), dict.fromkeys(victims))
        self.due().nominating(unit, entry)
        for victim in victims:
            self.evicting[victim] = unit
        self.engine.dispatched[unit] = "evicting"
        self.counters["evictions"] += len(victims)

    def end_nomination(self, unit: str) -> None:
        """``unit`` no longer waits for its victims or moves (they were not all reported
        gone in time, or a shard refused a move of its plan): it is the queue's again,
        the room its plan held is freed."""
        self.moves_after.pop(unit, None)
        entry = self.nominated.pop(unit, None)
        if entry is None:
            return
        e = self.engine
        e.planned.pop(unit, None)
        e.planned_cards.pop(unit, None)
        for slot in e.held.pop(unit, []):
            e.fire(ClusterEvent.POD_FREED, slot)
        for victim in entry[1]:
            self.evicting.pop(victim, None)
        self._requeue(unit)

    def wait_for_owner(self, unit: str) -> None:
        """``unit`` was decided onto a node no shard owns now (its pool is moving to
        another shard): it tries again after its back-off."""
        self._requeue(unit, backoff=True)

    def wait_for_answers(self, unit: str) -> None:
        """``unit``'s plan moves a pod whose claim is not answered yet: it is tried
        first at the next pass (the answer starts one), as one scheduler would try it
        at once, with that pod bound."""
        self.ready.append(unit)

    def _victim_gone(self, victim: str) -> None:
        unit = self.evicting.pop(victim, None)
        if unit is None or unit not in self.nominated:
            return
        _, waiting = self.nominated[unit]
        waiting.pop(victim, None)
        if not waiting:
            del self.nominated[unit]
            self.engine.dispatched.pop(unit, None)
            self.ready.append(unit)

    def _requeue(self, unit: str, *, hard: bool = False, backoff: bool = False) -> None:
        """``unit`` is the queue's again: settled at the next pass, or (``backoff``:
        what was asked of a shard failed) after its back-off, as a failed bind is."""
        e = self.engine
        e.dispatched.pop(unit, None)
        if hard:
            self.hard[unit] = None
        if is_group_unit(unit):
            group = e.groups.get(unit[1:])
            pods = [e.pods[m] for m in group.members if m in e.pods] if group else []
            if backoff and group is not None and pods and group.phase == PENDING:
                lead = pods[0]
                group.attempts += 1
                e.queue.back_off(
                    unit,
                    lead.priority,
                    group.seq,
                    group.attempts,
                    e.now,
                    e.queue_of(group.namespace),
                )
                return
            e.dirty[unit] = None
        elif unit in e.pods:
            pod = e.pods[unit]
            if backoff and e.unit_of(unit) == unit and unit not in e.state.pods:
                e.queue.back_off(
                    unit,
                    pod.priority,
                    pod.seq,
                    max(pod.attempts, 1),
                    e.now,
                    e.queue_of(pod.spec.namespace),
                )
                return
            e.dirty[unit] = None

    def _forget_claim(self, claim: Claim) -> None:
        """``claim`` is over (every part closed, or none of its pods holds it): forget it,
        and that its pods were held under it (a pod the view rejected meanwhile, its gang
        timed out, is gone from the view and would keep that record for good)."""
        del self.claims[claim.rid]
        for pod in claim.pods:
            held = self.held_by.get(pod)
            if held is not None and claim.rid in held:
                del held[claim.rid]
                if not held:
                    del self.held_by[pod]

    def _unclaim(self, key: str) -> None:
        """``key`` no longer holds its place under its claim; a committed claim none of
        whose pods does is over."""
        rid = self.claim_of.pop(key, None)
        claim = self.claims.get(rid) if rid is not None else None
        if (
            claim is not None
            and claim.stage == COMMITTED
            and not any(self.claim_of.get(pod) == rid for pod in claim.pods)
        ):
            self._forget_claim(claim)

    def _left_part(self, key: str, rid: str | None = None) -> None:
        """Pod ``key`` left the part of claim ``rid`` (None: of every claim) on its
        shard: it finished, or its bind failed. As the shard folds it, a part with no
        pod left is over there (nothing to abort or release, no answer comes)."""
        held = self.held_by.get(key)
        if not held:
            return
        for claim_rid in [rid] if rid is not None else list(held):
            if claim_rid not in held:
                continue
            del held[claim_rid]
            claim = self.claims.get(claim_rid)
            if claim is None:
                continue
            for shard, left in claim.left.items():
                if key in left:
                    del left[key]
                    if not left and shard in claim.open:
                        del claim.open[shard]
                        claim.granted.pop(shard, None)
            if not claim.open:
                self._forget_claim(claim)
        if not held:
            del self.held_by[key]

    def _let_go(self, claim: Claim, reason: str) -> None:
        """Abort every open part of ``claim``, once (the shards answer, and the claim is
        forgotten with the last answer)."""
        if claim.stage == ABORTING:
            return
        claim.advance(ABORTING)
        self.counters["aborted"] += 1
        for shard in sorted(claim.open):
            self.send(shard, ReservationAborted(rid=claim.rid, reason=reason))
        if not claim.open:
            self._forget_claim(claim)


def _label_keys(flight: Flight) -> tuple[LabelKey, ...]:
    """What ``flight`` counts in the flying labels: its pods' labels, or one
    :data:`UNKNOWN` for a flight recorded without them."""
    return flight.labels if len(flight.labels) == len(flight.pods) else (UNKNOWN,)
