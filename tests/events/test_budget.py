"""The byte budget behind the log server's memory bound: never more than its limit
held, first come first served, nothing held by a waiter that was cancelled."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.budget import ByteBudget


@given(
    limit=st.integers(1, 1000),
    tasks=st.lists(
        st.tuples(st.integers(0, 1000), st.integers(0, 3), st.booleans()), min_size=1, max_size=12
    ),
)
def test_never_more_than_the_limit_and_first_come_first_served(
    limit: int, tasks: list[tuple[int, int, bool]]
) -> None:
    """Tasks reserve, hold for a few turns of the loop and release; some are cancelled
    while they wait. Held bytes never pass the limit, grants follow the order of
    arrival, and at the end nothing is held."""

    async def run() -> None:
        budget = ByteBudget(limit)
        granted: list[int] = []

        async def one(index: int, size: int, turns: int) -> None:
            async with budget.holding(size):
                granted.append(index)
                assert budget.held <= budget.limit
                for _ in range(turns):
                    await asyncio.sleep(0)

        running = []
        for index, (size, turns, cancel) in enumerate(tasks):
            if size > limit:
                with pytest.raises(ValueError, match="never fit"):
                    await budget.reserve(size)
                continue
            task = asyncio.create_task(one(index, size, turns))
            running.append((index, task, cancel))
        await asyncio.sleep(0)
        for _, task, cancel in running:
            if cancel:
                task.cancel()
        await asyncio.gather(*(task for _, task, _ in running), return_exceptions=True)
        assert budget.held == 0 and budget.peak <= limit
        assert granted == sorted(granted)

    asyncio.run(run())


async def test_a_waiter_behind_a_large_one_waits_its_turn() -> None:
    budget = ByteBudget(10)
    await budget.reserve(8)
    large = asyncio.create_task(budget.reserve(5))
    small = asyncio.create_task(budget.reserve(1))
    await asyncio.sleep(0)
    assert not large.done() and not small.done() and budget.waits == 2
    budget.release(8)
    await asyncio.gather(large, small)
    assert budget.held == 6
