"""Leader election as client-go does it: a renew deadline, request time-outs, and
expiry judged by the candidate's own clock (never the holder's ``renewTime``)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client

from shards.kube.client import api_client
from shards.kube.lease import LeaderElector
from tests.kube.apiserver import FakeApiServer
from tests.kube.test_ingest import eventually

START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


class Clocks:
    """A monotonic clock the test moves, and a wall clock per candidate (skewable)."""

    def __init__(self) -> None:
        self.mono = 0.0

    def monotonic(self) -> float:
        return self.mono

    def wall(self, skew: float = 0.0) -> Callable[[], datetime.datetime]:
        return lambda: START + datetime.timedelta(seconds=self.mono + skew)


def elector(api: Any, identity: str, clocks: Clocks, skew: float = 0.0, **kw: Any) -> LeaderElector:
    return LeaderElector(
        api,
        namespace="shoal",
        name="coordinator",
        identity=identity,
        lease_seconds=15,
        clock=clocks.wall(skew),
        monotonic=clocks.monotonic,
        **kw,
    )


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[str]:
    """A TCP listener that accepts connections and never answers: a hung API server."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for writer in held:
            writer.close()
        server.close()


async def test_a_hung_renewal_makes_the_leader_step_down_within_the_renew_deadline(
    api: Any,
) -> None:
    clocks = Clocks()
    a = elector(api, "a", clocks, renew_deadline=10, retry_period=2, request_timeout=0.05)
    assert await a.try_acquire_or_renew() and a.leading()
    async with silent_server() as url:
        hung = await api_client(host=url)
        a.api = client.CoordinationV1Api(hung)
        stop = asyncio.Event()
        task = asyncio.create_task(a.run(stop, renew_every=0.01))
        try:
            # renewals time out; within the deadline it still leads
            clocks.mono = 9.0
            await asyncio.sleep(0.2)
            assert a.leader
            clocks.mono = 10.5  # past the renew deadline: not leading, at once
            assert not a.leading()
            await eventually(lambda: not a.leader, timeout=30)
        finally:
            stop.set()
            await task
            await hung.close()


async def test_a_leader_steps_down_when_the_deadline_passes_mid_request(api: Any) -> None:
    """A request that hangs is cut at what is left of the renew deadline, even when the
    request time-out is longer."""
    clocks = Clocks()
    a = elector(api, "a", clocks, renew_deadline=10, retry_period=2, request_timeout=3600)
    assert await a.try_acquire_or_renew()
    async with silent_server() as url:
        hung = await api_client(host=url)
        a.api = client.CoordinationV1Api(hung)
        clocks.mono = 9.9  # leading, with 0.1 s of its deadline left
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(a.try_acquire_or_renew(), 30)  # cut at 0.1 s
        finally:
            await hung.close()
    clocks.mono = 10.0
    assert not a.leading()


@pytest.mark.parametrize("skew", [-3600.0, 3600.0])
async def test_a_skewed_holder_clock_neither_hastens_nor_delays_a_takeover(
    apiserver: FakeApiServer, api: Any, skew: float
) -> None:
    clocks = Clocks()
    a = elector(api, "a", clocks, skew=skew)  # the holder's wall clock is an hour off
    b = elector(api, "b", clocks)
    assert await a.try_acquire_or_renew()
    for _ in range(10):  # a renews every 5 s: b never takes over, however old renewTime looks
        assert not await b.try_acquire_or_renew()
        clocks.mono += 5
        assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()  # b sees the last renewal
    clocks.mono += 14  # a stopped renewing; not yet a lease duration, by b's clock
    assert not await b.try_acquire_or_renew()
    clocks.mono += 2
    assert await b.try_acquire_or_renew()  # took over, however far ahead a's clock was
    assert apiserver.get("Lease", "coordinator", "shoal")["spec"]["holderIdentity"] == "b"
    assert b.epoch > a.epoch
    assert not await a.try_acquire_or_renew()


async def test_each_term_takes_a_higher_epoch_and_never_one_below_the_floor(
    apiserver: FakeApiServer, api: Any
) -> None:
    clocks = Clocks()
    a, b = elector(api, "a", clocks), elector(api, "b", clocks)
    a.floor = 7  # the log has seen epoch 6 (the Lease was deleted since)
    assert await a.try_acquire_or_renew() and a.epoch == 7
    assert not await b.try_acquire_or_renew()
    clocks.mono += 16
    assert await b.try_acquire_or_renew() and b.epoch == 8
    b.floor = 12
    assert await b.advance_epoch() and b.epoch == 12
    assert apiserver.get("Lease", "coordinator", "shoal")["spec"]["leaseTransitions"] == 12
    assert await b.try_acquire_or_renew() and b.epoch == 12  # a renewal keeps the epoch


async def test_the_timings_must_nest(api: Any) -> None:
    with pytest.raises(ValueError, match="renew deadline"):
        LeaderElector(api, namespace="n", name="l", identity="a", renew_deadline=20)
