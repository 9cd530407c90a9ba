"""``NetworkSpeed``: score (and optionally filter) nodes by their measured network speed.

Seed 001's plugin probed each node from inside ``Score`` (an HTTP call per node and
pod). In shoal a plugin does no I/O: a prober measures the nodes and writes the result
into an annotation of each Node (``shoal.io/network-mbps: "25000"``), which reaches
shoal's log with the node, so that replay gives the same decisions. The plugin reads it.

Score: 100 for the fastest feasible node, the others in proportion (integer
arithmetic: ``100 * speed // fastest``); a node without a measurement scores 0.
Filter: with ``minimumMbps`` set, a node measured slower (or not measured) is refused.

Vectorised: the speeds are parsed once per version of the nodes' labels, taints and
annotations (``ClusterState.static_version``) into one array, so each attempt is a few
numpy operations over all nodes.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from engine.framework.cycle import CycleState
from engine.model.changes import ClusterEvent
from engine.model.pods import PodInfo
from engine.model.state import ClusterState

ANNOTATION = "shoal.io/network-mbps"


class NetworkSpeedArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """``pluginConfig`` args of ``NetworkSpeed``."""

    annotation: str = ANNOTATION
    """The node annotation holding the measured speed, in Mbit/s (a whole number)."""
    minimum_mbps: int = 0
    """Nodes measured slower than this are refused (0: no filter)."""
    selector: dict[str, str] = {}
    namespace: str = ""
    timeout: int = 0
    port: int = 0
    """Seed 001's args: they configure the prober (which blackbox exporter to ask, and
    how), which writes the annotation; accepted so that its configuration loads, and
    not read by the plugin."""

    def __post_init__(self) -> None:
        if self.minimum_mbps < 0:
            raise ValueError("minimumMbps must not be negative")


class NetworkSpeed:
    """A static filter and a score: both depend only on the nodes' annotations."""

    name = "NetworkSpeed"
    Args = NetworkSpeedArgs
    static = True
    unresolvable = True
    local = False

    def __init__(self, args: NetworkSpeedArgs | None) -> None:
        self.args = args or NetworkSpeedArgs()
        self._cached: tuple[int, int, int] | None = None
        self._speeds: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)

    def __repr__(self) -> str:
        return f"NetworkSpeed({self.args})"

    def speeds(self, state: ClusterState) -> npt.NDArray[np.int64]:
        """Measured speed per slot (-1: not measured), parsed once per node version."""
        key = (id(state), state.static_version, state.capacity)
        if key != self._cached:
            out = np.full(state.capacity, -1, dtype=np.int64)
            for slot in range(state.high_water):
                raw = state.node_annotations[slot].get(self.args.annotation, "")
                if raw.isascii() and raw.isdigit() and len(raw) < 16:
                    out[slot] = int(raw)
            self._speeds, self._cached = out, key
        return self._speeds

    # ------------------------------------------------------------------ filter

    def filter(self, cycle: CycleState, pod: PodInfo, state: ClusterState) -> Any:
        if self.args.minimum_mbps <= 0:
            return state.valid
        return self.speeds(state) >= self.args.minimum_mbps

    def reasons(
        self, cycle: CycleState, pod: PodInfo, state: ClusterState, rejected: Any
    ) -> dict[str, int]:
        return {f"network slower than {self.args.minimum_mbps} Mbit/s": int(rejected.sum())}

    def events(self) -> frozenset[ClusterEvent]:
        return frozenset({ClusterEvent.NODE_ADDED, ClusterEvent.NODE_UPDATED})

    # ------------------------------------------------------------------ score

    def score(self, cycle: CycleState, pod: PodInfo, state: ClusterState, feasible: Any) -> Any:
        speeds = self.speeds(state)
        fastest = int(np.max(speeds, where=feasible, initial=0))
        if fastest <= 0:  # an array, not 0: which nodes are feasible can change
            return np.zeros(state.capacity, dtype=np.int64)
        return np.clip(speeds, 0, None) * 100 // fastest
