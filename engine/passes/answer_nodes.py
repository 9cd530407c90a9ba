"""The answers whose reason is the nodes' verdicts: which reason rejected the most nodes
(ties by name), and its template (:mod:`engine.passes.answers` has the table of kinds).

Cost: a few vectorised passes over the nodes (the static filters, a free column), on
the slow path only (a pod reported unschedulable), once per pass and pod shape.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import numpy as np

from engine.framework.cycle import CycleState
from engine.model.devices import GPU
from engine.model.pods import PodInfo
from engine.model.pools import POOL_LABEL
from engine.model.shard import ShardModel
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
from events.types import Answer

_TAINT: Final = re.compile(r"node\(s\) had untolerated taint \{(.*)\}")
_INSUFFICIENT: Final = re.compile(r"Insufficient (.+)$")


def node_answer(
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
    evidence = tuple(
        f"{n} node(s): {r}" for r, n in sorted(rejections.items(), key=lambda kv: (-kv[1], kv[0]))
    )
    tenant = e.pools.tenants.get(pod.spec.namespace) if e.pools.exclusive else None
    if tenant is not None and ranked[0][0] == AFFINITY_REASON:
        inside = _in_pools(state, tenant)
        if ranked[0][1] == total - inside:  # the nodes off its pools, and only those
            pools = ", ".join(tenant)
            if inside == 0:
                return Answer(
                    kind="pools",
                    summary=(
                        f"namespace {pod.spec.namespace} runs on its tenant pool(s) {pools} "
                        "only, which have no node"
                    ),
                    evidence=evidence,
                    next_step=f"add nodes to pool(s) {pools}, or change the tenant's pools",
                )
            if len(ranked) > 1:  # what keeps it off its own pools' nodes matters
                ranked = ranked[1:]
                evidence = (
                    f"namespace {pod.spec.namespace} runs on its tenant pool(s) {pools} only "
                    f"({inside} node(s))",
                    *evidence,
                )
    dominant, count = ranked[0]
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
    if dominant == NODE_NAME_REASON and named not in state.index:
        return Answer(
            kind="node-name",
            summary=f"the pod asks for node {named} (spec.nodeName), which does not exist",
            evidence=evidence,
            next_step=f"clear spec.nodeName, or add node {named}",
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


def _in_pools(state: ClusterState, pools: tuple[str, ...]) -> int:
    """How many nodes are in ``pools`` (by their pool label)."""
    column = state.label_columns.get(POOL_LABEL)
    if column is None:
        return 0
    known = state.label_values.get(POOL_LABEL, {})
    codes = [known[p] for p in pools if p in known]
    return int((state.valid & np.isin(column[: state.capacity], codes)).sum()) if codes else 0


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
        return f"{amount} GPU card(s) with {need.removeprefix('cards with ').removesuffix(' free')}"
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


__all__ = ["node_answer"]
