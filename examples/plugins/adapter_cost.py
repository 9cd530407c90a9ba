"""What the per-node adapter costs: the example's NetworkSpeed score, vectorised, against
the same score written per node (``score_node``), over N nodes, per attempt.

    .venv/bin/pip install -e examples/plugins
    .venv/bin/python examples/plugins/adapter_cost.py 5000
"""

from __future__ import annotations

import sys
import time

from shoal_example_plugins.network import ANNOTATION, NetworkSpeed

from engine.engine import Engine
from engine.framework.cycle import CycleState
from engine.framework.userplugins import NodeView, plugin_factory
from engine.model.pods import PodInfo, pod_info
from engine.model.state import ClusterState
from events.types import NodeSpec, PodSpec

FASTEST = 40_000


class PerNodeSpeed:
    name = "NetworkSpeed"

    def score_node(self, pod: PodInfo, node: NodeView) -> int:
        raw = node.annotations.get(ANNOTATION, "")
        return int(raw) * 100 // FASTEST if raw.isdigit() else 0


def main(nodes: int) -> None:
    state = ClusterState()
    for i in range(nodes):
        state.add_node(
            NodeSpec(
                name=f"n{i}",
                allocatable={"cpu": 32_000, "pods": 110},
                annotations={ANNOTATION: str(10_000 + i % 30_000)},
            )
        )
    pod = pod_info(PodSpec(namespace="d", name="p", requests={"cpu": 1000}), state.resources, 0)
    engine = Engine()
    cycle = CycleState()
    for label, cls, reps in (("vectorised", NetworkSpeed, 200), ("per node", PerNodeSpeed, 5)):
        plugin = plugin_factory(cls, "NetworkSpeed")({}, "bench", engine)
        plugin.score(cycle, pod, state, state.valid)  # type: ignore[attr-defined]
        started = time.perf_counter()
        for _ in range(reps):
            plugin.score(cycle, pod, state, state.valid)  # type: ignore[attr-defined]
        took = (time.perf_counter() - started) / reps
        print(f"{label}: {took * 1e6:,.0f} us per attempt over {nodes:,} nodes")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
