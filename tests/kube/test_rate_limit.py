"""The binder's client-side rate limit: a token bucket, as client-go's."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shards.kube.client import RateLimit


class Clock:
    """Time that passes only when the limiter sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


@settings(max_examples=50, deadline=None)
@given(qps=st.integers(1, 500), burst=st.integers(1, 200), calls=st.integers(1, 600))
async def test_never_more_than_the_burst_at_once_nor_the_rate_on_average(
    qps: int, burst: int, calls: int
) -> None:
    clock = Clock()
    limit = RateLimit(qps, burst, clock=clock, sleep=clock.sleep)
    times = []
    for _ in range(calls):
        await limit.acquire()
        times.append(clock.now)
    # the first `burst` go at once; every call after them waits its 1/qps
    assert times[: min(burst, calls)] == [0.0] * min(burst, calls)
    expected = max(calls - burst, 0) / qps
    assert times[-1] == pytest.approx(expected, abs=1e-6)
    assert limit.waited == pytest.approx(expected, abs=1e-6) or calls <= burst


async def test_no_limit_by_default() -> None:
    clock = Clock()
    limit = RateLimit(clock=clock, sleep=clock.sleep)
    for _ in range(10_000):
        await limit.acquire()
    assert clock.now == 0.0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="qps"):
        RateLimit(-1)
    with pytest.raises(ValueError, match="burst"):
        RateLimit(10, 0)
