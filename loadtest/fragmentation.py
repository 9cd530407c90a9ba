"""``shoal loadtest fragmentation``: FGD's GPU fragmentation benchmark on the real engine.

One run is one (workload, policy, seed): the trace's nodes are added to an
:class:`~engine.engine.Engine` whose profile scores with the policy alone (every
default score plugin disabled, no preemption), then the protocol's pods arrive one at a
time, each followed by a scheduling pass; a pod the pass does not bind is deleted at
once (no retries), nothing departs. After each pod: GPU allocated (milli-GPU of the pods
bound) and GPU arrived (of every pod so far), over the cluster's GPU capacity. Reported:
the unallocated GPU % at the first pod whose arrival reaches 100% of capacity, and the
allocation % at the end (the arrival just under 130%).

FGD and ShoalGpu are given the target workload of PROTOCOL.md (the file's shapes that
cover 95% of its pods) as ``targetWorkload`` args, ShoalGpu's with each shape's median
memory (which it counts and FGD does not); GpuRandom gets the run's seed.
Runs are independent and spread over ``jobs`` processes; each result is handed to the
caller as it completes.

With a move budget (``--moves P``), the profile also has the ``Rescheduler`` as its only
post-filter, ``maxMoves`` 3 and ``budget: {percentOfPlaced: P}``, and (unless
``--on-demand-only``) ``consolidate: true``: a pod that fits nowhere may be placed by
moving running pods (each move a ``PodMigrated``), and between pods the budget's moves
left go to the moves that lower ShoalGpu's (or FGD's) fragmentation most. Moves go
through the engine's own passes, the same code ``serve`` runs. Reported besides: moves
in all and by 100% arrival, as a percent of the pods placed, the pods placed thanks to
moves, the nodes moved from and the most moves off one node.

Pods per second: the protocol's pods over the CPU seconds of the arrival loop, the
compiled code loaded before (:func:`warm_up`), so policies compare at their steady speed.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from engine.config import parse_config
from engine.engine import Engine
from engine.plugins import kernels
from engine.plugins.gpu import compiled
from events.types import (
    Envelope,
    Event,
    NodeAdded,
    PodBound,
    PodDeleted,
    PodMigrated,
    PodSubmitted,
)
from loadtest.gputrace import (
    POLICIES,
    TARGET_PCT,
    TraceNode,
    TracePod,
    arrivals,
    node_order,
    read_nodes,
    read_pods,
    target_workload,
)

MAX_MOVES: Final = 3
"""Pods one plan may move (the rescheduler's ``maxMoves``) in a run with moves."""


@dataclass(frozen=True, slots=True, order=True)
class Run:
    workload: str
    policy: str
    seed: int
    moves: int | None = None
    """The move budget in percent of the pods placed so far (None: the protocol as
    published, no rescheduler; 0: the rescheduler on with no budget)."""
    consolidate: bool = False
    """Also spend the budget on consolidation (:mod:`engine.passes.consolidate`)."""


def profile_config(
    policy: str,
    seed: int,
    pods: list[TracePod],
    moves: int | None = None,
    consolidate: bool = False,
) -> dict[str, Any]:
    """The ``KubeSchedulerConfiguration`` of a run: the policy is the only score; with
    ``moves``, the rescheduler is the only post-filter, its moves at most ``moves``
    percent of the pods placed so far."""
    plugin = POLICIES[policy]
    config: list[dict[str, Any]] = []
    if plugin == "GpuRandom":
        config.append({"name": plugin, "args": {"seed": seed}})
    elif plugin in ("GpuFragmentation", "ShoalGpu"):
        workload = target_workload(pods, memory=plugin == "ShoalGpu")
        config.append({"name": plugin, "args": {"targetWorkload": workload.to_args()}})
    post_filter: dict[str, Any] = {"disabled": [{"name": "*"}]}
    if moves is not None:
        post_filter["enabled"] = [{"name": "Rescheduler"}]
        budget = {"percentOfPlaced": moves}
        args: dict[str, Any] = {"maxMoves": MAX_MOVES, "budget": budget}
        if consolidate:
            args["consolidate"] = True
        config.append({"name": "Rescheduler", "args": args})
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [
            {
                "schedulerName": "default-scheduler",
                "plugins": {
                    "score": {"disabled": [{"name": "*"}], "enabled": [{"name": plugin}]},
                    "postFilter": post_filter,
                },
                "pluginConfig": config,
            }
        ],
    }


@functools.lru_cache(maxsize=4)
def _nodes(trace: Path) -> list[TraceNode]:
    return read_nodes(trace)


@functools.lru_cache(maxsize=4)
def _pods(trace: Path, workload: str) -> list[TracePod]:
    return read_pods(trace, workload)


def run_one(trace: Path, run: Run) -> dict[str, Any]:
    """Run the protocol once; the result row (with the allocation curve at every whole
    percent of arrival, ``curve[k]`` = allocation % once k% had arrived)."""
    nodes = _nodes(trace)
    pods = _pods(trace, run.workload)
    capacity = sum(n.gpus for n in nodes) * 1000
    sequence = arrivals(pods, capacity, run.seed)
    engine = Engine(
        parse_config(profile_config(run.policy, run.seed, pods, run.moves, run.consolidate))
    )
    for node in node_order(nodes, run.seed):
        engine.apply(Envelope(event=NodeAdded(node=node.spec()), producer="ingest"))
    engine.schedule()
    allocated = arrived = bound = 0
    at_100: int | None = None
    moves = Moves()
    curve = [0.0]
    warm_up()
    started = time.process_time()
    for i, pod in enumerate(sequence):
        spec = pod.spec(f"{pod.name}-{i}")
        engine.apply(Envelope(event=PodSubmitted(pod=spec), producer="ingest"))
        decisions = engine.schedule()
        placed = any(isinstance(e, PodBound) for e in decisions)
        # every move of the pass, once: the placed pod's plan and consolidation's, which
        # may also move pods in a pass that places none
        moves.count(decisions, spec.key if placed else None)
        if placed:
            allocated += pod.gpu_milli
            bound += 1
        else:
            engine.apply(Envelope(event=PodDeleted(pod=spec.key), producer="ingest"))
        arrived += pod.gpu_milli
        if at_100 is None and arrived >= capacity:
            at_100 = allocated
            moves.at_100 = (moves.total, moves.rescued, bound)
        while len(curve) <= TARGET_PCT and arrived * 100 >= len(curve) * capacity:
            curve.append(round(allocated * 100 / capacity, 3))
    seconds = time.process_time() - started
    if at_100 is None:
        at_100 = allocated
        moves.at_100 = (moves.total, moves.rescued, bound)
    return {
        "workload": run.workload,
        "policy": run.policy,
        "seed": run.seed,
        "moves_budget_pct": run.moves,
        "consolidate": run.consolidate,
        "unallocated_pct_at_100": round(100 - at_100 * 100 / capacity, 3),
        "alloc_pct_at_130": round(allocated * 100 / capacity, 3),
        "pods": len(sequence),
        "bound": bound,
        **moves.row(bound),
        "cpu_seconds": round(seconds, 3),
        "pods_per_second": round(len(sequence) / seconds, 1) if seconds > 0 else 0.0,
        "curve": curve,
    }


def warm_up() -> None:
    """Load every policy's compiled code now (numba, from its disk cache: a few tenths
    of a second once per process), so that pods/s measures placing pods, warm, for every
    policy alike."""
    kernels.warm_up()
    compiled.kernel()


@dataclass(slots=True)
class Moves:
    """The moves of one run: in all, per node they left, and the pods they placed."""

    total: int = 0
    rescued: int = 0
    """Pods placed by a plan of moves (they would have failed without)."""
    per_node: dict[str, int] = field(default_factory=dict)
    at_100: tuple[int, int, int] = (0, 0, 0)
    """(moves, pods placed by moves, pods placed) when 100% had arrived."""

    def count(self, decisions: list[Event], pod: str | None) -> None:
        """Count the moves of one pass, each once, whatever it was made for (a pod's
        plan or consolidation); ``pod``: the pod the pass placed, if any (placed by
        moves when some were made for it). Call once per pass: the engine's
        ``moved_total`` counts the same moves."""
        made = [e for e in decisions if isinstance(e, PodMigrated)]
        if not made:
            return
        self.total += len(made)
        self.rescued += pod is not None and any(e.by == pod for e in made)
        for e in made:
            self.per_node[e.from_node] = self.per_node.get(e.from_node, 0) + 1

    def row(self, bound: int) -> dict[str, Any]:
        moves, rescued, placed = self.at_100
        return {
            "moves": self.total,
            "moves_pct_of_placed": round(self.total * 100 / bound, 3) if bound else 0.0,
            "placed_by_moves": self.rescued,
            "moves_at_100": moves,
            "placed_by_moves_at_100": rescued,
            "moves_pct_of_placed_at_100": round(moves * 100 / placed, 3) if placed else 0.0,
            "nodes_moved_from": len(self.per_node),
            "most_moves_off_one_node": max(self.per_node.values(), default=0),
        }


def run_all(
    trace: Path,
    runs: Iterable[Run],
    jobs: int,
    done: Callable[[dict[str, Any]], None],
) -> None:
    """Run every run, ``jobs`` at a time in worker processes (1: in this process),
    calling ``done`` with each result as it completes."""
    todo = sorted(runs)
    if jobs <= 1 or len(todo) <= 1:
        for run in todo:
            done(run_one(trace, run))
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        pending: set[Future[dict[str, Any]]] = {pool.submit(run_one, trace, r) for r in todo}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in sorted(finished, key=id):
                done(future.result())


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)))
