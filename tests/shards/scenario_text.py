"""Scenario text for the tests of several shards: Nodes and Pods as users write them
(YAML documents ``shoal simulate`` reads), with the annotations shoal adds for
simulation (``shoal.io/arrive-at``, ``shoal.io/runtime``, ``shoal.io/depends-on``)."""

from __future__ import annotations

from engine.model.pools import POOL_LABEL


def node(
    name: str,
    *,
    cpu: int = 16,
    memory: str = "64Gi",
    gpu: int = 0,
    labels: dict[str, str] | None = None,
) -> str:
    gpus = f', nvidia.com/gpu: "{gpu}"' if gpu else ""
    label_text = ", ".join(f"{k}: {v}" for k, v in (labels or {}).items())
    return f"""
apiVersion: v1
kind: Node
metadata: {{name: {name}, labels: {{{label_text}}}}}
status: {{allocatable: {{cpu: "{cpu}", memory: {memory}{gpus}}}}}
---"""


def pod(
    name: str,
    *,
    ns: str = "default",
    cpu: str = "1",
    memory: str = "1Gi",
    gpu: int = 0,
    at: float = 0,
    runtime: float | None = None,
    priority: int | None = None,
    group: str = "",
    node_name: str = "",
    scheduler: str = "",
    selector: dict[str, str] | None = None,
    never: bool = False,
    pool: str = "",
    depends_on: str = "",
) -> str:
    gpus = f', nvidia.com/gpu: "{gpu}"' if gpu else ""
    annotations = [f'shoal.io/arrive-at: "{at:g}"']
    if runtime is not None:
        annotations.append(f'shoal.io/runtime: "{runtime:g}"')
    if depends_on:
        annotations.append(f'shoal.io/depends-on: "{depends_on}"')
    labels = f"scheduling.x-k8s.io/pod-group: {group}" if group else ""
    spec = []
    if priority is not None:
        spec.append(f"  priority: {priority}")
    if never:
        spec.append("  preemptionPolicy: Never")
    if node_name:
        spec.append(f"  nodeName: {node_name}")
    if scheduler:
        spec.append(f"  schedulerName: {scheduler}")
    if pool:
        selector = {**(selector or {}), POOL_LABEL: pool}
    if selector:
        spec.append("  nodeSelector: {" + ", ".join(f"{k}: {v}" for k, v in selector.items()) + "}")
    extra = "\n".join(spec)
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
  labels: {{{labels}}}
  annotations: {{{", ".join(annotations)}}}
spec:
{extra}
  containers:
  - name: c
    resources: {{requests: {{cpu: "{cpu}", memory: {memory}{gpus}}}}}
---"""
