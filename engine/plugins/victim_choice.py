"""Which pods preemption takes from a node, and what a plan costs: the per-node part of
``DefaultPreemption`` (:mod:`engine.plugins.preemption`), shared by its exact path and
its fast path for priority preemption (:mod:`engine.plugins.preemption_priority`).

A victim is taken with its *unit*: itself, or every placed member of the gang that
would drop below ``minMember`` without it. On a node, every eligible unit is taken,
then units are reprieved one at a time while the pod still fits the node and its
quota, as kube-scheduler's ``selectVictimsOnNode`` does (see :func:`victims_for`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from engine.framework.handle import Handle
from engine.model.devices import GpuRequest
from engine.model.groups import SCHEDULED
from engine.model.pods import PodInfo
from engine.model.quota import QuotaTable
from engine.model.state import ClusterState, Request
from engine.model.victims import Cost, cost_of


class Mode(Enum):
    """Whose pods a preemptor may evict (see the module docstring)."""

    PRIORITY = "priority"
    RECLAIM = "reclaim"
    OWN = "own"


@dataclass(frozen=True, slots=True)
class Plan:
    slot: int
    victims: tuple[str, ...]
    cost: Cost


@dataclass(frozen=True, slots=True)
class Victim:
    key: str
    priority: int
    started: int
    namespace: str
    slot: int
    request: dict[str, int]
    """What it holds on its node, by resource name (its cards' rows aside)."""
    counted: dict[str, int]
    """What it counts in quotas (:meth:`QuotaTable.named`: its cards in milli-cards)."""

    def rank(self) -> tuple[int, int, str]:
        """Most valuable first: higher priority, then earlier start."""
        return (-self.priority, self.started, self.key)


def describe(handle: Handle, key: str) -> tuple[int, int]:
    pod = handle.pods[key]
    return pod.priority, handle.started.get(key, 0)


def victims_for(
    pod: PodInfo,
    state: ClusterState,
    slot: int,
    here: list[Victim],
    least_first: list[Victim],
    wanted: dict[str, int],
    agg_short: dict[str, int],
    max_short: dict[str, int],
    quotas: QuotaTable,
    mode: Mode,
    units: dict[str, tuple[Victim, ...]],
    breaking: Callable[[list[Victim]], set[str]],
) -> list[Victim] | None:
    """A minimal set of victims that lets ``pod`` fit ``slot`` and its quota, or None.
    A victim is taken with its unit (the gang that would fall with it), so the floor of
    its namespace and the room it frees count every pod that goes."""
    names = state.resources
    card_rows = state.cards.rows
    free = {
        names.name(row): int(state.free[row, slot])
        for row, _ in pod.request
        if row not in card_rows
    }
    wanted = {r: a for r, a in wanted.items() if names.get(r) not in card_rows}
    node_short = {r for r, amount in wanted.items() if free.get(r, 0) < amount}
    reclaimed = set(agg_short) | node_short
    taken: dict[str, dict[str, int]] = {}

    def floor_ok(victim: Victim) -> bool:
        """Taking ``victim``'s unit too keeps every namespace at or above its ``min`` in
        every resource being reclaimed (reclaim only)."""
        if mode != Mode.RECLAIM:
            return True
        after: dict[str, dict[str, int]] = {}
        for member in units[victim.key]:
            if member.key in chosen_keys:
                continue
            quota = quotas.get(member.namespace)
            if quota is None:
                return False
            took = taken.get(member.namespace, {})
            left = after.setdefault(member.namespace, {})
            for resource in reclaimed:
                if resource not in quota.spec.min or not quota.names(resource):
                    continue
                floor = quota.min_of(resource)
                if resource not in left:
                    left[resource] = quota.used.get(resource, 0) - took.get(resource, 0)
                left[resource] -= member.counted.get(resource, 0)
                if left[resource] < floor:
                    return False
        return True

    def take(victim: Victim, chosen: list[Victim]) -> None:
        for member in units[victim.key]:
            if member.key in chosen_keys:
                continue
            chosen.append(member)
            chosen_keys.add(member.key)
            took = taken.setdefault(member.namespace, {})
            for resource, amount in member.counted.items():
                took[resource] = took.get(resource, 0) + amount

    chosen: list[Victim] = []
    chosen_keys: set[str] = set()
    covers = coverage(pod, wanted, free, agg_short, max_short, quotas, slot)
    gpu = state.gpu_of(pod.request)
    if gpu is not None:
        covers = with_cards(covers, state, gpu, slot)
    on_node = sorted(here, key=lambda v: v.rank(), reverse=True)  # least valuable first
    # where the quota is short too: victims anywhere, in one order (least valuable
    # first) whatever their node, so that what a pod elsewhere frees is weighed against
    # the pods here, not only after them (and the choice does not depend on which of
    # equal nodes the pods here happened to land on). Pods elsewhere are taken until
    # those taken free the quota short: any more valuable one would be reprieved (those
    # free the quota without it, and it frees no room here).
    short = () if mode == Mode.PRIORITY else (*agg_short, *max_short)
    elsewhere = (
        v for v in least_first if v.slot != slot and any(v.counted.get(r, 0) > 0 for r in short)
    )
    nxt = next(elsewhere, None) if short else None
    freed_agg = dict.fromkeys(agg_short, 0)
    freed_own = dict.fromkeys(max_short, 0)
    counted = 0  # (of ``chosen``: what those from elsewhere free, kept as they come)

    def offer(victim: Victim) -> None:
        if victim.key not in chosen_keys and floor_ok(victim):
            take(victim, chosen)

    def offer_elsewhere(victim: Victim) -> Victim | None:
        """Offer ``victim`` (from elsewhere); the next one to offer, or None once those
        taken from elsewhere free the quota short (counted as :func:`coverage` counts)."""
        nonlocal counted
        offer(victim)
        for member in chosen[counted:]:
            if member.slot != slot:
                frees(member, freed_agg, freed_own, quotas, pod.spec.namespace)
        counted = len(chosen)
        if all(freed_agg[r] >= need for r, need in agg_short.items()) and all(
            freed_own[r] >= need for r, need in max_short.items()
        ):
            return None
        return next(elsewhere, None)

    for victim in on_node:
        rank = victim.rank()
        while nxt is not None and nxt.rank() > rank:
            nxt = offer_elsewhere(nxt)
        offer(victim)
    while nxt is not None:
        nxt = offer_elsewhere(nxt)
    if not covers(chosen):
        return None
    # reprieve a unit at a time, as kube-scheduler's selectVictimsOnNode does: those
    # whose eviction would break a disruption budget first, then the most valuable (a
    # gang as valuable as its most valuable member); whoever cannot be spared stays
    kept = list(chosen)
    breaks = breaking(chosen)

    def order(victim: Victim) -> tuple[bool, tuple[int, int, str], tuple[int, int, str]]:
        unit = units[victim.key]
        unit_breaks = any(m.key in breaks for m in unit)
        return (not unit_breaks, min(m.rank() for m in unit), victim.rank())

    for victim in sorted(chosen, key=order):
        unit = {m.key for m in units[victim.key]}
        if victim.key not in {v.key for v in kept}:
            continue  # reprieved with its gang already
        trial = [v for v in kept if v.key not in unit]
        if covers(trial):
            kept = trial
    return kept


def units_of(
    everyone: list[Victim], state: ClusterState, handle: Handle
) -> dict[str, tuple[Victim, ...]]:
    """Each eligible victim's unit: itself, or every placed member of the gang that would
    drop below ``minMember`` without it (members that are not eligible themselves
    included: they go down with it all the same)."""
    by_key = {v.key: v for v in everyone}
    units: dict[str, tuple[Victim, ...]] = {}
    for victim in everyone:
        if victim.key in units:
            continue  # a member of a gang already seen
        gang = gang_of(handle, state, victim.key)
        if not gang:
            units[victim.key] = (victim,)
            continue
        members = tuple(by_key.get(key) or victim_of(handle, state, key) for key in gang)
        for member in members:  # the same unit for every member, eligible or not
            units[member.key] = members
    return units


def victim_of(handle: Handle, state: ClusterState, key: str) -> Victim:
    """``key`` as a victim; what it counts in quotas left empty where there are no
    quotas (read only by the quota rules)."""
    pod = handle.pods[key]
    placed = state.pods[key]
    quotas = handle.quotas
    return Victim(
        key,
        pod.priority,
        handle.started.get(key, 0),
        pod.spec.namespace,
        placed.slot,
        named(state, placed.request),
        quotas.named(placed.request) if quotas else {},
    )


def named(state: ClusterState, request: Request) -> dict[str, int]:
    """``request`` by resource name (what it takes on a node)."""
    names = state.resources
    return {names.name(row): amount for row, amount in request}


def coverage(
    pod: PodInfo,
    wanted: dict[str, int],
    free: dict[str, int],
    agg_short: dict[str, int],
    max_short: dict[str, int],
    quotas: QuotaTable,
    slot: int,
) -> Callable[[list[Victim]], bool]:
    """Whether a set of victims makes room for ``pod`` on ``slot`` and in its quota."""

    def covers(victims: list[Victim]) -> bool:
        room = dict(free)
        agg = dict.fromkeys(agg_short, 0)
        own = dict.fromkeys(max_short, 0)
        for victim in victims:
            if victim.slot == slot:
                for resource in room:
                    room[resource] += victim.request.get(resource, 0)
            frees(victim, agg, own, quotas, pod.spec.namespace)
        return (
            all(room.get(r, 0) >= amount for r, amount in wanted.items())
            and all(agg[r] >= need for r, need in agg_short.items())
            and all(own[r] >= need for r, need in max_short.items())
        )

    return covers


def frees(
    victim: Victim,
    agg: dict[str, int],
    own: dict[str, int],
    quotas: QuotaTable,
    namespace: str,
) -> None:
    """Add what evicting ``victim`` gives back to ``agg`` (per resource short over the
    quotas' sum of ``min``: what its quota counts) and to ``own`` (per resource short
    under ``namespace``'s ``max``: what it counts there, if it is of ``namespace``)."""
    theirs = quotas.get(victim.namespace)
    if theirs is not None:
        for resource in agg:
            if theirs.names(resource):
                agg[resource] += victim.counted.get(resource, 0)
    if victim.namespace == namespace:
        for resource in own:
            own[resource] += victim.counted.get(resource, 0)


def with_cards(
    covers: Callable[[list[Victim]], bool], state: ClusterState, gpu: GpuRequest, slot: int
) -> Callable[[list[Victim]], bool]:
    """``covers``, and the pod's GPU cards fit ``slot`` without the victims there."""

    def both(victims: list[Victim]) -> bool:
        here = [v for v in victims if v.slot == slot]
        return covers(victims) and cards_fit(state, gpu, slot, here)

    return both


def cards_fit(state: ClusterState, gpu: GpuRequest, slot: int, victims: list[Victim]) -> bool:
    """Whether ``gpu`` fits the cards of ``slot`` with ``victims`` gone from it."""
    released = []
    for victim in victims:
        placed = state.pods.get(victim.key)
        if placed is not None and placed.gpu is not None and placed.slot == slot:
            released.append((placed.devices, placed.gpu))
    return state.cards.fits_after(slot, gpu, released)


def with_gangs(handle: Handle, state: ClusterState, chosen: Sequence[Victim]) -> list[str]:
    """The keys of ``chosen``, then of the members that go down with each
    (:func:`gang_of`), each once, in that order."""
    expanded = dict.fromkeys(v.key for v in chosen)
    for victim in chosen:
        expanded.update(dict.fromkeys(gang_of(handle, state, victim.key)))
    return list(expanded)


def gang_of(handle: Handle, state: ClusterState, key: str) -> tuple[str, ...]:
    """The placed members that go down with ``key`` (its gang, if it would drop below
    ``minMember``)."""
    pod = handle.pods.get(key)
    group = handle.groups.get(pod.spec.group) if pod is not None and pod.spec.group else None
    if group is None or group.phase != SCHEDULED:
        return ()
    placed = [m for m in group.members if m in state.pods]
    return tuple(placed) if len(placed) - 1 < group.min_member else ()


def lean_plan(
    pod: PodInfo, state: ClusterState, handle: Handle, slot: int, keys: list[str]
) -> Plan | None:
    """:func:`victims_for` on ``slot`` in priority mode, and the plan's cost, where
    every one of ``keys`` (the eligible pods there) is a unit of its own (no gang),
    no disruption budget exists and ``pod`` asks for no GPU cards: then room on the
    node is all that decides, so the same choice runs over integers per resource.

    As :func:`victims_for`: all of them taken, least valuable first; then each
    reprieved, most valuable first, while the rest still free what the node lacks; the
    rest in the order taken. None where even all of them leave the pod no room; no
    victims where the pod fits without any."""
    pods = handle.pods
    started = handle.started
    placed_pods = state.pods
    card_rows = state.cards.rows
    rows = [(row, amount) for row, amount in pod.request if row not in card_rows]
    free = state.free
    room = [int(free[row, slot]) for row, _ in rows]
    if len(keys) == 1:  # (a wave's nodes: taken unless the pod fits without it)
        key = keys[0]
        held = dict(placed_pods[key].request)
        if any(
            have + held.get(row, 0) < amount for have, (row, amount) in zip(room, rows, strict=True)
        ):
            return None
        name = state.names[slot] or ""
        if all(have >= amount for have, (_, amount) in zip(room, rows, strict=True)):
            return Plan(slot, (), cost_of(0, [], name))
        return Plan(slot, (key,), cost_of(0, [(pods[key].priority, started.get(key, 0))], name))
    taken: list[tuple[tuple[int, int, str], list[int]]] = []
    for key in keys:
        held = dict(placed_pods[key].request)
        freed = [held.get(row, 0) for row, _ in rows]
        taken.append(((-pods[key].priority, started.get(key, 0), key), freed))
        for i, amount in enumerate(freed):
            room[i] += amount
    if any(have < amount for have, (_, amount) in zip(room, rows, strict=True)):
        return None
    taken.sort(key=lambda item: item[0], reverse=True)  # least valuable first
    spared: set[str] = set()
    for rank, freed in reversed(taken):  # most valuable first
        if all(have - f >= amount for have, f, (_, amount) in zip(room, freed, rows, strict=True)):
            spared.add(rank[2])
            for i, amount in enumerate(freed):
                room[i] -= amount
    kept = [(rank[2], -rank[0], rank[1]) for rank, _ in taken if rank[2] not in spared]
    cost = cost_of(0, [(priority, start) for _, priority, start in kept], state.names[slot] or "")
    return Plan(slot, tuple(key for key, _, _ in kept), cost)
