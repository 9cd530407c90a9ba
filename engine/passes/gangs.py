"""A gang's attempt: all pending members against staged state, committed or undone whole.

Members are tried in arrival order, each through its profile (pre-filters, among them
ElasticQuota and Coscheduling's minResources; filters; scores); if fewer than minMember
can be placed, members that failed may preempt (the profile's post-filters), still
staged, the gang's plan judged whole in kube-scheduler's order
(:mod:`engine.passes.gang_preemption`), and if that staged no eviction and still falls
short, may have room made by moving running pods (the rescheduler, at most
``maxMoves`` pods for the whole gang).
Only when minMember is reached does anything leave the statement, through the dispatch:
evictions first, moves next, then the bindings. Members beyond minMember that did not
fit become ordinary pods, tried again at once on their own (where they may preempt, as
any pod may).

A part of a gang the coordinator asked this shard to hold (a reservation) is a gang of
its own whose every pod must be placed, never by preemption: on the nodes the
coordinator chose for them, checked against this shard's own state, or (a gang handed
over whole) where the profile puts them, with moves if need be (the coordinator hands a
gang whole for a plan of moves within this shard). It is granted or denied at once.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from engine.fold import granted, part_closed
from engine.framework.cycle import CycleState
from engine.framework.runtime import Framework
from engine.model.changes import EVERY
from engine.model.groups import SCHEDULED, advance, group_unit
from engine.model.pods import PodInfo
from engine.model.state import Bools, held_devices
from engine.model.statement import Statement
from engine.passes.context import PassContext
from engine.passes.dispatch import Placed, migrate
from engine.passes.extenders import applicable, ask_if_needed, verdict_for
from engine.passes.gang_preemption import Failure, preempt_for
from engine.passes.pods import no_profile, preempt_into
from engine.passes.reservations import commit
from engine.passes.topology import one_domain, plan
from engine.plugins.rescheduler import CHEAPEST, GANG, MOVES_LEFT, PLACED, Rescheduler
from engine.plugins.rescheduler import NAME as NAME_RESCHEDULER
from events.types import ReservationDenied, ReservationGranted


def attempt_group(p: PassContext, key: str) -> None:
    """Place a Pending gang: every pending member against staged state, preempting
    if that can reach minMember; commit all or undo all."""
    e = p.e
    group = e.groups[key]
    assert group.spec is not None
    members = [e.pods[m] for m in group.members if m in e.pods]
    pending = [m for m in members if m.key not in e.state.pods]
    if not group.reservation and _asks_extenders(p, pending, group_unit(key)):
        return  # parked until every member's extenders answered
    group.attempts += 1
    need = group.min_member - (len(members) - len(pending))
    planned = e.planned.pop(group_unit(key), None)
    planned_cards = e.planned_cards.pop(group_unit(key), {})
    later: list[PodInfo] = []
    if planned is not None:
        # after the evictions planned for it: the members they made room for, the
        # others as ordinary pods (what one scheduler's evicting attempt commits)
        later = [m for m in pending if m.key not in planned]
        pending = [m for m in pending if m.key in planned]
    if need <= 0 and not group.reservation:
        # minMember already run (the coordinator's view, after an aborted claim left
        # some placed): the gang is scheduled; the rest are ordinary pods
        advance(group, SCHEDULED)
        e.group_changes[key] = None
        e.wake(key)
        for pod in pending + later:
            e.queue.add(pod.key, pod.priority, pod.seq, e.queue_of(pod.spec.namespace))
        return
    # a part held for the coordinator goes where it chose; a gang after the evictions
    # planned for it goes first where the plan put each member (its nominated nodes and
    # the cards its victims free, as kube-scheduler tries a preemptor's nominated node
    # first and one scheduler's evicting attempt takes them), else anywhere
    directed = e.reservations[group.reservation].placements if group.reservation else planned or {}
    cards = e.reservations[group.reservation].devices if group.reservation else planned_cards
    for pod in pending:
        pod.attempts += 1
        e.count("attempts")
    topology = None if group.reservation else plan(p, group, pending, need)
    statement = Statement(e.state, e.quotas)
    lifted = _lift_leaving(p, statement, group.reservation)
    placed: Placed = []
    failures: dict[str, Failure] = {}
    if isinstance(topology, str):
        failures = {pod.key: (topology, (), {}) for pod in pending}
    elif topology is not None:
        # the domain first, then the nodes inside it: each candidate in turn, staged
        for candidate in topology.candidates:
            placed, failures = _members(
                p, statement, pending, directed, candidate.mask, not group.reservation, cards
            )
            if len(placed) >= need:
                break
            statement.discard()
            statement = Statement(e.state, e.quotas)
        else:
            within: Bools | None = None
            if topology.required is not None:
                # in the roomiest domain, then preemption (kept only within one domain)
                within = np.zeros(e.state.capacity, dtype=np.bool_)
                if topology.candidates:
                    within = max(
                        topology.candidates, key=lambda c: (int(c.mask.sum()), c.domains)
                    ).mask
            placed, failures = _members(
                p, statement, pending, directed, within, not group.reservation, cards
            )
    else:
        placed, failures = _members(
            p, statement, pending, directed, None, not group.reservation, cards
        )
    if len(placed) < need and not group.reservation and not isinstance(topology, str):
        preempt_for(p, statement, pending, placed, failures, need, key)
    if len(placed) < need and topology is None and _moves_allowed(p, group.reservation):
        _migrate_for(p, statement, pending, placed, failures, need, key)
    if topology is not None and not isinstance(topology, str) and topology.required is not None:
        slots = [slot for _, slot, _ in placed]
        slots += [e.state.pods[m].slot for m in group.members if m in e.state.pods]
        if len(placed) >= need and not one_domain(p, topology.required, slots):
            statement.discard()
            statement = Statement(e.state, e.quotas)
            placed = []
        if len(placed) < need and topology.reason:
            failures = {k: (topology.reason, f[1], f[2]) for k, f in failures.items()} or {
                pending[0].key: (topology.reason, (), {})
            }
    if placed and len(placed) >= need and group.reservation:
        for moved, origin, slot, by in statement.moves():
            migrate(p, moved, origin, slot, by)  # made room for the part (handed whole)
        statement.commit()
        e.reservations[group.reservation].lifted = lifted
        grant = ReservationGranted(
            rid=group.reservation,
            group=key,
            placements={pod.key: e.state.names[slot] or "" for pod, slot, _ in placed},
            shard=e.shard,
            devices=held_devices(e.state, [pod.key for pod, _, _ in placed]),
        )
        granted(e, grant)  # already staged in state: records them as held
        p.out.append(grant)
        res = e.reservations[group.reservation]
        if res.at_once:
            commit(p, res)  # the whole reservation: bound at once
        return
    if placed and len(placed) >= need:
        if not p.dispatch.commit(p, statement, placed):
            return  # evictions under way: the gang waits for them, whole
        advance(group, SCHEDULED)
        e.group_changes[key] = None
        e.wake(key)
        for pod in pending + later:
            if pod.key in failures or pod in later:
                # beyond minMember: an ordinary pod from now on, tried again as one at
                # once (it may preempt, as any pod may)
                e.queue.add(pod.key, pod.priority, pod.seq, e.queue_of(pod.spec.namespace))
        return
    statement.discard()
    pending += later
    first = next(iter(failures.values()), ("", (), {}))
    reason = (
        f"pod group {key}: {len(placed)} of the {need} members still needed fit; {first[0]}"
    ).rstrip("; ")
    plugins = tuple(dict.fromkeys(name for f in failures.values() for name in f[1]))
    if group.reservation:
        denial = ReservationDenied(rid=group.reservation, group=key, reason=reason, shard=e.shard)
        part_closed(e, denial)
        p.out.append(denial)
        return
    park_gang(p, key, pending, reason, plugins, failures)


def park_gang(
    p: PassContext,
    key: str,
    pending: list[PodInfo],
    reason: str,
    plugins: tuple[str, ...],
    failures: dict[str, Failure] | None = None,
) -> None:
    """Gang ``key`` found no place this attempt: its pending members are told why, and
    it waits in the queue for the cluster events that may help."""
    e = p.e
    group = e.groups[key]
    answer = None
    if pending:
        # one answer for the gang, from the nodes' verdicts on its failed members (the
        # most nodes any member saw rejected for each reason)
        merged: dict[str, int] = {}
        for _, _, counts in (failures or {}).values():
            for why, n in counts.items():
                merged[why] = max(merged.get(why, 0), n)
        answer = p.answer(pending[0], reason, plugins, merged, group_unit(key))
    for pod in pending:
        _, _, rejections = (failures or {}).get(pod.key, ("", (), {}))
        p.unschedulable(pod, reason, plugins, rejections, unit=group_unit(key), answer=answer)
    group.reason = reason
    e.group_changes[key] = None
    framework = p.profiles.framework_for(pending[0]) if pending else None
    events = framework.events_for(plugins) if framework and plugins else EVERY
    e.queue.park(
        group_unit(key),
        p.group_priority(group),
        group.seq,
        group.attempts,
        e.now,
        plugins,
        events,
        e.queue_of(group.namespace),
    )


def _lift_leaving(p: PassContext, statement: Statement, rid: str) -> dict[str, tuple[int, ...]]:
    """Take off their nodes, in ``statement``, the pods of part ``rid`` that its plan of
    moves takes to other shards (``Reservation.leaving``; those still on the node named),
    so that the pods it brings in may use their room: the GPU cards each held."""
    e = p.e
    res = e.reservations.get(rid) if rid else None
    if res is None or not res.leaving:
        return {}
    lifted: dict[str, tuple[int, ...]] = {}
    for key, node in sorted(res.leaving.items()):
        placed = e.state.pods.get(key)
        pod = e.pods.get(key)
        if placed is None or pod is None or e.state.names[placed.slot] != node:
            continue  # gone, or elsewhere: it takes no room there
        lifted[key] = placed.devices
        statement.lift(key, pod.spec.namespace, res.moved_for)
    return lifted


def _members(
    p: PassContext,
    statement: Statement,
    pending: list[PodInfo],
    directed: dict[str, str],
    within: Bools | None,
    judged: bool = True,
    cards: Mapping[str, tuple[int, ...]] | None = None,
) -> tuple[Placed, dict[str, Failure]]:
    """Stage each pending member where its profile puts it (``within``: only there), or
    where the coordinator directed it (on the GPU ``cards`` it chose, where still
    free); what found no node, and why. ``judged``: the extenders' answers apply (not
    to a part held for the coordinator)."""
    e = p.e
    placed: Placed = []
    failures: dict[str, Failure] = {}
    for pod in pending:
        framework = p.profiles.framework_for(pod)
        if framework is None:
            failures[pod.key] = (no_profile(pod), (), {})
            continue
        if pod.key in directed:
            failure = _directed(
                p,
                statement,
                pod,
                framework,
                directed[pod.key],
                not judged,
                cards.get(pod.key) if cards else None,
            )
            if failure is None:
                placed.append((pod, e.state.pods[pod.key].slot, 0))
                continue
            if not judged:
                failures[pod.key] = failure
                continue
            # a nominated node that no longer holds it: wherever the profile puts it
        extenders = applicable(p, pod) if judged else ()
        verdict = verdict_for(p, pod, extenders) if extenders else None
        attempt = framework.schedule(
            pod, e.state, explain=pod.key == p.explain, within=within, verdict=verdict
        )
        p.record(pod, attempt)
        if attempt.slot >= 0:
            statement.assume_pod(pod, attempt.slot)
            placed.append((pod, attempt.slot, 0))
        else:
            d = attempt.diagnosis
            plugins = tuple(d.plugins) if d and d.plugins else ()
            if not plugins and attempt.status.plugin:
                plugins = (attempt.status.plugin,)
            failures[pod.key] = (attempt.status.message(), plugins, d.rejections() if d else {})
    return placed, failures


def _asks_extenders(p: PassContext, pending: list[PodInfo], unit: str) -> bool:
    """Whether the gang waits for extenders: each pending member they must judge is
    asked about (unless it was), and the gang is attempted once all have answered."""
    waiting = False
    for pod in pending:
        framework = p.profiles.framework_for(pod)
        extenders = applicable(p, pod) if framework is not None else ()
        if framework is not None and extenders:
            waiting = ask_if_needed(p, pod, framework, extenders, unit) or waiting
    return waiting


def _directed(
    p: PassContext,
    statement: Statement,
    pod: PodInfo,
    framework: Framework,
    node: str,
    local_only: bool = True,
    cards: tuple[int, ...] | None = None,
) -> Failure | None:
    """Stage ``pod`` on ``node`` (the coordinator's choice, or a nomination) if this
    engine's state agrees it fits there: the profile's pre-filters, and its filters on
    that node (``local_only``: those that read no other node's pods). GPU ``cards``:
    the coordinator's choice, taken where each still has room (else the state's)."""
    e = p.e
    slot = e.state.index.get(node)
    if slot is None:
        return (f"node {node} is not on this shard", (), {})
    cycle = CycleState()
    status = framework.run_pre_filters(cycle, pod, e.state)
    if not status.ok:
        return (status.message(), (status.plugin,) if status.plugin else (), {})
    # the rules that read pods on other nodes were checked by the coordinator on its
    # whole view; this shard sees only its own pods
    if not framework.feasible_on(cycle, pod, e.state, slot, local_only=local_only):
        return (f"{pod.key} no longer fits node {node}", ("NodeResourcesFit",), {})
    # (cards no longer free: the state chooses)
    statement.assume_pod(pod, slot, e.state.cards_if_free(slot, pod.request, cards))
    return None


def _moves_allowed(p: PassContext, rid: str) -> bool:
    """Whether moves may place this gang: an engine that owns its nodes, for a gang of
    its own or one the coordinator handed it whole to place at once (a part whose nodes
    the coordinator chose is placed there or not at all)."""
    e = p.e
    if not e.migrates:
        return False
    res = e.reservations.get(rid) if rid else None
    return not rid or (res is not None and res.at_once and not res.placements)


def _migrate_for(
    p: PassContext,
    statement: Statement,
    pending: list[PodInfo],
    placed: Placed,
    failures: dict[str, Failure],
    need: int,
    key: str,
) -> None:
    """Members that found no room may have it made by moving running pods (the
    rescheduler, staged), in order, until minMember is reached, with at most
    ``maxMoves`` pods moved for the whole gang. Not after evictions were staged (a
    gang is placed by preemption or by moves, not both). What a member was told (the
    cheapest plan beyond the moves left, a budget that refused one) joins its reason."""
    if statement.evicted():
        return
    for pod in pending:
        if len(placed) >= need:
            break
        framework = p.profiles.framework_for(pod)
        failure = failures.get(pod.key)
        if failure is None or framework is None or "NodeResourcesFit" not in failure[1]:
            continue
        rescheduler = next((f for f in framework.post_filters if isinstance(f, Rescheduler)), None)
        if rescheduler is None:
            continue
        cycle = CycleState()
        cycle.write(NAME_RESCHEDULER, GANG, key)
        cycle.write(NAME_RESCHEDULER, MOVES_LEFT, rescheduler.max_moves - len(statement.moves()))
        slot = preempt_into(
            p, statement, pod, framework, exclude_group=key, cycle=cycle, preempts=False
        )
        if slot is not None and cycle.read(NAME_RESCHEDULER, PLACED, -1) == slot:
            placed.append((pod, slot, 0))
            del failures[pod.key]
            continue
        note = str(cycle.read(NAME_RESCHEDULER, CHEAPEST, ""))
        if note:
            failures[pod.key] = (f"{failure[0]}; {note}", failure[1], failure[2])
