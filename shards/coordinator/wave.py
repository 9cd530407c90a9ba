"""Runs of identical preemptors, decided on the coordinator in one step.

A preemption the coordinator decides is carried out by the shards that own the nodes:
the victims are evicted there first, and the preemptor is placed once they are gone
(:mod:`shards.coordinator.dispatch`). Decided one at a time, each preemption of a wave
(a high-priority workload arriving on a full cluster: thousands of identical pods, each
of which must evict) costs a round trip through the log for its evictions and another
for its placement, during which the whole queue waits; the coordinator's planning was
under half of its time. Here a run of identical preemptors is decided in one pass and
carried out together:

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
2. **Carried out together.** When the run ends (a pod of another kind at the head of the
   queue, the queue empty: :meth:`Wave.flush`, from the pass's ``done``), everything
   staged is undone (the view keeps the victims until their shards evict them, as
   before), each shard is sent one ``PreemptionRequested`` with every victim of the
   run on its nodes (each naming the pod it makes room for), and each preemptor is
   nominated: its victims, and the node planned for it (``engine.planned``).
3. **Handed over together.** A member whose victims are gone waits for the rest of its
   run (:meth:`Wave.first`); once no member waits for a victim, every member is placed,
   in queue order, in one pass: on its nominated node if that still passes its
   pre-filters and filters (kube-scheduler tries a preemptor's nominated node first),
   else by a full attempt. Each placement goes to its shard as a part of its own
   (``ReservationRequested`` on the node chosen), all in the same pass: one round trip
   for every eviction of the run, and one for every placement.

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
the changed nodes: :meth:`engine.framework.runtime.Framework.sole_fit`), staging and
undoing its victims and placement (O(victims)), its share of one ``PreemptionRequested``
per shard, the fold of its victims' evictions (O(victims)), the check of its nominated
node (one node) and its placement record (``ReservationRequested``, its claim), and the
fold of its shard's answer. Per run: one pass to decide it, one to place it, and the
passes between, each reading the run's members once (:meth:`Wave.first`).

Measured (``shoal loadtest scale --shards 8 --templates 1 --pods 2000``, a loaded
2-core machine, November 2026): at 20,000 nodes, a wave of 2,000, the wave's engine
CPU (coordinator and shards) 9.2 s before, 1.2 s now (the coordinator 2.6 ms per
preemption before, 0.42 ms now), 29 s of wall time before, 5 s now; at 130,000 nodes, a
wave of 5,000, 4.3 s (0.87 ms per preemption, 0.62 ms of it the coordinator's), about
34 s projected for 39,000. A profile of the coordinator puts the rest in the members'
attempts (planning, about half), the placements' parts and claims, and the folds.
Then the time-outs of the run's nominations and claims were read off heaps
(:mod:`shards.coordinator.due`, not a pass over every one at each poll) and a shard
checks a directed placement on its node alone (``Framework.feasible_on``, not the
filters over all its nodes): at 130,000 nodes, alternated with the commit before on a
loaded 2-core machine, the whole 39,000-eviction wave at 8 shards took 17.6 to 18.9 s of
engine CPU (19.9 to 21.3 s before; coordinator 13.6 to 13.9 s, shards 4.0 to 5.0 s), and
a wave of 5,000 at 1 shard 2.1 to 2.5 s (3.7 to 4.4 s before; the shard 0.5 to 0.7 s,
1.6 to 1.9 before).

**Time-outs.** The run's placements are all sent at the end of one pass, thousands per
shard, while the view's time (that of the records folded) stood still; a claim's
time-out runs from that time plus an allowance per request the pass sent its shard
before it (``Ledger.issue``). Without it, on a loaded machine (or profiled, slower
still) most claims of a 39,000-eviction wave timed out before their answers were
folded, were aborted and decided again: about twice the work.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Protocol

from engine.engine import Engine
from engine.framework.cycle import CycleState
from engine.framework.runtime import Framework
from engine.model.changes import ClusterEvent
from engine.model.groups import is_group_unit
from engine.model.pods import PodInfo
from engine.model.statement import Statement
from engine.passes.context import PassContext, Placed, Route
from engine.passes.pods import attempt_pod
from events.types import Event, PreemptionRequested
from shards.coordinator.batches import kind_key
from shards.coordinator.routing import Routing

MAX_WAVE: Final = 50_000
"""Preemptors decided in one run at most."""
EVICTING: Final = "evicting"
"""What ``engine.dispatched`` says of a preemptor waiting for its victims."""


class Waving(Protocol):
    """What a run of preemptors reads and asks of the coordinator."""

    engine: Engine
    routing: Routing
    nominated: dict[str, tuple[int, dict[str, None]]]
    ready: list[str]
    hard: dict[str, None]
    held_by: dict[str, dict[str, None]]
    counters: dict[str, int]

    def send(self, partition: int, event: Event) -> None: ...

    def nominate(self, unit: str, victims: list[str], shards: Iterable[int]) -> None: ...


@dataclass
class Member:
    """A preemptor of the run being decided: its staged evictions and placement."""

    unit: str
    statement: Statement
    slot: int


class Wave:
    """The run of identical preemptors a pass is deciding (staged until
    :meth:`flush`), and the placement of a run whose victims are gone
    (:meth:`first`). What outlives a pass is in the coordinator's state: the
    nominations (``nominated``, ``evicting``), each member's node (``engine.planned``)
    and the members whose victims are gone (``ready``)."""

    def __init__(self, coordinator: Waving) -> None:
        self.c = coordinator
        self.members: list[Member] = []
        self.kind: tuple[object, ...] = ()
        self.closed = False
        """No more members: a victim changed more than the staged view shows, or a
        pod was put back."""
        self.placing = False
        """Placing a run whose victims are gone: a preemption found meanwhile is
        carried out at once (a run of one)."""

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
        if self.placing:
            self.flush(p)
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
        """Carry out the run: undo what it staged, ask each shard to evict the run's
        victims on its nodes (one request per shard), nominate each member."""
        members, self.members = self.members, []
        self.closed = False
        if not members:
            return
        c = self.c
        e = c.engine
        owner = c.routing.slot_shard
        victims: dict[int, dict[str, str]] = {}
        own: list[tuple[list[str], list[int]]] = []
        for member in members:
            mine: dict[int, list[str]] = {}
            for op in member.statement.ops:
                if op.kind == "evict":
                    shard = int(owner[op.slot])
                    victims.setdefault(shard, {})[op.key] = op.by or member.unit
                    mine.setdefault(shard, []).append(op.key)
            own.append(([v for part in mine.values() for v in part], list(mine)))
        names = e.state.names
        for member in reversed(members):
            member.statement.discard()  # the view keeps the victims until they are gone
        for shard in sorted(victims):
            c.send(shard, PreemptionRequested(victims=victims[shard]))
        for member, (keys, shards) in zip(members, own, strict=True):
            c.nominate(member.unit, keys, shards)
            e.planned[member.unit] = {member.unit: names[member.slot] or ""}
        if len(members) > 1:
            c.counters["waves"] = c.counters.get("waves", 0) + 1

    # ------------------------------------------------------------------ placing

    def first(self, p: PassContext) -> list[str]:
        """The units to attempt before the queue (preemptors whose victims are gone),
        in order. A member of a run waits until no member of its run waits for a
        victim; then the whole run is placed here, in queue order (see the module's
        docstring), and what is left is returned."""
        c = self.c
        e = c.engine
        ready, c.ready = c.ready, []
        for unit in ready:
            e.queue.remove(unit)
        planned = e.planned
        if all(is_group_unit(unit) for unit in planned):
            return ready  # (no run: ``planned`` is empty or holds gangs only)

        def member(unit: str) -> bool:
            # a plain unit in ``planned``: looked up there, not listed, while members
            # wait for victims (a pass per report of evictions would list the whole
            # run again: thousands of members, a hundred passes)
            return unit in planned and not is_group_unit(unit)

        arrived = [unit for unit in ready if member(unit)]
        others = [unit for unit in ready if not member(unit)]
        if any(member(unit) for unit in c.nominated):
            for unit in arrived:
                e.dispatched[unit] = EVICTING  # (held: no one else places it meanwhile)
            c.ready = arrived
            return others
        # every member's victims are gone (or its nomination timed out: it is queued)
        run = [unit for unit in planned if not is_group_unit(unit)]
        came = dict.fromkeys(arrived)
        freed: list[int] = []
        self.placing = True
        try:
            for unit in run:
                nodes = planned.pop(unit, {})
                if unit not in came:
                    continue
                e.dispatched.pop(unit, None)
                pod = e.pods.get(unit)
                if pod is not None and unit not in e.state.pods:
                    p.unit = unit
                    if not self._nominated(p, pod, nodes.get(unit, "")):
                        attempt_pod(p, pod)
                freed += e.held.pop(unit, [])
        finally:
            self.placing = False
        # parked pods hear of the room left once the whole run is placed, once per
        # node: what one at a time leaves there after the last member that changed it
        p.freed(freed)
        return others

    def _nominated(self, p: PassContext, pod: PodInfo, node: str) -> bool:
        """Place ``pod`` on its nominated ``node`` if it passes the pod's pre-filters and
        filters there (kube-scheduler's nominated node first); False: not placed."""
        e = self.c.engine
        slot = e.state.index.get(node)
        framework = p.profiles.framework_for(pod)
        if slot is None or framework is None or self.c.routing.slot_shard[slot] < 0:
            return False
        if not _fits(framework, pod, e, slot):
            return False
        pod.attempts += 1
        e.count("attempts")
        p.dispatch.commit(p, None, [(pod, slot, 0)])
        return True


def _fits(framework: Framework, pod: PodInfo, e: Engine, slot: int) -> bool:
    """Whether ``pod`` passes its pre-filters, and its filters on ``slot``: one node
    looked at where every filter that applies is local, else all of them."""
    state = e.state
    one = framework.sole_fit(pod, state, [slot])
    if one is not None:
        return one == slot
    cycle = CycleState()
    if not framework.run_pre_filters(cycle, pod, state).ok:
        return False
    return bool(framework.feasible(cycle, pod, state)[slot])


def _plain(pod: PodInfo) -> bool:
    """A pod of its own: not in a gang, depending on nothing."""
    spec = pod.spec
    return not (spec.group or spec.depends_on)
