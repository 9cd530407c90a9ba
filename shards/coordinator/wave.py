"""Runs of identical preemptors, decided on the coordinator in one step.

A preemption the coordinator decides one at a time (a gang's, a reclaim under quotas) is
carried out by the shards that own the nodes: the victims are evicted there first, and
the preemptor is placed once they are reported gone (:mod:`shards.coordinator.dispatch`).
Decided that way, each preemption of a wave (a high-priority workload arriving on a full
cluster: thousands of identical pods, each of which must evict) costs a round trip
through the log for its evictions and another for its placement, during which the whole
queue waits; the coordinator's planning was under half of its time. Here a run of
identical preemptors is decided in one pass and carried out together:

1. **Decided in one pass.** The first preemptor of the run (the *lead*) is attempted as
   any unit is; its evictions and its placement stay staged in the view
   (:class:`engine.model.statement.Statement`) instead of being discarded, and the
   pods behind it in the queue that are identical to it (the same kind of pod:
   :func:`shards.coordinator.batches.kind_key`, consecutive in queue order) are
   attempted on that staged view, each staging its own victims and placement in turn,
   as one scheduler does when it evicts and places in one step. So each preemptor's
   victims are planned by the same plugin, on the same view, in the same order as one
   at a time, and the fast path of priority preemption (candidates kept between
   identical preemptors, victims over integers: :mod:`engine.plugins.preemption_priority`)
   serves the run as it serves one shard.
2. **Carried out as one scheduler carries it out.** When the run ends (a pod of another
   kind at the head of the queue, the queue empty: :meth:`Wave.flush`, from the pass's
   ``done``), what it staged stays in the view, as one scheduler commits each
   preemption: the victims are over, each member is placed where it was planned. Each
   shard is sent one ``PreemptionRequested`` with every victim of the run on its
   nodes (each naming the pod it makes room for), then each member is handed to its
   node (one ``PodRouted`` naming the node and its GPU cards), in queue order. A
   shard's partition is read in order and a shard's pass evicts before it places
   what was handed to it, so the shard evicts, then places: one round trip for the
   whole run, and the queue goes on at the next pass, as one scheduler goes on after
   evicting and placing in one step. (A shard that cannot place a member hands it
   back, as any pod handed to a node: it is decided again.)

**Why the answers are one at a time's.** A member is attempted on the view one at a time
would have: the run's earlier members placed and their victims gone. That holds while
what an eviction changes is only what the staged view shows, so the run ends (the pods
behind it wait for the run to be carried out, then are decided as before) after a
member whose victim

- is covered by a disruption budget (a budget's allowance counts the live pods: a pod
  evicted is one fewer, a pod staged away is not),
- belongs to a gang some of whose members stay placed (an evicted member fails a gang
  that ran, which changes how its remaining members are chosen), or
- is a dependency of another pod (its failure wakes that pod);

and before a member that one at a time would not have decided here: one that fits
without evicting anyone (one at a time would first try to hand it to a shard) or only by
moving pods (the rescheduler's plans go to the shards differently); that member is put
back at the head of the queue as it was, and decided after the run as one at a time
would decide it. Runs are made only for plain pods (not a gang, nor a member of one, nor
a pod with dependencies) whose namespace has no quota (priority preemption: every
victim is of lower priority than the run, so nothing an eviction wakes jumps ahead of
it), and where no extender is asked. Anything else, a gang that preempts above all,
is decided one at a time as before (a run of one). ``MAX_WAVE`` bounds a run.

**Cost per preemptor** (the coordinator's; what a shard does per eviction and per
placement is unchanged): its attempt (one brief failure over the nodes changed since
the last member, its victims planned by the kept candidates, its placement found among
the changed nodes: :meth:`engine.framework.runtime.Framework.sole_fit`), staging its
victims and placement (O(victims)), its share of one ``PreemptionRequested`` per
shard, its hand-over (one ``PodRouted``), and the folds of its shard's reports (the
evictions, already over in the view, and the placement). Per run: one pass.

Measured (``shoal loadtest scale --shards 8 --templates 1 --pods 2000``, a loaded
2-core machine, November 2026): at 20,000 nodes, a wave of 2,000, the wave's engine
CPU (coordinator and shards) 9.2 s when each preemption was decided alone, 1.2 s once
runs were decided in one pass (the coordinator 2.6 ms per preemption before, 0.42 ms
after). Then each member's placement went out as a part, after its victims were
reported gone (the view kept them until then, undid the run's staging and placed
each member again): at 130,000 nodes, the whole 39,000-eviction wave took 11.6 to
12.2 s of engine CPU. Carried out at once, as above, alternated with that version:
9.3 and 10.0 s against 11.4 and 11.8 (the coordinator 7.4 and 7.7 s against 9.8 and
10.1; ``--preemption-wave 39000 --nodes 130000``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from engine.engine import Engine
from engine.model.changes import ClusterEvent
from engine.model.groups import FAILED, is_group_unit
from engine.model.pods import PodInfo
from engine.model.statement import Statement
from engine.passes.context import PassContext, Placed, Route
from engine.passes.pods import attempt_pod
from events.types import Event, PreemptionRequested
from shards.coordinator.batches import kind_key
from shards.coordinator.routing import Routing

MAX_WAVE: Final = 50_000
"""Preemptors decided in one run at most."""


class Waving(Protocol):
    """What a run of preemptors reads and asks of the coordinator."""

    engine: Engine
    routing: Routing
    hard: dict[str, None]
    held_by: dict[str, dict[str, None]]
    counters: dict[str, int]

    def send(self, partition: int, event: Event) -> None: ...


@dataclass
class Member:
    """A preemptor of the run being decided: its staged evictions and placement."""

    unit: str
    statement: Statement
    slot: int


Hand = Callable[[PodInfo, int, "tuple[int, ...] | None"], None]
"""Place a pod on a slot in the view and hand it to that node's shard (with its GPU
cards, if the pass chose them): the dispatch's directed hand-over."""


class Wave:
    """The run of identical preemptors a pass is deciding, staged until
    :meth:`flush` carries it out. Nothing of it outlives the pass."""

    def __init__(self, coordinator: Waving, hand: Hand) -> None:
        self.c = coordinator
        self.hand = hand
        self.members: list[Member] = []
        self.kind: tuple[object, ...] = ()
        self.closed = False
        """No more members: a victim changed more than the staged view shows, or a
        pod was put back."""

    def __repr__(self) -> str:
        return f"Wave(members={len(self.members)}, closed={self.closed})"

    # ------------------------------------------------------------------ deciding

    def route(self, p: PassContext, unit: str) -> Route | None:
        """While a run is being decided: ``unit`` is attempted as its next member
        (HANDED: it joined the run), or the run ends before it (WAIT: the run is
        carried out at the end of the pass, and the queue waits for it as for any
        preemption, ``unit`` still at its head, not attempted). None: no run under
        way."""
        if not self.members:
            return None
        c = self.c
        e = c.engine
        pod = e.pods.get(unit)
        if (
            self.closed
            or len(self.members) >= MAX_WAVE
            or pod is None
            or unit == p.explain
            or not self._joins(unit, pod)
        ):
            self.closed = True
            return Route.WAIT
        before = len(self.members)
        p.unit = unit
        attempt_pod(p, pod, trial=True)
        if len(self.members) == before:
            # it failed, fits without evicting, or only by moves: one at a time would
            # decide it after the run; undone, it waits at the head of the queue
            pod.attempts -= 1
            e.count("attempts", -1)
            self.closed = True
            return Route.WAIT
        c.hard.pop(unit, None)
        c.counters["decided"] += 1
        return Route.HANDED

    def _joins(self, unit: str, pod: PodInfo) -> bool:
        """Whether ``unit`` is identical to the run's lead (and is not held anywhere)."""
        c = self.c
        if unit in c.engine.state.pods or unit in c.held_by or not _plain(pod):
            return False
        try:
            return kind_key(pod) == self.kind
        except TypeError:
            return False

    def commit(self, p: PassContext, statement: Statement | None, placed: Placed) -> bool | None:
        """Take a successful attempt into the run (False: not placed yet, the unit waits
        for its victims); None where the run does not take it (the dispatch commits it
        as before)."""
        if statement is None and not self.members:
            return None  # a placement, no run under way (most commits: each placement)
        c = self.c
        e = c.engine
        unit = p.unit
        preempts = statement is not None and bool(statement.evicted()) and not statement.moves()
        if preempts:
            assert statement is not None
            owner = c.routing.slot_shard
            preempts = all(owner[op.slot] >= 0 for op in statement.ops) and all(
                owner[slot] >= 0 for _, slot, _ in placed
            )
        if self.members:  # a member's attempt (:meth:`route`)
            if not preempts:
                if statement is not None:
                    statement.discard()
                p.devices.pop(unit, None)
                return False  # not a member: undone by :meth:`route`
        elif not preempts or not self._leads(unit):
            return None
        else:
            self.kind = kind_key(e.pods[unit])
        assert statement is not None
        self.members.append(Member(unit, statement, placed[0][1]))
        if not self._simple(statement):
            self.closed = True
        return False

    def _leads(self, unit: str) -> bool:
        """Whether a preemption for ``unit`` may start a run."""
        c = self.c
        e = c.engine
        if is_group_unit(unit) or e.config.extenders:
            return False
        pod = e.pods.get(unit)
        if pod is None or not _plain(pod) or e.quotas.get(pod.spec.namespace) is not None:
            return False
        if e.queue.parked_from(ClusterEvent.POD_FREED, pod.priority):
            # one at a time, the room each eviction leaves could wake it ahead of the
            # rest of the run
            return False
        try:
            hash(kind_key(pod))
        except TypeError:
            return False
        return True

    def _simple(self, statement: Statement) -> bool:
        """Whether every eviction ``statement`` stages changes the view only as the
        staged view shows (see the module's docstring)."""
        e = self.c.engine
        placed = e.state.pods
        for key in statement.evicted():
            pod = e.pods.get(key)
            if pod is None:
                return False
            spec = pod.spec
            if e.budgets and e.budgets.covering(spec):
                return False
            if e.dependents.get(key):
                return False
            group = e.groups.get(spec.group) if spec.group else None
            if group is not None and any(m in placed for m in group.members):
                return False
        return True

    def flush(self, p: PassContext) -> None:
        """Carry out the run as one scheduler carries out each preemption: what it
        staged stays (its victims are over, its members placed where planned); each
        shard is asked to evict the run's victims on its nodes (one request per
        shard), then each member is handed to its node there (after the request, in
        the shard's partition: the shard evicts, then places)."""
        members, self.members = self.members, []
        self.closed = False
        if not members:
            return
        c = self.c
        e = c.engine
        owner = c.routing.slot_shard
        pods = e.pods
        victims: dict[int, dict[str, str]] = {}
        freed: list[int] = []
        for member in members:
            for op in member.statement.ops:
                if op.kind != "evict":
                    continue
                shard = int(owner[op.slot])
                asked = victims.get(shard)
                if asked is None:
                    asked = victims[shard] = {}
                asked[op.key] = op.by or member.unit
                freed.append(op.slot)
                if op.key in pods:  # (off its node in the view already: the statement)
                    e.finish(op.key, FAILED)
            member.statement.commit()
        for shard in sorted(victims):
            c.send(shard, PreemptionRequested(victims=victims[shard]))
        for member in members:
            self.hand(pods[member.unit], member.slot, p.devices.pop(member.unit, None))
        c.counters["evictions"] += len(freed)
        if len(members) > 1:
            c.counters["waves"] = c.counters.get("waves", 0) + 1
        # parked pods hear of the room left once the whole run is placed, once per
        # node: what one at a time leaves there after the last member that changed it
        p.freed(freed)


def _plain(pod: PodInfo) -> bool:
    """A pod of its own: not in a gang, depending on nothing."""
    spec = pod.spec
    return not (spec.group or spec.depends_on)
