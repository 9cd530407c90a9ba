"""``shoal loadtest kube --realkube``: kube-scheduler and shoal alternated, each on a
fresh etcd and kube-apiserver v1.37 (``loadtest/kubepeer.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from events.errors import InputError
from loadtest.kubepeer import alternate, check, table
from tests.kube.realkube import DEFAULT, require


def _args(build: Path, **overrides: Any) -> argparse.Namespace:
    values: dict[str, Any] = {
        "realkube": str(build),
        "api": None,
        "kubeconfig": None,
        "token": "",
        "insecure": False,
        "scheduler_name": "shoal",
        "nodes": 20,
        "init_pods": 10,
        "pods": 60,
        "creators": 4,
        "timeout": 120.0,
        "tag": "0",
        "proc": [],
        "alternate": 1,
        "shoal_shards": 1,
        "json": False,
    }
    values.update(overrides)
    return argparse.Namespace(**values)


def test_what_it_cannot_honour_is_refused(tmp_path: Path) -> None:
    """No build there; no rounds or shards; a --proc or --scheduler-name, which this
    mode decides itself."""
    with pytest.raises(InputError, match="bin/kube-apiserver") as missing:
        check(_args(tmp_path))
    assert missing.value.location == "--realkube"
    for name in ("kube-apiserver", "kube-scheduler", "etcd"):
        (tmp_path / "bin").mkdir(exist_ok=True)
        (tmp_path / "bin" / name).write_text("")
    assert check(_args(tmp_path)) == tmp_path
    with pytest.raises(InputError) as proc:
        check(_args(tmp_path, proc=["x=1"]))
    assert proc.value.location == "--proc"
    for flag in ("alternate", "shoal_shards"):
        with pytest.raises(InputError) as zero:
            check(_args(tmp_path, **{flag: 0}))
        assert zero.value.location == f"--{flag.replace('_', '-')}"
    with pytest.raises(InputError) as named:
        check(_args(tmp_path, scheduler_name="other"))
    assert named.value.location == "--scheduler-name"


def test_the_table_has_a_line_per_run() -> None:
    run = {
        "bound": 60,
        "pods_per_second": 12.5,
        "latency_ms": {"p50": 100.0, "p90": 150.0, "p99": 200.0},
        "cpu_ms_per_bound_pod": {"scheduler": 1.5, "apiserver": 4.0, "etcd": 1.0},
    }
    text = table({"runs": [{"peer": "kube-scheduler", "round": 1, **run}]})
    lines = text.splitlines()
    assert len(lines) == 2 and "p99" in lines[0]
    assert lines[1].split() == [
        "kube-scheduler",
        "1",
        "60",
        "12.5",
        "100",
        "200",
        "1.50",
        "4.00",
        "1.00",
    ]


@pytest.mark.slow
async def test_both_are_measured_each_on_a_fresh_server() -> None:
    """One round: kube-scheduler, then shoal, every measured pod bound by each."""
    require(DEFAULT)
    result = await alternate(_args(DEFAULT.cache), lambda line: None)
    assert [r["peer"] for r in result["runs"]] == ["kube-scheduler", "shoal"]
    for run in result["runs"]:
        assert run["all_bound"] and not run["overcommitted_nodes"], run
        assert set(run["cpu_seconds"]) == {"scheduler", "apiserver", "etcd"}
