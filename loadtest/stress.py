"""Stress shapes for the engine under contention, run through ``shoal simulate``'s driver.

- ``churn``: more pods than the cluster holds, each running a while: every completion
  frees room for a few waiting pods (tests bounded requeueing);
- ``preempt``: a cluster full of low-priority pods, then a wave of high-priority ones
  (tests victim search).

``python -m loadtest.stress churn --nodes 30 --pods 20000`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

import msgspec
import orjson

from events.memory import MemoryLog
from events.types import SECOND, NodeAdded, PodSubmitted
from loadtest.synthetic import basic_nodes, basic_pods
from shards.inputs.scenario import Scenario, TimedEvent
from shards.simulate import simulate


def churn(nodes: int, pods: int, seed: int = 1) -> Scenario:
    rng = random.Random(seed)
    events = [TimedEvent(0, i, NodeAdded(node=n)) for i, n in enumerate(basic_nodes(nodes, rng))]
    for i, spec in enumerate(basic_pods(pods, rng)):
        timed = msgspec.structs.replace(spec, runtime=rng.randint(10, 300) * SECOND)
        events.append(
            TimedEvent(rng.randint(0, 600) * SECOND, len(events) + i, PodSubmitted(pod=timed))
        )
    events.sort(key=lambda e: (e.time, e.order))
    return Scenario(events=events)


def preempt(nodes: int, pods: int, seed: int = 2) -> Scenario:
    rng = random.Random(seed)
    events = [TimedEvent(0, i, NodeAdded(node=n)) for i, n in enumerate(basic_nodes(nodes, rng))]
    for pod in basic_pods(pods, rng, namespace="low"):
        events.append(TimedEvent(0, len(events), PodSubmitted(pod=pod)))
    for spec in basic_pods(pods // 8, rng, namespace="high"):
        urgent = msgspec.structs.replace(spec, priority=100)
        events.append(TimedEvent(10 * SECOND, len(events), PodSubmitted(pod=urgent)))
    return Scenario(events=events)


async def run(shape: str, nodes: int, pods: int) -> dict[str, Any]:
    scenario = churn(nodes, pods) if shape == "churn" else preempt(nodes, pods)
    started = time.perf_counter()
    result = await simulate(scenario, MemoryLog())
    return {
        "shape": {"name": shape, "nodes": nodes, "pods": pods},
        "wall_seconds": time.perf_counter() - started,
        "attempts": result.stats["attempts"],
        "preempted": result.stats["preempted"],
        **result.report.counts(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=("churn", "preempt"))
    parser.add_argument("--nodes", type=int, default=30)
    parser.add_argument("--pods", type=int, default=20000)
    args = parser.parse_args()
    print(orjson.dumps(asyncio.run(run(args.shape, args.nodes, args.pods))).decode())


if __name__ == "__main__":
    main()
