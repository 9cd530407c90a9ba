"""The metrics exporter (prometheus_client): types, full precision, process metrics, and
the format a scraper asks for (issue #28, item 12)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from shards.metrics import Metrics


def _families(text: str) -> dict[str, tuple[str, dict[str, float]]]:
    """Family name → (type, {sample name and labels: value})."""
    return {
        f.name: (
            f.type,
            {s.name + str(sorted(s.labels.items())): s.value for s in f.samples},
        )
        for f in text_string_to_metric_families(text)
    }


def test_counters_gauges_histograms_and_process_metrics_have_their_types() -> None:
    metrics = Metrics()
    metrics.inc("binder_actions_total", "Binder actions by kind.", 2, {"kind": "bound"})
    metrics.counted("extender_calls", "HTTP calls to extenders.", lambda: 7, {"role": "shard-0"})
    metrics.gauge("queue_depth", "Pods queued.", lambda: 3, {"shard": "0", "queue": "active"})
    metrics.observe("scheduling_attempt_seconds", "Seconds.", 0.003, {"shard": "0"})
    families = _families(metrics.render())
    assert families["shoal_binder_actions"] == (
        "counter",
        {"shoal_binder_actions_total[('kind', 'bound')]": 2.0},
    )
    assert families["shoal_extender_calls"] == (
        "counter",
        {"shoal_extender_calls_total[('role', 'shard-0')]": 7.0},
    )
    assert families["shoal_queue_depth"] == (
        "gauge",
        {"shoal_queue_depth[('queue', 'active'), ('shard', '0')]": 3.0},
    )
    kind, samples = families["shoal_scheduling_attempt_seconds"]
    assert kind == "histogram"
    assert samples["shoal_scheduling_attempt_seconds_count[('shard', '0')]"] == 1
    assert samples["shoal_scheduling_attempt_seconds_bucket[('le', '0.005'), ('shard', '0')]"] == 1
    assert samples["shoal_scheduling_attempt_seconds_bucket[('le', '0.0025'), ('shard', '0')]"] == 0
    # the process's own, from the client's collectors
    assert families["process_cpu_seconds"][0] == "counter"
    assert families["process_resident_memory_bytes"][0] == "gauge"
    assert families["process_resident_memory_bytes"][1]["process_resident_memory_bytes[]"] > 0
    assert "python_info" in families
    # nothing counted is exposed as a gauge
    for name, (kind, samples) in families.items():
        if any(s.split("[")[0].endswith("_total") for s in samples):
            assert kind == "counter", name


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=2**53), st.integers(min_value=0, max_value=2**53))
def test_large_values_keep_full_precision(counted: int, gauged: int) -> None:
    metrics = Metrics(process=False)
    metrics.inc("bus_errors_total", "Bus operations that failed.", counted, {"role": "shard"})
    metrics.gauge("consumer_lag_records", "Records not yet read.", lambda: gauged)
    families = _families(metrics.render())
    assert families["shoal_bus_errors"][1]["shoal_bus_errors_total[('role', 'shard')]"] == counted
    assert families["shoal_consumer_lag_records"][1]["shoal_consumer_lag_records[]"] == gauged


def test_the_scraper_gets_openmetrics_when_it_asks_for_it() -> None:
    metrics = Metrics(process=False)
    metrics.inc("binder_actions_total", "Binder actions by kind.", 1234567, {"kind": "bound"})
    body, content_type = metrics.exposition("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    (family,) = [f for f in openmetrics_families(body.decode()) if f.name == "shoal_binder_actions"]
    assert family.type == "counter" and family.samples[0].value == 1234567
    body, content_type = metrics.exposition("")
    assert content_type.startswith("text/plain")


def test_a_name_reused_with_other_labels_or_another_type_is_refused() -> None:
    metrics = Metrics(process=False)
    metrics.inc("binder_actions_total", "Binder actions by kind.", 1, {"kind": "bound"})
    with pytest.raises(ValueError, match="labels"):
        metrics.inc("binder_actions_total", "Binder actions by kind.", 1, {"shard": "0"})
    with pytest.raises(ValueError, match="counter"):
        metrics.gauge("binder_actions_total", "Binder actions by kind.", lambda: 1)
