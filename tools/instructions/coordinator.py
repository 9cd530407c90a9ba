"""The coordinator's fold and passes alone, per plain pod: a coordinator of 2 shards in
this process is fed ``shoal loadtest scale``'s nodes and pods (one template) in slices of
1,000 submissions, and after each pass the placements of what it handed over, as the
shards would report them (each pod on the next node of its shard, round robin, or on
the node the coordinator chose). No log, no decoding: what the coordinator itself does
per pod. Prints the CPU µs per pod of its folds and passes (the collector as the
coordinator's worker sets it).

usage: python coordinator.py NODES PODS (with PYTHONPATH at the checkout to measure).
``coordinator.sh`` runs it under callgrind with PODS and with none, and divides the
difference of the instructions by PODS (the machine's load hardly moves that count).
"""

from __future__ import annotations

import gc
import itertools
import sys
import time

from engine.model.pools import Sharding
from events.types import (
    Envelope,
    Event,
    NodeAdded,
    PodRouted,
    SchedulerConfigured,
    ShardSummary,
)
from loadtest.scale import ScaleShape, workload
from shards.cli import COORDINATOR_GC_THRESHOLDS
from shards.coordinator.coordinator import Coordinator

SHARDS = 2


def main() -> None:
    nodes, pods = int(sys.argv[1]), int(sys.argv[2])
    load = workload(ScaleShape(nodes=nodes, pods=pods, shards=SHARDS))
    coordinator = Coordinator(Sharding(shards=SHARDS))
    offsets = itertools.count()

    def ingest(event: Event) -> Envelope:
        return Envelope(event=event, offset=next(offsets), producer="ingest")

    coordinator.apply_all(
        [ingest(SchedulerConfigured()), *(ingest(NodeAdded(node=n)) for n in load.nodes)]
    )
    coordinator.schedule()
    owned: dict[int, list[str]] = {}
    for name in coordinator.engine.state.index:
        owned.setdefault(coordinator.routing.node_shard[name], []).append(name)
    turn = {shard: itertools.cycle(names) for shard, names in owned.items()}
    gc.set_threshold(*COORDINATOR_GC_THRESHOLDS)
    reports: list[Envelope] = []
    cpu = 0.0
    for batch in [*load.batches, []]:
        records = [*(ingest(e) for e in batch), *reports]
        started = time.process_time()
        coordinator.apply_all(records)
        out = coordinator.schedule()
        cpu += time.process_time() - started
        placed: dict[int, dict[str, str]] = {shard: {} for shard in range(SHARDS)}
        for partition, event in out:
            if isinstance(event, PodRouted):
                placed[partition][event.pod.key] = event.node or next(turn[partition])
        reports = [
            Envelope(
                event=ShardSummary(shard=shard, seen=0, placed=where),
                offset=next(offsets),
                stream="relay",
                producer=f"relay-{shard}",
                causation=next(offsets),
            )
            for shard, where in placed.items()
            if where
        ]
    held = len(coordinator.engine.state.pods)
    per_pod = cpu / pods * 1e6 if pods else 0.0
    print(f"{nodes} nodes, {pods} pods: {per_pod:.2f} µs of CPU per pod; {held} placed")


if __name__ == "__main__":
    main()
