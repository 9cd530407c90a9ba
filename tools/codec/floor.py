"""The coordinator's floor per plain pod: the records it must decode and encode for each
pod it hands over (a ``PodSubmitted`` read, a ``PodRouted`` written, a ``PodBound`` read
back), timed alone with ``events.codec`` over 20,000 pods of one template.

usage: PYTHONPATH=. .venv/bin/python tools/codec/floor.py [PODS]

Whatever else the coordinator does per pod (queue order, quota, its view) comes on top,
so no coordinator of this design spends less per pod than this; compare it with one
in-process shard's CPU per pod (``shoal loadtest scale --shards 0``) measured in the
same minutes (the machine's load moves both).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from events.codec import decode, encode
from events.types import Envelope, PodBound, PodRouted, PodSpec, PodSubmitted


def best_of(runs: int, work: Callable[[], object], count: int) -> float:
    """The fastest of ``runs`` runs of ``work``, in CPU µs per item of ``count``."""
    best = float("inf")
    for _ in range(runs):
        started = time.process_time()
        work()
        best = min(best, time.process_time() - started)
    return best / count * 1e6


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    pods = [
        PodSpec(namespace="default", name=f"p{i}", requests={"cpu": 100, "memory": 100 << 20})
        for i in range(count)
    ]
    submitted = [encode(Envelope(event=PodSubmitted(pod=p), producer="ingest")) for p in pods]
    routed = [
        Envelope(event=PodRouted(pod=p, decision_id=f"{p.key}#1"), producer="coordinator")
        for p in pods
    ]
    bound = [
        encode(
            Envelope(
                event=PodBound(
                    pod=p.key, node="node-00123", decision_id=f"{p.key}#1", attempt=1, shard=0
                ),
                producer="shard-0",
            )
        )
        for p in pods
    ]
    read = best_of(7, lambda: [decode(b) for b in submitted], count)
    hand = best_of(7, lambda: [encode(e) for e in routed], count)
    back = best_of(7, lambda: [decode(b) for b in bound], count)
    print(
        f"decode PodSubmitted {read:.2f} µs, encode PodRouted {hand:.2f} µs, "
        f"decode PodBound {back:.2f} µs: {read + hand + back:.2f} µs per pod"
    )


if __name__ == "__main__":
    main()
