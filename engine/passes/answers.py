"""One answer per waiting unit: why it waits, the facts, and what a user can do.

A pass that reports a pod unschedulable (or holds it: a dependency, a gang short of
members) hands the raw outcome here: the reason text, the filter plugins that rejected
nodes and the count of nodes per reason. :func:`compose` turns it into an
:class:`~events.types.Answer` from the state the engine holds (quota use, the gang's
counts, the nodes' free resources, their taints) and nothing else: no clock, no
randomness, so replay re-derives the same answer.

The dominant reason: a block of the unit itself comes first (no profile, pod group
missing or short of members, a dependency not done, the quota's admission), since it
applies before any node is looked at; then the reason that rejected the most nodes
(ties by name). Each kind has one template, with its numbers and names, and a next step:

====================  ============================================================
kind                  next step
====================  ============================================================
``profile``           set ``schedulerName`` to a profile this scheduler serves
``group-missing``     create the PodGroup
``gang-members``      submit the missing members, or lower ``minMember``
``dependency``        wait for the dependency (how long it has run, if it runs)
``dependency-cycle``  break the cycle of dependencies it waits on
``next-run``          wait for the earlier run of the pod group
``extender``          wait for the extender's answer / fix what it rejects
``quota-max``         raise the quota's ``max`` to the use it needs (and ``min`` where
                      the quotas' guarantees fall short of it too), or wait for a pod
``quota-reclaim``     wait for borrowers to give back (named, with what they borrow)
``quota-borrow``      raise the quota's ``min``, or wait for borrowed capacity
``resources``         free the difference on the fullest-fitting node, or add a node
``gpu-cards``         the same, in GPU cards
``taint``             add a toleration for the taint, or untaint the nodes
``node-affinity``     label nodes to match the selector, or change it
``pools``             add nodes to the tenant's pools (which have none)
``pod-affinity``      the pods it must (not) be near; change the rule
``spread``            add room in other domains, or raise ``maxSkew``
``host-ports``        free the port, or pick another
``cordoned``          uncordon nodes
``node-name``         the node named does not take it
``no-nodes``          add nodes
``other``             see ``replay --explain``
====================  ============================================================

Cost: called only where a pod is reported unschedulable or held (the slow path), and
cached per pass by the caller (:meth:`engine.passes.run.SchedulingPass.answer`), keyed by
what decides the answer (reason, verdicts, unit, pod shape, namespace, group).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from engine.model.pods import PodInfo
from engine.model.quota import Quota, quantity
from engine.model.shard import QUOTA_PLUGIN, ShardModel
from engine.passes.answer_nodes import node_answer
from events.types import SECOND, Answer

_MEMBERS: Final = re.compile(r"waiting for members of pod group (\S+): (\d+) of minMember (\d+)")
_MISSING: Final = re.compile(r"waiting for pod group (\S+), which does not exist")
CYCLE: Final = "waiting on a dependency cycle: "
"""The start of the reason of a unit whose dependencies wait for it (the names follow)."""
_DEPENDENCY: Final = re.compile(r"waiting for (\S+) to succeed \((.*)\)$")
_NEXT_RUN: Final = re.compile(r"waiting for the pods of the run of pod group (\S+) ")
_EXTENDER: Final = re.compile(r"waiting for the answer of (.+)$")
_GANG: Final = re.compile(r"pod group (\S+): (\d+) of the (\d+) members still needed fit")
_TOPOLOGY: Final = re.compile(
    r"no (\S+) holds its (\d+) members \(required topology \S+\)"
    r"(?:; the roomiest, (\S+), has (\d+) nodes that fit)?"
)


def duration(ns: int) -> str:
    """``ns`` nanoseconds as a person says it: 45 s, 12 min, 2 h, 3 d."""
    seconds = max(ns, 0) // SECOND
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


def compose(
    e: ShardModel,
    pod: PodInfo,
    reason: str,
    plugins: tuple[str, ...],
    rejections: Mapping[str, int],
    unit: str | None = None,
) -> Answer:
    """The answer for ``pod`` (of gang ``unit``, if given) that waits for ``reason``."""
    held = _held(e, pod, reason)
    if held is not None:
        return held
    gang = _GANG.match(reason)
    who = f"gang {gang.group(1)}" if gang else "the pod"
    pods = _unit_pods(e, pod, unit)
    if "elastic quota " in reason or QUOTA_PLUGIN in plugins:
        answer = _quota(e, pod, pods, who, reason)
        if answer is not None:
            return answer
    if gang is None:
        return node_answer(e, pod, reason, rejections, 1)
    key, placed, need = gang.group(1), int(gang.group(2)), int(gang.group(3))
    topology = _TOPOLOGY.search(reason)
    if topology is not None:
        return _topology(key, placed, need, topology)
    answer = node_answer(e, pod, reason, rejections, need)
    return Answer(
        kind=answer.kind,
        summary=f"gang {key}: {placed} of {need} members placeable; {answer.summary}",
        evidence=(f"{need - placed} member(s) find no node", *answer.evidence),
        next_step=answer.next_step,
    )


def _topology(key: str, placed: int, need: int, m: re.Match[str]) -> Answer:
    level, members, roomiest, nodes = m.group(1), int(m.group(2)), m.group(3), m.group(4)
    where = (
        f"the roomiest {level}, {roomiest}, has {nodes} node(s) that fit a member"
        if roomiest
        else f"no {level} has a node that fits a member"
    )
    return Answer(
        kind="topology",
        summary=(
            f"gang {key}: {placed} of {need} members placeable; no {level} holds all "
            f"{members} members (its required topology)"
        ),
        evidence=(where,),
        next_step=(
            f"free room for {members} members within one {level} ({where}), or make the "
            f"gang's topology {level} preferred instead of required"
        ),
    )


# ------------------------------------------------------------------ unit-level blocks


def _held(e: ShardModel, pod: PodInfo, reason: str) -> Answer | None:
    if reason.startswith("no scheduling profile serves"):
        name = pod.spec.scheduler_name or "default-scheduler"
        return Answer(
            kind="profile",
            summary=f"no scheduling profile serves schedulerName {name!r}",
            next_step="set spec.schedulerName to a profile of this scheduler's configuration",
        )
    if m := _MISSING.match(reason):
        return Answer(
            kind="group-missing",
            summary=f"pod group {m.group(1)} does not exist",
            next_step=f"create PodGroup {m.group(1)}, or remove the pod's pod-group label",
        )
    if m := _MEMBERS.match(reason):
        key, present, minimum = m.group(1), int(m.group(2)), int(m.group(3))
        return Answer(
            kind="gang-members",
            summary=f"gang {key}: {present} of minMember {minimum} members submitted",
            evidence=(f"the gang is tried once {minimum} members exist",),
            next_step=(
                f"submit {minimum - present} more member(s) of {key}, "
                f"or lower its minMember to {present}"
            ),
        )
    if reason.startswith(CYCLE):
        chain = reason.removeprefix(CYCLE)
        return Answer(
            kind="dependency-cycle",
            summary=f"waits on a dependency cycle: {chain}, so it can never start",
            evidence=tuple(f"depends on {d}" for d in _depends_on(e, pod)),
            next_step=(
                "delete the cycle's pods and create them again without one of its "
                "dependencies (shoal.io/depends-on)"
            ),
        )
    if m := _DEPENDENCY.match(reason):
        dep, state = m.group(1), m.group(2)
        running = _running_for(e, dep)
        since = f" (running {duration(running)})" if running is not None else ""
        return Answer(
            kind="dependency",
            summary=f"depends on {dep}, which is {state}",
            evidence=tuple(f"depends on {d}" for d in _depends_on(e, pod)),
            next_step=f"wait for {dep} to succeed{since}, or remove it from the dependencies",
        )
    if m := _NEXT_RUN.match(reason):
        return Answer(
            kind="next-run",
            summary=f"an earlier run of pod group {m.group(1)} still has pods",
            next_step=f"wait for the earlier run of {m.group(1)} to finish, or delete its pods",
        )
    if m := _EXTENDER.match(reason):
        return Answer(
            kind="extender",
            summary=f"waiting for the answer of extender {m.group(1)}",
            next_step=f"check that extender {m.group(1)} is reachable and answers",
        )
    return None


def _depends_on(e: ShardModel, pod: PodInfo) -> tuple[str, ...]:
    group = e.groups.get(pod.spec.group) if pod.spec.group else None
    deps = list(group.spec.depends_on) if group is not None and group.spec else []
    return tuple(dict.fromkeys([*deps, *pod.spec.depends_on]))


def _running_for(e: ShardModel, key: str) -> int | None:
    """How long pod or pod group ``key`` has run (its earliest placed member)."""
    group = e.groups.get(key)
    members = group.members if group is not None else [key]
    starts = [e.started[m] for m in members if m in e.started]
    return e.now - min(starts) if starts else None


def _unit_pods(e: ShardModel, pod: PodInfo, unit: str | None) -> list[PodInfo]:
    if unit is None or not pod.spec.group:
        return [pod]
    group = e.groups.get(pod.spec.group)
    if group is None:
        return [pod]
    pending = [e.pods[m] for m in group.members if m in e.pods and m not in e.state.pods]
    return pending or [pod]


# ------------------------------------------------------------------ quota


def _quota(
    e: ShardModel, pod: PodInfo, pods: list[PodInfo], who: str, reason: str
) -> Answer | None:
    namespace = pod.spec.namespace
    quota = e.quotas.get(namespace)
    if quota is None:
        return None
    wanted: dict[str, int] = {}
    for member in pods:
        for name, amount in e.quotas.wanted(quota, member.request).items():
            wanted[name] = wanted.get(name, 0) + amount
    over = quota.over_max_with(wanted)
    if over is not None:
        used, need = quota.used.get(over, 0), wanted[over]
        limit = quota.max_of(over) or 0
        wait = _longest_running(e, namespace, over)
        step = f"raise max {over} of quota {namespace} to {_units(over, used + need)}"
        lacking = e.quotas.short(wanted).get(over, 0)
        if lacking:  # over the quotas' guarantees too: a higher max alone lets nothing in
            step += f" and its min to {_units(over, quota.min_of(over) + lacking)}"
        if wait:
            step += f", or wait for {wait}"
        return Answer(
            kind="quota-max",
            summary=(
                f"quota {namespace}: {_units(over, used)} of max {_units(over, limit)} "
                f"{over} in use, {who} needs {_units(over, need)}"
            ),
            evidence=(reason,),
            next_step=step,
        )
    short = e.quotas.short(wanted)
    if not short:
        return None
    resource = next(iter(short))
    used, need = quota.used.get(resource, 0), wanted[resource]
    total_used, guaranteed = e.quotas.aggregate(resource)
    if quota.within_min_with(wanted):
        borrowers = _borrowers(e, resource, quota)
        return Answer(
            kind="quota-reclaim",
            summary=(
                f"quota {namespace}: {_units(resource, used)} of min "
                f"{_units(resource, quota.min_of(resource))} {resource} in use, {who} needs "
                f"{_units(resource, need)}, and the rest of its guaranteed {resource} is lent out"
            ),
            evidence=tuple(borrowers) or (reason,),
            next_step=(
                f"wait while {', '.join(borrowers)} give(s) back what they borrow "
                "(reclaimed by preemption where the profile enables it)"
                if borrowers
                else "wait for borrowed capacity to be given back"
            ),
        )
    return Answer(
        kind="quota-borrow",
        summary=(
            f"quota {namespace}: {_units(resource, used)} {resource} in use (min "
            f"{_units(resource, quota.min_of(resource))}), {who} needs "
            f"{_units(resource, need)} more, and all quotas use "
            f"{_units(resource, total_used)} of {_units(resource, guaranteed)} guaranteed: "
            "none idle to borrow"
        ),
        evidence=(reason,),
        next_step=(
            f"raise min {resource} of quota {namespace} to "
            f"{_units(resource, used + need)}, or wait for other quotas to use less"
        ),
    )


def _units(resource: str, amount: int) -> str:
    return quantity(resource, amount)


def _longest_running(e: ShardModel, namespace: str, resource: str) -> str:
    """The pod of ``namespace`` using ``resource`` that has run longest (ties by name)."""
    best: tuple[int, str] | None = None
    for key, start in e.started.items():
        info = e.pods.get(key)
        if info is None or info.spec.namespace != namespace:
            continue
        if not e.quotas.named(info.request).get(resource):
            continue
        if best is None or (start, key) < best:
            best = (start, key)
    if best is None:
        return ""
    return f"{best[1]} (running {duration(e.now - best[0])})"


def _borrowers(e: ShardModel, resource: str, own: Quota) -> list[str]:
    out = []
    for name, quota in sorted(e.quotas.quotas.items()):
        if quota is own or not quota.names(resource):
            continue
        over = quota.used.get(resource, 0) - quota.min_of(resource)
        if over > 0:
            out.append(f"{name} (borrows {_units(resource, over)} {resource})")
    return out


__all__ = ["compose", "duration"]
