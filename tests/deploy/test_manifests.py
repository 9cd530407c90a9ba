"""deploy/ renders with kustomize itself, and every manifest validates offline against the
Kubernetes OpenAPI schemas (kubernetes-validate), plus the checks a schema cannot make.
``test_server.py`` applies the same renderings to a real kube-apiserver v1.37.

kustomize is the one built with the v1.37 control plane (``./dev kube build``,
``tests/kube/realkube.py``): without it these tests are skipped, saying why, unless
``SHOAL_REAL_KUBE=1`` demands it.
"""

from __future__ import annotations

import copy
import functools
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from shards.cli import build_parser
from shards.inputs.scenario import load_sharding
from shards.serve import ROLES, ServeOptions
from tests.kube.realkube import V1_37, require

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "base"
K8S_VERSION = "1.30.0"
CUSTOM_KINDS = {"KafkaTopic"}  # the operator's CRD is not among Kubernetes' own schemas
RENDERINGS = ["deploy/base", "deploy/kafka", "deploy/overlays/production"]
"""What the documentation tells an operator to apply (``kubectl apply -k``)."""
PARTS = {"deploy/crds"}
"""Kustomizations that are only part of another (deploy/base includes the CRDs)."""


def render(directory: Path) -> list[dict[str, Any]]:
    """``kustomize build directory``: the documents, in kustomize's order (a copy each
    time, as tests change them)."""
    return copy.deepcopy(_render(str(directory)))


@functools.cache
def _render(directory: str) -> list[dict[str, Any]]:
    require(V1_37)
    done = subprocess.run(
        [str(V1_37.binary("kustomize")), "build", directory],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, f"kustomize build {directory}: {done.stderr}"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def image_name(image: str) -> str:
    """``registry/name`` without its ``:tag`` or ``@digest``, as kustomize matches it."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def test_every_kustomization_is_rendered_by_these_tests() -> None:
    found = {str(k.parent.relative_to(ROOT)) for k in (ROOT / "deploy").rglob("kustomization.yaml")}
    assert found == set(RENDERINGS) | PARTS


@pytest.fixture(scope="module", params=RENDERINGS)
def manifests(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(ROOT / request.param)


def test_every_manifest_validates_against_the_openapi_schemas(
    manifests: list[dict[str, Any]],
) -> None:
    kinds = set()
    for doc in manifests:
        kinds.add(doc["kind"])
        if doc["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(copy.deepcopy(doc), K8S_VERSION, strict=True)
    assert {
        "Namespace",
        "NetworkPolicy",
        "ServiceAccount",
        "ClusterRole",
        "Role",
        "ConfigMap",
        "Deployment",
        "StatefulSet",
        "Service",
        "PodDisruptionBudget",
        "CustomResourceDefinition",
    } <= kinds


def test_a_broken_manifest_is_caught() -> None:
    doc = next(d for d in render(DEPLOY) if d["kind"] == "Deployment")
    doc["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_workloads_are_consistent(manifests: list[dict[str, Any]], tmp_path: Path) -> None:
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for doc in manifests:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    config = by_kind["ConfigMap"]["shoal"]["data"]
    shards = int(config["SHOAL_SHARDS"])
    assert shards > 1
    accounts = set(by_kind["ServiceAccount"])
    parser = build_parser()
    roles_seen = set()
    for kind in ("Deployment", "StatefulSet"):
        for name, doc in by_kind[kind].items():
            spec = doc["spec"]
            assert (
                spec["selector"]["matchLabels"].items()
                <= spec["template"]["metadata"]["labels"].items()
            ), name
            pod = spec["template"]["spec"]
            assert pod["serviceAccountName"] in accounts
            assert [c["name"] for c in pod["containers"]] == ["shoal", "kube-rbac-proxy"], name
            container = pod["containers"][0]
            assert image_name(container["image"]) in ("shoal", "registry.example.com/shoal")
            for env in container["env"]:
                ref = env.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    assert ref["key"] in config, f"{name}: missing ConfigMap key {ref['key']}"
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
            proxy_ports = {p["containerPort"] for p in pod["containers"][1]["ports"]}
            for probe in ("livenessProbe", "readinessProbe"):
                assert container[probe]["httpGet"]["port"] in proxy_ports, f"{name}: {probe}"
            args = [
                a.replace("$(SHOAL_BUS)", config["SHOAL_BUS"])
                .replace("$(POD_NAMESPACE)", "shoal")
                .replace("$(POD_NAME)", "shoal-0")
                for a in container["args"]
            ]
            parsed = parser.parse_args(args)
            assert parsed.command == "serve" and parsed.role in ROLES
            roles_seen.add(parsed.role)
            env_names = {e["name"] for e in container["env"]}
            assert "SHOAL_SHARDS" in env_names, f"{name}: every role needs the shard count"
            mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
            mounted = {
                item["path"]
                for volume in pod.get("volumes", [])
                for item in volume.get("configMap", {}).get("items", [])
            }
            for path in (parsed.config, parsed.sharding):
                if path:
                    assert str(Path(path).parent) in mounts, f"{name}: {path} not mounted"
                    assert Path(path).name in config and Path(path).name in mounted, name
            sharding_file = tmp_path / "sharding.yaml"
            sharding_file.write_text(config["sharding.yaml"])
            options = ServeOptions(
                role=parsed.role,
                bus=config["SHOAL_BUS"],
                shards=shards,
                sharding=load_sharding(str(sharding_file)).sharding(shards)
                if parsed.sharding
                else None,
                listen=parsed.listen,
                identity=f"{name}-{shards - 1}",
            )
            options.validate()  # what serve checks first: the last shard's ordinal too
            if parsed.role in ("ingest", "coordinator"):
                assert parsed.sharding, f"{name}: ingest and the coordinator record/check it"
            assert not container.get("ports"), f"{name}: shoal listens on 127.0.0.1 only"
            assert parsed.listen.startswith("127.0.0.1:"), name
    assert roles_seen == {"ingest", "coordinator", "shard", "binder"}
    assert by_kind["StatefulSet"]["shoal-shard"]["spec"]["replicas"] == shards
    for topic in by_kind.get("KafkaTopic", {}).values():
        assert topic["spec"]["partitions"] == shards + 1, "one per shard and the control one"
    scheduler = yaml.safe_load(config["scheduler.yaml"])
    assert scheduler["kind"] == "KubeSchedulerConfiguration"
    assert config["SHOAL_BUS"].startswith("kafka://")


def test_the_crds_accept_what_shoal_reads() -> None:
    docs = {
        d["metadata"]["name"]: d for d in render(DEPLOY) if d["kind"] == "CustomResourceDefinition"
    }
    podgroup = docs["podgroups.scheduling.x-k8s.io"]["spec"]["versions"][0]
    assert set(podgroup["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]) >= {
        "minMember",
        "minResources",
        "scheduleTimeoutSeconds",
    }
    assert "status" in podgroup["subresources"]
    quota = docs["elasticquotas.scheduling.x-k8s.io"]["spec"]["versions"][0]
    assert set(quota["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]) == {
        "min",
        "max",
    }


def test_the_overlay_points_at_kafka_and_declares_the_topic() -> None:
    docs = render(ROOT / "deploy" / "kafka")
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    assert config["data"]["SHOAL_BUS"].startswith("kafka://my-cluster-kafka-bootstrap")
    topic = next(d for d in docs if d["kind"] == "KafkaTopic")
    assert topic["spec"]["partitions"] >= 1
