"""A real kube-apiserver v1.37 with etcd for the end-to-end tests of ``tests/kube/`` and
``tests/deploy/`` (:data:`V1_37`, with kube-scheduler and kustomize).

Built once by ``./dev kube build`` into ``$SHOAL_REALKUBE137`` (by default
``${XDG_CACHE_HOME:-~/.cache}/shoal/realkube-v1.37.2``), started here on 127.0.0.1 on
free ports for the test session (``tools/realkube137/start.sh``: with the feature gate
and API version of Kubernetes' own Workload and PodGroup), stopped at its end by the
PIDs it recorded. Tests marked ``real_kube`` run against it as well as against the
in-repo server; without the build they are skipped, saying why, unless
``SHOAL_REAL_KUBE=1`` demands them (then its absence is an error: :func:`require`).

:class:`RealApiServer` offers what the tests use of ``FakeApiServer``: ``put``, ``get``,
``remove``, ``all`` as synchronous calls (the tests make them between awaits; a short
blocking HTTP call to another process holds nothing up), ``url`` and a kubeconfig.
``remove`` of a pod is a kubelet's final delete (grace period 0). Between tests the
cluster is emptied of what tests create.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube.apiserver import KINDS, Kind

JSON = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
START = ROOT / "tools" / "realkube137" / "start.sh"


def _cache(variable: str, version: str) -> Path:
    return Path(
        os.environ.get(variable)
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "shoal"
        / f"realkube-{version}"
    )


@dataclass(frozen=True)
class Build:
    """One build of the control plane in the cache: where, and the binaries it has."""

    version: str
    cache: Path
    binaries: tuple[str, ...]

    def missing(self) -> str | None:
        """Why this build cannot run here, or None."""
        for binary in self.binaries:
            if not (self.cache / binary).is_file():
                return f"no real Kubernetes {self.version} built in {self.cache} (./dev kube build)"
        return None

    def binary(self, name: str) -> Path:
        return self.cache / "bin" / name


V1_37 = Build(
    "v1.37.2",
    _cache("SHOAL_REALKUBE137", "v1.37.2"),
    tuple(f"bin/{b}" for b in ("kube-apiserver", "kube-scheduler", "etcd", "kustomize")),
)
DEFAULT = V1_37
"""The build the tests of tests/kube/ run against."""
TOKEN = "admin-token-0123456789"
WITH_STATUS = {
    "Pod",
    "PodGroup",
    "PodDisruptionBudget",
    "ElasticQuota",
    "KubePodGroup",
    "VolcanoPodGroup",
    "KaiPodGroup",
    "TencentPodGroup",
}
"""Kinds whose status is written through the status subresource only."""
EMPTIED = [
    "Pod",
    "Event",
    "PodGroup",
    "KubePodGroup",
    "Workload",
    "VolcanoPodGroup",
    "KaiPodGroup",
    "TencentPodGroup",
    "ElasticQuota",
    "PodDisruptionBudget",
    "Lease",
    "Node",
]
CRDS = [
    *sorted((ROOT / "deploy" / "crds").glob("*.yaml")),
    *sorted((ROOT / "tests" / "fixtures" / "crds").glob("*.yaml")),
]
"""scheduler-plugins' CRDs (``deploy/crds``) and stand-ins for Volcano's, KAI's and
Tencent's."""


def missing() -> str | None:
    """Why the real server of tests/kube/ cannot run here, or None."""
    asked = os.environ.get("SHOAL_KUBE")
    if asked and asked != "v1.37":  # (v1.20, once the default, was dropped)
        return f"SHOAL_KUBE={asked}: the tests run against v1.37 only"
    return DEFAULT.missing()


def require(build: Build) -> None:
    """Skip the test, saying why, when ``build`` is not there; fail instead when
    ``SHOAL_REAL_KUBE=1`` demands the real server (CI builds it first)."""
    why = build.missing()
    if why is None:
        return
    if os.environ.get("SHOAL_REAL_KUBE") == "1":
        pytest.fail(f"SHOAL_REAL_KUBE=1 but {why}")
    pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RealApiServer:
    """etcd + kube-apiserver started for a session; the fake's test helpers over HTTP."""

    def __init__(
        self, run: Path, *, authorization: str = "AlwaysAllow", build: Build = DEFAULT
    ) -> None:
        self.run = run
        self.authorization = authorization
        self.build = build
        self.url = ""
        self.kubeconfig = str(run / "admin.kubeconfig")
        self._ssl = ssl.create_default_context()
        self._namespaces: set[str] = {"default"}

    def __repr__(self) -> str:
        return f"RealApiServer({self.url!r})"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> str:
        env = {
            **os.environ,
            "RK": str(self.build.cache),
            "AUTHZ": self.authorization,
            "API_PORT": str(_free_port()),
            "ETCD_PORT": str(_free_port()),
            "ETCD_PEER": str(_free_port()),
            "ETCD_METRICS": str(_free_port()),
        }
        done = subprocess.run(
            ["bash", str(START), "up", str(self.run)],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            self.stop()
            raise RuntimeError(f"the real kube-apiserver did not start: {done.stderr[-2000:]}")
        self.url = (self.run / "url").read_text().strip()
        self._ssl = ssl.create_default_context(cafile=str(self.build.cache / "pki" / "ca.crt"))
        for crd in CRDS:
            for doc in yaml.safe_load_all(crd.read_text()):
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    self._call(
                        "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc
                    )
        self._until_served()
        return self.url

    def _until_served(self) -> None:
        """The CRDs are served (established) and the default namespace exists."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                self._call("GET", "/apis/scheduling.x-k8s.io/v1alpha1/podgroups")
                self._call("GET", "/apis/scheduling.x-k8s.io/v1alpha1/elasticquotas")
                self._call("GET", "/apis/scheduling.volcano.sh/v1beta1/podgroups")
                self._call("GET", "/apis/scheduling.run.ai/v2alpha2/podgroups")
                self._call("GET", "/apis/batch.scheduler.tencent.com/v1/podgroups")
                self._call("GET", "/api/v1/namespaces/default")
                return
            except urllib.error.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("the CRDs were not served in time")

    def stop(self) -> None:
        subprocess.run(
            ["bash", str(START), "down", str(self.run)],
            check=False,
            # its data is thrown away: no need to wait for a clean exit
            env={**os.environ, "RK": str(self.build.cache), "GRACE": "1"},
            capture_output=True,
            timeout=60,
        )

    def kubeconfig_for(self, user: str, token: str) -> str:
        """A kubeconfig for ``user`` authenticating with ``token`` (``start.sh`` lists
        the tokens of the binder's and ingest's ServiceAccounts)."""
        path = self.run / f"{user}.kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "realkube",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority": str(self.build.cache / "pki" / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": user, "context": {"cluster": "realkube", "user": user}}],
            "current-context": user,
        }
        path.write_text(json.dumps(config))
        return str(path)

    def apply(self, doc: JSON) -> None:
        """Create ``doc`` as the administrator (any kind, by its apiVersion)."""
        group_version = doc["apiVersion"]
        base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        plural = doc["kind"].lower() + ("es" if doc["kind"].endswith("s") else "s")
        namespace = doc["metadata"].get("namespace")
        if namespace:
            self.namespace(namespace)
            base += f"/namespaces/{namespace}"
        self._call("POST", f"{base}/{plural}", doc)

    def drop_watches(self) -> None:
        """Cannot cut a real server's watches; the tests' watches end within a second."""

    def empty(self) -> None:
        """Delete what tests create, in every namespace (pods at once, as a kubelet)."""
        for kind_name in EMPTIED:
            try:
                found = self.all(kind_name)
            except urllib.error.HTTPError as exc:
                if exc.code != 404:  # a kind this server does not serve
                    raise
                continue
            for obj in found:
                meta = obj["metadata"]
                self.remove(kind_name, meta["name"], meta.get("namespace"))
        for obj in self.all("PriorityClass"):
            if not obj["metadata"]["name"].startswith("system-"):
                self.remove("PriorityClass", obj["metadata"]["name"])

    # ------------------------------------------------------------------ HTTP

    def _call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> JSON:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {TOKEN}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        with urllib.request.urlopen(request, context=self._ssl, timeout=30) as response:
            answer: JSON = json.loads(response.read() or b"{}")
            return answer

    @staticmethod
    def _kind(kind_name: str) -> Kind:
        return next(k for k in KINDS if k.name == kind_name)

    @staticmethod
    def _path(kind: Kind, namespace: str | None, name: str = "") -> str:
        base = f"/api/{kind.version}" if not kind.group else f"/apis/{kind.group}/{kind.version}"
        if kind.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        return f"{base}/{kind.plural}" + (f"/{name}" if name else "")

    def namespace(self, namespace: str) -> None:
        """Create ``namespace`` unless it exists (the in-repo server needs none)."""
        if namespace in self._namespaces:
            return
        try:
            self._call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise
        self._namespaces.add(namespace)

    # ------------------------------------------------------------------ the fake's helpers

    def put(self, kind_name: str, obj: JSON) -> JSON:
        """Create or replace ``obj`` (its status through the status subresource)."""
        kind = self._kind(kind_name)
        obj = json.loads(json.dumps(obj))
        meta = obj.setdefault("metadata", {})
        namespace = meta.setdefault("namespace", "default") if kind.namespaced else None
        if namespace:
            self.namespace(namespace)
        obj.setdefault("apiVersion", kind.api_version)
        obj.setdefault("kind", kind.kind)
        for field in ("resourceVersion", "uid", "creationTimestamp", "generation"):
            meta.pop(field, None)
        current = self.get(kind_name, meta["name"], namespace)
        if current is None:
            stored = self._call("POST", self._path(kind, namespace), obj)
        else:
            meta["resourceVersion"] = current["metadata"]["resourceVersion"]
            stored = self._call("PUT", self._path(kind, namespace, meta["name"]), obj)
        if kind_name in WITH_STATUS and obj.get("status"):
            stored["status"] = {**(stored.get("status") or {}), **obj["status"]}
            path = self._path(kind, namespace, meta["name"]) + "/status"
            stored = self._call("PUT", path, stored)
        return stored

    def get(self, kind_name: str, name: str, namespace: str | None = None) -> JSON | None:
        kind = self._kind(kind_name)
        try:
            return self._call("GET", self._path(kind, namespace or "default", name))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def remove(self, kind_name: str, name: str, namespace: str | None = None) -> JSON | None:
        kind = self._kind(kind_name)
        found = self.get(kind_name, name, namespace)
        if found is None:
            return None
        path = self._path(kind, namespace or "default", name)
        if found["metadata"].get("finalizers"):  # Kubernetes' PodGroups get one; no
            # controller here takes it off
            self._call(
                "PATCH",
                path,
                {"metadata": {"finalizers": None}},
                content_type="application/merge-patch+json",
            )
        path += "?gracePeriodSeconds=0"
        try:
            self._call("DELETE", path)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
        return found

    def all(self, kind_name: str) -> list[JSON]:
        items: list[JSON] = self._call("GET", self._path(self._kind(kind_name), None))["items"]
        return items
