"""The binder: applies shard decisions to the (simulated) cluster, optimistically.

It follows the log behind the shards; a ``PodBound`` the cluster cannot honour becomes a
``BindFailed`` in the deciding shard's partition (the shard then un-assumes and
requeues the pod, or rolls its gang back); a ``PodUnbound`` takes a placement back. The
cluster's own consequences (pods lost with a node) are appended by the binder too, as
the cluster's voice in the log: to the partition cluster inputs go to (the control
partition when there are several shards).

With several shards the binder reads the control partition first (what exists: nodes,
pods) and then every shard partition (what was decided), so a decision never arrives
before the pod it places.
"""

from __future__ import annotations

import logging

from events.log import EventLog, read_past_unreadable
from events.types import Envelope, Event, PodBound, PodMigrated, PodUnbound
from shards.cluster import SimulatedCluster
from shards.coordinator.flights import MOVES

logger = logging.getLogger(__name__)


class Binder:
    def __init__(
        self,
        cluster: SimulatedCluster,
        log: EventLog,
        *,
        shards: int = 1,
        failed: set[str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.log = log
        self.shards = shards
        self.failed = failed or set()
        """Decisions already refused (a binder started again applies the log from the
        start to rebuild the cluster, and must not refuse them twice)."""
        self.inputs = shards if shards > 1 else 0
        """The partition of cluster inputs (the control partition with several shards)."""
        self.positions = [0] * (shards + 1 if shards > 1 else 1)
        self.deferred: list[tuple[int, int, Envelope]] = []
        """Moves of a plan carried out by several shards whose new node had no room yet
        (partition, when, the move): the pods it replaces there move in the other
        shards' records, which may come later; tried again at each poll, and refused
        once the clock moved on (as in Kubernetes a moved pod's replacement waits for
        the room its plan frees)."""

    def __repr__(self) -> str:
        return f"Binder(positions={self.positions}, {self.cluster!r})"

    @property
    def position(self) -> int:
        return self.positions[self.inputs]

    async def poll(self, now: int) -> int:
        """Handle new records; return how many events were appended."""
        appended = 0
        order = [self.inputs, *range(self.shards)] if self.shards > 1 else [0]
        for partition in order:
            appended += await self._poll(partition, now)
        return appended + await self._retry(now)

    async def _retry(self, now: int) -> int:
        """Try the deferred moves again; refuse those still without room once the clock
        moved on since they came."""
        if not self.deferred:
            return 0
        waiting, self.deferred = self.deferred, []
        refused: dict[int, list[Envelope]] = {}
        for partition, since, env in waiting:
            assert isinstance(env.event, PodMigrated)
            failed = self.cluster.migrate_all([env.event], now)
            if not failed:
                continue
            if now > since:
                refused.setdefault(partition, []).extend(
                    self._envelope(event, now, env, "binder") for _, event in failed
                )
            else:
                self.deferred.append((partition, since, env))
        for partition, out in sorted(refused.items()):
            await self.log.append(out, partition)
        return sum(len(out) for out in refused.values())

    async def _poll(self, partition: int, now: int) -> int:
        records, unreadable, self.positions[partition] = await read_past_unreadable(
            self.log, partition, self.positions[partition]
        )
        for offset, reason in unreadable:  # the partition's reader records it
            logger.warning("record skipped partition=%d offset=%d: %s", partition, offset, reason)
        if not records:
            return 0
        decided: list[Envelope] = []
        voice: list[Envelope] = []
        moves: list[Envelope] = []
        for env in records:
            event = env.event
            if moves and not isinstance(event, PodMigrated):
                decided += self._move(moves, partition, now)
            if isinstance(event, PodBound):
                if event.decision_id in self.failed:
                    continue
                for e in self.cluster.bind(event, now):
                    decided.append(self._envelope(e, now, env, "binder"))
            elif isinstance(event, PodUnbound):
                self.cluster.unbind(event)
            elif isinstance(event, PodMigrated):
                copy = env.producer == "router" or env.stream == "relay"
                if copy or event.decision_id in self.failed:
                    # a copy of a move seen in its shard's partition: the router's
                    # forward, or the coordinator's relay of it (applied again, a move
                    # the cluster refused would be made after all, unknown to the shards)
                    continue
                moves.append(env)
            elif self.shards == 1 or (
                env.stream != "relay" if partition == self.inputs else not _forwarded(env)
            ):
                for e in self.cluster.observe(env):
                    voice.append(self._envelope(e, now, env, "cluster"))
        if moves:
            decided += self._move(moves, partition, now)
        if self.shards == 1:
            out = decided + voice
            if out:
                out.sort(key=lambda e: e.causation)
                await self.log.append(out, 0)
            return len(out)
        if decided:
            await self.log.append(decided, partition)
        if voice:
            await self.log.append(voice, self.inputs)
        return len(decided) + len(voice)

    def _move(self, moves: list[Envelope], partition: int, now: int) -> list[Envelope]:
        """Carry out moves that follow one another in a partition (a plan's) as one
        step (:meth:`SimulatedCluster.migrate_all`); empties ``moves``. A move of a plan
        several shards carry out (its part named for moves) that finds no room is
        deferred (:attr:`deferred`), not refused."""
        decisions = [env.event for env in moves if isinstance(env.event, PodMigrated)]
        failed = self.cluster.migrate_all(decisions, now)
        out: list[Envelope] = []
        for i, event in failed:
            if MOVES in decisions[i].decision_id and self.shards > 1:
                self.deferred.append((partition, now, moves[i]))
            else:
                out.append(self._envelope(event, now, moves[i], "binder"))
        moves.clear()
        return out

    @staticmethod
    def _envelope(event: Event, now: int, cause: Envelope, producer: str) -> Envelope:
        return Envelope(event=event, time=now, causation=cause.offset, producer=producer)


def _forwarded(env: Envelope) -> bool:
    """A copy the router forwarded: the binder saw the original in the control partition."""
    return env.producer == "router"
