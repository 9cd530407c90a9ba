"""Human output: tables, explanations and progress lines (rich on a terminal)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from engine.counterfactual import Counterfactual
from events.codec import to_builtins
from events.types import SECOND, Envelope, SnapshotTaken
from shards.inputs.progress import ProgressLines
from shards.replay import ReplayResult
from shards.report import RunReport

MAX_ROWS = 60


def make_console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr): as wide as the terminal, else 160 columns."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 160
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


def report_table(report: RunReport, summary: dict[str, Any]) -> None:
    console = make_console()
    table = Table(title="Pods at the end of the run", title_justify="left")
    for column in ("POD", "NODE", "PHASE", "SHARD", "TRIES", "REASON"):
        table.add_column(column, overflow="fold")
    rows = sorted(report.pods.items())
    for key, view in rows[:MAX_ROWS]:
        style = {"Bound": "green", "Succeeded": "cyan", "Pending": "yellow", "Failed": "red"}
        table.add_row(
            key,
            view.node or "-",
            f"[{style.get(view.phase, 'white')}]{view.phase}[/]",
            "-" if view.shard is None else str(view.shard),
            str(view.attempts),
            view.shown_reason() if view.phase != "Bound" else "",
        )
    console.print(table)
    if len(rows) > MAX_ROWS:
        console.print(f"... and {len(rows) - MAX_ROWS} more pods (use --json for all)")
    if report.groups:
        groups = Table(title="Pod groups", title_justify="left")
        for column in ("GROUP", "PHASE", "PLACED", "MIN", "MEMBERS", "REASON"):
            groups.add_column(column, overflow="fold")
        for key, group in sorted(report.groups.items())[:MAX_ROWS]:
            groups.add_row(
                key,
                group.phase,
                str(group.scheduled),
                str(group.min_member),
                str(group.members),
                group.answer.text()
                if group.answer is not None and group.phase == "Pending"
                else group.reason,
            )
        console.print(groups)
    if report.preemptions:
        console.print(
            "preempted: "
            + ", ".join(f"{p['pod']} on {p['node']} by {p['by']}" for p in report.preemptions[:20])
        )
    if report.migrations:
        console.print(
            "moved: "
            + ", ".join(
                f"{m['pod']} {m['from']} → {m['to']} for {m['by']}" for m in report.migrations[:20]
            )
        )
    counts = report.counts()
    parts = [f"{counts[k]} {k}" for k in ("bound", "succeeded", "pending", "failed") if counts[k]]
    line = ", ".join(parts) or "no pods"
    extra = f" in {summary['wall_seconds']:.3f}s wall" if "wall_seconds" in summary else ""
    console.print(
        f"{line}; {counts['nodes']} nodes, {counts['events']} events, "
        f"{report.last_time / SECOND:g}s simulated{extra}"
    )


def progress_printer(silent: bool) -> Callable[[int, int, int], None] | None:
    """A progress callback for a simulation, on stderr (:class:`ProgressLines`: quiet
    for a short run; a line every two seconds, or on a terminal one line twice a
    second)."""
    if silent:
        return None
    lines = ProgressLines()

    def show(now: int, done: int, total: int) -> None:
        lines("simulating", done, total, f"objects ingested, {now / SECOND:,.1f}s simulated")

    return show


def envelope_json(env: Envelope) -> dict[str, Any]:
    data: dict[str, Any] = to_builtins(env)
    if isinstance(env.event, SnapshotTaken):
        # the state itself is opaque and large: its size says enough here
        data["event"]["data"] = f"<{len(env.event.data)} bytes>"
    return data


# --------------------------------------------------------------------------- explain


def explanation_json(
    key: str, result: ReplayResult, would_run: Counterfactual | None = None
) -> dict[str, Any]:
    attempts = []
    for exp in result.engine.explanations:
        item: dict[str, Any] = {
            "attempt": exp.attempt,
            "time_seconds": exp.time / SECOND,
            "node": exp.node,
            "status": exp.status.code.name,
            "message": exp.status.message() if exp.node is None else "",
        }
        if exp.diagnosis is not None:
            item["nodes"] = exp.diagnosis.nodes
            item["feasible"] = exp.diagnosis.feasible
            item["filters"] = exp.diagnosis.plugins
            item["rejected"] = exp.diagnosis.rejected
            item["top"] = [
                {"node": n.node, "total": n.total, "plugins": n.plugins} for n in exp.diagnosis.top
            ]
        attempts.append(item)
    view = result.report.pods.get(key)
    out: dict[str, Any] = {
        "pod": key,
        "final": view.to_json() if view else None,
        "attempts": attempts,
    }
    answer = (out["final"] or {}).get("answer")
    if answer is not None:
        answer["counterfactual"] = would_run.to_json() if would_run is not None else None
    spec = result.explained
    if spec is not None and spec.group:
        group = result.report.groups.get(spec.group)
        out["group"] = {"name": spec.group, **(group.to_json() if group else {"phase": "unknown"})}
    deps = result.dependencies()
    if deps:
        out["dependencies"] = [{"name": name, "state": state} for name, state in deps]
    moves = [m for m in result.report.migrations if key in (m["pod"], m["by"])]
    if moves:
        out["migrations"] = moves
    preempted = [p for p in result.report.preemptions if key in (p["pod"], p["by"])]
    if preempted:
        out["preemptions"] = preempted
    return out


def explanation_text(
    key: str, result: ReplayResult, would_run: Counterfactual | None = None
) -> None:
    console = make_console()
    data = explanation_json(key, result, would_run)
    final = data["final"] or {}
    answer = final.get("answer")
    if answer:
        console.print(f"[bold]answer[/]: {escape(answer['text'])}", soft_wrap=True)
        for fact in answer["evidence"]:
            console.print(f"  - {fact}", markup=False, soft_wrap=True)
        if would_run is not None:
            console.print(f"[bold]{escape(would_run.text())}[/]", soft_wrap=True)
    console.print(
        f"[bold]{key}[/]: {final.get('phase')} on {final.get('node') or '-'}"
        + (f" — {final['reason']}" if final.get("reason") else "")
    )
    if "group" in data:
        group = data["group"]
        console.print(
            f"pod group {group['name']}: {group['phase']}, {group.get('scheduled', 0)} of "
            f"minMember {group.get('min_member', '?')} placed"
            + (f" — {group['reason']}" if group.get("reason") else "")
        )
    for dep in data.get("dependencies", []):
        console.print(f"depends on {dep['name']}: {dep['state']}")
    for move in data.get("migrations", []):
        console.print(
            f"migration: {move['pod']} moved from {move['from']} to {move['to']} "
            f"to make room for {move['by']}"
        )
    for victim in data.get("preemptions", []):
        console.print(
            f"preemption: {victim['pod']} evicted from {victim['node']} by {victim['by']}"
        )
    if not data["attempts"]:
        console.print("no scheduling attempt was recorded for this pod")
        return
    last = data["attempts"][-1]
    outcome = f"bound to {last['node']}" if last["node"] else f"unschedulable: {last['message']}"
    console.print(
        f"last attempt (#{last['attempt']}, {len(data['attempts'])} in all) "
        f"at t={last['time_seconds']:g}s: {outcome}"
    )
    if "filters" in last:
        table = Table(
            title=f"Filters over {last['nodes']} nodes ({last['feasible']} feasible)",
            title_justify="left",
        )
        table.add_column("PLUGIN")
        table.add_column("REJECTED", justify="right")
        table.add_column("WHY")
        for plugin, reasons in last["filters"].items():
            why = ", ".join(f"{n} x {r}" for r, n in sorted(reasons.items()))
            table.add_row(plugin, str(last["rejected"].get(plugin, 0)), why)
        if not last["filters"]:
            table.add_row("(all)", "0", "every node passed every filter")
        console.print(table)
    if last.get("top"):
        plugins = list(last["top"][0]["plugins"])
        table = Table(title="Top-scored nodes (weighted plugin scores)", title_justify="left")
        table.add_column("NODE")
        table.add_column("TOTAL", justify="right")
        for plugin in plugins:
            table.add_column(plugin, justify="right")
        for node in last["top"]:
            table.add_row(
                node["node"], str(node["total"]), *(str(node["plugins"][p]) for p in plugins)
            )
        console.print(table)
