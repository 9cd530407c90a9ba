"""The differential test's harness (``tests/kube/test_differential.py``): the objects a
case is made of, and a run of a case for one scheduler on the real API server.

Each run of a case gets a fresh namespace and fresh nodes (``<run>-n0``...), labelled
with the run, and its pods select them (``diff-run``), so no run sees another's pods or
nodes. There is no kubelet: pods stay Pending but bound (``spec.nodeName`` is compared),
and a run does a kubelet's one part that matters here: a pod given a
``deletionTimestamp`` (a victim, evicted by shoal or deleted by kube-scheduler) is
deleted at once. A run has settled when each pod is bound, gone, or marked
``PodScheduled=False`` without a nomination, with no pod terminating, twice in a row.
"""

from __future__ import annotations

import asyncio
import copy
import urllib.error
from dataclasses import dataclass, field
from typing import Any

from tests.kube.realkube import RealApiServer

JSON = dict[str, Any]
RUN_LABEL = "diff-run"
HOSTNAME = "kubernetes.io/hostname"
POOL = "shoal.io/pool"
GPU = "nvidia.com/gpu"
PENDING = "pending"
PREEMPTED = "preempted"
PLACED = "placed"
DRIVER = "gpu.example.com"
DRA = "resource.k8s.io/v1"
DEVICE_CLASS = "diff-gpu"


def node(
    name: str, cpu: str = "4", taints: list[JSON] | None = None, gpus: int = 0, **labels: str
) -> JSON:
    """A node as kube-scheduler needs to see it (Ready, capacity and allocatable), with
    ``gpus`` device-plugin GPUs (``nvidia.com/gpu``)."""
    resources = {"cpu": cpu, "memory": "8Gi", "pods": "110", **({GPU: str(gpus)} if gpus else {})}
    return {
        "metadata": {"name": name, "labels": {HOSTNAME: name, **labels}},
        "spec": {"taints": taints or []},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def pod(
    name: str,
    cpu: str = "1",
    priority: str = "",
    app: str = "",
    memory: str = "",
    gpus: int = 0,
    **spec: Any,
) -> JSON:
    """A pod of one container requesting ``cpu`` (and ``memory``, and ``gpus`` whole
    GPUs as the device plugin's extended resource, limits equal to requests)."""
    requests = {"cpu": cpu, **({"memory": memory} if memory else {})}
    resources: JSON = {"requests": requests}
    if gpus:
        requests[GPU] = str(gpus)
        resources["limits"] = {GPU: str(gpus)}
    body: JSON = {
        "containers": [{"name": "c", "image": "pause", "resources": resources}],
        "terminationGracePeriodSeconds": 30,
        **spec,
    }
    if priority:
        body["priorityClassName"] = priority
    return {"metadata": {"name": name, "labels": {"app": app} if app else {}}, "spec": body}


def on(node: str) -> JSON:
    return {HOSTNAME: node}


def zone_in(*zones: str, operator: str = "In") -> JSON:
    term = {"matchExpressions": [{"key": "zone", "operator": operator, "values": list(zones)}]}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def with_app(app: str, anti: bool = False) -> JSON:
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": HOSTNAME}
    kind = "podAntiAffinity" if anti else "podAffinity"
    return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def gang(name: str, count: int) -> list[JSON]:
    """A Workload, its PodGroup (gang of ``count``), and ``count`` one-cpu members."""
    policy = {"gang": {"minCount": count}}
    workload = {
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {"podGroupTemplates": [{"name": "workers", "schedulingPolicy": policy}]},
    }
    group = {
        "kind": "KubePodGroup",
        "metadata": {"name": f"{name}-workers"},
        "spec": {
            "workloadRef": {"workloadName": name, "templateName": "workers"},
            "schedulingPolicy": policy,
        },
    }
    members = [
        pod(f"{name}{i}", schedulingGroup={"podGroupName": f"{name}-workers"}) for i in range(count)
    ]
    return [workload, group, *members]


def claim(name: str, count: int) -> JSON:
    """A ResourceClaim for ``count`` devices of the test's class."""
    request = {"name": "gpus", "exactly": {"deviceClassName": DEVICE_CLASS, "count": count}}
    return {
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }


def claiming(name: str, claim: str) -> JSON:
    """A one-cpu pod using the ResourceClaim ``claim``."""
    item = pod(name, resourceClaims=[{"name": "gpu", "resourceClaimName": claim}])
    item["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return item


def device_slice(node: str, devices: int) -> JSON:
    return {
        "apiVersion": DRA,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpus"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{i}"} for i in range(devices)],
        },
    }


@dataclass(frozen=True)
class Case:
    """Nodes, then objects created stage by stage (each settled before the next), and
    the one right outcome: pod → node, ``pending`` or ``preempted`` (``placed`` where
    the node is not unique); ``claim/NAME`` → the node of the devices allocated to
    the ResourceClaim, or ``pending``."""

    name: str
    nodes: list[JSON]
    stages: list[list[JSON]]
    expected: dict[str, str]
    unique_nodes: bool = True
    devices: dict[str, int] = field(default_factory=dict)
    """Node → the GPUs its ResourceSlice publishes."""
    profile: str = ""
    """shoal's profile for the case's pods (``shoal-<profile>``; empty: the default)."""
    peer: str | None = ""
    """kube-scheduler's (``kube-peer-<peer>``; empty: ``kube-peer``, the default
    profile). None: kube-scheduler has no equivalent, and the case is not played
    there: ``expected`` is then what one shoal shard does."""


class Run:
    """One case's objects for one scheduler, in namespace and on nodes of its own."""

    def __init__(self, real: RealApiServer, case: Case, tag: str, scheduler: str) -> None:
        self.real = real
        self.case = case
        self.tag = tag
        self.namespace = f"diff-{tag}"
        self.scheduler = scheduler
        self.pods: list[str] = []
        self.claims: list[str] = []

    def node(self, logical: str) -> str:
        return f"{self.tag}-{logical}"

    def logical(self, node: str) -> str:
        return node.removeprefix(f"{self.tag}-")

    def create_nodes(self) -> None:
        for body in self.case.nodes:
            item = copy.deepcopy(body)
            logical = item["metadata"]["name"]
            name = self.node(logical)
            item["metadata"]["name"] = name
            item["metadata"]["labels"][HOSTNAME] = name
            item["metadata"]["labels"][RUN_LABEL] = self.tag
            # a pool of its own: pools go to shoal's shards in turn as they appear, so
            # a case's nodes lie in as many shards as there are (kube-scheduler ignores
            # the label)
            item["metadata"]["labels"][POOL] = name
            self.real.put("Node", item)
            if logical in self.case.devices:
                self.real.apply(device_slice(name, self.case.devices[logical]))

    def create(self, stage: list[JSON]) -> None:
        self.real.namespace(self.namespace)
        for body in stage:
            item = copy.deepcopy(body)
            kind = item.pop("kind", "Pod")
            item["metadata"]["namespace"] = self.namespace
            if kind == "Pod":
                spec = item["spec"]
                spec["schedulerName"] = self.scheduler
                selector = spec.setdefault("nodeSelector", {})
                if HOSTNAME in selector:
                    selector[HOSTNAME] = self.node(selector[HOSTNAME])
                selector[RUN_LABEL] = self.tag
                self.pods.append(item["metadata"]["name"])
            if kind == "ResourceClaim":
                self.claims.append(item["metadata"]["name"])
                self.real.apply({"apiVersion": DRA, "kind": kind, **item})
                continue
            self.real.put(kind, item)

    def _pods(self) -> list[JSON]:
        found: list[JSON] = self.real._call("GET", f"/api/v1/namespaces/{self.namespace}/pods")[
            "items"
        ]
        return found

    def _kubelet(self, pods: list[JSON]) -> None:
        """What a kubelet would do: a pod being deleted goes at once."""
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                path = f"/api/v1/namespaces/{self.namespace}/pods/{pod['metadata']['name']}"
                try:
                    self.real._call("DELETE", path + "?gracePeriodSeconds=0")
                except urllib.error.HTTPError as exc:
                    if exc.code != 404:
                        raise

    def outcome(self) -> dict[str, str] | None:
        """Each pod's outcome, or None while the run has not settled."""
        pods = {p["metadata"]["name"]: p for p in self._pods()}
        self._kubelet(list(pods.values()))
        out: dict[str, str] = {}
        for name in self.pods:
            pod = pods.get(name)
            if pod is None:
                out[name] = PREEMPTED
                continue
            if pod["metadata"].get("deletionTimestamp"):
                return None
            node = pod["spec"].get("nodeName")
            if node:
                out[name] = self.logical(node) if self.case.unique_nodes else PLACED
                continue
            status = pod.get("status") or {}
            told = [
                c
                for c in status.get("conditions") or []
                if c["type"] == "PodScheduled" and c["status"] == "False"
            ]
            if not told or status.get("nominatedNodeName"):
                return None
            out[name] = PENDING
        return out

    async def settle(self, timeout: float = 60.0) -> dict[str, str]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last: dict[str, str] | None = None
        while True:
            now = await asyncio.to_thread(self.outcome)
            if now is not None and now == last:
                return now
            if loop.time() > deadline:
                raise AssertionError(f"{self.case.name} ({self.scheduler}) did not settle: {now}")
            last = now
            await asyncio.sleep(0.5)

    def claim_outcome(self, name: str) -> str:
        """The node whose devices the claim's allocation names (all distinct, all of
        that node's slice), ``pending`` while it has none, else what it names."""
        path = f"/apis/{DRA}/namespaces/{self.namespace}/resourceclaims/{name}"
        allocation = (self.real._call("GET", path).get("status") or {}).get("allocation")
        if not allocation:
            return PENDING
        results = allocation["devices"]["results"]
        pools = {(r["driver"], r["pool"]) for r in results}
        devices = [r["device"] for r in results]
        if len(pools) == 1 and len(set(devices)) == len(devices):
            driver, pool = next(iter(pools))
            logical = self.logical(pool)
            known = {f"gpu-{i}" for i in range(self.case.devices.get(logical, 0))}
            if driver == DRIVER and set(devices) <= known:
                return logical
        return f"devices {sorted(pools)} {devices}"

    async def play(self) -> dict[str, str]:
        """Create the nodes (at once: the runs played together create theirs one run
        after the other, so each run's pools are consecutive), then each stage and
        wait until it settles. The calls to the API server run in threads: shoal's
        ``serve`` shares this event loop, and a loop held up by many runs' polls
        misses its Leases' renew deadlines."""
        self.create_nodes()
        outcome: dict[str, str] = {}
        for stage in self.case.stages:
            await asyncio.to_thread(self.create, stage)
            outcome = await self.settle()
        return {**outcome, **{f"claim/{c}": self.claim_outcome(c) for c in self.claims}}

    def remove(self) -> None:
        """Take away the run's pods (at once, as a kubelet would) and events, one call
        each (the next test's ``empty`` deletes one object a call), its nodes and
        their ResourceSlices."""
        for kind in ("pods", "events"):
            self.real._call(
                "DELETE", f"/api/v1/namespaces/{self.namespace}/{kind}?gracePeriodSeconds=0"
            )
        for body in self.case.nodes:
            logical = body["metadata"]["name"]
            self.real.remove("Node", self.node(logical))
            if logical in self.case.devices:
                path = f"/apis/{DRA}/resourceslices/{self.node(logical)}-gpus"
                self.real._call("DELETE", path)
