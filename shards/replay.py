"""Replay a recorded log: rebuild the state, re-derive decisions, explain a pod.

A shard's pass ran right after it folded the input at offset ``causation``; every
decision of that pass carries it. Replay folds the log input by input and, after the
input a recorded pass was caused by, runs the pass again and compares what it derives
with what was recorded, decision by decision. The first difference is reported with
the offset of the recorded decision; a recorded decision that no pass derives (or a
pass that derives more than was recorded) is a difference too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

import msgspec

from engine.config import SchedulerConfig, parse_config
from engine.engine import Engine
from engine.framework.registry import Registry
from engine.model.pools import PROTOCOL, Sharding
from engine.snapshot import FORMAT, SnapshotError, digest, encode_state, format_of
from events.errors import (
    InputError,
    LogCorruptedError,
    ReplayMismatchError,
    UnverifiableLogError,
)
from events.log import quarantined_in
from events.types import (
    Envelope,
    Event,
    PodBound,
    PodGroupStatusChanged,
    PodSpec,
    PodSubmitted,
    PodUnschedulable,
    SchedulerConfigured,
    ShardingConfigured,
    SnapshotTaken,
    is_decision,
    is_output_of,
)
from shards import plugins
from shards.coordinator.coordinator import ROUTER, Coordinator
from shards.coordinator.snapshot import COORDINATOR, coordinator_state, snapshot_digest
from shards.report import RunReport, merge


@dataclass
class ReplayResult:
    report: RunReport
    engine: Engine
    verified: int = 0
    """Decisions re-derived and found equal."""
    passes: int = 0
    mismatch: ReplayMismatchError | None = None
    explained: PodSpec | None = None
    """The submitted spec of the pod under ``--explain``."""
    snapshots: int = 0
    """Snapshots checked against the state replay derives."""
    older_snapshots: int = 0
    """Snapshots written in another format (by another version): not compared."""
    unappended: list[Event] | None = None
    """With ``cut_tail``: the decisions of the last recorded pass that replay derives
    past those recorded (the shard died between two chunks of their append), to be
    appended by the restarted shard, caused by ``unappended_cause`` at
    ``unappended_time``."""
    unappended_cause: int = -1
    unappended_time: int = 0
    unforwarded: int = 0
    """Coordinator outputs derived from the end of the control partition but not in the
    log (yet): it stopped before appending them. A restarted one appends them; only a
    tail can be missing, a gap is a mismatch."""
    coordinator: Coordinator | None = None
    """The coordinator as the control partition leaves it (several shards, verified)."""

    def dependencies(self) -> list[tuple[str, str]]:
        """(dependency, its state at the end of the replay) for the explained pod."""
        spec = self.explained
        if spec is None:
            return []
        deps = list(spec.depends_on)
        group = self.engine.groups.get(spec.group)
        if group is not None and group.spec is not None:
            deps = [*group.spec.depends_on, *deps]
        return list(self.engine.dependency_state(tuple(dict.fromkeys(deps))).details)


T = TypeVar("T")


def _describe(event: Event | None) -> str:
    if event is None:
        return "nothing"
    data = msgspec.structs.asdict(event)
    fields = ", ".join(f"{k}={v!r}" for k, v in data.items() if k not in ("rejections",))
    return f"{type(event).__name__}({fields})"


def _in_report_order(items: Sequence[T], event: Callable[[T], Event]) -> list[T]:
    """``items`` with each run of group status reports in the order of their groups: a
    pass's reports are a set (the engine makes them in that order; logs of the earlier
    version listed them in the order the groups changed, which a pass that reported
    nothing, and so left no record to re-run, could change)."""
    out = list(items)
    start = 0
    while start < len(out):
        end = start
        while end < len(out) and isinstance(event(out[end]), PodGroupStatusChanged):
            end += 1
        if end - start > 1:
            out[start:end] = sorted(
                out[start:end], key=lambda i: cast(PodGroupStatusChanged, event(i)).group
            )
        start = end + 1
    return out


def same_decision(derived: Event | None, recorded: Event | None) -> bool:
    """Whether replay derived the recorded decision. A ``PodBound`` recorded without
    GPU cards (logs written before cards were modelled) matches the same binding with
    the cards replay chooses; a ``PodUnschedulable`` recorded without an answer (logs
    written before answers were composed) matches the same one with the answer replay
    composes."""
    if derived == recorded:
        return True
    if (
        isinstance(derived, PodUnschedulable)
        and isinstance(recorded, PodUnschedulable)
        and recorded.answer is None
        and derived.answer is not None
    ):
        return msgspec.structs.replace(derived, answer=None) == recorded
    if (
        isinstance(derived, PodBound)
        and isinstance(recorded, PodBound)
        and not recorded.devices
        and derived.devices
    ):
        return msgspec.structs.replace(derived, devices=()) == recorded
    return False


def _first_difference(derived: Sequence[Event], recorded: Sequence[Envelope]) -> int | None:
    for i in range(max(len(derived), len(recorded))):
        d = derived[i] if i < len(derived) else None
        r = recorded[i].event if i < len(recorded) else None
        if not same_decision(d, r):
            return i
    return None


def recorded_config(records: Sequence[Envelope]) -> SchedulerConfig | None:
    """The configuration recorded at the start of the log (None: the defaults), past
    any the run quarantined."""
    skipped = quarantined_in(records)
    for env in records:
        if isinstance(env.event, SchedulerConfigured) and env.offset not in skipped:
            if not env.event.config:
                return None
            try:
                raw = json.loads(env.event.config)
                return parse_config(raw, "recorded configuration")
            except (ValueError, InputError) as exc:
                raise LogCorruptedError(
                    f"recorded configuration is invalid: {exc}",
                    partition=env.partition,
                    offset=env.offset,
                ) from None
    return None


@dataclass
class Resume:
    """Where a replay starts instead of the beginning: an engine restored from a
    snapshot, and the first record it has not folded."""

    engine: Engine
    position: int


def snapshots_in(records: Sequence[Envelope], producer: str) -> dict[int, list[Envelope]]:
    """Complete snapshots of ``producer`` in ``records``, by the pass they follow
    (their causation): the parts, in order. Incomplete ones are left out."""
    found: dict[int, list[Envelope]] = {}
    run: list[Envelope] = []
    sha = ""
    for env in records:
        event = env.event
        if not isinstance(event, SnapshotTaken) or env.producer != producer:
            continue
        if event.part == 0:
            run, sha = [], event.digest
        if event.part == len(run) and event.digest == sha:
            run.append(env)
            if len(run) == event.parts:
                found[env.causation] = run
                run = []
        else:
            run = []
    return found


def replay(
    records: Sequence[Envelope],
    config: SchedulerConfig | None = None,
    *,
    verify: bool = False,
    explain: str | None = None,
    until: int | None = None,
    shard: int = 0,
    resume: Resume | None = None,
    registry: Registry | None = None,
    cut_tail: bool = False,
) -> ReplayResult:
    """Fold ``records`` (one partition, in offset order) through a fresh engine, or
    through ``resume``'s engine from its position on (earlier records are skipped).

    With ``verify``, every recorded pass of ``shard`` is re-run and compared, and so is
    every snapshot with the state after the pass it follows; the first difference is
    returned in ``mismatch`` (not raised). ``until`` stops after that offset.
    ``explain`` records diagnoses for that pod's attempts. With ``cut_tail`` (a shard
    restarting), the last recorded pass may hold only the first of the decisions
    replay derives (a bus stores a large append chunk by chunk, and the shard died
    between two): the rest is returned in ``unappended``, not a mismatch.
    """
    if config is None and resume is None:
        config = recorded_config(records)
    if registry is None and resume is None:
        registry = plugins.for_records(records, config).registry
    engine = resume.engine if resume is not None else Engine(config, shard=shard, registry=registry)
    start = resume.position if resume is not None else 0
    engine.explain = explain
    producer = f"shard-{shard}"
    result = ReplayResult(report=RunReport(), engine=engine)
    passes: dict[int, list[Envelope]] = {}
    for env in records:
        if is_decision(env.event) and env.producer == producer and env.causation >= start:
            passes.setdefault(env.causation, []).append(env)
    inputs = {env.offset for env in records if not is_output_of(env, producer)}
    for causation, batch in passes.items():
        if causation not in inputs and verify:
            result.mismatch = ReplayMismatchError(
                f"recorded {_describe(batch[0].event)} names causation {causation}, "
                "which is not an input in this log",
                offset=batch[0].offset,
            )
            return result
    rederive = verify or explain is not None
    last_pass = max(passes, default=-1) if cut_tail else -2
    snapshots = snapshots_in(records, producer) if verify else {}
    for env in records:
        if until is not None and env.offset > until:
            break
        if env.offset < start:
            continue
        if isinstance(env.event, SnapshotTaken) and env.producer == producer:
            continue  # folding it changes nothing; verified after the pass it follows
        result.report.apply(env)
        if isinstance(env.event, PodSubmitted) and env.event.pod.key == explain:
            result.explained = env.event.pod
        if is_decision(env.event) and env.producer == producer:
            # When re-deriving, its pass already applied it; otherwise folding it is how
            # the state learns it (unless the resumed state has it already).
            if not rederive and env.causation >= start:
                engine.apply(env)
            continue
        engine.apply(env)
        recorded = passes.get(env.offset)
        if recorded is None or not rederive:
            continue
        if recorded[0].time != engine.now:
            result.mismatch = ReplayMismatchError(
                f"recorded pass ran at {recorded[0].time} ns, replay is at {engine.now} ns",
                offset=recorded[0].offset,
            )
            return result
        derived = engine.schedule()
        if env.offset == last_pass and len(derived) > len(recorded):
            rest = _cut_rest(derived, recorded)
            if rest is not None:
                result.unappended = rest
                result.unappended_cause, result.unappended_time = env.offset, engine.now
                derived = derived[: len(recorded)]
        derived = _in_report_order(derived, lambda e: e)
        recorded = _in_report_order(recorded, lambda env: env.event)
        result.passes += 1
        index = _first_difference(derived, recorded)
        if index is not None:
            rec = recorded[index] if index < len(recorded) else None
            got = derived[index] if index < len(derived) else None
            offset = rec.offset if rec is not None else recorded[-1].offset
            result.mismatch = ReplayMismatchError(
                f"recorded {_describe(rec.event if rec else None)}, "
                f"but replay derives {_describe(got)}",
                offset=offset,
            )
            return result
        result.verified += len(recorded)
        snapshot = snapshots.get(env.offset)
        if snapshot is not None:
            first = snapshot[0].event
            assert isinstance(first, SnapshotTaken)
            same = digest(encode_state(engine)) == first.digest
            if not same and _earlier_format(snapshot):
                result.older_snapshots += 1
                continue
            if not same:
                result.mismatch = ReplayMismatchError(
                    "the recorded snapshot differs from the state replay derives after the "
                    f"pass it follows (caused by {env.offset})",
                    offset=snapshot[0].offset,
                )
                return result
            result.snapshots += 1
    if verify:
        engine.state.check_invariants()
    return result


def _cut_rest(derived: Sequence[Event], recorded: Sequence[Envelope]) -> list[Event] | None:
    """What ``derived`` holds past ``recorded``, if ``recorded`` is its beginning (in
    the order the pass made them, which is the order they were appended); else None."""
    if all(same_decision(d, r.event) for d, r in zip(derived, recorded, strict=False)):
        return list(derived[len(recorded) :])
    return None


def sharding_of(control: Sequence[Envelope]) -> Sharding:
    for env in control:
        if isinstance(env.event, ShardingConfigured):
            try:
                return Sharding.from_json(env.event.config)
            except (ValueError, KeyError, TypeError) as exc:
                raise LogCorruptedError(
                    f"recorded sharding configuration is invalid: {exc}",
                    partition=env.partition,
                    offset=env.offset,
                ) from None
    raise LogCorruptedError(
        "a log with several partitions must start its last (control) partition with the "
        "sharding configuration",
        partition=len(control) and control[0].partition,
        offset=0,
    )


def verify_control(
    parts: Sequence[Sequence[Envelope]],
    config: SchedulerConfig | None = None,
    into: ReplayResult | None = None,
    registry: Registry | None = None,
) -> tuple[int, int, int, ReplayMismatchError | None]:
    """Fold the control partition again, re-run the coordinator's passes where they ran
    (the causations of its records), and compare what each derives with what it
    appended, partition by partition, and each of its snapshots with the state it
    re-derives. Returns (records checked, records not appended yet, snapshots checked,
    the first difference).

    The coordinator appends each partition's records in the order of their causes, so
    what a stopped coordinator had not appended yet is a tail of each partition: derived
    records past the last recorded one are counted, not a mismatch."""
    control_records = parts[-1]
    sharding = sharding_of(control_records)
    if sharding.protocol != PROTOCOL:
        return 0, 0, 0, _unverifiable(sharding.protocol)
    if registry is None:
        registry = plugins.for_records(control_records, config).registry
    coordinator = Coordinator(sharding, config, registry)
    if into is not None:
        into.coordinator = coordinator
    recorded: list[dict[int, list[Envelope]]] = []
    last: list[int] = []
    for records in parts:
        by_cause: dict[int, list[Envelope]] = {}
        for env in records:
            if env.producer == ROUTER:
                by_cause.setdefault(env.causation, []).append(env)
        recorded.append(by_cause)
        last.append(max(by_cause, default=-1))
    points = {cause for by_cause in recorded for cause in by_cause}
    checked = pending = verified = 0
    snapshots = snapshots_in(control_records, COORDINATOR)
    last_input = -1
    for env in control_records:
        coordinator.apply(env)
        if env.producer not in (ROUTER, COORDINATOR):
            last_input = env.offset
        if env.offset in points:
            derived: dict[int, list[Event]] = {}
            for partition, event in coordinator.schedule():
                derived.setdefault(partition, []).append(event)
            for partition in range(len(parts)):
                got = _in_report_order(derived.get(partition, []), lambda e: e)
                had = _in_report_order(recorded[partition].get(env.offset, []), lambda r: r.event)
                for i in range(max(len(got), len(had))):
                    if i >= len(had):
                        if last[partition] > env.offset:
                            return checked, pending, verified, _gap(partition, got[i], env.offset)
                        pending += len(got) - i
                        break
                    if i >= len(got) or not same_decision(got[i], had[i].event):
                        return (
                            checked,
                            pending,
                            verified,
                            ReplayMismatchError(
                                f"partition {partition}: recorded {_describe(had[i].event)} "
                                f"(caused by {env.offset}), but the coordinator derives "
                                f"{_describe(got[i] if i < len(got) else None)}",
                                offset=had[i].offset,
                            ),
                        )
                    checked += 1
        snapshot = snapshots.get(env.offset)
        if snapshot is not None and not _earlier_format(snapshot):
            mismatch = _check_coordinator_snapshot(coordinator, snapshot)
            if mismatch is not None:
                return checked, pending, verified, mismatch
            verified += 1
    if last_input > max(points, default=-1):
        pending += len(coordinator.schedule())  # the pass it was owed: not run yet
    return checked, pending, verified, None


def _earlier_format(snapshot: list[Envelope]) -> bool:
    """Whether a snapshot was written in another format than this version's (its state
    cannot be compared, though the records around it can)."""
    parts = [e.event for e in snapshot if isinstance(e.event, SnapshotTaken)]
    fmt = format_of(parts)
    return fmt is not None and fmt != FORMAT


def _unverifiable(protocol: int) -> UnverifiableLogError:
    return UnverifiableLogError(
        f"the log was recorded under coordinator protocol {protocol} (an earlier version "
        f"of shoal); this version re-derives protocol {PROTOCOL} only: the report is "
        "complete, but its decisions cannot be checked"
    )


def _gap(partition: int, event: Event, cause: int) -> ReplayMismatchError:
    return ReplayMismatchError(
        f"partition {partition}: the coordinator derives {_describe(event)} (caused by "
        f"{cause}), which was never appended though later records were",
        offset=cause,
    )


def _check_coordinator_snapshot(
    coordinator: Coordinator, snapshot: list[Envelope]
) -> ReplayMismatchError | None:
    """Compare a coordinator snapshot with the fold of the records before it."""
    parts = [e.event for e in snapshot if isinstance(e.event, SnapshotTaken)]
    try:
        recorded = snapshot_digest(parts)
    except SnapshotError as exc:
        return ReplayMismatchError(
            f"the coordinator snapshot cannot be read: {exc}", offset=snapshot[0].offset
        )
    if digest(coordinator_state(coordinator)) != recorded:
        return ReplayMismatchError(
            "the coordinator snapshot differs from the fold of the records before it",
            offset=snapshot[0].offset,
        )
    return None


def replay_routed(
    parts: Sequence[Sequence[Envelope]],
    config: SchedulerConfig | None = None,
    *,
    verify: bool = False,
    explain: str | None = None,
    registry: Registry | None = None,
) -> ReplayResult:
    """Replay a log of several shards: the router's fold of the control partition, and
    each shard's partition as :func:`replay` does. The report covers every partition;
    ``engine`` is the engine of the shard that last held the explained pod."""
    control = len(parts) - 1
    report = RunReport(control=control)
    for env in merge([list(p) for p in parts]):
        report.apply(env)
    result = ReplayResult(report=report, engine=Engine(config))
    if verify:
        checked, result.unforwarded, snapshots, mismatch = verify_control(
            parts, config, result, registry
        )
        result.verified += checked
        result.snapshots += snapshots
        if mismatch is not None:
            result.mismatch = mismatch
            return result
    owner = report.current.get(explain, (0, 0))[1] if explain is not None else 0
    if explain is not None and explain in report.pods and report.pods[explain].shard is not None:
        owner = report.pods[explain].shard or owner
    for shard in range(control):
        wanted = explain if shard == owner else None
        if not verify and wanted is None:
            continue
        part = replay(
            parts[shard], config, verify=verify, explain=wanted, shard=shard, registry=registry
        )
        result.verified += part.verified
        result.passes += part.passes
        result.snapshots += part.snapshots
        result.older_snapshots += part.older_snapshots
        if shard == owner:
            result.engine = part.engine
            result.explained = part.explained
        if part.mismatch is not None:
            detail = str(part.mismatch).split(": ", 1)[-1]
            result.mismatch = ReplayMismatchError(
                f"partition {shard} (shard {shard}): {detail}", offset=part.mismatch.offset
            )
            return result
    if explain is not None and result.explained is None:
        for env in parts[control]:
            if isinstance(env.event, PodSubmitted) and env.event.pod.key == explain:
                result.explained = env.event.pod
    return result
