"""Scenario text for DRA (``resource.k8s.io/v1``): a GPU driver's ResourceSlices, a
DeviceClass, claims, claim templates and the pods that use them."""

from __future__ import annotations

DRIVER = "gpu.example.com"


def device_class(name: str = "gpu", driver: str = DRIVER, extra: str = "") -> str:
    expression = f'device.driver == "{driver}"' + (f" && {extra}" if extra else "")
    return f"""
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {{name: {name}}}
spec:
  selectors:
  - cel: {{expression: '{expression}'}}
---"""


def node(name: str, *, cpu: int = 64) -> str:
    return f"""
apiVersion: v1
kind: Node
metadata: {{name: {name}}}
status: {{allocatable: {{cpu: "{cpu}", memory: 512Gi, pods: "110"}}}}
---"""


def resource_slice(
    node_name: str, devices: int, *, model: str = "H100", driver: str = DRIVER, generation: int = 1
) -> str:
    listed = "".join(
        f"""
  - name: gpu-{i}
    attributes:
      productName: {{string: {model}}}
      index: {{int: {i}}}
    capacity:
      memory: {{value: 80Gi}}"""
        for i in range(devices)
    )
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: {node_name}-{driver}-g{generation}}}
spec:
  driver: {driver}
  nodeName: {node_name}
  pool: {{name: {node_name}, generation: {generation}, resourceSliceCount: 1}}
  devices:{listed if devices else " []"}
---"""


def _requests(count: int, klass: str, selector: str, mode: str = "") -> str:
    selectors = (
        f"\n          selectors:\n          - cel: {{expression: '{selector}'}}" if selector else ""
    )
    allocation = f"\n          allocationMode: {mode}" if mode else ""
    return f"""
    devices:
      requests:
      - name: gpus
        exactly:
          deviceClassName: {klass}
          {f"count: {count}" if count else ""}{allocation}{selectors}"""


def claim(
    name: str,
    count: int,
    *,
    klass: str = "gpu",
    selector: str = "",
    mode: str = "",
    namespace: str = "default",
) -> str:
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: {namespace}}}
spec:{_requests(count, klass, selector, mode)}
---"""


def claim_template(
    name: str, count: int, *, klass: str = "gpu", selector: str = "", mode: str = ""
) -> str:
    """``count`` 0: none stated (``mode: All``)."""
    body = _requests(count, klass, selector, mode).replace("\n", "\n  ")
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {name}, namespace: default}}
spec:
  spec:{body}
---"""


def pod(
    name: str,
    *,
    claim_name: str = "",
    template: str = "",
    at: float = 0,
    group: str = "",
    priority: int | None = None,
    namespace: str = "default",
) -> str:
    source = (
        f"resourceClaimName: {claim_name}"
        if claim_name
        else f"resourceClaimTemplateName: {template}"
    )
    labels = f"scheduling.x-k8s.io/pod-group: {group}" if group else ""
    extra = f"\n  priority: {priority}" if priority is not None else ""
    return f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {namespace}
  labels: {{{labels}}}
  annotations: {{shoal.io/arrive-at: "{at:g}"}}
spec:{extra}
  resourceClaims:
  - {{name: gpu, {source}}}
  containers:
  - name: c
    resources:
      requests: {{cpu: "1"}}
      claims: [{{name: gpu}}]
---"""
