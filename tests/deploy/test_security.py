"""Pod security, network policies, image pinning and Kafka secrets in deploy/, and
checkov over every rendering of it.

checkov runs from a virtual environment of its own outside the checkout
(tests/deploy/checkov_env.py: built once, about a minute and a half); the test is
skipped, saying why, only when PyPI cannot be reached to build it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from events.errors import InputError
from events.kafka import KafkaSettings
from tests.deploy.checkov_env import CheckovUnavailable, checkov_binary
from tests.deploy.test_manifests import DEPLOY, RENDERINGS, ROOT, render

DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
BASE_SKIPS = {
    "CKV_K8S_43": "image digests are pinned by deploy/overlays/production (checked by "
    "test_production_pins_every_image_by_digest); the base and the kafka overlay name "
    "tags so that a locally built image runs",
    "CKV_K8S_15": "imagePullPolicy Always matters for a movable tag; the production "
    "overlay pins digests, which cannot move",
}
"""Checks skipped for the renderings that are not production, each with its reason.
Skips inside the manifests are ``checkov.io/skipN`` annotations that carry theirs."""


def _workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] in ("Deployment", "StatefulSet")}


@pytest.fixture(scope="module", params=RENDERINGS)
def rendering(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(ROOT / request.param)


# ---------------------------------------------------------------------------- checkov


def _checkov(rendered: Path, skips: dict[str, str]) -> dict[str, Any]:
    try:
        binary = checkov_binary()
    except CheckovUnavailable as exc:
        pytest.skip(f"checkov could not be installed: {exc}")
    command = [str(binary), "-f", str(rendered), "--framework", "kubernetes"]
    command += ["--skip-download", "--output", "json"]
    if skips:
        command += ["--skip-check", ",".join(sorted(skips))]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode in (0, 1), result.stderr[-2000:]  # 1: something failed
    report = json.loads(result.stdout)
    return report["results"] if isinstance(report, dict) else report[0]["results"]


def test_checkov_finds_nothing(rendering: tuple[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    name, docs = rendering
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    skips = {} if name.endswith("production") else BASE_SKIPS
    results = _checkov(rendered, skips)
    failed = [
        f"{c['check_id']} {c['check_name']}: {c['resource']}"
        for c in results.get("failed_checks", [])
    ]
    assert not failed, "\n".join(failed)
    assert results.get("passed_checks"), "checkov checked something"
    for check in results.get("skipped_checks", []):
        reason = (check.get("check_result") or {}).get("suppress_comment") or ""
        if check["check_id"] not in skips:
            assert len(reason) > 20, f"{check['check_id']} on {check['resource']}: no reason"


def test_checkov_catches_a_privileged_pod(tmp_path: Path) -> None:
    """The same run, on a pod made unsafe, fails: the clean result above means something."""
    docs = render(ROOT / "deploy/overlays/production")
    container = _workloads(docs)["shoal-shard"]["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"] = {"privileged": True}
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    failed = {c["check_id"] for c in _checkov(rendered, {}).get("failed_checks", [])}
    assert {"CKV_K8S_16", "CKV_K8S_20", "CKV_K8S_22"} <= failed


# ---------------------------------------------------------------------------- pods


def test_every_pod_runs_restricted(rendering: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendering
    for name, workload in _workloads(docs).items():
        pod = workload["spec"]["template"]["spec"]
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True, name
        assert context["runAsUser"] >= 10000 and context["runAsGroup"] >= 10000, name
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
        for container in pod["containers"]:
            where = f"{name}/{container['name']}"
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, where
            assert security["readOnlyRootFilesystem"] is True, where
            assert security["capabilities"] == {"drop": ["ALL"]}, where
            assert security.get("runAsNonRoot", True) is True, where
            assert not security.get("privileged"), where
            resources = container["resources"]
            for kind in ("cpu", "memory"):
                assert kind in resources["requests"] and kind in resources["limits"], where
            assert resources["requests"]["memory"] == resources["limits"]["memory"], (
                f"{where}: memory is not overcommitted (an OOM kill is a restart, not a slowdown)"
            )


def test_shoal_listens_on_localhost_and_the_proxy_serves_it(
    rendering: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendering
    for name, workload in _workloads(docs).items():
        pod = workload["spec"]["template"]["spec"]
        shoal, proxy = pod["containers"]
        listen = next(a for a in shoal["args"] if a.startswith("--listen="))
        assert listen.startswith("--listen=127.0.0.1:"), name
        port = listen.rsplit(":", 1)[1]
        assert f"--upstream=http://127.0.0.1:{port}/" in proxy["args"], name
        assert "--ignore-paths=/healthz,/readyz" in proxy["args"], "probes carry no token"
        (served,) = proxy["ports"]
        assert "--secure-listen-address=0.0.0.0:" + str(served["containerPort"]) in proxy["args"]
        for probe in ("livenessProbe", "readinessProbe"):
            get = shoal[probe]["httpGet"]
            assert (get["port"], get["scheme"]) == (served["containerPort"], "HTTPS"), name
    for service in (d for d in docs if d["kind"] == "Service"):
        for port in service["spec"]["ports"]:
            assert port["targetPort"] == "https-metrics", service["metadata"]["name"]


# ---------------------------------------------------------------------------- network


def _selected(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _allowed(docs: list[dict[str, Any]], labels: dict[str, str], direction: str) -> set[Any]:
    """(peer namespace or "*", peer pod selector, protocol, port) a pod may reach
    (direction "egress") or be reached from ("ingress")."""
    allowed: set[Any] = set()
    key, peers = ("egress", "to") if direction == "egress" else ("ingress", "from")
    for policy in (d for d in docs if d["kind"] == "NetworkPolicy"):
        spec = policy["spec"]
        if not _selected(spec["podSelector"], labels):
            continue
        for rule in spec.get(key, []):
            targets = rule.get(peers) or [{}]
            for target in targets:
                assert "ipBlock" not in target, "not evaluated here"
                ns = target.get("namespaceSelector", {}).get("matchLabels", {})
                namespace = ns.get("kubernetes.io/metadata.name", "*" if not target else "?")
                pods = tuple(sorted(target.get("podSelector", {}).get("matchLabels", {}).items()))
                for port in rule.get("ports", [{"protocol": "*", "port": "*"}]):
                    allowed.add((namespace, pods, port["protocol"], port["port"]))
    return allowed


def test_network_policies_deny_all_but_what_each_pod_needs() -> None:
    docs = render(DEPLOY)
    deny = next(d for d in docs if d["metadata"]["name"] == "shoal-default-deny")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    dns = {("kube-system", (("k8s-app", "kube-dns"),), proto, 53) for proto in ("UDP", "TCP")}
    kafka = {("kafka", (), "TCP", port) for port in (9092, 9093)}
    apiserver = {("*", (), "TCP", port) for port in (443, 6443)}
    for name, workload in _workloads(docs).items():
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert _allowed(docs, labels, "egress") == dns | kafka | apiserver, name
        assert _allowed(docs, labels, "ingress") == {("monitoring", (), "TCP", 8443)}, name
    # anything else in the namespace is denied both ways
    assert _allowed(docs, {"app": "other"}, "egress") == set()
    assert _allowed(docs, {"app": "other"}, "ingress") == set()


# ---------------------------------------------------------------------------- images


def test_production_pins_every_image_by_digest() -> None:
    docs = render(ROOT / "deploy/overlays/production")
    images = [
        c["image"]
        for w in _workloads(docs).values()
        for c in w["spec"]["template"]["spec"]["containers"]
    ]
    assert len(images) == 8
    for image in images:
        assert DIGEST.search(image), f"{image} is not pinned by a sha256 digest"
    base = [
        c["image"]
        for w in _workloads(render(DEPLOY)).values()
        for c in w["spec"]["template"]["spec"]["containers"]
    ]
    assert not any(DIGEST.search(i) for i in base), "the check tells a tag from a digest"


# ---------------------------------------------------------------------------- Kafka


def test_kafka_secrets_are_files_from_the_secret(tmp_path: Path) -> None:
    docs = render(ROOT / "deploy/overlays/production")
    maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    config = maps["shoal-kafka"]
    assert config["SHOAL_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    files = {k: v for k, v in config.items() if k.endswith(("_FILE", "FILE"))}
    assert "SHOAL_KAFKA_SASL_PASSWORD_FILE" in files and "SHOAL_KAFKA_SSL_CAFILE" in files
    for name, workload in _workloads(docs).items():
        pod = workload["spec"]["template"]["spec"]
        secret_volumes = {
            v["name"]
            for v in pod["volumes"]
            if v.get("secret", {}).get("secretName") == "shoal-kafka"
        }
        shoal = pod["containers"][0]
        mounts = [m for m in shoal["volumeMounts"] if m["name"] in secret_volumes]
        assert mounts and all(m["readOnly"] for m in mounts), name
        for path in files.values():
            assert any(path.startswith(m["mountPath"] + "/") for m in mounts), f"{name}: {path}"
        assert {"configMapRef": {"name": "shoal-kafka"}} in shoal["envFrom"], name
        for env in shoal.get("env", []):
            assert "PASSWORD" not in env["name"] or env["name"].endswith("_FILE"), name
            assert "secretKeyRef" not in env.get("valueFrom", {}), f"{name}: secrets as files"
        assert not any("password" in a.lower() for a in shoal["args"]), name
    # what the pods are given is what the bus accepts: the files stand in for the Secret's
    for path in files.values():
        (tmp_path / Path(path).name).write_text("s3cret\n")
    env = {k: str(tmp_path / Path(v).name) if k in files else v for k, v in config.items()}
    bus = maps["shoal"]["SHOAL_BUS"]
    settings = KafkaSettings.from_url(bus, env=env)
    assert settings.sasl_password() == "s3cret"
    assert "s3cret" not in repr(settings)
    with pytest.raises(InputError, match="SASL_PASSWORD is refused"):
        KafkaSettings.from_url(bus, env={**env, "SHOAL_KAFKA_SASL_PASSWORD": "s3cret"})
