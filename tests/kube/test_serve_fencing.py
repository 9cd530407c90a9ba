"""Two coordinator replicas; the leader frozen (SIGSTOP) past its lease while a
cross-shard gang is in flight, the other takes over, the first resumes (SIGCONT): it
stops leading, nothing it appends late takes effect, nothing is bound twice, and the
log verifies with ``shoal replay --verify``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from engine.model.pools import POOL_LABEL
from events.fence import FencedLog
from events.filelog import FileLog
from events.kafka import KafkaSettings, create_topic
from events.remote import LogServer
from events.types import Envelope, PodSubmitted, TermBegan
from shards.bus import open_bus
from shards.serve import ServeOptions, Service, serve
from tests.kube.realkube import RealApiServer, missing
from tests.kube.test_ingest import eventually, node, pod
from tests.kube.test_serve import GROUP_LABEL, _check_routed_log

ROOT = Path(__file__).resolve().parents[2]
LEASE = ["--lease-seconds", "6", "--renew-deadline", "4", "--retry-period", "0.5"]
"""Short, and yet long enough for a busy machine (a leader stalled past its renew
deadline steps down)."""
FENCE = "shoal-coordinator"


@contextlib.asynccontextmanager
async def _fresh_bus(
    kind: str, request: pytest.FixtureRequest, partitions: int = 1
) -> AsyncIterator[str]:
    """The ``--bus`` URL of a fresh log: a log server, or a Kafka topic of the
    session's broker."""
    if kind == "remote":
        async with LogServer(partitions) as server:
            yield server.url
        return
    bootstrap = request.getfixturevalue("kafka_bootstrap")
    topic = f"serve-fence-{uuid.uuid4().hex[:10]}"
    await create_topic(KafkaSettings(bootstrap=bootstrap, topic=topic, partitions=partitions))
    yield f"kafka://{bootstrap}?topic={topic}&partitions={partitions}"


def _access(apiserver: Any) -> dict[str, Any]:
    if isinstance(apiserver, RealApiServer):
        return {"kubeconfig": apiserver.kubeconfig}
    return {"host": apiserver.url, "token": "t"}


def _flags(access: dict[str, Any]) -> list[str]:
    return [flag for key, value in access.items() for flag in (f"--{key}", value)]


@contextlib.asynccontextmanager
async def _coordinator(
    bus: str, access: dict[str, Any], identity: str, stderr: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    with stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shards.cli",
            "-v",
            "serve",
            "--role",
            "coordinator",
            "--shards",
            "2",
            "--bus",
            bus,
            *_flags(access),
            "--identity",
            identity,
            "--listen",
            "127.0.0.1:0",
            *LEASE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
        )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _holder(apiserver: Any) -> str | None:
    lease = apiserver.get("Lease", FENCE, "shoal") or {}
    return (lease.get("spec") or {}).get("holderIdentity")


def _put_pods(apiserver: Any, names: list[str]) -> None:
    for name in names:
        apiserver.put("Pod", pod(name, labels={GROUP_LABEL: "g"} if name[0] == "g" else {}))


def _bound(apiserver: Any, names: list[str]) -> bool:
    return all(
        (apiserver.get("Pod", n, "default") or {}).get("spec", {}).get("nodeName") for n in names
    )


@pytest.mark.real_kube  # the split-brain check: in the suite, not behind the slow marker
@pytest.mark.parametrize("bus", ["remote", pytest.param("kafka", marks=pytest.mark.slow)])
async def test_a_frozen_coordinator_is_fenced_when_it_resumes(
    apiserver: Any, tmp_path: Path, bus: str, request: pytest.FixtureRequest
) -> None:
    if not isinstance(apiserver, RealApiServer) and missing() is None:
        pytest.skip("runs against the real kube-apiserver, which is built (half a minute)")
    if isinstance(apiserver, RealApiServer):
        apiserver.namespace("shoal")  # the Leases' namespace
    for i in range(4):
        item = node(f"n{i}")
        item["metadata"]["labels"][POOL_LABEL] = "a" if i < 2 else "b"
        apiserver.put("Node", item)
    access = _access(apiserver)
    async with _fresh_bus(bus, request, partitions=3) as url:
        base: dict[str, Any] = {
            "bus": url,
            "listen": "127.0.0.1:0",
            "shards": 2,
            "watch_seconds": 1,
            "lease_seconds": 3,
            "poll_interval": 0.02,
            **access,
        }
        roles = [("ingest", {}), ("shard", {"shard_id": 0}), ("shard", {"shard_id": 1})]
        roles.append(("binder", {}))
        services: list[Service] = []
        tasks = [
            asyncio.create_task(
                serve(ServeOptions(role=role, **{**base, **extra}), ready=services.append)
            )
            for role, extra in roles
        ]
        logs = {name: tmp_path / f"{name}.stderr" for name in ("ca", "cb")}
        try:
            async with (
                _coordinator(url, access, "ca", logs["ca"]) as ca,
                _coordinator(url, access, "cb", logs["cb"]) as cb,
            ):
                await eventually(lambda: _holder(apiserver) in logs, timeout=60)
                first = _holder(apiserver)
                assert first is not None
                other = "cb" if first == "ca" else "ca"
                leader = {"ca": ca, "cb": cb}[first]
                await eventually(lambda: len(services) == len(roles), timeout=30)
                _put_pods(apiserver, ["p0", "p1"])
                await eventually(lambda: _bound(apiserver, ["p0", "p1"]), timeout=60)
                # a gang neither pool holds alone: the coordinator reserves on both
                apiserver.put(
                    "PodGroup",
                    {
                        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                        "metadata": {"name": "g", "namespace": "default"},
                        "spec": {"minMember": 10},
                    },
                )
                gang = [f"g{i}" for i in range(10)]
                _put_pods(apiserver, [*gang, "p2"])
                leader.send_signal(signal.SIGSTOP)  # frozen with the gang in flight
                await eventually(lambda: _holder(apiserver) == other, timeout=60)
                await eventually(lambda: _bound(apiserver, [*gang, "p2"]), timeout=60)
                leader.send_signal(signal.SIGCONT)
                stepped_down = f"lease={FENCE} identity={first} leader=False".encode()
                await eventually(lambda: stepped_down in logs[first].read_bytes(), timeout=60)
                _put_pods(apiserver, ["p3", "p4"])
                await eventually(lambda: _bound(apiserver, ["p3", "p4"]), timeout=60)
                assert leader.returncode is None, "the resumed replica must stand by, not exit"
                assert _holder(apiserver) == other
            reader = await open_bus(url, partitions=3)
            parts = [await reader.read(p, 0) for p in range(3)]
            await reader.close()
        finally:
            for service in services:
                service.stop.set()
            results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert results == [0] * len(roles)
    _check_terms(parts, [first, other])
    _check_routed_log(parts, apiserver)
    # a Kafka log is replayed where it is: a copy would number its records afresh
    # (commit markers take offsets), and the records name each other by offset
    await _replay_verifies(parts, tmp_path / "run.events", url if bus == "kafka" else None)


def _check_terms(parts: list[list[Envelope]], holders: list[str]) -> None:
    """The first leader's term, then the other's with a higher epoch, in every
    partition; after the second began nothing of the first's term is in the log."""
    for records in parts:
        terms = [
            (e.event.holder, e.event.epoch, e.offset)
            for e in records
            if isinstance(e.event, TermBegan) and e.event.fence == FENCE
        ]
        assert [holder for holder, _, _ in terms][:2] == holders, terms
        (_, old, _), (_, new, began) = terms[:2]
        assert new > old
        late = [e for e in records if e.offset > began and e.fence == FENCE and e.epoch < new]
        assert not late, late


async def _replay_verifies(parts: list[list[Envelope]], path: Path, url: str | None) -> None:
    """The log at ``url``, or else copied into a file partition by partition, passes
    ``shoal replay --verify`` (the command, as a person runs it)."""
    if url is None:
        log = FileLog(path, partitions=len(parts))
        for partition, records in enumerate(parts):
            await log.append(records, partition)
        await log.close()
    replay = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "shards.cli",
        "replay",
        url or str(path),
        "--verify",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    out, err = await replay.communicate()
    assert replay.returncode == 0, (out + err).decode()[-2000:]
    assert b"verified" in out, out.decode()[-1000:]


@pytest.mark.parametrize("bus", ["remote", "kafka"])
async def test_a_leader_the_log_fences_off_stops_and_comes_back_with_a_higher_epoch(
    apiserver: Any, caplog: pytest.LogCaptureFixture, bus: str, request: pytest.FixtureRequest
) -> None:
    """Ingest leads with epoch 1; another term of its Lease (epoch 7) begins in the
    log (on Kafka, from another process's producer): ingest's next append is refused,
    it steps down (one warning), and when it takes the lease again its term starts
    above what the log holds."""
    apiserver.put("Node", node("n0"))
    async with _fresh_bus(bus, request) as url:
        services: list[Service] = []
        options = ServeOptions(
            role="ingest", bus=url, listen="127.0.0.1:0", identity="a",
            watch_seconds=1, lease_seconds=3, poll_interval=0.02, **_access(apiserver),
        )  # fmt: skip
        task = asyncio.create_task(serve(options, ready=services.append))
        reader = await open_bus(url, partitions=1)
        try:
            await eventually(
                lambda: (
                    bool(services)
                    and services[0].leaders.get("ingest") is not None
                    and services[0].leaders["ingest"].epoch == 1
                )
            )
            deadline = asyncio.get_running_loop().time() + 30
            while not [e for e in await reader.read(0, 0) if isinstance(e.event, TermBegan)]:
                assert asyncio.get_running_loop().time() < deadline, "the term never began"
                await asyncio.sleep(0.05)

            async def ingested(name: str) -> Envelope | None:
                return next(
                    (
                        e
                        for e in await reader.read(0, 0)
                        if isinstance(e.event, PodSubmitted) and e.event.pod.name == name
                    ),
                    None,
                )

            await FencedLog(reader, fence="shoal-ingest", epoch=7).begin([0], "b", now=1)
            apiserver.put("Pod", pod("p0"))
            found: list[Envelope | None] = [None]

            async def poll() -> bool:
                found[0] = await ingested("p0")
                return found[0] is not None

            while not await poll():
                assert asyncio.get_running_loop().time() < deadline, "p0 never ingested"
                await asyncio.sleep(0.05)
            assert found[0] is not None and found[0].epoch == 8
            deposed = [r for r in caplog.records if "deposed" in r.getMessage()]
            assert len(deposed) == 1 and deposed[0].levelname == "WARNING"
        finally:
            await reader.close()
            if services:
                services[0].stop.set()
            assert await asyncio.wait_for(task, 15) == 0
