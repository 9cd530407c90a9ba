"""``shoal loadtest defrag``: the Alibaba GPU trace with departures, with and without
defragmentation (:mod:`engine.passes.defrag`), at several budgets, for several placement
policies.

The trace's pods arrive at their ``creation_time`` and leave at their
``deletion_time`` (seconds), in time order, on the trace's GPU nodes, with the real
engine; the profile scores with the policy alone (``--policy``: ShoalGpu, FGD and
BestFit by default; FGD and ShoalGpu get the pod file's own target workload as args, as
the fragmentation benchmark gives it) and the on-demand rescheduler is off, so that
what changes between the runs of a policy is the background defragmentation alone. A
pod that finds no node waits and is tried again as others leave (the engine's own
queue); at its deletion time it leaves, placed or not. Reported per policy and
budget: the 8-card pods placed (of those that arrived), the GPU placed (milli-GPU of
the pods ever placed, of all that arrived), the time-averaged share of GPU capacity
idle while some pod waited (the fragmentation that made it wait), the moves made, and
the CPU time (the compiled code loaded before).

No published system reports this (the FGD paper's results are for arrivals only, the
fragmentation benchmark's protocol): FGD and BestFit, the paper's best and best simple
policies, run beside ShoalGpu in the same run instead. ``--churn`` draws its pods from
the same pod file (the trace's own shapes, as the fragmentation protocol does).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import numpy as np

from engine.config import parse_config
from engine.engine import Engine
from events.errors import InputError
from events.types import (
    SECOND,
    ClockTicked,
    Envelope,
    NodeAdded,
    PodBound,
    PodDeleted,
    PodMigrated,
    PodSubmitted,
)
from loadtest.fragmentation import warm_up
from loadtest.gputrace import (
    NODE_FILE,
    POD_PREFIX,
    POLICIES,
    TracePod,
    arrivals,
    node_order,
    read_nodes,
    read_pods,
    target_workload,
)
from loadtest.tracefiles import TRACE_HELP, location, read_text, trace_source

BUDGETS: Final = {
    "off": None,
    "1/min": (1, 1),
    "10/min": (10, 2),
    "100/min": (100, 8),
}
"""Configuration → (moves per minute in all, per node), or None: no defragmentation."""
DEFAULT_POLICIES: Final = "shoal,fgd,bestfit"
"""``--policy``: no published figures exist for departures, so the paper's FGD and
BestFit run beside ShoalGpu."""
FILL_PCT: Final = 120
"""``--churn``: pods arrive as in the fragmentation benchmark until this share of the
GPU capacity has arrived (placed or not) before the churn starts."""


@dataclass(frozen=True, slots=True)
class Timed:
    at: int
    """Seconds."""
    order: int
    pod: TracePod
    leaves: bool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="default", help="a pod file with times (default)")
    parser.add_argument("--trace", type=Path, default=None, help=TRACE_HELP)
    parser.add_argument(
        "--budgets",
        default=",".join(BUDGETS),
        help=f"configurations to run, of {', '.join(BUDGETS)} (default: all)",
    )
    parser.add_argument(
        "--copies",
        type=int,
        default=1,
        help="each pod of the file this many times, at its times (the real trace never "
        "fills the cluster; 2 or 3 make pods wait)",
    )
    parser.add_argument(
        "--churn",
        type=int,
        default=0,
        metavar="STEPS",
        help="instead of the trace's times: pods arrive as in the fragmentation benchmark "
        "(seed 42) until 120%% of the GPU has arrived, then STEPS steps of one second, each "
        "one placed pod leaving and one new pod of the file arriving",
    )
    parser.add_argument(
        "--policy",
        default=DEFAULT_POLICIES,
        help=f"placement policies to run, of {', '.join(POLICIES)} (default: "
        f"{DEFAULT_POLICIES}; nothing is published for departures to compare with)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE.png")


def timeline(trace: Path, workload: str, copies: int = 1) -> list[Timed]:
    """Arrivals and departures of the pod file, each pod ``copies`` times, in time
    order (a pod that never leaves stays to the end)."""
    pods = {pod.name: pod for pod in read_pods(trace, workload)}
    name = f"{POD_PREFIX}{workload}.csv"
    path = location(trace, name)
    out: list[Timed] = []
    reader = csv.DictReader(io.StringIO(read_text(trace, name), newline=""))
    for column in ("creation_time", "deletion_time"):
        if column not in (reader.fieldnames or ()):
            raise InputError(
                f"has no {column} column: departures need a pod file with times",
                location=path,
            )
    for line, row in enumerate(reader, start=2):
        pod = pods.get(row["name"])
        try:
            created = int(row["creation_time"] or 0)
            deleted = int(row["deletion_time"] or 0)
        except ValueError:
            raise InputError("times must be integers", location=f"{path}: line {line}") from None
        if pod is None:
            continue
        for copy in range(copies):
            twin = pod if copy == 0 else replace(pod, name=f"{pod.name}-{copy}")
            order = 2 * (line * copies + copy)
            out.append(Timed(created, order, twin, False))
            if deleted > created:
                out.append(Timed(deleted, order + 1, twin, True))
    out.sort(key=lambda t: (t.at, not t.leaves, t.order))
    return out


def config_of(
    pods: list[TracePod], budget: tuple[int, int] | None, policy: str = "fgd"
) -> dict[str, Any]:
    """The profile of a run: ``policy`` (a ``--policy`` name) the only score, with the
    pod file's target workload where it takes one (ShoalGpu's with memory)."""
    args: dict[str, Any] = {"maxMoves": 0}
    if budget is not None:
        args["defragmentation"] = {
            "movesPerMinute": budget[0],
            "movesPerNodePerMinute": budget[1],
        }
    plugin = POLICIES[policy]
    config: list[dict[str, Any]] = [{"name": "Rescheduler", "args": args}]
    if plugin in ("GpuFragmentation", "ShoalGpu"):
        workload = target_workload(pods, memory=plugin == "ShoalGpu")
        config.append({"name": plugin, "args": {"targetWorkload": workload.to_args()}})
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [
            {
                "plugins": {
                    "score": {
                        "disabled": [{"name": "*"}],
                        "enabled": [{"name": plugin, "weight": 1}],
                    },
                    "postFilter": {"disabled": [{"name": "DefaultPreemption"}]},
                },
                "pluginConfig": config,
            }
        ],
    }


def run_one(
    trace: Path, workload: str, name: str, copies: int = 1, policy: str = "fgd"
) -> dict[str, Any]:
    nodes = read_nodes(trace)
    pods = read_pods(trace, workload)
    events = timeline(trace, workload, copies)
    capacity = sum(n.gpus for n in nodes) * 1000
    engine = Engine(parse_config(config_of(pods, BUDGETS[name], policy)))
    warm_up()
    for node in nodes:
        engine.apply(Envelope(event=NodeAdded(node=node.spec()), producer="ingest"))
    engine.schedule()
    placed: set[str] = set()
    arrived_gpu = placed_gpu = arrived_8 = placed_8 = moves = 0
    allocated = 0
    holding: dict[str, int] = {}
    idle_waiting = 0.0
    waited = 0.0
    last = events[0].at if events else 0
    started = time.process_time()

    def note(decisions: list[Any]) -> None:
        nonlocal placed_gpu, placed_8, allocated, moves
        for decision in decisions:
            if isinstance(decision, PodBound) and decision.pod not in holding:
                pod = by_key[decision.pod]
                holding[decision.pod] = pod.gpu_milli
                allocated += pod.gpu_milli
                if decision.pod not in placed:
                    placed.add(decision.pod)
                    placed_gpu += pod.gpu_milli
                    placed_8 += pod.gpus == 8
            elif isinstance(decision, PodMigrated):
                moves += 1

    by_key: dict[str, TracePod] = {}
    for event in events:
        if event.at > last:
            waiting = len(engine.pods) - len(engine.state.pods)
            if waiting > 0:
                span = event.at - last
                idle_waiting += span * (capacity - allocated) / capacity
                waited += span
            engine.apply(Envelope(event=ClockTicked(), time=event.at * SECOND, producer="clock"))
            note(engine.schedule())
            last = event.at
        key = f"default/{event.pod.name}"
        if event.leaves:
            engine.apply(
                Envelope(event=PodDeleted(pod=key), time=event.at * SECOND, producer="ingest")
            )
            allocated -= holding.pop(key, 0)
        else:
            by_key[key] = event.pod
            arrived_gpu += event.pod.gpu_milli
            arrived_8 += event.pod.gpus == 8
            spec = event.pod.spec(event.pod.name)
            engine.apply(
                Envelope(event=PodSubmitted(pod=spec), time=event.at * SECOND, producer="ingest")
            )
        note(engine.schedule())
    seconds = time.process_time() - started
    return {
        "workload": workload,
        "copies": copies,
        "policy": policy,
        "defragmentation": name,
        "pods": len(by_key),
        "eight_card_placed": placed_8,
        "eight_card_arrived": arrived_8,
        "gpu_placed_pct": round(100 * placed_gpu / max(arrived_gpu, 1), 2),
        "idle_gpu_pct_while_waiting": round(100 * idle_waiting / waited, 2) if waited else 0.0,
        "moves": moves,
        "cpu_seconds": round(seconds, 1),
    }


def run_churn(
    trace: Path, workload: str, name: str, steps: int, seed: int = 42, policy: str = "fgd"
) -> dict[str, Any]:
    """The saturated variant (see ``--churn``): 8-card pods placed of those that arrived
    during the churn, the GPU left idle on average over its steps, the moves. The pods
    are the pod file's (the same draws for every policy and budget)."""
    nodes = read_nodes(trace)
    pods = read_pods(trace, workload)
    capacity = sum(n.gpus for n in nodes) * 1000
    rng = np.random.Generator(np.random.PCG64(seed))
    engine = Engine(parse_config(config_of(pods, BUDGETS[name], policy)))
    warm_up()
    for node in node_order(nodes, seed):
        engine.apply(Envelope(event=NodeAdded(node=node.spec()), producer="ingest"))
    engine.schedule()
    holding: dict[str, int] = {}
    moves = 0
    now = 0

    def submit(pod: TracePod, name_: str) -> bool:
        spec = pod.spec(name_)
        engine.apply(Envelope(event=PodSubmitted(pod=spec), time=now * SECOND, producer="ingest"))
        nonlocal moves
        bound = False
        for decision in engine.schedule():
            if isinstance(decision, PodBound) and decision.pod == spec.key:
                bound = True
            elif isinstance(decision, PodMigrated):
                moves += 1
        if bound:
            holding[spec.key] = pod.gpu_milli
        else:
            engine.apply(
                Envelope(event=PodDeleted(pod=spec.key), time=now * SECOND, producer="ingest")
            )
        return bound

    sequence = arrivals(pods, capacity, seed)
    arrived = 0
    for i, pod in enumerate(sequence):
        if arrived >= capacity * FILL_PCT // 100:
            break
        submit(pod, f"fill-{i}")
        arrived += pod.gpu_milli
    placed_8 = arrived_8 = 0
    idle = 0.0
    started = time.process_time()
    for step in range(steps):
        now += 1
        if holding:
            keys = sorted(holding)
            gone = keys[int(rng.integers(len(keys)))]
            del holding[gone]
            engine.apply(Envelope(event=PodDeleted(pod=gone), time=now * SECOND, producer="ingest"))
        pod = pods[int(rng.integers(len(pods)))]
        placed = submit(pod, f"churn-{step}")
        if pod.gpus == 8:
            arrived_8 += 1
            placed_8 += placed
        idle += (capacity - sum(holding.values())) / capacity
    return {
        "workload": workload,
        "churn_steps": steps,
        "policy": policy,
        "defragmentation": name,
        "eight_card_placed": placed_8,
        "eight_card_arrived": arrived_8,
        "idle_gpu_pct": round(100 * idle / max(steps, 1), 2),
        "moves": moves,
        "cpu_seconds": round(time.process_time() - started, 1),
    }


def run(args: argparse.Namespace) -> int:
    trace = trace_source(args.trace, NODE_FILE)
    names = [n.strip() for n in args.budgets.split(",") if n.strip()]
    if not 1 <= args.copies <= 10:
        raise InputError(f"must be 1..10, got {args.copies}", location="--copies")
    unknown = [n for n in names if n not in BUDGETS]
    if unknown or not names:
        raise InputError(
            f"unknown configuration {unknown[0] if unknown else ''!r} (of {', '.join(BUDGETS)})",
            location="--budgets",
        )
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    strange = [p for p in policies if p not in POLICIES]
    if strange or not policies:
        raise InputError(
            f"unknown policy {strange[0] if strange else ''!r} (of {', '.join(POLICIES)})",
            location="--policy",
        )
    results = []
    for policy in policies:
        for name in names:
            print(f"{policy}, defragmentation {name}: running", file=sys.stderr, flush=True)
            if args.churn:
                results.append(run_churn(trace, args.workload, name, args.churn, policy=policy))
            else:
                results.append(run_one(trace, args.workload, name, args.copies, policy))
    if args.json:
        print(json.dumps({"results": results}))
    elif args.churn:
        print("| policy | defragmentation | 8-card pods placed | idle GPU % | moves | CPU s |")
        print("|---|---|---|---|---|---|")
        for r in results:
            print(
                f"| {r['policy']} | {r['defragmentation']} | {r['eight_card_placed']} of "
                f"{r['eight_card_arrived']} | {r['idle_gpu_pct']} | {r['moves']} "
                f"| {r['cpu_seconds']} |"
            )
    else:
        print(
            "| policy | defragmentation | 8-card pods placed | GPU placed % "
            "| idle GPU % while pods waited | moves | CPU s |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in results:
            print(
                f"| {r['policy']} | {r['defragmentation']} | {r['eight_card_placed']} of "
                f"{r['eight_card_arrived']} | {r['gpu_placed_pct']} "
                f"| {r['idle_gpu_pct_while_waiting']} | {r['moves']} | {r['cpu_seconds']} |"
            )
    if not args.json:
        print(
            "(no published figures exist with departures: the FGD paper's are for arrivals "
            "only; FGD and BestFit are run here instead)"
        )
    if args.plot is not None:
        _plot(results, args.plot)
    return 0


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError(
            "needs matplotlib: pip install matplotlib (in a checkout of shoal: "
            "pip install -e '.[plot]')",
            location="--plot",
        ) from None
    names = list(dict.fromkeys(r["defragmentation"] for r in results))
    policies = list(dict.fromkeys(r["policy"] for r in results))
    by = {(r["policy"], r["defragmentation"]): r for r in results}
    idle = "idle_gpu_pct" if "idle_gpu_pct" in results[0] else "idle_gpu_pct_while_waiting"
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    width = 0.8 / len(policies)
    for k, policy in enumerate(policies):
        xs = [i + (k - (len(policies) - 1) / 2) * width for i in range(len(names))]
        rows = [by.get((policy, n)) for n in names]
        left.bar(xs, [r["eight_card_placed"] if r else 0 for r in rows], width, label=policy)
        right.bar(xs, [r[idle] if r else 0 for r in rows], width, label=policy)
    left.set_title(f"8-card pods placed (of {results[0]['eight_card_arrived']})")
    right.set_title("idle GPU %" if idle == "idle_gpu_pct" else "idle GPU % while pods waited")
    for axis in (left, right):
        axis.set_xticks(range(len(names)), names)
        axis.set_xlabel("defragmentation budget")
    left.legend(title="policy", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
