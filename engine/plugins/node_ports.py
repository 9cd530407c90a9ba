"""NodePorts: a pod may not bind a host port that a pod already on the node binds.

The rule is kube-scheduler's (``HostPortInfo.CheckConflict``): two host ports conflict
when their protocol and port are equal and their addresses overlap, where ``0.0.0.0``
overlaps every address. The ports a pod binds are its containers' and its sidecars'
(``PodSpec.host_ports``); those bound on each node are count rows in the cluster state
(``ClusterState.host_ports``), so the verdict is a few row operations over all nodes.

The filter is *static*: its verdict changes only when a pod binding a host port is
placed or released, and the state bumps ``static_version`` then, which drops the cached
verdicts. So shapes stay incremental, and the coordinator, whose view holds every
placement, counts exactly which nodes of each shard are free for the pod's ports: it
never hands a pod to a shard where every node conflicts. Unlike kube-scheduler,
preemption does not evict a pod to free its host port (it frees resources only).
"""

from __future__ import annotations

import numpy as np

from engine.framework.cycle import CycleState
from engine.model.changes import ClusterEvent
from engine.model.pods import PodInfo
from engine.model.state import Bools, ClusterState
from events.types import HostPort

REASON = "node(s) didn't have free ports for the requested pod ports"
ALL_ADDRESSES = "0.0.0.0"


def overlaps(wanted: HostPort, bound_ip: str) -> bool:
    """Whether ``wanted`` overlaps a port bound on ``bound_ip`` with the same protocol
    and number (kube-scheduler's ``CheckConflict``)."""
    return ALL_ADDRESSES in (wanted.ip, bound_ip) or wanted.ip == bound_ip


def conflicts(pod: PodInfo, state: ClusterState) -> Bools | None:
    """Per slot, whether a port ``pod`` wants is already bound there (None: nowhere)."""
    blocked: Bools | None = None
    for wanted in pod.spec.host_ports:
        for ip, row in state.host_ports.get((wanted.protocol, wanted.port), {}).items():
            if overlaps(wanted, ip):
                used = row > 0
                blocked = used if blocked is None else blocked | used
    return blocked


class NodePorts:
    name = "NodePorts"
    static = True
    unresolvable = True
    """Preemption frees resources, not host ports (see the module's docstring)."""
    local = False

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Bools:
        blocked = conflicts(pod, state)
        return state.valid if blocked is None else np.logical_not(blocked)

    def reasons(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, rejected: Bools
    ) -> dict[str, int]:
        return {REASON: int(rejected.sum())}

    def events(self) -> frozenset[ClusterEvent]:
        return frozenset({ClusterEvent.NODE_ADDED, ClusterEvent.POD_FREED})

    def worth_retrying(
        self, pod: PodInfo, event: ClusterEvent, slot: int, state: ClusterState
    ) -> bool:
        """A pod freed on node ``slot`` helps only if the ports are free there now."""
        if event != ClusterEvent.POD_FREED or slot < 0:
            return True
        blocked = conflicts(pod, state)
        return blocked is None or not bool(blocked[slot])
