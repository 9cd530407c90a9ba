"""Dry run of a job against a recorded run (``shoal whatif JOB.yaml --log LOG``): where
each of the job's pods would go, when, whom it would preempt or move, and why not if
never.

The state at the point asked for (an offset of the log's inputs, a time, or the log's
end) is the log's recorded inputs up to there, fed again (:func:`shards.whatif.inputs_of`):
the system re-derives from them the decisions, bindings and completions that led to
that state, so the re-run is that state. The job's objects, read as a scenario, arrive
at that point (their ``shoal.io/arrive-at``, if any, counts from it), and the run
goes on at the log's shard count, sharding and recorded configuration until nothing is
left to do: running pods finish ``shoal.io/runtime`` after they were bound (pods without
one run to the end), back-offs and time-outs expire, so a job pod's waiting time is the
one those completions give it.

What the dry run knows is what was known at the point: inputs recorded after it (pods
and nodes that arrived later) are left out, unless ``--with-later`` asks for hindsight
(what would have happened had the job been submitted then, later arrivals included).
Either way the answer is what a real submission at that point does in a simulated run
of the same inputs (``tests/shards/test_dryrun.py`` holds it to that).

A log recorded against a real cluster is refused, as ``replay --config`` refuses it: its
placements and completions were observed on the cluster, and the re-run derives its
own (see :mod:`shards.whatif`).

Priority classes are resolved when a scenario is read and are not in the log: a job
whose pods name one gives its ``PriorityClass`` among its files.

Cost: a dry run is a simulated run of the log's inputs up to the point and of what
follows, as long as ``shoal simulate`` of them (nothing is kept between dry runs); a
job pod never placed gets a counterfactual ("would run if: ...",
:mod:`shards.wouldrun`), found on the state the run ends with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.config import SchedulerConfig
from events.errors import InputError
from events.memory import MemoryLog
from events.types import (
    SECOND,
    Envelope,
    PodGroupSubmitted,
    PodSubmitted,
    QuotaDefined,
)
from shards import wouldrun
from shards.inputs.scenario import Scenario, TimedEvent
from shards.simulate import simulate
from shards.whatif import MAX_ROWS, facts, input_records, log_sharding, outcome

NEEDS = "a dry run (whatif)"


@dataclass(frozen=True, slots=True)
class Point:
    """Where in the log the job is submitted: a time (ns) and the last offset of the
    inputs partition whose input is known then (None: every input up to ``time``)."""

    time: int
    offset: int | None = None

    def describe(self) -> str:
        seconds = f"{_number(self.time / SECOND):g}s"
        return seconds if self.offset is None else f"{seconds} (offset {self.offset})"


def point_of(parts: Sequence[Sequence[Envelope]], at: int | None, at_time: float | None) -> Point:
    """The point ``--at OFFSET`` (of the inputs partition, the last one) or
    ``--at-time SECONDS`` names; neither: the log's end (its last record's time)."""
    control = parts[-1]
    if at is not None and at_time is not None:
        raise InputError("give --at or --at-time, not both", location="--at")
    if at is not None:
        for env in control:
            if env.offset == at:
                return Point(env.time, at)
        last = control[-1].offset if control else -1
        raise InputError(
            f"offset {at} is past the end of the inputs partition (last offset {last})",
            location="--at",
        )
    if at_time is not None:
        if not at_time >= 0:
            raise InputError(f"expected seconds >= 0, got {at_time:g}", location="--at-time")
        return Point(round(at_time * SECOND))
    return Point(max((env.time for part in parts for env in part), default=0))


@dataclass
class Job:
    """The job's objects as a scenario, and the names it brings, in its order."""

    scenario: Scenario
    pods: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)


def job_of(scenario: Scenario, where: str) -> Job:
    """The job a loaded scenario describes; refuses what a dry run cannot honour: a
    scheduler configuration, topology or sharding (the log's recorded ones are used),
    and a job with no pod."""
    if scenario.config is not None:
        raise InputError(
            "a dry run uses the log's recorded scheduler configuration and topology: "
            "leave KubeSchedulerConfiguration, Topology and HyperNode objects out",
            location=where,
        )
    if scenario.sharding is not None:
        raise InputError(
            "a dry run uses the log's recorded sharding: leave the sharding document out",
            location=where,
        )
    job = Job(scenario)
    for timed in scenario.events:
        event = timed.event
        if isinstance(event, PodSubmitted):
            job.pods.append(event.pod.key)
        elif isinstance(event, PodGroupSubmitted):
            job.groups.append(event.group.key)
    if not job.pods:
        raise InputError("no pod to place (a job of Pods or workload objects)", location=where)
    return job


def check_names(parts: Sequence[Sequence[Envelope]], job: Job, where: str) -> None:
    """Refuse a job whose pod, pod group or quota namespace the log already has (the
    answer would be about another object of that name)."""
    pods, groups = set(job.pods), set(job.groups)
    quotas = {
        e.event.quota.namespace for e in job.scenario.events if isinstance(e.event, QuotaDefined)
    }
    for env in parts[-1]:
        event = env.event
        taken = ""
        if isinstance(event, PodSubmitted) and event.pod.key in pods:
            taken = f"pod {event.pod.key}"
        elif isinstance(event, PodGroupSubmitted) and event.group.key in groups:
            taken = f"pod group {event.group.key}"
        elif isinstance(event, QuotaDefined) and event.quota.namespace in quotas:
            taken = f"a quota for namespace {event.quota.namespace}"
        if taken:
            raise InputError(
                f"{taken} is already in the log (offset {env.offset}); rename it", location=where
            )


def dry_run_scenario(
    parts: Sequence[Sequence[Envelope]], job: Job, point: Point, *, later: bool, where: str
) -> Scenario:
    """The log's inputs known at ``point`` (all of them with ``later``) and the job's
    objects arriving there, as one scenario; the job's objects come after the inputs
    of the same instant, and those ``later`` adds after the job's."""
    events: list[TimedEvent] = []
    after: list[Envelope] = []
    for env in input_records(parts, where, NEEDS):
        known = env.offset <= point.offset if point.offset is not None else env.time <= point.time
        if known:
            events.append(TimedEvent(env.time, len(events), env.event))
        elif later:
            after.append(env)
    for timed in job.scenario.events:
        events.append(TimedEvent(point.time + timed.time, len(events), timed.event))
    events += (TimedEvent(env.time, len(events) + i, env.event) for i, env in enumerate(after))
    events.sort(key=lambda e: (e.time, e.order))
    return Scenario(events=events)


# --------------------------------------------------------------------------- the answer


def _number(value: float) -> float:
    """Rounded to a millionth, and whole numbers as integers (deterministic text)."""
    rounded = round(value, 6)
    return int(rounded) if rounded == int(rounded) else rounded


def answers(parts: Sequence[Sequence[Envelope]], job: Job) -> dict[str, Any]:
    """What a run (its partitions, the control one last) did with the job's pods: for
    each, the node it was first placed on and the nodes after (moves), the seconds from
    its submission to that placement, the pods its placement preempted or moved, how it
    ended, and, never placed, the engine's reason; and the preemptions and moves made
    for the job's pod groups."""
    run = facts(parts)
    report = run.report
    rows: list[dict[str, Any]] = []
    for key in job.pods:
        view = report.pods.get(key)
        nodes = run.nodes.get(key, [])
        bound = run.first_bound.get(key)
        submitted = run.submitted.get(key, 0)
        rows.append(
            {
                "pod": key,
                "node": nodes[0] if nodes else None,
                "nodes": nodes,
                "wait_seconds": None if bound is None else _number((bound - submitted) / SECOND),
                "placed_at_seconds": None if bound is None else _number(bound / SECOND),
                "preempts": [
                    {"pod": p["pod"], "node": p["node"]}
                    for p in report.preemptions
                    if p["by"] == key
                ],
                "moves": [
                    {"pod": m["pod"], "from": m["from"], "to": m["to"]}
                    for m in report.migrations
                    if m["by"] == key
                ],
                "outcome": outcome(view, nodes),
                "reason": view.reason if view is not None and bound is None else "",
            }
        )
    groups = set(job.groups)
    return {
        "pods": rows,
        "group_preemptions": [dict(p) for p in report.preemptions if p["by"] in groups],
        "group_moves": [dict(m) for m in report.migrations if m["by"] in groups],
    }


@dataclass
class DryRun:
    """A dry run's answer, and where it was asked."""

    point: Point
    shards: int
    later: bool
    answer: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "at_seconds": _number(self.point.time / SECOND),
            "at_offset": self.point.offset,
            "with_later": self.later,
            "shards": self.shards,
            **self.answer,
        }

    def table(self) -> list[str]:
        """The answer as lines of text (plain columns, for a terminal and a test)."""
        pods: list[dict[str, Any]] = self.answer["pods"]
        placed = sum(1 for r in pods if r["node"] is not None)
        shards = f"{self.shards} shard{'s' if self.shards > 1 else ''}"
        known = "every input, later ones too" if self.later else "the inputs known then"
        lines = [
            f"submitted at {self.point.describe()}, {known}, {shards}: "
            f"{placed} of {len(pods)} pods placed"
        ]
        cells = [
            [
                r["pod"],
                r["node"] or "-",
                "-" if r["wait_seconds"] is None else f"{r['wait_seconds']:g}",
                r["outcome"],
                r["reason"],
            ]
            for r in pods[:MAX_ROWS]
        ]
        lines += _columns(["POD", "NODE", "WAIT (s)", "OUTCOME", "WHY NOT PLACED"], cells)
        if len(pods) > MAX_ROWS:
            lines.append(f"... and {len(pods) - MAX_ROWS} more pods (--json lists them all)")
        units: dict[str, list[str]] = {}
        for r in pods:
            cf = r.get("counterfactual")
            if cf is not None:
                units.setdefault(cf["text"], []).append(r["pod"])
        lines += (f"{', '.join(keys)}: {text}" for text, keys in units.items())
        for r in pods:
            lines += (f"{r['pod']} preempts {p['pod']} on {p['node']}" for p in r["preempts"])
            lines += (f"{r['pod']} moves {m['pod']} {m['from']} → {m['to']}" for m in r["moves"])
        for p in self.answer["group_preemptions"]:
            lines.append(f"{p['by']} preempts {p['pod']} on {p['node']}")
        for m in self.answer["group_moves"]:
            lines.append(f"{m['by']} moves {m['pod']} {m['from']} → {m['to']}")
        return lines


def _columns(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]


async def dry_run(
    parts: Sequence[Sequence[Envelope]],
    job: Job,
    config: SchedulerConfig | None,
    point: Point,
    *,
    later: bool = False,
    where: str = "the log",
) -> DryRun:
    """The job submitted at ``point`` of the recorded run ``parts``, run to its end at
    the log's shard count under ``config`` (the recorded one)."""
    check_names(parts, job, where)
    scenario = dry_run_scenario(parts, job, point, later=later, where=where)
    log = MemoryLog(len(parts))
    result = await simulate(scenario, log, config, sharding=log_sharding(parts))
    run = [await log.read(p, 0) for p in range(log.partitions)]
    shards = len(parts) - 1 if len(parts) > 1 else 1
    answer = answers(run, job)
    engine = wouldrun.whole_engine(
        result.engines, result.control.engine if result.control is not None else None
    )
    waiting = [r["pod"] for r in answer["pods"] if r["node"] is None]
    found = wouldrun.find(engine, [p for p in waiting if p in result.report.pods])
    for row in answer["pods"]:
        if row["node"] is None:
            cf = found.get(row["pod"])
            row["counterfactual"] = cf.to_json() if cf is not None else None
    return DryRun(point, shards, later, answer)
