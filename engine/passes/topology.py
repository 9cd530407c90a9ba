"""Where a gang with a topology constraint is tried: its domains, best first.

A gang may *require* a level (every member in one domain of it: one leaf) and/or
*prefer* one (as few of its domains as possible). The domain is chosen first, then the
nodes inside it: each candidate is a mask of nodes, and the gang is attempted (staged,
members in order, through their profile) within one candidate after another until one
holds it (:func:`engine.passes.gangs.attempt_group`).

How candidates are ordered (seed 001's rule for Slurm on Kubernetes: with ``m`` the
members still needed and ``n`` a domain's nodes that pass every filter for the gang's
first pending member, plus those already holding members, ``k = n - m``):

1. single domains of the starting level (the preferred one, else the required one):
   those already holding members first, then ``k >= 0`` by ascending ``k`` (the
   tightest that holds the gang, so the others stay whole), then ``k < 0`` by
   descending ``n`` (pods may share a node, so a domain with fewer nodes than members
   may still hold them); ties to the domain owned by the fewest shards (the
   coordinator's view: one shard then holds the whole gang), then by name. Domains
   with ``n = 0`` are skipped;
2. for a preferred level, each broader level in turn up to the required one (or the
   whole cluster when none is required): in each of its domains, the fewest
   starting-level domains whose ``n`` add up to ``m`` (greedily the largest, and last
   the tightest that covers the rest), candidates ordered by how many they take, then
   by the nodes they leave over, then by the shards that own them, then by name;
3. without a required level, anywhere (what the profile alone chooses).

A required level that no domain can hold leaves the gang pending with a reason naming
the level. Preemption is tried after the candidates, as for any gang; under a required
level its outcome is kept only if every member ends in one domain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.framework.cycle import CycleState
from engine.model.groups import GroupInfo
from engine.model.pods import PodInfo
from engine.model.state import Bools, Ints
from engine.passes.context import PassContext


@dataclass(frozen=True, slots=True)
class Candidate:
    mask: Bools
    domains: tuple[str, ...]
    """The starting level's domains it spans (or the broader domain's name)."""


@dataclass
class Plan:
    candidates: list[Candidate] = field(default_factory=list)
    required: int | None = None
    """The required level's index (None: only preferred)."""
    level: str = ""
    """The name of the level the gang is kept in (required, else preferred)."""
    reason: str = ""
    """Why no candidate holds the gang, for "why pending" ("": the members' own reasons
    stand: no profile, or refused before the filters)."""


def constraint(p: PassContext, group: GroupInfo) -> tuple[int | None, int | None] | str:
    """(required, preferred) level indices of ``group``, or why they cannot be resolved."""
    spec = group.spec
    assert spec is not None
    topology = p.profiles.config.topology
    out: list[int | None] = []
    for kind, name in (
        ("required", spec.topology_required),
        ("preferred", spec.topology_preferred),
    ):
        if not name:
            out.append(None)
            continue
        level = topology.resolve(name)
        if level is None:
            return (
                f"pod group {group.key}: {kind} topology level {name!r} is not declared "
                f"(levels: {topology.describe()})"
            )
        out.append(level)
    return out[0], out[1]


def plan(p: PassContext, group: GroupInfo, pending: list[PodInfo], need: int) -> Plan | str | None:
    """The candidates for ``group`` (None: it has no topology constraint; a string: its
    constraint names a level the configuration does not declare)."""
    spec = group.spec
    if spec is None or not (spec.topology_required or spec.topology_preferred) or not pending:
        return None
    levels = constraint(p, group)
    if isinstance(levels, str):
        return levels
    required, preferred = levels
    e = p.e
    state = e.state
    topology = p.profiles.config.topology
    index = p.profiles.topology
    start = preferred if preferred is not None else required
    assert start is not None
    if required is not None:
        start = min(start, required)
    top = required if required is not None else len(topology.levels) - 1
    kept = required if required is not None else start
    out = Plan(required=required, level=topology.levels[kept].name)
    lead = pending[0]
    framework = p.profiles.framework_for(lead)
    if framework is None:
        return out
    cycle = CycleState()
    admitted = framework.run_pre_filters(cycle, lead, state).ok
    # refused before the filters (a quota, minResources): every domain is tried and the
    # members' own reason stands
    counted = framework.feasible(cycle, lead, state).copy() if admitted else state.valid.copy()
    held = [state.pods[key].slot for key in group.members if key in state.pods]
    counted[held] = True
    m = need
    base = index.codes(state, start)
    names = index.names(state, start)
    inside = counted & (base >= 0)
    n = np.bincount(base[inside], minlength=len(names))
    held_in = np.bincount(base[held][base[held] >= 0], minlength=len(names)) if held else None
    if required is not None and held:
        # members already run in a domain of the required level: the gang stays there
        codes = index.codes(state, required)
        home = codes[held[0]]
        allowed = codes == home if home >= 0 else np.zeros_like(counted)
    else:
        allowed = state.valid

    owners = p.dispatch.slot_owners()

    def single_key(d: int) -> tuple[int, int, int, int, str]:
        holds = int(held_in[d]) if held_in is not None else 0
        k = int(n[d]) - m
        fit = k if k >= 0 else -int(n[d])
        return (-holds, 0 if k >= 0 else 1, fit, _spread(owners, base == d), names[d])

    for d in sorted((d for d in range(len(names)) if n[d] > 0), key=single_key):
        mask = (base == d) & allowed
        if mask.any():
            out.candidates.append(Candidate(mask, (names[d],)))
    for level in range(start + 1, top + 1):
        codes = index.codes(state, level)
        out.candidates += _spanning(
            codes, index.names(state, level), base, names, inside, m, allowed, owners
        )
    if required is None:
        everywhere = np.zeros(state.capacity, dtype=np.int64)
        out.candidates += _spanning(
            everywhere, ["cluster"], base, names, inside, m, allowed, owners
        )
    what = topology.levels[kept].name
    if not admitted:
        return out
    if required is None:
        out.reason = f"{m} members fit nowhere"
        return out
    codes = index.codes(state, required)
    outer = index.names(state, required)
    room = np.bincount(codes[counted & (codes >= 0) & allowed], minlength=len(outer))
    roomiest = max(range(len(outer)), key=lambda d: (int(room[d]), outer[d]), default=None)
    out.reason = f"no {what} holds its {m} members (required topology {what})"
    if roomiest is None or room[roomiest] == 0:
        out.reason += f"; no {what} has a node that fits them"
    else:
        out.reason += f"; the roomiest, {outer[roomiest]}, has {int(room[roomiest])} nodes that fit"
    return out


def _spanning(
    codes: Ints,
    outer_names: list[str],
    base: Ints,
    names: list[str],
    inside: Bools,
    m: int,
    allowed: Bools,
    owners: Ints | None,
) -> list[Candidate]:
    """Per domain of a broader level (``codes``), the fewest starting-level domains in
    it whose nodes add up to ``m``, best first."""
    keyed: list[tuple[tuple[int, int, int, str], Candidate]] = []
    for outer, name in enumerate(outer_names):
        within = (codes == outer) & inside & allowed
        if not within.any():
            continue
        counts = np.bincount(base[within], minlength=len(names))
        subs = sorted(
            (d for d in range(len(names)) if counts[d] > 0), key=lambda d: (-counts[d], names[d])
        )
        if len(subs) < 2:
            continue  # one domain: tried already on its own
        chosen: list[int] = []
        left = m
        while subs and left > 0:
            fits = [d for d in subs if counts[d] >= left]
            pick = min(fits, key=lambda d: (counts[d], names[d])) if fits else subs[0]
            chosen.append(pick)
            subs.remove(pick)
            left -= int(counts[pick])
        if len(chosen) < 2:
            continue
        mask = np.isin(base, chosen) & (codes == outer) & allowed
        waste = -left if left <= 0 else 1 << 40
        picked = tuple(sorted(names[d] for d in chosen))
        keyed.append(((len(chosen), waste, _spread(owners, mask), name), Candidate(mask, picked)))
    keyed.sort(key=lambda item: item[0])
    return [candidate for _, candidate in keyed]


def _spread(owners: Ints | None, mask: Bools) -> int:
    """How many shards own the nodes of ``mask`` (0 where the engine owns them all)."""
    if owners is None:
        return 0
    slots = np.flatnonzero(mask)
    slots = slots[slots < owners.shape[0]]
    return int(np.unique(owners[slots][owners[slots] >= 0]).size)


def one_domain(p: PassContext, level: int, slots: list[int]) -> bool:
    """Whether ``slots`` all lie in one domain of ``level``."""
    codes = p.profiles.topology.codes(p.e.state, level)
    found = {int(codes[slot]) for slot in slots}
    return len(found) <= 1 and -1 not in found
