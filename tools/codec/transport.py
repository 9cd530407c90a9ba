"""The coordinator's transport floor per plain pod over the log server: a process that
only reads each pod's submission (decoded, as the coordinator folds it) from the control
partition and appends one ``PodRouted`` per pod to a shard partition, in slices of 1,000,
and does nothing else. Its CPU per pod is what any coordinator of this design pays for
the log alone, before queue order, quotas, its view or the shards' reports.

usage: PYTHONPATH=. .venv/bin/python tools/codec/transport.py [PODS]

This process serves the log (a :class:`~events.logserver.LogServer` on 127.0.0.1, a
free port) and appends the pods of ``shoal loadtest scale --templates 1``; a child
process reads and hands them over, and prints its CPU µs per pod. Compare it with one
in-process shard's CPU per pod (``shoal loadtest scale --shards 0``) measured in the
same minutes (the machine's load moves both).
"""

from __future__ import annotations

import asyncio
import sys
import time

import uvloop

from events.logserver import LogServer
from events.remote import RemoteLog
from events.types import Envelope, PodRouted, PodSubmitted
from loadtest.scale import ScaleShape, workload

SLICE = 1000
CONTROL = 2


async def hand_over(url: str, pods: int) -> float:
    """Read ``pods`` submissions from the control partition and hand each over; return
    the CPU seconds it took."""
    log = await RemoteLog.connect(url)
    started = time.process_time()
    position = handed = 0
    while handed < pods:
        records = await log.fetch(CONTROL, position, SLICE, wait=1.0)
        if not records[1]:
            continue
        position = records[1][-1].offset + 1
        out: dict[int, list[Envelope]] = {0: [], 1: []}
        for env in records[1]:
            event = env.event
            if type(event) is PodSubmitted:
                routed = PodRouted(pod=event.pod, decision_id=f"{event.pod.key}#{handed}")
                out[handed % 2].append(
                    Envelope(event=routed, time=env.time, causation=env.offset, producer="router")
                )
                handed += 1
        for partition, batch in out.items():
            if batch:
                await log.append(batch, partition)
    seconds = time.process_time() - started
    await log.close()
    return seconds


async def serve(pods: int) -> None:
    async with LogServer(3) as server:
        log = await RemoteLog.connect(server.url)
        load = workload(ScaleShape(nodes=1000, pods=pods, shards=2))
        envelopes = [
            Envelope(event=e, time=1, producer="ingest")
            for batch in load.batches
            for e in batch
            if isinstance(e, PodSubmitted)
        ]
        for start in range(0, len(envelopes), SLICE):
            await log.append(envelopes[start : start + SLICE], CONTROL)
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--child", server.url, str(len(envelopes))
        )
        await child.wait()
        await log.close()


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        pods = int(sys.argv[3])
        seconds = uvloop.run(hand_over(sys.argv[2], pods))
        print(f"read and handed over {pods} pods: {seconds / pods * 1e6:.2f} µs of CPU per pod")
        return
    uvloop.run(serve(int(sys.argv[1]) if len(sys.argv) > 1 else 50_000))


if __name__ == "__main__":
    main()
