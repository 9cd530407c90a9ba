"""Bundles as users paste them: kinds that do not concern scheduling are skipped with one
warning each; a kind that looks like one shoal reads is refused, the message whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from events.errors import InputError
from shards.cli import main
from shards.inputs.kinds import SKIPPED, group_of
from shards.inputs.limits import MAX_MESSAGE_CHARS
from shards.inputs.scenario import KINDS, load_scenario

BUNDLE = """
apiVersion: v1
kind: Namespace
metadata: {name: team}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: team}
data: {a: b}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: team}
spec: {selector: {app: web}, ports: [{port: 80}]}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly, namespace: team}
spec:
  schedule: "0 1 * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers: [{name: c, resources: {requests: {cpu: "1"}}}]
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: web, namespace: team}
spec: {}
---
apiVersion: v1
kind: List
items:
- apiVersion: rbac.authorization.k8s.io/v1
  kind: Role
  metadata: {name: reader, namespace: team}
- apiVersion: v1
  kind: Node
  metadata: {name: n1}
  status: {allocatable: {cpu: "4", memory: 8Gi}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: team}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: c, resources: {requests: {cpu: "1"}}}]
"""
SKIPPED_DOCS = {
    "document 1 (Namespace team)": "skipped: a Namespace does not concern scheduling",
    "document 2 (ConfigMap settings)": "skipped: a ConfigMap does not concern scheduling",
    "document 3 (Service web)": "skipped: a Service does not concern scheduling",
    "document 4 (CronJob nightly)": "skipped, not acted on: a CronJob creates Jobs",
    "document 5 (ServiceMonitor web)": "skipped: shoal does not read 'ServiceMonitor'",
    "document 6 items[0]: document 6 (Role reader)": "skipped: a Role does not concern",
}


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_a_bundle_schedules_its_workloads_and_skips_the_rest_with_a_warning_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    path = tmp_path / "bundle.yaml"
    path.write_text(BUNDLE)
    log = tmp_path / "run.events"
    argv = ["simulate", str(path), "--shards", str(shards), "--log", str(log), "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)  # stdout is one JSON object, warnings or not
    assert data["summary"]["bound"] == 3
    assert all(pod["node"] == "n1" for pod in data["pods"].values())
    warnings = [line for line in err.splitlines() if line.startswith("shoal: warning: ")]
    for where, message in SKIPPED_DOCS.items():
        hits = [w for w in warnings if f"{path}: {where}: {message}" in w]
        assert len(hits) == 1, (where, warnings)
    assert main(["replay", str(log), "--verify"]) == 0


@pytest.mark.parametrize(
    ("version", "kind", "message"),
    [
        ("v1", "Pdo", "unknown kind 'Pdo' with apiVersion 'v1': did you mean v1 Pod?"),
        ("apps/v1", "deployment", "did you mean apps/v1 Deployment?"),
        ("v1", "Nodes", "did you mean v1 Node?"),
        ("apps/v1beta1", "Deployment", "shoal reads Deployment with apiVersion apps/v1, not"),
        (
            "batch/v2",
            "Job",
            "shoal reads Job with apiVersion batch.volcano.sh/v1alpha1 or batch/v1",
        ),
    ],
)
def test_a_kind_like_one_shoal_reads_is_refused(
    tmp_path: Path, version: str, kind: str, message: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(f"apiVersion: {version}\nkind: {kind}\nmetadata: {{name: x}}\n")
    with pytest.raises(InputError) as info:
        load_scenario([str(path)])
    assert message in str(info.value)


READ = sorted(KINDS)


@st.composite
def misspelt_kind(draw: st.DrawFn) -> tuple[str, str]:
    version, kind = draw(st.sampled_from(READ))
    i = draw(st.integers(0, len(kind) - 2))
    typo = kind[:i] + kind[i + 1] + kind[i] + kind[i + 2 :]
    assume(typo != kind and typo not in {k for _, k in KINDS})
    return version, typo


@settings(max_examples=40, deadline=None)
@given(case=misspelt_kind())
def test_every_kind_read_misspelt_is_refused_with_a_whole_message(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[str, str]
) -> None:
    """Two neighbouring letters swapped: refused, suggesting a kind, and the message is
    whole (it used to list every kind and be cut mid-word)."""
    version, typo = case
    path = tmp_path_factory.mktemp("k") / "s.yaml"
    path.write_text(f"apiVersion: {version}\nkind: {typo}\nmetadata: {{name: x}}\n")
    with pytest.raises(InputError) as info:
        load_scenario([str(path)])
    assert "did you mean" in info.value.message or "shoal reads" in info.value.message
    assert "…" not in str(info.value)
    assert len(info.value.message) < MAX_MESSAGE_CHARS


def test_no_kind_shoal_reads_is_also_skipped() -> None:
    assert not {(group_of(v), k) for v, k in KINDS} & set(SKIPPED)
