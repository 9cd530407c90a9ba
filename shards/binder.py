"""The binder: applies shard decisions to the (simulated) cluster, optimistically.

It follows the log behind the shards; a ``PodBound`` the cluster cannot honour becomes a
``BindFailed`` (the shard then un-assumes and requeues the pod). The cluster's own
consequences (pods lost with a node) are appended by the binder too, as the cluster's
voice in the log.
"""

from __future__ import annotations

from events.log import EventLog
from events.types import Envelope, Event, PodBound
from shards.cluster import SimulatedCluster


class Binder:
    def __init__(self, cluster: SimulatedCluster, log: EventLog, *, partition: int = 0) -> None:
        self.cluster = cluster
        self.log = log
        self.partition = partition
        self.position = 0

    def __repr__(self) -> str:
        return f"Binder(position={self.position}, {self.cluster!r})"

    async def poll(self, now: int) -> int:
        """Handle new records; return how many events were appended."""
        records = await self.log.read(self.partition, self.position)
        if not records:
            return 0
        self.position = records[-1].offset + 1
        out: list[Envelope] = []
        for env in records:
            caused: list[Event]
            if isinstance(env.event, PodBound):
                caused = self.cluster.bind(env.event, now)
                producer = "binder"
            else:
                caused = self.cluster.observe(env)
                producer = "cluster"
            out.extend(
                Envelope(event=e, time=now, causation=env.offset, producer=producer) for e in caused
            )
        if out:
            await self.log.append(out, self.partition)
        return len(out)
