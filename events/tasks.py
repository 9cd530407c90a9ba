"""Small asyncio helpers shared by the log backends and the service."""

from __future__ import annotations

import asyncio


def being_cancelled() -> bool:
    """Whether the running task itself is being cancelled, as opposed to merely handed a
    ``CancelledError`` by a library whose inner task was stopped under it (aiokafka after
    another caller restarted its client, say): only the first must propagate."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
