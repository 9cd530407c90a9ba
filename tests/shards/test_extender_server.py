"""``shoal extender`` as kube-scheduler meets it: a real process on 127.0.0.1, requests in
kube-scheduler's exact JSON (``k8s.io/kube-scheduler/extender/v1``), hostile ones too
(a 4xx, never a crash), a gang held at bind until it can bind whole, and a log whose
answers ``--verify`` derives again."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0


@dataclass
class Served:
    port: int
    proc: subprocess.Popen[str]
    log: Path

    def post(self, verb: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/{verb}",
            data=data,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=DEADLINE) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start(tmp_path: Path, *extra: str) -> Served:
    port = free_port()
    log = tmp_path / "extender.events"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shards.cli",
            "extender",
            "--listen",
            f"127.0.0.1:{port}",
            "--log",
            str(log),
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return Served(port, proc, log)
        except OSError:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "shoal extender did not start"
            time.sleep(0.05)


def stop(served: Served) -> str:
    served.proc.terminate()
    _, err = served.proc.communicate(timeout=DEADLINE)
    assert served.proc.returncode == 0, err
    return err


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = start(tmp_path)
    try:
        yield s
    finally:
        if s.proc.poll() is None:
            stop(s)


def node(name: str, cpu: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {
            "capacity": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
        },
    }


def pod(name: str, cpu: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "labels": labels or {},
        },
        "spec": {
            "schedulerName": "default-scheduler",
            "priority": 0,
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}],
        },
    }


NODES = {"apiVersion": "v1", "kind": "NodeList", "items": [node("small", "2"), node("big", "8")]}


def args(p: dict[str, Any], nodes: Any = NODES) -> dict[str, Any]:
    """``ExtenderArgs`` as kube-scheduler sends it to an extender that is not
    nodeCacheCapable."""
    return {"Pod": p, "Nodes": nodes, "NodeNames": None}


def verify(log: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "shards.cli", "extender", "--verify", str(log)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("verified:")


def test_filter_prioritize_and_bind_in_kube_schedulers_json(served: Served) -> None:
    status, result = served.post("filter", args(pod("web", "4")))
    assert status == 200
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["big"]
    assert result["FailedNodes"] == {"small": "rejected by NodeResourcesFit"}
    assert result["Error"] == ""
    status, scores = served.post("prioritize", args(pod("web", "1")))
    assert status == 200
    assert {s["Host"] for s in scores} == {"small", "big"}
    assert all(0 <= s["Score"] <= 10 for s in scores)
    binding = {"PodName": "web", "PodNamespace": "default", "PodUID": "uid-web", "Node": "big"}
    assert served.post("bind", binding) == (200, {"Error": ""})
    # big has 4 of 8 cpu left now: a pod of 5 fits nowhere
    status, result = served.post("filter", args(pod("db", "5")))
    assert result["Nodes"]["items"] == []
    assert set(result["FailedNodes"]) == {"small", "big"}
    # nodeCacheCapable: names only, of nodes it has seen
    status, result = served.post(
        "filter", {"Pod": pod("tiny", "1"), "Nodes": None, "NodeNames": ["small", "big", "new"]}
    )
    assert status == 200
    assert result["NodeNames"] == ["small", "big"]
    assert "new" in result["FailedAndUnresolvableNodes"]
    stop(served)
    verify(served.log)


def test_a_gang_is_held_at_bind_until_it_can_bind_whole(served: Served) -> None:
    labels = {
        "pod-group.scheduling.sigs.k8s.io/name": "train",
        "pod-group.scheduling.sigs.k8s.io/min-available": "2",
    }
    members = [pod(f"w{i}", "1", labels) for i in range(2)]
    for m in members:
        assert served.post("filter", args(m))[0] == 200

    def bind(i: int) -> tuple[int, Any]:
        return served.post(
            "bind",
            {"PodName": f"w{i}", "PodNamespace": "default", "PodUID": f"uid-w{i}", "Node": "big"},
        )

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(bind, 0)
        time.sleep(0.3)  # (not a wait on a condition: only to make w0 ask first)
        assert not first.done()  # held: its gang is not whole yet
        second = pool.submit(bind, 1)
        assert second.result(timeout=DEADLINE) == (200, {"Error": ""})
        assert first.result(timeout=DEADLINE) == (200, {"Error": ""})
    stop(served)
    verify(served.log)


def test_a_gang_that_never_completes_gets_an_error_at_bind(tmp_path: Path) -> None:
    s = start(tmp_path, "--gang-wait", "0.2")
    try:
        labels = {
            "pod-group.scheduling.sigs.k8s.io/name": "g",
            "pod-group.scheduling.sigs.k8s.io/min-available": "3",
        }
        assert s.post("filter", args(pod("m0", "1", labels)))[0] == 200
        status, result = s.post(
            "bind", {"PodName": "m0", "PodNamespace": "default", "PodUID": "", "Node": "big"}
        )
        assert status == 200
        assert "minMember 3" in result["Error"]
    finally:
        stop(s)


HOSTILE = [
    b"",
    b"{not json",
    b"[]",
    b"null",
    b'{"Pod": 3}',
    b'{"Pod": {"metadata": {}}, "NodeNames": ["a"]}',
    b'{"Pod": {"metadata": {"name": "x"}, "spec": {}}, "Nodes": {"items": 7}}',
    b'{"Pod": {"metadata": {"name": "x"}, "spec": {}}, "Nodes": {"items": [{"metadata": {"name": 5}}]}}',
    b'{"Pod": {"metadata": {"name": "x"}, "spec": {"containers": [{"resources": {"requests": {"cpu": "-1"}}}]}}, "NodeNames": []}',
    b'{"Pod": {"metadata": {"name": "x"}, "spec": {}}, "NodeNames": "abc"}',
    b"[" * 100_000 + b"]" * 100_000,
    b'{"Pod": {"metadata": {"name": "' + b"x" * 1_000_000 + b'"}, "spec": {}}, "NodeNames": []}',
]


def test_hostile_requests_get_a_4xx_and_the_server_goes_on(served: Served) -> None:
    for raw in HOSTILE:
        for verb in ("filter", "prioritize", "bind"):
            status, _ = served.post(verb, raw=raw)
            assert 400 <= status < 500, (verb, raw[:80], status)
    assert served.post("filter", args(pod("ok", "1")))[0] == 200
    assert "Traceback" not in stop(served)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = st.sampled_from(["Pod", "Nodes", "NodeNames", "pod", "nodes", "PodName", "Node", "x"])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.dictionaries(KEYS, JSON, max_size=4), st.sampled_from(["filter", "prioritize", "bind"]))
def test_wrong_types_anywhere_never_crash_it(
    served: Served, body: dict[str, Any], verb: str
) -> None:
    status, _ = served.post(verb, body)
    assert status == 200 or 400 <= status < 500
    assert served.proc.poll() is None


def test_elastic_quotas_of_objects_hold_a_namespace_to_its_max(tmp_path: Path) -> None:
    objects = tmp_path / "objects.yaml"
    objects.write_text(
        "apiVersion: scheduling.x-k8s.io/v1alpha1\n"
        "kind: ElasticQuota\n"
        "metadata: {name: quota, namespace: default}\n"
        "spec:\n"
        '  min: {cpu: "2"}\n'
        '  max: {cpu: "3"}\n'
    )
    s = start(tmp_path, "--objects", str(objects))
    try:
        status, result = s.post("filter", args(pod("first", "2")))
        assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["small", "big"]
        binding = {"PodName": "first", "PodNamespace": "default", "PodUID": "", "Node": "big"}
        assert s.post("bind", binding) == (200, {"Error": ""})
        # 2 of the namespace's max 3 cpu are used: a pod of 2 more is over it everywhere
        status, result = s.post("filter", args(pod("second", "2")))
        assert status == 200
        assert result["Nodes"]["items"] == []
        assert all("ElasticQuota" in why for why in result["FailedNodes"].values())
    finally:
        stop(s)
    verify(s.log)
