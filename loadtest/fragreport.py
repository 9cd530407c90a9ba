"""``shoal loadtest fragmentation``: arguments, the published means, the table and the plot."""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from events.errors import InputError
from loadtest.fragbound import bounds, bounds_table
from loadtest.fragplot import plot
from loadtest.gputrace import (
    NODE_FILE,
    POD_PREFIX,
    POLICIES,
    PUBLISHED_FILE,
    PUBLISHED_NAMES,
    read_nodes,
    read_pods,
    workloads,
)
from loadtest.tracefiles import TRACE_HELP, has, read_text, trace_source


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="default", help="default, all, or a NAME")
    parser.add_argument("--policy", default="all", help=f"all, or one of {', '.join(POLICIES)}")
    parser.add_argument("--seeds", default="42-51", help="A-B or A,B,C (default 42-51)")
    parser.add_argument(
        "--moves",
        default=None,
        metavar="BUDGET",
        help="let the rescheduler move running pods, at most BUDGET percent of the pods "
        "placed so far (integers 0..100, or several: 0,1,2,5); absent: no moves",
    )
    parser.add_argument(
        "--on-demand-only",
        action="store_true",
        help="with --moves: move pods only to place one that would fail (no consolidation)",
    )
    parser.add_argument(
        "--bound",
        action="store_true",
        help="print lower bounds on the unallocated GPU %% at 100%% arrival that no policy "
        "beats, with any moves (loadtest/fragbound.py), instead of running",
    )
    parser.add_argument("--trace", type=Path, default=None, help=TRACE_HELP)
    parser.add_argument("--jobs", type=int, default=0, help="processes (default: CPUs)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE.png")
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        metavar="FILE.jsonl",
        help="append each run's result here as it completes, and skip runs already there",
    )


def _seeds(raw: str) -> list[int]:
    try:
        if "-" in raw:
            low, high = (int(x) for x in raw.split("-", 1))
            seeds = list(range(low, high + 1))
        else:
            seeds = [int(x) for x in raw.split(",")]
    except ValueError:
        raise InputError(f"must be A-B or A,B,C, got {raw!r}", location="--seeds") from None
    if not seeds or any(s < 0 for s in seeds):
        raise InputError(f"no seeds, or a negative one, in {raw!r}", location="--seeds")
    return seeds


def _budgets(raw: str | None) -> list[int | None]:
    if raw is None:
        return [None]
    try:
        budgets = [int(x) for x in raw.split(",")]
    except ValueError:
        raise InputError(
            f"must be P or P,Q,... (integers), got {raw!r}", location="--moves"
        ) from None
    if any(not 0 <= b <= 100 for b in budgets):
        raise InputError(f"each budget must be 0..100, got {raw!r}", location="--moves")
    return list(dict.fromkeys(budgets))


def published(trace: Path, column: str = "alloc_pct_mean") -> dict[tuple[str, str, int], float]:
    """(workload, policy, arrived %) → published mean allocation % (or ``column``:
    ``alloc_pct_std``, its standard deviation over the published seeds)."""
    out: dict[tuple[str, str, int], float] = {}
    if not has(trace, PUBLISHED_FILE):
        return out
    names = {v: k for k, v in PUBLISHED_NAMES.items()}
    for row in csv.DictReader(io.StringIO(read_text(trace, PUBLISHED_FILE), newline="")):
        policy = names.get(row.get("policy", ""))
        workload = row.get("workload", "").removeprefix(POD_PREFIX)
        try:
            out[(workload, policy or "", int(row["arrived_pct"]))] = float(row[column])
        except (KeyError, ValueError):
            continue
    return out


def run(args: argparse.Namespace) -> int:
    from loadtest.fragmentation import Run, default_jobs, run_all

    trace = trace_source(args.trace, NODE_FILE)
    known = workloads(trace)
    if args.workload == "all":
        chosen = known
    elif args.workload in known:
        chosen = [args.workload]
    else:
        raise InputError(
            f"unknown workload {args.workload!r} (all, {', '.join(known)})", location="--workload"
        )
    if args.policy == "all":
        policies = list(POLICIES)
    elif args.policy in POLICIES:
        policies = [args.policy]
    else:
        raise InputError(
            f"unknown policy {args.policy!r} (all, {', '.join(POLICIES)})", location="--policy"
        )
    seeds = _seeds(args.seeds)
    if args.bound:
        return _bounds(trace, chosen, seeds, args.json)
    budgets = _budgets(args.moves)
    if args.on_demand_only and args.moves is None:
        raise InputError("needs --moves", location="--on-demand-only")
    consolidate = args.moves is not None and not args.on_demand_only
    if args.jobs < 0:
        raise InputError("must be at least 1 (0: the CPU count)", location="--jobs")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise InputError(
                "needs matplotlib: pip install matplotlib (in a checkout of shoal: "
                "pip install -e '.[plot]')",
                location="--plot",
            ) from None
    results: list[dict[str, Any]] = []
    if args.results is not None and args.results.is_file():
        for line in args.results.read_text().splitlines():
            if line.strip():
                results.append(json.loads(line))
    have = {
        (r["workload"], r["policy"], r["seed"], r.get("moves_budget_pct"))
        for r in results
        if r.get("consolidate", False) == consolidate
    }
    runs = [
        Run(w, p, s, b, consolidate and b is not None)
        for w in chosen
        for p in policies
        for s in seeds
        for b in budgets
        if (w, p, s, b) not in have
    ]
    results = [
        r
        for r in results
        if r["workload"] in chosen
        and r["policy"] in policies
        and r.get("moves_budget_pct") in budgets
        and r.get("consolidate", False) == consolidate
    ]
    total, started = len(runs), time.monotonic()
    finished = 0

    def done(result: dict[str, Any]) -> None:
        nonlocal finished
        finished += 1
        results.append(result)
        if args.results is not None:
            with args.results.open("a") as out:
                out.write(json.dumps(result) + "\n")
        print(
            f"[{finished}/{total}] {result['workload']} {result['policy']} seed "
            f"{result['seed']}{_budget_label(result)}: unallocated "
            f"{result['unallocated_pct_at_100']:.2f}% at 100%, "
            f"{result['pods_per_second']:.0f} pods/s ({time.monotonic() - started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )

    run_all(trace, runs, args.jobs or default_jobs(), done)
    results.sort(
        key=lambda r: (
            chosen.index(r["workload"]),
            policies.index(r["policy"]),
            budgets.index(r.get("moves_budget_pct")),
            r["seed"],
        )
    )
    if args.json:
        keys = ["workload", "policy", "seed", "unallocated_pct_at_100", "alloc_pct_at_130"]
        keys += ["pods_per_second"]
        if args.moves is not None:
            keys[3:3] = ["moves_budget_pct"]
            keys += ["moves_at_100", "placed_by_moves_at_100", "moves", "placed_by_moves"]
            keys += ["moves_pct_of_placed", "nodes_moved_from", "most_moves_off_one_node"]
        print(json.dumps({"results": [{k: r[k] for k in keys} for r in results]}))
    else:
        print(table(results, published(trace)))
    if args.plot is not None:
        plot(results, args.plot, published(trace), published(trace, "alloc_pct_std"))
    return 0


def _bounds(trace: Path, chosen: list[str], seeds: list[int], as_json: bool) -> int:
    cards = sum(n.gpus for n in read_nodes(trace))
    rows = [(w, s, bounds(read_pods(trace, w), cards, s)) for w in chosen for s in seeds]
    if as_json:
        out = [{"workload": w, "seed": s, **b} for w, s, b in rows]
        print(json.dumps({"bounds": out}))
    else:
        print(bounds_table(rows))
    return 0


def _budget_label(result: dict[str, Any]) -> str:
    budget = result.get("moves_budget_pct")
    return "" if budget is None else f" moves {budget}%"


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):6.2f} ± {std:4.2f}"


def table(results: list[dict[str, Any]], paper: dict[tuple[str, str, int], float]) -> str:
    """Per workload and policy: means ± std over seeds, beside the published means."""
    lines = [
        f"{'workload':<12} {'policy':<14} {'seeds':>5}  {'unalloc% @100':>15} {'paper':>6}"
        f"  {'alloc% @130':>15} {'paper':>6}"
    ]
    moving = any(r.get("moves_budget_pct") is not None for r in results)
    if moving:
        lines[0] += f"  {'moves':>6} {'% placed':>8} {'placed by moves':>15} {'max/node':>8}"
    lines[0] += f"  {'pods/s':>7}"
    groups: dict[tuple[str, str, int | None], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["workload"], r["policy"], r.get("moves_budget_pct")), []).append(r)
    for (workload, policy, budget), rows in groups.items():
        at_100 = paper.get((workload, policy, 100))
        at_130 = paper.get((workload, policy, 130))
        name = policy if budget is None else f"{policy} {budget}%"
        line = (
            f"{workload:<12} {name:<14} {len(rows):>5}  "
            f"{_mean_std([r['unallocated_pct_at_100'] for r in rows]):>15} "
            f"{'-' if at_100 is None else f'{100 - at_100:.2f}':>6}  "
            f"{_mean_std([r['alloc_pct_at_130'] for r in rows]):>15} "
            f"{'-' if at_130 is None else f'{at_130:.2f}':>6}"
        )
        if moving:
            # moves and the pods they placed by 100% arrival (means over seeds)
            line += (
                f"  {statistics.mean(r.get('moves_at_100', 0) for r in rows):>6.1f} "
                f"{statistics.mean(r.get('moves_pct_of_placed_at_100', 0.0) for r in rows):>8.3f} "
                f"{statistics.mean(r.get('placed_by_moves_at_100', 0) for r in rows):>15.1f} "
                f"{max(r.get('most_moves_off_one_node', 0) for r in rows):>8}"
            )
        # the median run's speed (CPU seconds of its arrival loop, warm)
        speeds = [r["pods_per_second"] for r in rows if "pods_per_second" in r]
        # runs kept in --results by an earlier version carry no speed
        line += f"  {statistics.median(speeds):>7.0f}" if speeds else f"  {'-':>7}"
        lines.append(line)
    return "\n".join(lines)
