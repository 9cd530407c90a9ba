"""shoal serve's /metrics as Prometheus reads it: parsed with prometheus_client's own
parser, counts are counters, the process's metrics are there, a large value keeps its
digits (issue #28, item 12)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from shards.serve import ServeOptions, Service
from tests.kube.apiserver import FakeApiServer
from tests.kube.test_ingest import eventually, node, pod
from tests.kube.test_serve import running


async def test_metrics_scrape_parses_with_the_types_prometheus_expects(
    apiserver: FakeApiServer,
) -> None:
    apiserver.put("Node", node("n1"))
    apiserver.put("Pod", pod("p0"))
    async with running(apiserver) as service:
        await eventually(
            lambda: bool(apiserver.get("Pod", "p0", "default")["spec"].get("nodeName")), timeout=30
        )
        service.metrics.gauge("test_large", "A large value.", lambda: 1234567891.0)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{service.url}/metrics") as response,
        ):
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=")
            text = await response.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    kinds = {name: f.type for name, f in families.items()}
    for name in ("shoal_schedule_attempts", "shoal_binder_actions", "shoal_extender_calls"):
        assert kinds[name] == "counter", (name, kinds.get(name))
    assert kinds["shoal_queue_depth"] == "gauge"
    assert kinds["shoal_consumer_lag_records"] == "gauge"
    assert kinds["shoal_scheduling_attempt_seconds"] == "histogram"
    assert kinds["process_cpu_seconds"] == "counter"
    assert kinds["process_open_fds"] == "gauge"
    (bound,) = [
        s
        for s in families["shoal_schedule_attempts"].samples
        if s.name.endswith("_total") and s.labels == {"result": "bound", "shard": "0"}
    ]
    assert bound.value >= 1
    assert families["shoal_test_large"].samples[0].value == 1234567891


def test_extender_counters_carry_on_across_a_rebuilt_fold() -> None:
    """A shard's fold is rebuilt after a bus failure with its extender counts at zero;
    the counter goes on from where the old fold left it, never down."""
    service = Service(ServeOptions())

    def fold(calls: int) -> Any:
        stats = SimpleNamespace(calls=calls, failures=0, timeouts=0)
        return SimpleNamespace(asker=SimpleNamespace(stats=stats))

    read = service._extender_count("shard-0", "calls")
    assert read() == 0
    service.workers[0] = fold(5)
    assert read() == 5
    service._retire("shard-0", service.workers[0])
    service.workers[0] = fold(2)
    assert read() == 7
