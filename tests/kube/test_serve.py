"""shoal serve against the in-repo API server: health, readiness, metrics, SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine.model.pools import POOL_LABEL, Sharding
from events.errors import InputError, LogError
from events.remote import LogServer, RemoteLog
from events.types import (
    Envelope,
    NodeAdded,
    NodeSpec,
    PodBound,
    PodDeleted,
    ShardingConfigured,
)
from shards.replay import replay_routed
from shards.serve import ServeOptions, Service, serve, shard_ordinal
from tests.kube.apiserver import FakeApiServer
from tests.kube.test_ingest import eventually, node, pod

ROOT = Path(__file__).resolve().parents[2]


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


@contextlib.asynccontextmanager
async def running(
    apiserver: FakeApiServer,
    shards: int = 1,
    sharding: Sharding | None = None,
    stuck_after: float = 120.0,
    ui_token: str | None = None,
) -> AsyncIterator[Service]:
    """``serve --role all`` in this process against ``apiserver``; stopped on exit."""
    services: list[Service] = []
    options = ServeOptions(
        sharding=sharding,
        role="all",
        bus="memory",
        host=apiserver.url,
        token="t",
        listen="127.0.0.1:0",
        identity="test-0",
        shards=shards,
        watch_seconds=1,
        lease_seconds=3,
        poll_interval=0.02,
        stuck_after=stuck_after,
        ui_token=ui_token,
    )
    task = asyncio.create_task(serve(options, ready=services.append))
    try:
        await eventually(lambda: bool(services))
        yield services[0]
    finally:
        if services:
            services[0].stop.set()
        assert await asyncio.wait_for(task, 15) == 0


async def test_serve_all_roles_in_one_process(apiserver: FakeApiServer) -> None:
    apiserver.put("Node", node("n1"))
    apiserver.put("Pod", pod("p0"))
    async with running(apiserver) as service:
        await _exercise(apiserver, service)


def _state(service: Service) -> str:
    worker = service.worker
    return (
        f"leaders={ {k: v.leader for k, v in service.leaders.items()} } "
        f"ingest={service.ingest.stats() if service.ingest else None} "
        f"worker={worker.stats() if worker else None} "
        f"engine={worker.engine.stats() if worker else None} "
        f"binder={service.binder.stats() if service.binder else None}"
    )


async def _exercise(apiserver: FakeApiServer, service: Service) -> None:
    assert (await get(f"{service.url}/healthz"))[0] == 200
    try:
        await eventually(
            lambda: bool(apiserver.get("Pod", "p0", "default")["spec"].get("nodeName")), timeout=15
        )
        apiserver.put("Pod", pod("p1"))
        await eventually(
            lambda: bool(apiserver.get("Pod", "p1", "default")["spec"].get("nodeName")), timeout=15
        )
    except AssertionError:
        raise AssertionError(f"pods not bound in time: {_state(service)}") from None
    status, why = await get(f"{service.url}/readyz")
    assert status == 200, why
    status, text = await get(f"{service.url}/metrics")
    assert status == 200
    assert 'shoal_schedule_attempts_total{result="bound",shard="0"}' in text
    assert 'shoal_queue_depth{queue="active",shard="0"} 0' in text
    assert 'shoal_binder_actions_total{kind="bound"}' in text
    assert "shoal_scheduling_attempt_seconds_bucket" in text
    assert apiserver.get("Lease", "shoal-ingest", "shoal")["spec"]["holderIdentity"] == "test-0"


# --------------------------------------------------------------------------- shards

GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


def _two_pools(apiserver: FakeApiServer) -> list[str]:
    """Two pools of two 4-cpu nodes; a pod another scheduler bound; a gang of ten
    one-cpu pods that neither pool can hold alone (8 cpu each); three single pods.
    Returns the pods shoal must bind."""
    for i in range(4):
        item = node(f"n{i}")
        item["metadata"]["labels"][POOL_LABEL] = "a" if i < 2 else "b"
        apiserver.put("Node", item)
    apiserver.put("Pod", pod("elsewhere", node_name="n3", scheduler="other"))
    apiserver.put(
        "PodGroup",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "metadata": {"name": "g", "namespace": "default"},
            "spec": {"minMember": 10},
        },
    )
    ours = [f"g{i}" for i in range(10)] + [f"p{i}" for i in range(3)]
    for name in ours:
        apiserver.put("Pod", pod(name, labels={GROUP_LABEL: "g"} if name[0] == "g" else {}))
    return ours


async def _all_bound(apiserver: FakeApiServer, names: list[str], why: Callable[[], str]) -> None:
    def bound() -> bool:
        return all(apiserver.get("Pod", n, "default")["spec"].get("nodeName") for n in names)

    try:
        await eventually(bound, timeout=30)
    except AssertionError:
        raise AssertionError(f"pods not bound in time: {why()}") from None


def _check_routed_log(parts: list[list[Envelope]], apiserver: FakeApiServer) -> None:
    """Every decision replays; nothing is bound twice; the gang spans both pools."""
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, verified.mismatch
    bound = [
        e.event.pod
        for records in parts[:-1]
        for e in records
        if isinstance(e.event, PodBound) and e.producer.startswith("shard-")
    ]
    assert len(bound) == len(set(bound)), "a pod was bound twice"
    assert "default/elsewhere" not in bound
    gang_nodes = {apiserver.get("Pod", f"g{i}", "default")["spec"]["nodeName"] for i in range(10)}
    assert {"n0", "n1"} & gang_nodes and {"n2", "n3"} & gang_nodes, gang_nodes


async def test_serve_two_shards_and_the_coordinator_in_one_process(
    apiserver: FakeApiServer,
) -> None:
    ours = _two_pools(apiserver)
    async with running(apiserver, shards=2) as service:
        await _all_bound(apiserver, ours, lambda: _state(service))
        assert service.bus is not None
        parts = [await service.bus.read(p, 0) for p in range(3)]
        status, text = await get(f"{service.url}/metrics")
        assert status == 200
    _check_routed_log(parts, apiserver)
    assert 'shoal_coordinator_gangs_total{step="committed"} 1' in text
    assert 'shoal_coordinator_gangs_total{step="prepared"}' in text
    assert "shoal_coordinator_commit_seconds_count 1" in text
    for consumer, partition in (("shard-1", 1), ("coordinator", 2), ("binder-0", 0)):
        assert f'consumer="{consumer}",partition="{partition}"' in text, text
    assert 'shoal_queue_depth{queue="active",shard="1"} 0' in text
    assert (
        apiserver.get("Lease", "shoal-coordinator", "shoal")["spec"]["holderIdentity"] == "test-0"
    )


async def test_serve_one_shard_honours_the_tenants_of_its_sharding(
    apiserver: FakeApiServer,
) -> None:
    """--sharding at one shard: the log records it first and its tenants own their pools
    (a tenant's pod lands only in its pool, everyone else's only outside it)."""
    for i in range(4):
        item = node(f"n{i}")
        item["metadata"]["labels"][POOL_LABEL] = "gpu" if i == 3 else "cpu"
        apiserver.put("Node", item)
    names = {"team": [f"t{i}" for i in range(3)], "default": [f"o{i}" for i in range(5)]}
    for ns, pods in names.items():
        for name in pods:
            apiserver.put("Pod", pod(name, ns=ns))
    sharding = Sharding(shards=1, tenants=(("team", ("gpu",)),))
    async with running(apiserver, sharding=sharding) as service:
        for ns, pods in names.items():
            await eventually(
                lambda ns=ns, pods=pods: all(  # type: ignore[misc]
                    apiserver.get("Pod", n, ns)["spec"].get("nodeName") for n in pods
                ),
                timeout=30,
            )
        assert service.bus is not None
        head = await service.bus.read(0, 0, 4)
    assert any(isinstance(e.event, ShardingConfigured) for e in head)
    for name in names["team"]:
        assert apiserver.get("Pod", name, "team")["spec"]["nodeName"] == "n3"
    for name in names["default"]:
        assert apiserver.get("Pod", name, "default")["spec"]["nodeName"] != "n3"


async def test_serve_refuses_a_sharding_for_a_log_set_up_without_one(
    apiserver: FakeApiServer,
) -> None:
    async with LogServer(1) as server:
        log = await RemoteLog.connect(server.url)
        await log.append([Envelope(event=PodDeleted(pod="default/p"))], 0)
        await log.close()
        options = ServeOptions(
            role="ingest",
            bus=server.url,
            host=apiserver.url,
            listen="127.0.0.1:0",
            sharding=Sharding(shards=1, tenants=(("team", ("gpu",)),)),
        )
        with pytest.raises(InputError, match="without a sharding configuration"):
            await serve(options)


async def test_serve_roles_as_separate_services_over_a_log_server(
    apiserver: FakeApiServer,
) -> None:
    """What ``deploy/`` runs: ingest, the coordinator, two shards and the binder, each a
    service of its own (in this process, to keep the test quick), sharing only the log."""
    ours = _two_pools(apiserver)
    async with LogServer(3) as server:
        base = {
            "bus": server.url,
            "host": apiserver.url,
            "token": "t",
            "listen": "127.0.0.1:0",
            "shards": 2,
            "watch_seconds": 1,
            "lease_seconds": 3,
            "poll_interval": 0.02,
        }
        roles = [
            ("ingest", {}),
            ("coordinator", {}),
            ("shard", {"identity": "shoal-shard-0"}),
            ("shard", {"shard_id": 1}),
            ("binder", {}),
        ]
        services: list[Service] = []
        tasks = [
            asyncio.create_task(
                serve(ServeOptions(role=role, **{**base, **extra}), ready=services.append)  # type: ignore[arg-type]
            )
            for role, extra in roles
        ]
        try:
            await eventually(lambda: len(services) == len(roles))
            await _all_bound(
                apiserver, ours, lambda: " | ".join(_state(service) for service in services)
            )
            reader = await RemoteLog.connect(server.url)
            parts = [await reader.read(p, 0) for p in range(3)]
            await reader.close()
        finally:
            for service in services:
                service.stop.set()
            results = await asyncio.wait_for(asyncio.gather(*tasks), 15)
        assert results == [0] * len(roles)
    _check_routed_log(parts, apiserver)
    shards = {s.options.role: s for s in services}
    assert shards["coordinator"].coordinator is not None
    assert {s.worker.engine.shard for s in services if s.worker is not None} == {0, 1}


async def test_serve_refuses_a_log_set_up_for_another_sharding(
    apiserver: FakeApiServer,
) -> None:
    async with LogServer(3) as server:
        log = await RemoteLog.connect(server.url)
        other = Sharding(shards=2, pools=(("a", 1),))
        await log.append([Envelope(event=ShardingConfigured(config=other.to_json()))], 2)
        await log.close()
        options = ServeOptions(
            role="coordinator", bus=server.url, host=apiserver.url, shards=2, listen="127.0.0.1:0"
        )
        with pytest.raises(InputError, match="another sharding"):
            await serve(options)
        options = ServeOptions(role="shard", bus=server.url, shards=3, listen="127.0.0.1:0")
        with pytest.raises(InputError, match="needs at least 4 partitions"):
            await serve(options)
        options = ServeOptions(role="shard", bus=server.url, listen="127.0.0.1:0")
        with pytest.raises(InputError, match="the bus has 3 partitions; 1 shard"):
            await serve(options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (ServeOptions(role="shard", bus="memory"), "--bus memory works only with --role all"),
        (ServeOptions(role="oracle"), "unknown role"),
        (ServeOptions(listen="nowhere"), "HOST:PORT"),
        (ServeOptions(shards=0), "1 to 64 shards"),
        (ServeOptions(shards=65), "1 to 64 shards"),
        (ServeOptions(role="coordinator", bus="tcp://x:1"), "give --shards N"),
        (ServeOptions(role="shard", bus="tcp://x:1", shards=2, shard_id=2), "shard 2 does not"),
        (
            ServeOptions(role="shard", bus="tcp://x:1", shards=2, identity="shoal-shard-5"),
            "shard 5 does not",
        ),
        (ServeOptions(shards=3, sharding=Sharding(shards=2)), "for 2 shards"),
    ],
)
async def test_bad_options(options: ServeOptions, message: str) -> None:
    with pytest.raises(InputError, match=message):
        await serve(options)


def test_shard_ordinal() -> None:
    assert shard_ordinal("shoal-shard-3") == 3
    assert shard_ordinal("laptop") == 0


async def test_sigterm_stops_cleanly_and_a_second_start_continues_the_log(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    apiserver.put("Node", node("n1"))
    for i in range(3):
        apiserver.put("Pod", pod(f"p{i}"))
    log = tmp_path / "serve.events"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    async def serve_until_bound(names: list[str]) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shards.cli",
            "-v",
            "serve",
            "--bus",
            f"file:{log}",
            "--host",
            apiserver.url,
            "--listen",
            "127.0.0.1:0",
            "--watch-seconds",
            "1",
            "--lease-seconds",
            "3",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        try:
            await eventually(
                lambda: (
                    proc.returncode is not None
                    or all(
                        apiserver.get("Pod", n, "default")["spec"].get("nodeName") for n in names
                    )
                ),
                timeout=60,
            )
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()[-2000:]

    await serve_until_bound([f"p{i}" for i in range(3)])
    # the same command again, on its own log: it continues it (a restarted pod does this)
    apiserver.put("Node", node("n2"))
    for i in range(3, 6):
        apiserver.put("Pod", pod(f"p{i}"))
    await serve_until_bound([f"p{i}" for i in range(6)])
    replay = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "shards.cli",
        "replay",
        str(log),
        "--verify",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    out, err = await replay.communicate()
    assert replay.returncode == 0, err.decode()
    # six bindings at least; pods listed before the node first get a "no node" verdict
    verified = re.search(rb"verified: (\d+) decisions in \d+ passes match the log", out)
    assert verified is not None and int(verified.group(1)) >= 6, out.decode()[-500:]
    assert b"6 bound" in out


class FlakyLog:
    """A real log that fails on demand (fault injection for the bus)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.failing = False

    @property
    def partitions(self) -> int:
        return int(self.inner.partitions)

    async def append(self, envelopes: Any, partition: int = 0) -> list[int]:
        if self.failing:
            raise LogError("the bus is down")
        result: list[int] = await self.inner.append(envelopes, partition)
        return result

    async def read(self, partition: int, offset: int, limit: int | None = None) -> list[Any]:
        if self.failing:
            raise LogError("the bus is down")
        result: list[Any] = await self.inner.read(partition, offset, limit)
        return result

    async def end_offset(self, partition: int) -> int:
        if self.failing:
            raise LogError("the bus is down")
        return int(await self.inner.end_offset(partition))

    async def close(self) -> None:
        await self.inner.close()


async def test_bus_outage_is_ridden_out(
    apiserver: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bus fails for a while: nothing crashes, readiness drops after a while is not
    required here, and once it is back pods get bound, none twice, and the log replays."""
    from events.memory import MemoryLog
    from shards import serve as serve_module
    from shards.replay import replay

    flaky = FlakyLog(MemoryLog())

    async def open_flaky(url: str, **_: Any) -> FlakyLog:
        return flaky

    monkeypatch.setattr(serve_module, "open_bus", open_flaky)
    apiserver.put("Node", node("n1"))
    async with running(apiserver) as service:
        apiserver.put("Pod", pod("before"))
        await eventually(
            lambda: bool(apiserver.get("Pod", "before", "default")["spec"].get("nodeName")),
            timeout=15,
        )
        flaky.failing = True
        apiserver.put("Pod", pod("during"))
        await asyncio.sleep(1.0)
        assert apiserver.get("Pod", "during", "default")["spec"].get("nodeName") is None
        flaky.failing = False
        await eventually(
            lambda: bool(apiserver.get("Pod", "during", "default")["spec"].get("nodeName")),
            timeout=15,
        )
        assert 'shoal_bus_errors_total{role="shard"}' in service.metrics.render()
    records = await flaky.inner.read(0, 0)
    bound = [
        e.event.pod
        for e in records
        if isinstance(e.event, PodBound) and e.producer.startswith("shard-")
    ]
    assert sorted(bound) == ["default/before", "default/during"], bound
    assert replay(records, verify=True).mismatch is None


async def test_healthz_fails_while_a_role_is_stuck_and_recovers_with_it(
    apiserver: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bus that keeps failing leaves every role retrying: /healthz says which roles are
    stuck (so Kubernetes restarts the process), and is healthy again once they move."""
    from events.memory import MemoryLog
    from shards import serve as serve_module

    flaky = FlakyLog(MemoryLog())

    async def open_flaky(url: str, **_: Any) -> FlakyLog:
        return flaky

    monkeypatch.setattr(serve_module, "open_bus", open_flaky)
    apiserver.put("Node", node("n1"))
    async with running(apiserver, stuck_after=1.0) as service:
        apiserver.put("Pod", pod("p"))
        await eventually(
            lambda: bool(apiserver.get("Pod", "p", "default")["spec"].get("nodeName")),
            timeout=30,
        )
        assert (await get(f"{service.url}/healthz"))[0] == 200
        flaky.failing = True
        await eventually(lambda: {"binder", "shard-0"} <= set(service.stuck()), timeout=60)
        status, text = await get(f"{service.url}/healthz")
        assert status == 503 and "binder" in text and "shard-0" in text, text
        flaky.failing = False
        await eventually(lambda: not service.stuck(), timeout=60)
        assert (await get(f"{service.url}/healthz"))[0] == 200


async def test_a_node_no_column_can_hold_is_quarantined_and_counted(
    apiserver: FakeApiServer,
) -> None:
    """Ingest refuses such a node at admission; one that another writer put in the log
    is quarantined by the shard, counted in the metrics, and the shard goes on."""
    apiserver.put("Node", node("huge", cpu="4e18"))
    apiserver.put("Node", node("n1"))
    async with running(apiserver) as service:
        assert service.bus is not None
        await eventually(
            lambda: (
                service.ingest is not None
                and any("Node huge" in r for r in service.ingest.rejected)
            )
        )
        hostile = NodeSpec(name="hostile", allocatable={"cpu": 1 << 60, "pods": 110})
        await service.bus.append([Envelope(event=NodeAdded(node=hostile), producer="other")])
        await eventually(
            lambda: 'shoal_records_quarantined{role="shard-0"} 1' in service.metrics.render(),
            timeout=30,
        )
        apiserver.put("Pod", pod("p"))
        await eventually(
            lambda: apiserver.get("Pod", "p", "default")["spec"].get("nodeName") == "n1",
            timeout=30,
        )


@pytest.mark.parametrize("shards", [1, 2])
async def test_a_pod_refused_at_admission_gets_an_event_and_the_rest_runs(
    apiserver: FakeApiServer, shards: int
) -> None:
    """A pod asking 100P CPUs cannot be held: ingest refuses it, and the binder writes a
    FailedScheduling Event on it that names its uid (what kubectl describe selects by);
    the other pods are bound."""
    apiserver.put("Node", node("n1"))
    huge = pod("huge")
    huge["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "100P"
    apiserver.put("Pod", huge)
    uid = apiserver.get("Pod", "huge", "default")["metadata"]["uid"]
    async with running(apiserver, shards=shards):
        apiserver.put("Pod", pod("fine"))
        await eventually(
            lambda: bool(apiserver.get("Pod", "fine", "default")["spec"].get("nodeName")),
            timeout=30,
        )

        def told() -> list[dict[str, Any]]:
            return [
                e
                for e in apiserver.all("Event")
                if e["involvedObject"]["name"] == "huge" and e["reason"] == "FailedScheduling"
            ]

        await eventually(lambda: bool(told()), timeout=30)
    (event,) = told()
    assert "refused at admission" in event["message"] and "cpu" in event["message"], event
    assert event["involvedObject"]["uid"] == uid and event["involvedObject"]["apiVersion"] == "v1"
    assert apiserver.get("Pod", "huge", "default")["spec"].get("nodeName") is None
