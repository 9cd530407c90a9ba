"""The control worker: the router and coordinator's I/O around the pure fold.

Each ``poll``:

1. *relays* the reports shards appended to their partitions (hand-backs, summaries,
   reservation answers, outcomes: ``events.types.REPORTS``) into the control partition,
   as copies with ``stream="relay"``, ``producer="relay-<shard>"`` and ``causation`` =
   the offset in the shard's partition. The order of the copies is the order the fold
   sees, so the fold stays a function of the control partition alone;
2. *folds* the control partition (:class:`shards.router.Control`; runs of plain pods
   through :class:`shards.fastroute.RunRouter`, to the same effect) and appends each
   record's outputs, with ``causation`` = that record's offset and producer ``router``,
   a slice of records at a time.

Crash safety. The fold's outputs for control record ``k`` depend only on records
``0..k``, and outputs are appended per partition in causation order, one atomic append
per partition and slice of records. So a restarted worker scans each partition once for the
highest ``causation`` of a ``router`` record it holds, folds the control partition from
the start, and appends only outputs caused by later records: nothing is lost and
nothing is sent twice. Relaying resumes after the last copy the fold has seen (and a
copy of a copy is ignored by the fold in any case).

Snapshots. With ``snapshot_every`` set, the worker appends its state to the control
partition (``SnapshotTaken`` parts, producer ``coordinator``) every that many folded
records (with ``snapshot_per_pod``, at least that many per pod the router holds, as a
shard does): the fold, its position, and per partition the offset of the last record it
appended. A restarted worker restores the newest one and scans each partition only
after that offset; one that cannot be restored is reported and the scan starts from
the beginning, as without snapshots.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

from engine.model.pools import PoolRule, Sharding
from engine.snapshot import (
    Allowed,
    SnapshotError,
    assemble,
    decode_state,
    decode_tree,
    digest,
    encode_tree,
    snapshot_parts,
)
from events.log import EventLog, read_kinds
from events.types import (
    REPORTS,
    Envelope,
    ReservationCommitted,
    ReservationRequested,
    ShardSummary,
    SnapshotTaken,
)
from shards.fastroute import RunRouter
from shards.router import RELAY, ROUTER, Control, _Gang, _Shard
from shards.worker import append_snapshot, newest_snapshot, snapshot_due

logger = logging.getLogger(__name__)
COORDINATOR: Final = "coordinator"
"""The producer of the coordinator's snapshots."""
ALLOWED: Final = Allowed.of(Control, _Shard, _Gang, Sharding, PoolRule)

FOLD_SLICE: Final = 1000
"""Control records folded before their outputs are appended: a burst of pods reaches
the shards in slices they start on while the router folds the next, not all at once
after it. (The worker still reads all that is new at once: on Kafka, every read seeks
and fetches again.)"""

REPORT_KINDS = tuple(str(kind.__struct_config__.tag) for kind in REPORTS)


class ControlWorker:
    def __init__(
        self,
        control: Control,
        log: EventLog,
        *,
        snapshot_every: int = 0,
        snapshot_per_pod: int = 0,
    ) -> None:
        self.control = control
        self.log = log
        self.router = RunRouter()
        """Folds control records like ``control.apply``, runs of plain pods at once."""
        self.fold_slice = FOLD_SLICE
        self.partition = control.control
        self.position = 0
        self.written = [-1] * (control.n + 1)
        """Per partition: the causation of the last router record it holds."""
        self.last_own = [-1] * (control.n + 1)
        """Per partition: the offset of the last record this worker (or a predecessor)
        appended there; a restart from a snapshot scans only after it."""
        self.snapshot_every = snapshot_every
        self.snapshot_per_pod = snapshot_per_pod
        self.snapshot_at = 0
        self.snapshots = 0
        self.restored_from = -1
        self.relay_from = [0] * control.n
        self._recovered = False
        self.folded = 0
        self.relayed = 0
        self.prepared_at: dict[str, float] = {}
        """Reservation → wall time its requests were appended (for commit latency)."""
        self.commit_seconds: list[float] = []
        """Wall seconds from appending a gang's prepare to appending its commit."""

    def __repr__(self) -> str:
        return f"ControlWorker(position={self.position}, relay_from={self.relay_from})"

    async def recover(self, *, use_snapshots: bool = True) -> None:
        """Find what a previous incarnation already appended (a fresh log: nothing):
        from its newest snapshot on, if there is one, else from the start."""
        start = [0] * (self.control.n + 1)
        found = None
        if use_snapshots:
            found = await newest_snapshot(self.log, self.partition, COORDINATOR)
        if found is not None:
            try:
                self._restore([e.event for e in found if isinstance(e.event, SnapshotTaken)])
                self.restored_from = found[0].offset
                start = [offset + 1 for offset in self.last_own]
            except SnapshotError as exc:
                logger.warning(
                    "coordinator snapshot not restored; folding from the start offset=%d error=%s",
                    found[0].offset,
                    exc,
                )
        for partition in range(self.control.n + 1):
            offset = start[partition]
            while records := await self.log.read(partition, offset, 10_000):
                for env in records:
                    if env.producer == ROUTER and env.causation > self.written[partition]:
                        self.written[partition] = env.causation
                    if env.producer in (ROUTER, COORDINATOR) or (
                        partition == self.partition and env.stream == RELAY
                    ):
                        self.last_own[partition] = env.offset
                offset = records[-1].offset + 1
        self._recovered = True

    def state(self) -> bytes:
        """The worker's state as snapshot bytes (the fold and where it stands)."""
        control = self.control
        header = {
            "component": COORDINATOR,
            "shards": control.n,
            "control": digest(control_state(control)),
        }
        pairs = [
            ("control", control),
            ("position", self.position),
            ("written", self.written),
            ("last_own", self.last_own),
            ("relay_from", self.relay_from),
        ]
        return encode_tree(header, pairs, ALLOWED)

    def _restore(self, parts: list[SnapshotTaken]) -> None:
        tree = decode_tree(assemble(parts))
        if tree.get("component") != COORDINATOR or tree.get("shards") != self.control.n:
            raise SnapshotError("not a snapshot of this coordinator")
        like = _Saved(self.control, self.position, self.written, self.last_own, self.relay_from)
        restored, _ = decode_state(tree, ALLOWED, like, frozenset())
        control = restored["control"]
        if not isinstance(control, Control) or control.sharding != self.control.sharding:
            raise SnapshotError("a snapshot of another sharding")
        n = self.control.n
        lists = (restored["written"], restored["last_own"], restored["relay_from"])
        if [len(v) for v in lists] != [n + 1, n + 1, n] or not all(
            isinstance(x, int) for v in lists for x in v
        ):
            raise SnapshotError("malformed positions")
        if not isinstance(restored["position"], int) or restored["position"] < 0:
            raise SnapshotError("malformed position")
        self.control = control
        self.position = self.snapshot_at = restored["position"]
        self.written, self.last_own, self.relay_from = (list(v) for v in lists)

    async def poll(self) -> int:
        """Fold what is new, relay what shards reported, fold again; return appended."""
        if not self._recovered:
            await self.recover()
        appended = await self._fold()
        appended += await self._relay()
        if appended:
            appended += await self._fold()
        if snapshot_due(
            self.position - self.snapshot_at,
            len(self.control.pods),
            self.snapshot_every,
            self.snapshot_per_pod,
        ):
            await self._snapshot()
        return appended

    async def _snapshot(self) -> None:
        parts = snapshot_parts(self.state(), self.position, component=COORDINATOR)
        offsets = await append_snapshot(
            self.log,
            self.partition,
            parts,
            at=self.control.now,
            causation=self.position - 1,
            producer=COORDINATOR,
        )
        self.last_own[self.partition] = offsets[-1]
        self.snapshot_at = self.position
        self.snapshots += 1

    async def _relay(self) -> int:
        control = self.control
        copies: list[Envelope] = []
        for shard in range(control.n):
            start = max(self.relay_from[shard], control.relayed[shard] + 1)
            stop, records = await read_kinds(self.log, shard, start, REPORT_KINDS)
            self.relay_from[shard] = max(stop, start)
            if not records:
                continue
            producer = f"{RELAY}-{shard}"
            last_summary = -1
            for env in records:
                if isinstance(env.event, ShardSummary):
                    last_summary = env.offset
            for env in records:
                event = env.event
                if not isinstance(event, REPORTS):
                    continue
                if isinstance(event, ShardSummary) and env.offset != last_summary:
                    continue  # only the newest summary of a read matters
                copies.append(
                    Envelope(
                        event=event,
                        time=env.time,
                        stream=RELAY,
                        causation=env.offset,
                        producer=producer,
                    )
                )
        if not copies:
            return 0
        offsets = await self.log.append(copies, self.partition)
        self.last_own[self.partition] = offsets[-1]
        self.relayed += len(copies)
        return len(copies)

    async def _fold(self) -> int:
        """Fold the new control records, ``fold_slice`` at a time, appending each
        slice's outputs before folding the next: a burst of pods reaches the shards in
        slices they start on while the router folds the rest."""
        records = await self.log.read(self.partition, self.position)
        appended = 0
        for start in range(0, len(records), self.fold_slice):
            appended += await self._fold_slice(records[start : start + self.fold_slice])
        return appended

    async def _fold_slice(self, records: list[Envelope]) -> int:
        control = self.control
        written = self.written
        outputs: dict[int, list[Envelope]] = {}
        for offset, now, events in self.router.fold(control, records):
            for partition, event in events:
                if offset <= written[partition]:
                    continue  # appended before a restart
                outputs.setdefault(partition, []).append(
                    Envelope(event=event, time=now, causation=offset, producer=ROUTER)
                )
        self.position = records[-1].offset + 1
        self.folded += len(records)
        appended = 0
        for partition in sorted(outputs):
            batch = outputs[partition]
            offsets = await self.log.append(batch, partition)
            written[partition] = batch[-1].causation
            self.last_own[partition] = offsets[-1]
            appended += len(batch)
            self._timestamps(batch)
        return appended

    def _timestamps(self, batch: list[Envelope]) -> None:
        now = time.perf_counter()
        for env in batch:
            event = env.event
            if isinstance(event, ReservationRequested):
                self.prepared_at.setdefault(event.rid, now)
            elif isinstance(event, ReservationCommitted):
                started = self.prepared_at.pop(event.rid, None)
                if started is not None:
                    self.commit_seconds.append(now - started)


class _Saved:
    """The shape of a coordinator snapshot's state (what :func:`decode_state` checks)."""

    def __init__(
        self,
        control: Control,
        position: int,
        written: list[int],
        last_own: list[int],
        relay_from: list[int],
    ) -> None:
        self.control = control
        self.position = position
        self.written = written
        self.last_own = last_own
        self.relay_from = relay_from


def control_state(control: Control) -> bytes:
    """The fold's state alone, as bytes (what replay compares with a snapshot)."""
    return encode_tree({}, [("control", control)], ALLOWED)


def snapshot_control_digest(parts: list[SnapshotTaken]) -> str:
    """The digest of the fold's state recorded in a coordinator snapshot."""
    tree: dict[str, Any] = decode_tree(assemble(parts))
    recorded = tree.get("control")
    if not isinstance(recorded, str):
        raise SnapshotError("no digest of the fold's state")
    return recorded
