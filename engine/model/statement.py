"""Stage, then commit: a Statement records placements and evictions against the live
state and undoes them in reverse order unless committed (after Volcano's Statement).

The engine is single-threaded and emits decisions only on commit, so a staged change
is never visible outside the attempt that made it. Staging in place (with an undo log)
instead of on a copy keeps a gang attempt proportional to its size, not the cluster's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.model.quota import QuotaTable
from engine.model.state import ClusterState, Request
from events.types import HostPort

if TYPE_CHECKING:
    from engine.model.pods import PodInfo


@dataclass(slots=True)
class _Op:
    kind: str  # "assume" | "evict" | "lift" | "land"
    key: str
    slot: int
    request: Request
    namespace: str
    by: str = ""
    """For an eviction: the pod it makes room for."""
    priority: int = 0
    ports: tuple[HostPort, ...] = ()
    devices: tuple[int, ...] | None = None
    """For an eviction: the GPU cards the pod held (taken again if undone)."""


@dataclass
class Statement:
    state: ClusterState
    quotas: QuotaTable
    ops: list[_Op] = field(default_factory=list)
    open: bool = True

    def __repr__(self) -> str:
        return f"Statement(ops={len(self.ops)}, open={self.open})"

    def assume_pod(self, pod: PodInfo, slot: int, devices: tuple[int, ...] | None = None) -> None:
        """:meth:`assume` ``pod`` (a pending pod of the engine's) on ``slot`` (on GPU cards
        ``devices``, else those the state chooses)."""
        spec = pod.spec
        self.assume(
            pod.key, spec.namespace, slot, pod.request, pod.priority, spec.host_ports, devices
        )

    def assume(
        self,
        key: str,
        namespace: str,
        slot: int,
        request: Request,
        priority: int = 0,
        ports: tuple[HostPort, ...] = (),
        devices: tuple[int, ...] | None = None,
    ) -> None:
        self.state.assume(key, slot, request, priority, ports, devices)
        self.quotas.add(namespace, request)
        self.ops.append(
            _Op("assume", key, slot, request, namespace, priority=priority, ports=ports)
        )

    def evict(self, key: str, namespace: str, by: str = "") -> int:
        slot = self._take_off("evict", key, namespace, by)
        self.quotas.remove(namespace, self.ops[-1].request)
        return slot

    def lift(self, key: str, namespace: str, by: str) -> int:
        """Take running pod ``key`` off its node, to :meth:`land` it on another (a
        migration; its quota is unchanged: it stays placed, elsewhere)."""
        return self._take_off("lift", key, namespace, by)

    def _take_off(self, kind: str, key: str, namespace: str, by: str) -> int:
        """Forget placed pod ``key``, recording how to put it back (its cards too)."""
        placed = self.state.pods[key]
        self.state.forget(key)
        self.ops.append(
            _Op(
                kind,
                key,
                placed.slot,
                placed.request,
                namespace,
                by,
                placed.priority,
                placed.ports,
                placed.devices,
            )
        )
        return placed.slot

    def land(
        self,
        key: str,
        namespace: str,
        slot: int,
        request: Request,
        priority: int,
        ports: tuple[HostPort, ...],
        by: str,
        devices: tuple[int, ...] | None = None,
    ) -> None:
        """Place a lifted pod on ``slot`` (on GPU cards ``devices``, else those the state
        chooses)."""
        self.state.assume(key, slot, request, priority, ports, devices)
        self.ops.append(_Op("land", key, slot, request, namespace, by, priority, ports))

    def land_pod(
        self, pod: PodInfo, slot: int, by: str, devices: tuple[int, ...] | None = None
    ) -> None:
        """:meth:`land` lifted pod ``pod`` on ``slot`` (on GPU cards ``devices``, else
        those the state chooses)."""
        spec = pod.spec
        self.land(
            pod.key, spec.namespace, slot, pod.request, pod.priority, spec.host_ports, by, devices
        )

    def rollback(self, mark: int) -> None:
        """Undo the operations staged after the first ``mark`` ones, newest first."""
        tail = self.ops[mark:]
        del self.ops[mark:]
        kept, self.ops = self.ops, tail
        self.discard()
        self.ops, self.open = kept, True

    def evicted(self) -> list[str]:
        return [op.key for op in self.ops if op.kind == "evict"]

    def moves(self) -> list[tuple[str, int, int, str]]:
        """(pod, from slot, to slot, for whom) of every migration staged."""
        lifted = {op.key: op.slot for op in self.ops if op.kind == "lift"}
        return [(op.key, lifted[op.key], op.slot, op.by) for op in self.ops if op.kind == "land"]

    def commit(self) -> None:
        self.open = False

    def discard(self) -> None:
        """Undo every staged operation, newest first."""
        for op in reversed(self.ops):
            if op.kind == "assume":
                self.state.forget(op.key)
                self.quotas.remove(op.namespace, op.request)
            elif op.kind == "land":
                self.state.forget(op.key)
            elif op.kind == "lift":
                self.state.assume(op.key, op.slot, op.request, op.priority, op.ports, op.devices)
            else:
                self.state.assume(op.key, op.slot, op.request, op.priority, op.ports, op.devices)
                self.quotas.add(op.namespace, op.request)
        self.ops.clear()
        self.open = False
