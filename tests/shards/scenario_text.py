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


def gpu_node(name: str, cards: int, *, model: str = "", cpu: int = 64, pool: str = "") -> str:
    """A node with ``cards`` GPU cards (of ``model``, as GPU feature discovery labels it),
    in node pool ``pool`` (``shoal.io/pool``; none: the default pool)."""
    pairs = ([f"nvidia.com/gpu.product: {model}"] if model else []) + (
        [f"shoal.io/pool: {pool}"] if pool else []
    )
    labels = ", ".join(pairs)
    return f"""
apiVersion: v1
kind: Node
metadata: {{name: {name}, labels: {{{labels}}}}}
status: {{allocatable: {{cpu: "{cpu}", memory: 512Gi, pods: "110", nvidia.com/gpu: "{cards}"}}}}
---"""


def gpu_pod(
    name: str,
    *,
    cards: int = 0,
    milli: int = 0,
    at: float = 0,
    priority: int | None = None,
    group: str = "",
    models: tuple[str, ...] = (),
    on: str = "",
    migratable: bool = True,
    runtime: float | None = None,
    labels: dict[str, str] | None = None,
) -> str:
    """A pod asking for ``cards`` whole cards or ``milli`` of one card; ``models``: the
    GPU models its node affinity allows; ``on``: the node it runs on (``nodeName``)."""
    resources = ['cpu: "1"']
    if cards:
        resources.append(f'nvidia.com/gpu: "{cards}"')
    if milli:
        resources.append(f'shoal.io/gpu-milli: "{milli}"')
    annotations = [f'shoal.io/arrive-at: "{at:g}"']
    if not migratable:
        annotations.append('shoal.io/migratable: "false"')
    if runtime is not None:
        annotations.append(f'shoal.io/runtime: "{runtime:g}"')
    spec = []
    if on:
        spec.append(f"  nodeName: {on}")
    if priority is not None:
        spec.append(f"  priority: {priority}")
    if models:
        values = ", ".join(models)
        spec.append(
            "  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:"
            "\n        nodeSelectorTerms:\n        - matchExpressions:\n"
            f"          - {{key: nvidia.com/gpu.product, operator: In, values: [{values}]}}"
        )
    pairs = {**({"scheduling.x-k8s.io/pod-group": group} if group else {}), **(labels or {})}
    labels_text = ", ".join(f"{k}: {v}" for k, v in pairs.items())
    extra = "\n".join(spec)
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{{labels_text}}}
  annotations: {{{", ".join(annotations)}}}
spec:
{extra}
  containers:
  - name: c
    resources: {{limits: {{{", ".join(resources)}}}}}
---"""


def pod_group(name: str, min_member: int, *, ns: str = "default", at: float = 0) -> str:
    return f"""
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata:
  name: {name}
  namespace: {ns}
  annotations: {{shoal.io/arrive-at: "{at:g}"}}
spec: {{minMember: {min_member}}}
---"""


def rescheduler_config(args: str, score: str = "") -> str:
    """A profile whose Rescheduler has ``args`` (a YAML flow mapping); ``score``: the
    only score plugin (else the default ones)."""
    plugins = (
        f'\n  plugins: {{score: {{disabled: [{{name: "*"}}], enabled: [{{name: {score}}}]}}}}'
        if score
        else ""
    )
    return f"""
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler{plugins}
  pluginConfig:
  - name: Rescheduler
    args: {args}
---"""


def fit_config(strategy: str) -> str:
    """A profile whose ``NodeResourcesFit`` scores by ``strategy`` (its
    ``scoringStrategy``, a YAML flow mapping): a packing profile, say."""
    return f"""
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
  pluginConfig:
  - name: NodeResourcesFit
    args: {{scoringStrategy: {strategy}}}
---"""
