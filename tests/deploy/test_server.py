"""deploy/ on a real kube-apiserver v1.37 (``tests/kube/realkube.py``, with RBAC).

- Every rendering the documentation tells an operator to apply is accepted by the server:
  each object is sent as a server-side apply with ``dryRun=All`` and strict field
  validation (what ``kubectl apply --server-side --dry-run=server`` sends), so the
  server's own schemas, defaulting and admission judge it; a broken manifest is refused.
  The Strimzi ``KafkaTopic`` of ``deploy/kafka/`` is checked against a stand-in CRD that
  declares only the fields the manifest sets.
- The base, applied for real, runs: ``shoal serve`` started with the manifests' own command
  lines, each process as its pod's ServiceAccount (under exactly the RBAC the manifests
  grant), binds a pod. What a pod would get from the cluster is given instead: the
  ConfigMap's files in a folder of the test, a kubeconfig holding the ServiceAccount's
  token, a free port for ``--listen``, and a log server for the bus (no Kafka here).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_manifests import DEPLOY, RENDERINGS, ROOT, render
from tests.kube.realkube import V1_37, RealApiServer, require
from tests.kube.test_ingest import node, pod

JSON = dict[str, Any]
KAFKA_TOPIC_CRD: JSON = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "kafkatopics.kafka.strimzi.io"},
    "spec": {
        "group": "kafka.strimzi.io",
        "names": {"kind": "KafkaTopic", "plural": "kafkatopics", "singular": "kafkatopic"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1beta2",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "partitions": {"type": "integer", "minimum": 1},
                                    "replicas": {"type": "integer", "minimum": 1},
                                    "config": {
                                        "type": "object",
                                        "x-kubernetes-preserve-unknown-fields": True,
                                    },
                                },
                            }
                        },
                    }
                },
            }
        ],
    },
}
"""A stand-in for Strimzi's CRD: the fields deploy/kafka/kafka-topic.yaml sets."""
ENV_REF = re.compile(r"\$\(([A-Z_]+)\)")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealApiServer]:
    require(V1_37)
    server = RealApiServer(
        tmp_path_factory.mktemp("deploy-v1.37"), authorization="RBAC", build=V1_37
    )
    server.start()  # with deploy/crds/ created
    try:
        for namespace in ("shoal", "kafka"):
            server.namespace(namespace)
        server.apply(KAFKA_TOPIC_CRD)
        _until(lambda: _served(server, "/apis/kafka.strimzi.io/v1beta2/kafkatopics"), "CRD")
        yield server
    finally:
        server.stop()


def _served(server: RealApiServer, path: str) -> bool:
    try:
        server._call("GET", path)
    except urllib.error.HTTPError:
        return False
    return True


def _until(condition: Callable[[], object], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not in {timeout} s"
        time.sleep(0.2)


class Applier:
    """Server-side apply of any object, the resource found through discovery."""

    def __init__(self, server: RealApiServer) -> None:
        self.server = server
        self._resources: dict[str, dict[str, JSON]] = {}

    def path(self, doc: JSON) -> str:
        group_version = doc["apiVersion"]
        base = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
        if group_version not in self._resources:
            found = self.server._call("GET", base)["resources"]
            self._resources[group_version] = {r["kind"]: r for r in found if "/" not in r["name"]}
        resource = self._resources[group_version][doc["kind"]]
        meta = doc["metadata"]
        if resource["namespaced"]:
            base += f"/namespaces/{meta.get('namespace', 'default')}"
        return f"{base}/{resource['name']}/{meta['name']}"

    def apply(self, doc: JSON, *, dry_run: bool) -> JSON:
        query = "?fieldManager=shoal-tests&force=true&fieldValidation=Strict"
        if dry_run:
            query += "&dryRun=All"
        try:
            return self.server._call(
                "PATCH", self.path(doc) + query, doc, "application/apply-patch+yaml"
            )
        except urllib.error.HTTPError as exc:
            raise Refused(exc.code, exc.read().decode(errors="replace")) from None


class Refused(Exception):
    def __init__(self, code: int, body: str) -> None:
        super().__init__(f"{code}: {body}")
        self.code = code
        self.body = body


@pytest.mark.parametrize("rendering", RENDERINGS)
def test_the_server_accepts_every_rendering(server: RealApiServer, rendering: str) -> None:
    applier = Applier(server)
    for doc in render(ROOT / rendering):
        try:
            answer = applier.apply(doc, dry_run=True)
        except Refused as exc:
            what = f"{rendering}: {doc['kind']} {doc['metadata']['name']}"
            raise AssertionError(f"{what}: {exc}") from None
        assert answer["metadata"]["name"] == doc["metadata"]["name"]


@pytest.mark.parametrize(
    ("field", "value", "refusal"),
    [
        ("replicas", "two", ".spec.replicas: expected numeric"),
        ("replica", 2, ".spec.replica: field not declared in schema"),
    ],
)
def test_the_server_refuses_a_broken_manifest(
    server: RealApiServer, field: str, value: Any, refusal: str
) -> None:
    doc = next(d for d in render(DEPLOY) if d["kind"] == "Deployment")
    doc["spec"][field] = value
    with pytest.raises(Refused) as refused:
        Applier(server).apply(doc, dry_run=True)
    assert refused.value.code >= 400  # 500 for a wrong type: the apply cannot be typed
    assert refusal in refused.value.body


# --------------------------------------------------------------------------- shoal serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _command_lines(docs: list[JSON], etc: Path) -> list[tuple[str, list[str], str | None]]:
    """Each pod's ``shoal`` command line with its ``$(VAR)`` references resolved as the
    kubelet would, the ConfigMap's files under ``etc``; and its ServiceAccount where
    the pod mounts a token. One per Deployment, one per StatefulSet replica."""
    by_kind: dict[str, dict[str, JSON]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    configmaps = by_kind["ConfigMap"]
    lines = []
    for kind in ("Deployment", "StatefulSet"):
        for name, workload in by_kind[kind].items():
            pod = workload["spec"]["template"]["spec"]
            container = pod["containers"][0]
            assert container["command"] == ["shoal"]
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            for volume in pod["volumes"]:
                if "configMap" in volume:
                    data = configmaps[volume["configMap"]["name"]]["data"]
                    for item in volume["configMap"]["items"]:
                        target = etc / mounts[volume["name"]].lstrip("/") / item["path"]
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_text(data[item["key"]])
            account = pod["serviceAccountName"] if pod.get("automountServiceAccountToken") else None
            replicas = workload["spec"]["replicas"] if kind == "StatefulSet" else 1
            for ordinal in range(replicas):
                env = {
                    "POD_NAME": f"{name}-{ordinal}",
                    "POD_NAMESPACE": workload["metadata"]["namespace"],
                }
                for var in container["env"]:
                    ref = var.get("valueFrom", {}).get("configMapKeyRef")
                    if ref:
                        env[var["name"]] = configmaps[ref["name"]]["data"][ref["key"]]
                args = [
                    _resolve(a, env).replace("=/etc/", f"={etc}/etc/") for a in container["args"]
                ]
                lines.append((f"{name}-{ordinal}", args, account))
    return lines


def _resolve(arg: str, env: dict[str, str]) -> str:
    return ENV_REF.sub(lambda m: env[m.group(1)], arg)


@contextlib.contextmanager
def _processes(
    commands: list[tuple[list[str], Path]],
    env: dict[str, str],
    after: Callable[[], bool] = lambda: True,
) -> Iterator[None]:
    """The commands running (once ``after`` holds), each logging into its file; stopped
    by SIGTERM on exit."""
    _until(after, "ready to start")
    running = []
    try:
        for command, log in commands:
            with log.open("w") as out:
                running.append(
                    subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
                )
        yield
    finally:
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        for process in running:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def test_the_base_runs_with_its_own_command_lines(server: RealApiServer, tmp_path: Path) -> None:
    docs = render(DEPLOY)
    applier = Applier(server)
    for doc in docs:
        applier.apply(doc, dry_run=False)
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "shoal")
    shards = int(config["data"]["SHOAL_SHARDS"])
    server.put("Node", node("n1"))
    server.put("Pod", pod("p0", scheduler="shoal"))

    token = tmp_path / "log-token"
    token.write_text("deploy-test-token-0123456789\n")
    bus_port = _free_port()
    bus = f"tcp://127.0.0.1:{bus_port}"
    shoal = [sys.executable, "-m", "shards.cli"]
    log_server = [
        *shoal,
        "log-server",
        f"--listen=127.0.0.1:{bus_port}",
        f"--partitions={shards + 1}",
        f"--token-file={token}",
    ]
    commands = []
    readyz = []
    for name, own, account in _command_lines(docs, tmp_path):
        port = _free_port()
        readyz.append((name, f"http://127.0.0.1:{port}/readyz"))
        args = [
            re.sub(r"^--listen=127\.0\.0\.1:9090$", f"--listen=127.0.0.1:{port}", a)
            for a in (re.sub(r"^--bus=.*", f"--bus={bus}", a) for a in own)
        ]
        assert f"--listen=127.0.0.1:{port}" in args and f"--bus={bus}" in args, args
        if account is not None:
            role = account.removeprefix("shoal-")
            args.append(f"--kubeconfig={server.kubeconfig_for(role, f'{role}-token-0123456789')}")
        commands.append(([*shoal, *args], tmp_path / f"{name}.log"))
    env = {
        **os.environ,
        "SHOAL_SHARDS": str(shards),
        "SHOAL_LOG_TOKEN_FILE": str(token),
        "PYTHONPATH": str(ROOT),
    }
    with (
        _processes([(log_server, tmp_path / "log-server.log")], env),
        _processes(commands, env, after=lambda: _listening(bus_port)),
    ):
        try:
            _until(lambda: (server.get("Pod", "p0") or {})["spec"].get("nodeName"), "bound", 90)
            _until(lambda: all(_status(url) == 200 for _, url in readyz), "ready", 30)
        except AssertionError as exc:
            logs = "\n".join(
                f"--- {log.name}\n{log.read_text()[-1500:]}" for log in tmp_path.glob("*.log")
            )
            raise AssertionError(f"{exc}; {[(n, _status(u)) for n, u in readyz]}\n{logs}") from None
    assert server.get("Pod", "p0")["spec"]["nodeName"] == "n1"  # type: ignore[index]
    leases = {lease["metadata"]["name"] for lease in server.all("Lease")}
    assert {"shoal-ingest", "shoal-coordinator", "shoal-binder"} <= leases
