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

=================  ============================================================
kind               next step
=================  ============================================================
``profile``        set ``schedulerName`` to a profile this scheduler serves
``group-missing``  create the PodGroup
``gang-members``   submit the missing members, or lower ``minMember``
``dependency``     wait for the dependency (how long it has run, if it runs)
``next-run``       wait for the earlier run of the pod group
``extender``       wait for the extender's answer / fix what it rejects
``quota-max``      raise the quota's ``max`` to the use it needs, or wait for a pod
``quota-reclaim``  wait for borrowers to give back (named, with what they borrow)
``quota-borrow``   raise the quota's ``min``, or wait for borrowed capacity
``resources``      free the difference on the fullest-fitting node, or add a node
``gpu-cards``      the same, in GPU cards
``taint``          add a toleration for the taint, or untaint the nodes
``node-affinity``  label nodes to match the selector, or change it
``pod-affinity``   the pods it must (not) be near; change the rule
``spread``         add room in other domains, or raise ``maxSkew``
``host-ports``     free the port, or pick another
``cordoned``       uncordon nodes
``node-name``      the node named does not take it
``no-nodes``       add nodes
``other``          see ``replay --explain``
=================  ============================================================

Cost: called only where a pod is reported unschedulable or held (the slow path), and
cached per pass by (reason, namespace, unit) by the caller.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import numpy as np

from engine.framework.cycle import CycleState
from engine.model.devices import GPU
from engine.model.pods import PodInfo
from engine.model.quota import Quota, scale, shown
from engine.model.shard import QUOTA_PLUGIN, ShardModel
from engine.model.state import Bools, ClusterState
from engine.plugins.interpod_affinity import AFFINITY, ANTI_AFFINITY, EXISTING
from engine.plugins.node_affinity import REASON as AFFINITY_REASON
from engine.plugins.node_affinity import NodeAffinity
from engine.plugins.node_name import REASON as NODE_NAME_REASON
from engine.plugins.node_ports import REASON as PORTS_REASON
from engine.plugins.taints import TaintToleration
from engine.plugins.topology_spread import MISSING, SKEW
from engine.plugins.unschedulable import REASON as CORDONED_REASON
from engine.plugins.unschedulable import NodeUnschedulable
from events.types import SECOND, Answer

_MEMBERS: Final = re.compile(r"waiting for members of pod group (\S+): (\d+) of minMember (\d+)")
_MISSING: Final = re.compile(r"waiting for pod group (\S+), which does not exist")
_DEPENDENCY: Final = re.compile(r"waiting for (\S+) to succeed \((.*)\)$")
_NEXT_RUN: Final = re.compile(r"waiting for the pods of the run of pod group (\S+) ")
_EXTENDER: Final = re.compile(r"waiting for the answer of (.+)$")
_GANG: Final = re.compile(r"pod group (\S+): (\d+) of the (\d+) members still needed fit")
_TAINT: Final = re.compile(r"node\(s\) had untolerated taint \{(.*)\}")
_INSUFFICIENT: Final = re.compile(r"Insufficient (.+)$")
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
        return _nodes(e, pod, reason, rejections, 1)
    key, placed, need = gang.group(1), int(gang.group(2)), int(gang.group(3))
    topology = _TOPOLOGY.search(reason)
    if topology is not None:
        return _topology(key, placed, need, topology)
    answer = _nodes(e, pod, reason, rejections, need)
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
    return shown(resource, amount) if scale(resource) > 1 else str(amount)


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


# ------------------------------------------------------------------ nodes


def _nodes(
    e: ShardModel, pod: PodInfo, reason: str, rejections: Mapping[str, int], members: int
) -> Answer:
    """The answer from the nodes' verdicts; ``members``: how many pods like ``pod`` the
    unit places (a gang's still needed members, else 1)."""
    state = e.state
    total = int(state.valid.sum())
    tail = reason.rsplit("; ", 1)[-1]
    note = tail if members == 1 and "; " in reason and "make room" in tail else ""
    if not rejections:
        if total == 0:
            return Answer(kind="no-nodes", summary="no nodes", next_step="add nodes")
        return _other(reason)
    named = pod.spec.node_name
    ranked = sorted(rejections.items(), key=lambda kv: (-kv[1], kv[0]))
    if named and len(ranked) > 1:
        # the other nodes only fail to be the one named: what rejects that one matters
        ranked = [kv for kv in ranked if kv[0] != NODE_NAME_REASON]
    dominant, count = ranked[0]
    evidence = tuple(
        f"{n} node(s): {r}" for r, n in sorted(rejections.items(), key=lambda kv: (-kv[1], kv[0]))
    )
    if m := _INSUFFICIENT.match(dominant):
        return _room(e, pod, m.group(1), count, total, evidence, note, members)
    if dominant == "Too many pods":
        return _room(e, pod, "pods", count, total, evidence, note, members)
    if m := _TAINT.match(dominant):
        return _taint(e, m.group(1), count, evidence)
    if dominant == AFFINITY_REASON:
        selector = ", ".join(f"{k}={v}" for k, v in sorted(pod.spec.node_selector.items()))
        if selector:
            step = f"label nodes with {selector} (the pod's nodeSelector), or change the selector"
        else:
            step = "label nodes to match the pod's required node affinity, or relax it"
        return Answer(
            kind="node-affinity",
            summary=(
                f"{count} of {total} nodes do not match the pod's node "
                f"{'selector ' + selector if selector else 'affinity'}"
            ),
            evidence=evidence,
            next_step=step,
        )
    if dominant in (AFFINITY, ANTI_AFFINITY, EXISTING):
        return Answer(
            kind="pod-affinity",
            summary=f"{count} of {total} nodes: {dominant}",
            evidence=evidence,
            next_step="change the pod's (anti-)affinity rules, or add nodes in other domains",
        )
    if dominant in (SKEW, MISSING):
        skews = ", ".join(
            f"{c.topology_key} maxSkew {c.max_skew}" for c in pod.spec.spread_constraints
        )
        return Answer(
            kind="spread",
            summary=f"{count} of {total} nodes would break the spread ({skews or 'defaults'})",
            evidence=evidence,
            next_step="add room in the less used domains, or raise maxSkew",
        )
    if dominant == PORTS_REASON:
        ports = ", ".join(str(p.port) for p in pod.spec.host_ports)
        return Answer(
            kind="host-ports",
            summary=f"{count} of {total} nodes have host port(s) {ports} taken",
            evidence=evidence,
            next_step=f"free host port(s) {ports} on a node, or use another port",
        )
    if dominant == CORDONED_REASON and named:
        return Answer(
            kind="cordoned",
            summary=f"the pod asks for node {named} (spec.nodeName), which is cordoned",
            evidence=evidence,
            next_step=f"uncordon {named} (kubectl uncordon {named}), or clear spec.nodeName",
        )
    if dominant == CORDONED_REASON:
        return Answer(
            kind="cordoned",
            summary=f"{count} of {total} nodes are cordoned",
            evidence=evidence,
            next_step=f"uncordon nodes (kubectl uncordon), {count} are cordoned",
        )
    if dominant == NODE_NAME_REASON:
        return Answer(
            kind="node-name",
            summary=f"the pod asks for node {pod.spec.node_name}, which does not take it",
            evidence=evidence,
            next_step=f"clear spec.nodeName, or make room on {pod.spec.node_name}",
        )
    return Answer(
        kind="other",
        summary=f"{count} of {total} nodes: {dominant}",
        evidence=evidence,
        next_step=f"see `shoal replay LOG --explain {pod.key}` for each node's verdict",
    )


def _other(reason: str) -> Answer:
    return Answer(
        kind="other",
        summary=reason,
        next_step="see `shoal replay LOG --explain POD` for each attempt's verdict",
    )


def _room(
    e: ShardModel,
    pod: PodInfo,
    resource: str,
    count: int,
    total: int,
    evidence: tuple[str, ...],
    note: str,
    members: int,
) -> Answer:
    """Nodes lack room in ``resource`` (a resource's name, or a GPU card need's, such
    as ``nvidia.com/gpu: whole cards``, whose rows count the cards that meet it)."""
    state = e.state
    row = state.resources.get(resource)
    need = 1 if resource == "pods" else dict(pod.request).get(row, 0) if row is not None else 0
    best_node, best, room = "", 0, 0
    if row is not None and total and need > 0:
        free = np.where(_eligible(pod, state), state.free[row], 0)
        slot = int(free.argmax())
        best, best_node = max(int(free[slot]), 0), state.names[slot] or ""
        room = int((np.maximum(free, 0) // need).sum())
    gpu = resource.startswith(GPU)
    kind = "gpu-cards" if gpu else "resources"
    wanted = _label(resource, need)
    if members > 1:
        summary = (
            f"{count} of {total} nodes lack room: each member needs {wanted} free, "
            f"the nodes have room for {room} of the {members} members still needed"
        )
        step = (
            f"free {wanted} on {members - room} more node(s), "
            f"or add {members - room} node(s) with {wanted} free"
            if room < members
            else f"free {wanted} on nodes that the gang's other rules allow"
        )
    else:
        summary = f"no node has {wanted} free (the pod's request)"
        if best_node and best > 0:
            summary += f"; the most free on one node is {_label(resource, best)}, on {best_node}"
            step = (
                f"free {_label(resource, need - best)} more on {best_node}, "
                f"or add a node with {wanted} free"
                if need > best
                else f"free {wanted} on a node that the pod's other rules allow"
            )
        else:
            step = f"free {wanted} on one node, or add a node with {wanted} free"
    if note:
        step += f"; {note}"
        evidence = (*evidence, note)
    return Answer(kind=kind, summary=summary, evidence=evidence, next_step=step)


def _eligible(pod: PodInfo, state: ClusterState) -> Bools:
    """Nodes the pod could use if they had room: those its node selector and affinity,
    its tolerations and the nodes' cordons allow (the static filters; the room an
    answer names is on one of these)."""
    cycle = CycleState()
    mask = state.valid.copy()
    for plugin in (NodeAffinity(), TaintToleration(), NodeUnschedulable()):
        mask &= plugin.filter(cycle, pod, state)
    return mask


def _label(resource: str, amount: int) -> str:
    """``amount`` of ``resource`` as a person reads it: 32 CPU, 4 GiB memory, 2 whole
    GPU cards."""
    if resource == "cpu":
        return f"{amount // 1000} CPU" if amount % 1000 == 0 else f"{amount}m CPU"
    if resource == "memory":
        if amount >= 2**30:
            return f"{round(amount / 2**30, 1):g} GiB memory"
        return f"{amount // 2**20} MiB memory"
    if resource == "pods":
        return f"{amount} pod slot(s)"
    if resource == GPU:
        return f"{amount} GPU card(s)"
    if resource.startswith(f"{GPU}: "):
        need = resource.split(": ", 1)[1]
        if need == "whole cards":
            return f"{amount} whole GPU card(s)"
        return f"{amount} GPU card(s) with {need.removesuffix(' free')}"
    return f"{amount} {resource}"


def _taint(e: ShardModel, label: str, count: int, evidence: tuple[str, ...]) -> Answer:
    key, _, value = label.partition(": ")
    effect = "NoSchedule"
    for taint in e.state.taint_codes:
        if (
            taint.key == key
            and taint.value == value
            and taint.effect in ("NoSchedule", "NoExecute")
        ):
            effect = taint.effect
            break
    spelled = f"{key}={value}:{effect}" if value else f"{key}:{effect}"
    return Answer(
        kind="taint",
        summary=f"{count} node(s) have taint {spelled}, which the pod does not tolerate",
        evidence=evidence,
        next_step=(
            f"add a toleration for {spelled} to the pod, or remove the taint from the "
            f"{count} node(s)"
        ),
    )


__all__ = ["compose", "duration"]
