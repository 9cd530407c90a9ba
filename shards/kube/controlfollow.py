"""What the binder of partition 0 writes for the coordinator (several shards;
``shards.kube.binder``): the coordinator's view alone knows each gang whole and judges
the pods no shard could place, and it reports both in the control partition. That
binder follows the control partition, read only: the groups' status (from its start
after a restart: a status already written is not written again, nor is a
scheduler-plugins one changed by writing it twice), and why the pods the coordinator
judged are pending, once: how far they were told is recorded in the binder's own
partition (``PositionRecorded`` of ``binder-control``), so a restart does not tell them
again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from events.log import EventLog, read_past_unreadable
from events.types import (
    Envelope,
    PodBound,
    PodDeleted,
    PodFailed,
    PodGroupStatusChanged,
    PodGroupSubmitted,
    PodSubmitted,
    PodSucceeded,
    PodUnschedulable,
    PositionRecorded,
)
from shards.kube.apicall import Unavailable
from shards.kube.known import Known
from shards.kube.telling import Teller, coordinators_group_status, coordinators_judgement

log = logging.getLogger(__name__)

CONTROL_TOLD: Final = "binder-control"
"""The component of the ``PositionRecorded`` that says how far in the control partition
the pods the coordinator judged were told (several shards)."""


class ControlFollower:
    """Follows ``control`` (None: one shard, nothing to follow) for the binder of
    ``partition`` (see the module's docstring)."""

    def __init__(
        self,
        log_: EventLog,
        control: int | None,
        partition: int,
        known: Known,
        teller: Teller,
        *,
        clock: Callable[[], int],
    ) -> None:
        self.log = log_
        self.control = control
        self.partition = partition
        self.known = known
        self.teller = teller
        self.clock = clock
        self.position = 0
        self.told = 0
        """The control partition's offset up to which pods were told (recorded)."""
        self.uids: dict[str, str] = {}
        """The uids of the pods the control partition submitted (live ones)."""

    def __repr__(self) -> str:
        return f"ControlFollower(control={self.control}, position={self.position})"

    async def follow(self) -> None:
        """Write what is new in the control partition (see the module's docstring)."""
        if self.control is None:
            return
        records, _, self.position = await read_past_unreadable(
            self.log, self.control, self.position
        )
        told = False
        known = self.known
        for env in records:
            match env.event:
                case PodGroupSubmitted(group=spec):
                    known.group_sources[spec.key] = spec.source
                case PodGroupStatusChanged() as event if coordinators_group_status(env):
                    try:
                        source = known.group_sources.get(event.group)
                        await self.teller.group_status(event, source)
                    except Unavailable as exc:  # informational: not retried
                        log.warning("group status not written group=%s: %s", event.group, exc)
                case PodSubmitted(pod=spec) if spec.uid or spec.group:
                    if spec.uid:
                        self.uids[spec.key] = spec.uid
                    if spec.group:
                        known.group_of[spec.key] = spec.group
                case PodDeleted(pod=key) | PodSucceeded(pod=key) | PodFailed(pod=key):
                    self.uids.pop(key, None)
                    known.group_of.pop(key, None)
                    self.teller.forget(key)
                case PodBound(pod=key):
                    self.teller.forget(key)  # (a shard's, relayed) bound: no more to tell
                case PodUnschedulable() as event if (
                    coordinators_judgement(env)
                    and event.attempt > 0
                    and (env.offset or 0) >= self.told
                ):
                    uid = self.uids.get(event.pod) or known.uids.get(event.pod, "")
                    await self.teller.unschedulable(event, uid, known.group_of.get(event.pod))
                    told = True
        if told:
            self.told = self.position
            record = PositionRecorded(component=CONTROL_TOLD, position=self.told)
            await self.log.append(
                [Envelope(event=record, time=self.clock(), producer="binder")], self.partition
            )
