"""``shoal loadtest kube`` against the in-repo API server, with shoal serving it: nodes
and pods go in through the API, the measured pods are seen bound by a watch, and the
report has the throughput samples, latencies, CPU and the over-commit check."""

from __future__ import annotations

import argparse
import os
from typing import Any

import pytest

from events.errors import InputError
from loadtest.kube import run_kube
from tests.kube.apiserver import FakeApiServer
from tests.kube.test_serve import running


def _args(url: str, **overrides: Any) -> argparse.Namespace:
    values: dict[str, Any] = {
        "api": url,
        "kubeconfig": None,
        "token": "t",
        "insecure": False,
        "scheduler_name": "default-scheduler",
        "nodes": 4,
        "init_pods": 6,
        "pods": 30,
        "creators": 4,
        "timeout": 60.0,
        "tag": "t",
        "proc": [f"shoal={os.getpid()}"],
    }
    values.update(overrides)
    return argparse.Namespace(**values)


async def test_a_run_through_the_api_is_measured(apiserver: FakeApiServer) -> None:
    async with running(apiserver):
        result = await run_kube(_args(apiserver.url), lambda line: None)
    assert result["all_bound"] and result["bound"] == 30
    assert result["overcommitted_nodes"] == 0 and result["nodes_used"] >= 1
    assert result["pods_per_second"] > 0
    assert set(result["latency_ms"]) == {"p50", "p90", "p99"}
    assert sum(result["throughput"]["samples"]) <= 30
    assert "shoal" in result["cpu_seconds"]
    assert result["shape"]["workload"] == "SchedulingBasic"
    assert result["bound_while_creating"] <= 30
    machine = result["machine"]
    assert machine["cores"] >= 1
    assert 0 <= machine["busy_cores_while_creating"] <= machine["cores"]
    assert 0 <= machine["busy_cores_after_creating"] <= machine["cores"]


@pytest.mark.parametrize(
    ("overrides", "where"),
    [
        ({"api": "ftp://x"}, "--api"),
        ({"proc": ["shoal=not-a-pid"]}, "--proc"),
        ({"creators": 0}, "--creators"),
    ],
)
async def test_bad_options_name_themselves(overrides: dict[str, Any], where: str) -> None:
    with pytest.raises(InputError) as raised:
        await run_kube(_args("http://127.0.0.1:1", **overrides), lambda line: None)
    assert raised.value.location == where
