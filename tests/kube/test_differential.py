"""A differential test against kube-scheduler v1.37 on the real API server: the same
objects are given to both, and the same pods must end up placed (on the same node
where the answer is unique), pending and preempted, with ``shoal serve`` at 1 and 2
shards.

kube-scheduler runs as a process for the module (``loadtest/kubescheduler.py``), with a
profile of its own (``kube-peer``): pods naming it are its, the others shoal's. Each run
of a case gets a fresh namespace and fresh nodes (``<run>-n0``...), labelled with the
run, and its pods select them (``diff-run``), so no run sees another's pods or nodes.
There is no kubelet: pods stay Pending but bound (``spec.nodeName`` is compared), and
the test does a kubelet's one part that matters here: a pod given a
``deletionTimestamp`` (a victim, evicted by shoal or deleted by kube-scheduler) is
deleted at once. A run has settled when each pod is bound, gone, or marked
``PodScheduled=False`` without a nomination, with no pod terminating, twice in a row.

Only cases whose outcome depends on no tie are here: which pod goes first is fixed by
creating them in stages (each waited for), and nodes are compared only where a single
node is right. Left out on purpose: anything scored (kube-scheduler's
LeastAllocated/BalancedAllocation spread against shoal's profiles' own scoring).

DRA: the test publishes a ResourceSlice per node of a case that has devices (as a
driver would; pool named after the node) and creates ResourceClaims directly (no
template: no resourceclaim controller runs here); each claim's outcome is the node
whose devices its ``status.allocation`` names, or ``pending`` while it has none.
"""

from __future__ import annotations

import asyncio
import copy
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from loadtest.kubescheduler import KubeScheduler
from tests.kube.realkube import DEFAULT, RealApiServer
from tests.kube.serving import serving

JSON = dict[str, Any]
PEER = "kube-peer"
RUN_LABEL = "diff-run"
HOSTNAME = "kubernetes.io/hostname"
PENDING = "pending"
PREEMPTED = "preempted"
PLACED = "placed"
PRIORITIES = {"diff-low": 10, "diff-mid": 100, "diff-high": 1000}
DRIVER = "gpu.example.com"
DRA = "resource.k8s.io/v1"
DEVICE_CLASS = "diff-gpu"


def _node(name: str, cpu: str = "4", taints: list[JSON] | None = None, **labels: str) -> JSON:
    """A node as kube-scheduler needs to see it (Ready, capacity and allocatable)."""
    resources = {"cpu": cpu, "memory": "8Gi", "pods": "110"}
    return {
        "metadata": {"name": name, "labels": {HOSTNAME: name, **labels}},
        "spec": {"taints": taints or []},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def _pod(name: str, cpu: str = "1", priority: str = "", app: str = "", **spec: Any) -> JSON:
    body: JSON = {
        "containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": cpu}}}],
        "terminationGracePeriodSeconds": 30,
        **spec,
    }
    if priority:
        body["priorityClassName"] = priority
    return {"metadata": {"name": name, "labels": {"app": app} if app else {}}, "spec": body}


def _on(node: str) -> JSON:
    return {HOSTNAME: node}


def _zone_in(*zones: str, operator: str = "In") -> JSON:
    term = {"matchExpressions": [{"key": "zone", "operator": operator, "values": list(zones)}]}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def _with(app: str, anti: bool = False) -> JSON:
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": HOSTNAME}
    kind = "podAntiAffinity" if anti else "podAffinity"
    return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def _gang(name: str, count: int) -> list[JSON]:
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
        _pod(f"{name}{i}", schedulingGroup={"podGroupName": f"{name}-workers"})
        for i in range(count)
    ]
    return [workload, group, *members]


def _claim(name: str, count: int) -> JSON:
    """A ResourceClaim for ``count`` devices of the test's class."""
    request = {"name": "gpus", "exactly": {"deviceClassName": DEVICE_CLASS, "count": count}}
    return {
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }


def _claiming(name: str, claim: str) -> JSON:
    """A one-cpu pod using the ResourceClaim ``claim``."""
    item = _pod(name, resourceClaims=[{"name": "gpu", "resourceClaimName": claim}])
    item["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return item


def _slice(node: str, devices: int) -> JSON:
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


CASES = [
    Case(
        "preemption",
        [_node("n0", cpu="3")],
        [
            [_pod("mid", priority="diff-mid"), _pod("low", cpu="2", priority="diff-low")],
            [_pod("high", cpu="2", priority="diff-high")],
        ],
        # freeing 2 cpus takes the low pod alone; the mid one is spared
        {"mid": "n0", "low": PREEMPTED, "high": "n0"},
    ),
    Case(
        "preemption-node",
        [_node("n0", cpu="2"), _node("n1", cpu="2")],
        [
            [
                _pod("low", cpu="2", priority="diff-low", nodeSelector=_on("n0")),
                _pod("mid", cpu="2", priority="diff-mid", nodeSelector=_on("n1")),
            ],
            [_pod("high", cpu="2", priority="diff-high")],
        ],
        # either node frees 2 cpus with one victim: the one whose victim matters least
        {"low": PREEMPTED, "mid": "n1", "high": "n0"},
    ),
    Case(
        "node-affinity",
        [_node("n0", zone="a"), _node("n1", zone="b"), _node("n2", zone="c")],
        [
            [
                _pod("in-b", affinity=_zone_in("b")),
                _pod("not-a-c", affinity=_zone_in("a", "c", operator="NotIn")),
                _pod("in-d", affinity=_zone_in("d")),
            ]
        ],
        {"in-b": "n1", "not-a-c": "n1", "in-d": PENDING},
    ),
    Case(
        "pod-affinity",
        [_node("n0"), _node("n1")],
        [
            [
                _pod("db", app="db", nodeSelector=_on("n1")),
                _pod("solo-0", app="solo", nodeSelector=_on("n0")),
            ],
            [
                _pod("web", affinity=_with("db")),
                _pod("solo-1", app="solo", affinity=_with("solo", anti=True)),
            ],
            [_pod("solo-2", app="solo", affinity=_with("solo", anti=True))],
        ],
        {"db": "n1", "solo-0": "n0", "web": "n1", "solo-1": "n1", "solo-2": PENDING},
    ),
    Case(
        "topology-spread",
        [_node("n0", zone="a"), _node("n1", zone="b")],
        [
            [_pod("s0", app="sp", nodeSelector=_on("n0"))],
            [
                _pod(
                    "s1",
                    app="sp",
                    topologySpreadConstraints=[
                        {
                            "maxSkew": 1,
                            "topologyKey": "zone",
                            "whenUnsatisfiable": "DoNotSchedule",
                            "labelSelector": {"matchLabels": {"app": "sp"}},
                        }
                    ],
                )
            ],
        ],
        {"s0": "n0", "s1": "n1"},
    ),
    Case(
        "taints",
        [
            _node("n0", taints=[{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]),
            _node("n1", cpu="1"),
        ],
        [
            [
                _pod("plain", cpu="2"),
                _pod("small"),
                _pod(
                    "tolerant",
                    cpu="2",
                    tolerations=[
                        {
                            "key": "dedicated",
                            "operator": "Equal",
                            "value": "infra",
                            "effect": "NoSchedule",
                        }
                    ],
                ),
            ]
        ],
        {"plain": PENDING, "small": "n1", "tolerant": "n0"},
    ),
    Case(
        "gang",
        [_node("n0", cpu="2"), _node("n1", cpu="2")],
        [_gang("a", 3), _gang("b", 3)],
        # 4 cpus: the first gang of 3 fits, the second does not (which node each member
        # gets is a tie)
        {**{f"a{i}": PLACED for i in range(3)}, **{f"b{i}": PENDING for i in range(3)}},
        unique_nodes=False,
    ),
    Case(
        "dra",
        [_node("n0"), _node("n1"), _node("n2")],
        [
            [_claim("three-a", 3), _claiming("a", "three-a")],
            [_claim("three-b", 3), _claiming("b", "three-b")],
        ],
        # only n1 has 3 devices; once a holds 3 of them, no node has 3 for b
        {"a": "n1", "b": PENDING, "claim/three-a": "n1", "claim/three-b": PENDING},
        devices={"n0": 2, "n1": 4, "n2": 2},
    ),
]


# ---------------------------------------------------------------------------- a run


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
            self.real.put("Node", item)
            if logical in self.case.devices:
                self.real.apply(_slice(name, self.case.devices[logical]))

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
            now = self.outcome()
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
        self.create_nodes()
        outcome: dict[str, str] = {}
        for stage in self.case.stages:
            self.create(stage)
            outcome = await self.settle()
        return {**outcome, **{f"claim/{c}": self.claim_outcome(c) for c in self.claims}}

    def remove_nodes(self) -> None:
        for body in self.case.nodes:
            logical = body["metadata"]["name"]
            self.real.remove("Node", self.node(logical))
            if logical in self.case.devices:
                path = f"/apis/{DRA}/resourceslices/{self.node(logical)}-gpus"
                self.real._call("DELETE", path)


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def peer(
    real_apiserver: RealApiServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeScheduler]:
    """kube-scheduler v1.37 with profile ``kube-peer``, for the module."""
    binary = DEFAULT.binary("kube-scheduler")
    if not binary.is_file():
        pytest.skip(f"no kube-scheduler in {DEFAULT.cache} (./dev kube build)")
    scheduler = KubeScheduler(
        binary,
        real_apiserver.kubeconfig,
        tmp_path_factory.mktemp("kube-scheduler"),
        scheduler_name=PEER,
    )
    scheduler.start()
    try:
        yield scheduler
    finally:
        scheduler.stop()


PEER_OUTCOMES: dict[str, dict[str, str]] = {}
"""kube-scheduler's outcome of each case (played once for the module)."""


def _priorities(real: RealApiServer) -> None:
    """The priority classes and the DRA cases' DeviceClass."""
    for name, value in PRIORITIES.items():
        if real.get("PriorityClass", name) is None:
            real.put("PriorityClass", {"metadata": {"name": name}, "value": value})
    expression = {"cel": {"expression": f'device.driver == "{DRIVER}"'}}
    try:
        real.apply(
            {
                "apiVersion": DRA,
                "kind": "DeviceClass",
                "metadata": {"name": DEVICE_CLASS},
                "spec": {"selectors": [expression]},
            }
        )
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise


async def _play(runs: list[Run]) -> list[dict[str, str]]:
    outcomes = await asyncio.gather(*(run.play() for run in runs))
    for run in runs:
        run.remove_nodes()
    return list(outcomes)


@pytest.mark.parametrize("shards", [1, 2])
async def test_shoal_places_pods_as_kube_scheduler_does(
    real_apiserver: RealApiServer, peer: KubeScheduler, shards: int
) -> None:
    """Every case, kube-scheduler's run once for the module, shoal's at ``shards``:
    the same pods placed (on the same nodes where unique), pending and preempted, and
    both the one right answer."""
    real = real_apiserver
    real.empty()
    _priorities(real)
    # the cases side by side (each on nodes and in a namespace of its own)
    if not PEER_OUTCOMES:
        runs = [Run(real, case, f"k-{case.name}", PEER) for case in CASES]
        PEER_OUTCOMES.update(zip([c.name for c in CASES], await _play(runs), strict=True))
    async with serving(real, shards):
        runs = [Run(real, case, f"s{shards}-{case.name}", "default-scheduler") for case in CASES]
        ours = dict(zip([c.name for c in CASES], await _play(runs), strict=True))
    differ = {
        name: (ours[name], PEER_OUTCOMES[name])
        for name in ours
        if ours[name] != PEER_OUTCOMES[name]
    }
    assert not differ, f"shoal, kube-scheduler: {differ}"
    wrong = {c.name: PEER_OUTCOMES[c.name] for c in CASES if PEER_OUTCOMES[c.name] != c.expected}
    assert not wrong, f"not the one right answer: {wrong}"
