"""What-if replay: a recorded run's inputs under another configuration, and how its
decisions differ from the recorded ones (``shoal replay LOG --config OTHER``).

The inputs of a run are what ingest appended: nodes, pods, pod groups, quotas,
disruption budgets, pool reassignments, each at its recorded time. Everything else is
derived and so is derived again: the shards' and the coordinator's decisions, the
simulated binder's failures, the clock's ticks, and the completions of pods, which the
simulated cluster reports ``shoal.io/runtime`` after the pod was bound (a pod placed
later under OTHER finishes later). The re-run is :func:`shards.simulate.simulate` of
those inputs at the log's shard count and sharding.

A log recorded against a real cluster (``shoal serve``) cannot be re-run so: its
completions, deletions and adoptions were observed on the cluster, after the recorded
placements, and would be replayed at the wrong times under OTHER. Such a log is refused
(:func:`inputs_of`), naming the first observed record.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.config import SchedulerConfig, default_config
from engine.model.devices import WHOLE, GpuRequestError, gpu_request, node_cards
from engine.model.pools import Sharding
from events.errors import InputError
from events.memory import MemoryLog
from events.types import (
    Envelope,
    NodeAdded,
    NodeRemoved,
    NodeUpdated,
    PodAdopted,
    PodFailed,
    PodSubmitted,
    PodSucceeded,
    PositionRecorded,
    SchedulerConfigured,
    ShardingConfigured,
)
from shards.inputs.scenario import Scenario, TimedEvent
from shards.replay import sharding_of
from shards.report import PodView, RunReport, merge
from shards.simulate import simulate

INGEST = "ingest"
CLUSTER = "cluster"
MAX_ROWS = 50
"""Pods the table lists (``--json`` lists every one)."""
_HEAD = (SchedulerConfigured, ShardingConfigured, PositionRecorded)
"""Ingest records that are not cluster inputs: the run's configuration, positions."""


def same_config(recorded: SchedulerConfig | None, other: SchedulerConfig) -> bool:
    """Whether ``other`` configures what the log recorded (its profiles, plugins and
    their arguments, back-off, topology, extenders; not the text it was written in)."""
    return other == (recorded or default_config())


def other_config(recorded: SchedulerConfig | None, other: SchedulerConfig) -> SchedulerConfig:
    """``other`` as the re-run uses it: with the recorded topology levels where it
    declares none (a run records its scenario's ``Topology`` objects as its
    configuration's levels; a configuration file given alone has none)."""
    if recorded is not None and recorded.topology.levels and not other.topology.levels:
        return replace(other, topology=recorded.topology)
    return other


def observed(env: Envelope) -> bool:
    """Whether a record of the inputs partition was observed on a real cluster (an
    adoption, a position, a completion the simulated cluster did not report)."""
    event = env.event
    return isinstance(event, PodAdopted | PositionRecorded) or (
        isinstance(event, PodSucceeded | PodFailed) and env.producer != CLUSTER
    )


def input_records(
    parts: Sequence[Sequence[Envelope]], where: str, needs: str = "a what-if replay (--config)"
) -> list[Envelope]:
    """The records of a log's inputs (``parts``: its partitions, the control one last),
    in the order they are fed again (by time, as appended where times agree); refuses a
    log whose cluster was real (``where`` names the log, ``needs`` what refuses it)."""
    records: list[Envelope] = []
    for env in parts[-1]:
        if observed(env):
            raise InputError(
                f"recorded against a real cluster ({type(env.event).__name__} at offset "
                f"{env.offset} was observed there, after the recorded placements): "
                f"{needs} needs a log of shoal simulate",
                location=where,
            )
        if env.producer == INGEST and not isinstance(env.event, _HEAD):
            records.append(env)
    records.sort(key=lambda env: env.time)  # stable: as appended, where times agree
    return records


def inputs_of(parts: Sequence[Sequence[Envelope]], where: str) -> Scenario:
    """The recorded inputs of a log (``parts``: its partitions, the control one last),
    as the scenario that feeds them again at their recorded times; refuses a log whose
    cluster was real (``where`` names the log in the refusal)."""
    records = input_records(parts, where)
    return Scenario(
        events=[
            TimedEvent(time=env.time, order=i, event=env.event) for i, env in enumerate(records)
        ]
    )


def log_sharding(parts: Sequence[Sequence[Envelope]]) -> Sharding | None:
    """The sharding a log recorded (None: one shard, unsharded)."""
    if len(parts) > 1 or any(isinstance(e.event, ShardingConfigured) for e in parts[-1]):
        return sharding_of(parts[-1])
    return None


async def rerun(
    parts: Sequence[Sequence[Envelope]], config: SchedulerConfig, where: str
) -> list[list[Envelope]]:
    """The log's inputs run again under ``config``, at its shard count: the partitions
    of the new log."""
    scenario = inputs_of(parts, where)
    log = MemoryLog(len(parts))
    await simulate(scenario, log, config, sharding=log_sharding(parts))
    return [await log.read(p, 0) for p in range(log.partitions)]


# --------------------------------------------------------------------------- the diff


@dataclass
class RunFacts:
    """What the diff compares of one run: a fold of its merged partitions."""

    report: RunReport
    submitted: dict[str, int] = field(default_factory=dict)
    first_bound: dict[str, int] = field(default_factory=dict)
    """Pod → the time it was first placed."""
    nodes: dict[str, list[str]] = field(default_factory=dict)
    """Pod → the nodes it was placed on, in turn (a move adds one)."""
    idle_end: float = 0.0
    """GPU cards unallocated at the end of the run."""
    idle_average: float = 0.0
    """GPU cards unallocated, averaged over the run's time."""
    end: int = 0

    def delays(self) -> list[float]:
        """Seconds from creation to first placement of each placed pod, sorted."""
        return sorted(
            (bound - self.submitted.get(key, bound)) / 1e9
            for key, bound in self.first_bound.items()
        )


def _gpu_milli(requests: dict[str, int]) -> int:
    try:
        gpu = gpu_request(requests)
    except GpuRequestError:
        return 0  # rejected: never holds a card
    return 0 if gpu is None else gpu.cards * gpu.need.milli


def facts(parts: Sequence[Sequence[Envelope]]) -> RunFacts:
    """Fold a log's partitions (the control one last) into the facts the diff needs."""
    records = merge([list(p) for p in parts])
    run = RunFacts(RunReport(control=len(parts) - 1 if len(parts) > 1 else None))
    capacity: dict[str, int] = {}
    asks: dict[str, int] = {}
    held: dict[str, int] = {}
    idle = 0  # milli-cards: the nodes' cards less those bound pods hold
    start = records[0].time if records else 0
    last = start
    integral = 0
    for env in records:
        if env.time > last:
            integral += idle * (env.time - last)
            last = env.time
        run.report.apply(env)
        event = env.event
        key: object = getattr(event, "pod", None)
        match event:
            case NodeAdded(node=spec) | NodeUpdated(node=spec):
                cards = node_cards(spec.allocatable, spec.labels)[0] * WHOLE
                idle += cards - capacity.get(spec.name, 0)
                capacity[spec.name] = cards
            case NodeRemoved(name=name):
                idle -= capacity.pop(name, 0)
            case PodSubmitted(pod=spec):
                key = spec.key
                run.submitted[spec.key] = env.time  # submitted again: a new pod of that name
                run.first_bound.pop(spec.key, None)
                run.nodes.pop(spec.key, None)
                asks[spec.key] = _gpu_milli(spec.requests)
        if not isinstance(key, str) or key not in run.report.pods:
            continue
        view = run.report.pods[key]
        idle += held.pop(key, 0)
        if view.phase == "Bound":
            held[key] = asks.get(key, 0)
            idle -= held[key]
            run.first_bound.setdefault(key, env.time)
            path = run.nodes.setdefault(key, [])
            if view.node and (not path or path[-1] != view.node):
                path.append(view.node)
    run.end = last
    run.idle_end = idle / WHOLE
    run.idle_average = integral / (last - start) / WHOLE if last > start else run.idle_end
    return run


def outcome(view: PodView | None, nodes: list[str]) -> str:
    """A pod's run as a cell of the table: the nodes it was placed on, in turn, and how
    it ended unless it is still bound."""
    if view is None:
        return "absent"
    placed = " → ".join(nodes)
    if view.phase == "Bound" and placed:
        return placed
    state = view.phase.lower()
    if view.phase == "Failed" and view.reason.startswith(("Preempted", "Evicted")):
        state = view.reason.split(maxsplit=1)[0].rstrip(":").lower()
    return f"{placed}, {state}" if placed else state


def _change(placed: bool, placed_other: bool, nodes: list[str], nodes_other: list[str]) -> str:
    if placed and placed_other:
        return "elsewhere" if nodes != nodes_other else "ends otherwise"
    if placed:
        return "not placed"
    if placed_other:
        return "placed"
    return "ends otherwise"


def _p99(values: list[float]) -> float:
    return values[math.ceil(0.99 * len(values)) - 1] if values else 0.0


def _number(value: float) -> float:
    """Rounded to a millionth, and whole numbers as integers (deterministic text)."""
    rounded = round(value, 6)
    return int(rounded) if rounded == int(rounded) else rounded


@dataclass
class WhatIf:
    """The difference in decisions between a recorded run and its inputs under OTHER."""

    recorded: RunFacts
    other: RunFacts
    shards: int

    def pods(self) -> list[dict[str, str]]:
        """Pods that ended differently: placed elsewhere, placed versus pending, or
        placed alike but ended otherwise (preempted in one run, say)."""
        rows = []
        a, b = self.recorded.report.pods, self.other.report.pods
        for key in sorted(a.keys() | b.keys()):
            nodes, nodes_other = self.recorded.nodes.get(key, []), self.other.nodes.get(key, [])
            was, now = outcome(a.get(key), nodes), outcome(b.get(key), nodes_other)
            if was != now:
                placed = key in self.recorded.first_bound
                change = _change(placed, key in self.other.first_bound, nodes, nodes_other)
                rows.append({"pod": key, "recorded": was, "other": now, "change": change})
        return rows

    def preemptions(self) -> dict[str, list[dict[str, str]]]:
        return _added_removed(self.recorded.report.preemptions, self.other.report.preemptions)

    def moves(self) -> dict[str, list[dict[str, str]]]:
        return _added_removed(self.recorded.report.migrations, self.other.report.migrations)

    def measures(self) -> dict[str, tuple[float, float]]:
        """(recorded, other) of each measure by its ``--json`` name, in table order."""
        return {
            name: (_number(measure(self.recorded)), _number(measure(self.other)))
            for name, _, measure in _MEASURES
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "pods": self.pods(),
            "preemptions": self.preemptions(),
            "moves": self.moves(),
            "measures": {
                name: {"recorded": a, "other": b, "change": _number(b - a)}
                for name, (a, b) in self.measures().items()
            },
        }

    def table(self) -> list[str]:
        """The difference as lines of text (plain columns, for a terminal and a test)."""
        pods = self.pods()
        total = len(self.recorded.report.pods.keys() | self.other.report.pods.keys())
        shards = f"{self.shards} shard{'s' if self.shards > 1 else ''}"
        lines = [f"{len(pods)} of {total} pods differ ({shards})"]
        if pods:
            lines += _columns(
                ["POD", "RECORDED", "OTHER", "CHANGE"],
                [[r["pod"], r["recorded"], r["other"], r["change"]] for r in pods[:MAX_ROWS]],
            )
        if len(pods) > MAX_ROWS:
            lines.append(f"... and {len(pods) - MAX_ROWS} more pods (--json lists them all)")
        for what, diff in (("preemption", self.preemptions()), ("move", self.moves())):
            for sign, rows in (("+", diff["added"]), ("-", diff["removed"])):
                lines += [f"{sign} {what}: {_describe(row)}" for row in rows]
        lines += _columns(
            ["MEASURE", "RECORDED", "OTHER", "CHANGE"],
            [
                [label, f"{a:g}", f"{b:g}", f"{_number(b - a):+g}"]
                for (_, label, _), (a, b) in zip(_MEASURES, self.measures().values(), strict=True)
            ],
        )
        return lines


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


Measure = Callable[[RunFacts], float]
_MEASURES: tuple[tuple[str, str, Measure], ...] = (
    ("pods_placed", "pods placed", lambda f: len(f.first_bound)),
    ("pods_pending", "pods pending at end", lambda f: f.report.counts()["pending"]),
    ("preemptions", "preemptions", lambda f: len(f.report.preemptions)),
    ("moves", "moves", lambda f: len(f.report.migrations)),
    ("gpu_idle_end", "GPU idle at end", lambda f: f.idle_end),
    ("gpu_idle_average", "GPU idle, time-average", lambda f: f.idle_average),
    ("queueing_mean_seconds", "queueing delay mean (s)", lambda f: _mean(f.delays())),
    ("queueing_p99_seconds", "queueing delay p99 (s)", lambda f: _p99(f.delays())),
    ("end_seconds", "last event (s)", lambda f: f.end / 1e9),
)
"""(``--json`` name, table label, measure) of each measure compared; GPU in cards."""


def _describe(row: dict[str, str]) -> str:
    if "to" in row:
        return f"{row['pod']} {row['from']} → {row['to']} by {row['by']}"
    return f"{row['pod']} on {row['node']} by {row['by']}"


def _added_removed(
    recorded: list[dict[str, str]], other: list[dict[str, str]]
) -> dict[str, list[dict[str, str]]]:
    def key(row: dict[str, str]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(row.items()))

    was = {key(r): r for r in recorded}
    now = {key(r): r for r in other}
    return {
        "added": [now[k] for k in sorted(now.keys() - was.keys())],
        "removed": [was[k] for k in sorted(was.keys() - now.keys())],
    }


def _columns(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]


def what_if(recorded: Sequence[Sequence[Envelope]], other: Sequence[Sequence[Envelope]]) -> WhatIf:
    shards = len(recorded) - 1 if len(recorded) > 1 else 1
    return WhatIf(facts(recorded), facts(other), shards)
