"""A differential test against kube-scheduler v1.37 on the real API server: the same
objects are given to both, and the same pods must end up placed (on the same node
where the answer is unique), pending and preempted, with ``shoal serve`` at 1, 2, 4
and 8 shards; every log shoal writes replays with ``replay --verify``.

kube-scheduler runs as a process for the module (``loadtest/kubescheduler.py``), with
profiles of its own (``kube-peer``, ``kube-peer-pack``...): pods naming one are its,
the others shoal's (``default-scheduler``, ``shoal-pack``...: the same profiles). How a
case is played is in ``tests/kube/differential.py``. Each node is a pool of its own
(``shoal.io/pool``), so at N shards a case's nodes lie in as many shards as it has
nodes, up to N (checked in the log).

Only cases whose outcome depends on no tie are here: which pod goes first is fixed by
creating them in stages (each waited for), and nodes are compared only where a single
node is right. The default profile's scoring (LeastAllocated, BalancedAllocation) is
left out on purpose: shoal's shards choose between shards by sums there (a documented
difference). The packing profiles are in: ``pack`` (``NodeResourcesFit`` with
``MostAllocated`` over cpu, memory and ``nvidia.com/gpu``) and ``ratio``
(``RequestedToCapacityRatio``, a shape that peaks at half full), with nodes filled to
different levels so that exactly one node is best; at N shards shoal decides their
units on the coordinator over every node, so the node must be kube-scheduler's.

GPU: ``nvidia.com/gpu`` as the device plugin's extended resource, scored by
``MostAllocated``, and shoal's GPU placement policies (``engine/plugins/gpu/``) as the
only score plugin of a profile each. Where kube-scheduler's ``MostAllocated`` on
``nvidia.com/gpu`` gives the same unique node (``GpuBestFit``, ``GpuMMinusN``,
``GpuPacking``, ``GpuClustering`` on the ``gpu-`` cases) shoal is compared with it;
``GpuFragmentation`` and ``ShoalGpu`` have no equivalent in kube-scheduler, so their
case is not played there and its expected outcome is what one shoal shard does.

DRA: the test publishes a ResourceSlice per node of a case that has devices (as a
driver would; pool named after the node) and creates ResourceClaims directly (no
template: no resourceclaim controller runs here); each claim's outcome is the node
whose devices its ``status.allocation`` names, or ``pending`` while it has none.

Each shard count is one ``shoal serve`` with every case played at once (kube-scheduler's
runs beside shoal's first), then its log replayed with every decision verified
(``replay``, ``replay_routed``: what ``shoal replay --verify`` runs). That costs about
8 s of play (the longest case has four stages) and 10-11 s a count in all, on a loaded
2-core machine: 1 and 2 shards are in the default suite, 4 and 8 are ``slow``
(``pytest -m slow tests``).
"""

from __future__ import annotations

import asyncio
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest

from engine.config import API_VERSIONS, KIND, SchedulerConfig, parse_config
from events.types import Envelope, NodeAdded
from loadtest.kubescheduler import KubeScheduler
from shards.replay import replay, replay_routed
from shards.serve import Service
from tests.kube.differential import (
    DEVICE_CLASS,
    DRA,
    DRIVER,
    GPU,
    JSON,
    PENDING,
    PLACED,
    PREEMPTED,
    Case,
    Run,
    claim,
    claiming,
    gang,
    node,
    on,
    pod,
    with_app,
    zone_in,
)
from tests.kube.realkube import DEFAULT, RealApiServer
from tests.kube.serving import serving

PEER = "kube-peer"
PRIORITIES = {"diff-low": 10, "diff-mid": 100, "diff-high": 1000}
SLOW = pytest.mark.slow

# ---------------------------------------------------------------------------- profiles


def _fit(strategy: JSON) -> JSON:
    resources = [{"name": r, "weight": 1} for r in ("cpu", "memory", GPU)]
    args = {"scoringStrategy": {"resources": resources, **strategy}}
    return {"pluginConfig": [{"name": "NodeResourcesFit", "args": args}]}


PEAK_AT_HALF = [
    {"utilization": 0, "score": 0},
    {"utilization": 50, "score": 10},
    {"utilization": 100, "score": 0},
]
PACKING: dict[str, JSON] = {
    "pack": _fit({"type": "MostAllocated"}),
    "ratio": _fit(
        {"type": "RequestedToCapacityRatio", "requestedToCapacityRatio": {"shape": PEAK_AT_HALF}}
    ),
}
"""The packing profiles, the same on both sides (kube-scheduler's ``kube-peer-<key>``,
shoal's ``shoal-<key>``)."""
AS_MOST_ALLOCATED = ("GpuBestFit", "GpuMMinusN", "GpuPacking", "GpuClustering")
"""shoal's GPU policies that place the ``gpu-`` cases where ``MostAllocated`` does."""
OWN_POLICIES = ("GpuFragmentation", "ShoalGpu")
"""Those kube-scheduler has no equivalent of."""


def _policy(plugin: str) -> JSON:
    score = {"disabled": [{"name": "*"}], "enabled": [{"name": plugin, "weight": 1}]}
    return {"plugins": {"score": score}}


def _shoal_config() -> SchedulerConfig:
    profiles = {**PACKING, **{p: _policy(p) for p in AS_MOST_ALLOCATED + OWN_POLICIES}}
    raw = {
        "apiVersion": API_VERSIONS[0],
        "kind": KIND,
        "profiles": [
            {"schedulerName": "default-scheduler"},
            *({"schedulerName": f"shoal-{k}", **v} for k, v in profiles.items()),
        ],
    }
    return parse_config(raw, "differential")


def _shoal(case: Case) -> str:
    return f"shoal-{case.profile}" if case.profile else "default-scheduler"


def _peer(case: Case) -> str:
    return f"{PEER}-{case.peer}" if case.peer else PEER


# ---------------------------------------------------------------------------- cases

CASES = [
    Case(
        "preemption",
        [node("n0", cpu="3")],
        [
            [pod("mid", priority="diff-mid"), pod("low", cpu="2", priority="diff-low")],
            [pod("high", cpu="2", priority="diff-high")],
        ],
        # freeing 2 cpus takes the low pod alone; the mid one is spared
        {"mid": "n0", "low": PREEMPTED, "high": "n0"},
    ),
    Case(
        "preemption-node",
        [node("n0", cpu="2"), node("n1", cpu="2")],
        [
            [
                pod("low", cpu="2", priority="diff-low", nodeSelector=on("n0")),
                pod("mid", cpu="2", priority="diff-mid", nodeSelector=on("n1")),
            ],
            [pod("high", cpu="2", priority="diff-high")],
        ],
        # either node frees 2 cpus with one victim: the one whose victim matters least
        {"low": PREEMPTED, "mid": "n1", "high": "n0"},
    ),
    Case(
        "node-affinity",
        [node("n0", zone="a"), node("n1", zone="b"), node("n2", zone="c")],
        [
            [
                pod("in-b", affinity=zone_in("b")),
                pod("not-a-c", affinity=zone_in("a", "c", operator="NotIn")),
                pod("in-d", affinity=zone_in("d")),
            ]
        ],
        {"in-b": "n1", "not-a-c": "n1", "in-d": PENDING},
    ),
    Case(
        "pod-affinity",
        [node("n0"), node("n1")],
        [
            [
                pod("db", app="db", nodeSelector=on("n1")),
                pod("solo-0", app="solo", nodeSelector=on("n0")),
            ],
            [
                pod("web", affinity=with_app("db")),
                pod("solo-1", app="solo", affinity=with_app("solo", anti=True)),
            ],
            [pod("solo-2", app="solo", affinity=with_app("solo", anti=True))],
        ],
        {"db": "n1", "solo-0": "n0", "web": "n1", "solo-1": "n1", "solo-2": PENDING},
    ),
    Case(
        "topology-spread",
        [node("n0", zone="a"), node("n1", zone="b")],
        [
            [pod("s0", app="sp", nodeSelector=on("n0"))],
            [
                pod(
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
            node("n0", taints=[{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]),
            node("n1", cpu="1"),
        ],
        [
            [
                pod("plain", cpu="2"),
                pod("small"),
                pod(
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
        [node("n0", cpu="2"), node("n1", cpu="2")],
        [gang("a", 3), gang("b", 3)],
        # 4 cpus: the first gang of 3 fits, the second does not (which node each member
        # gets is a tie)
        {**{f"a{i}": PLACED for i in range(3)}, **{f"b{i}": PENDING for i in range(3)}},
        unique_nodes=False,
    ),
    Case(
        "dra",
        [node("n0"), node("n1"), node("n2")],
        [
            [claim("three-a", 3), claiming("a", "three-a")],
            [claim("three-b", 3), claiming("b", "three-b")],
        ],
        # only n1 has 3 devices; once a holds 3 of them, no node has 3 for b
        {"a": "n1", "b": PENDING, "claim/three-a": "n1", "claim/three-b": PENDING},
        devices={"n0": 2, "n1": 4, "n2": 2},
    ),
]


HALF = "2Gi"
"""Memory with a cpu, in the nodes' proportion (4 cpu, 8Gi): ``BalancedAllocation``
is then the same on every node and packing alone decides."""


def _packed(name: str, cpu: int = 1, gpus: int = 0, **spec: Any) -> JSON:
    return pod(name, cpu=str(cpu), memory=f"{2 * cpu}Gi", gpus=gpus, **spec)


def _gpu_policy(policy: str, peer: str | None) -> Case:
    """One busy GPU node and one idle: the 2-card pod joins the busy one (it is the
    fuller, holds only 2-card pods, leaves fewer idle cards), so the 8-card pod
    still has a whole node."""
    return Case(
        f"gpu-{policy.lower()}",
        [node("g0", gpus=8), node("g1", gpus=8)],
        [
            [_packed("f1", gpus=2, nodeSelector=on("g1"))],
            [_packed("p", gpus=2)],
            [_packed("q", gpus=8)],
        ],
        {"f1": "g1", "p": "g1", "q": "g0"},
        profile=policy,
        peer=peer,
    )


PACKING_CASES = [
    Case(
        "pack-most",
        [node("n0"), node("n1"), node("n2")],
        [
            [_packed("f0", nodeSelector=on("n0")), _packed("f2", 2, nodeSelector=on("n2"))],
            # MostAllocated: n2 ends 3/4 full, n0 2/4, n1 1/4
            [_packed("p")],
            # n2 has 1 cpu left: n0 ends 3/4 full, n1 2/4
            [_packed("q", 2)],
        ],
        {"f0": "n0", "f2": "n2", "p": "n2", "q": "n0"},
        profile="pack",
        peer="pack",
    ),
    Case(
        "pack-ratio",
        [node("n0"), node("n1"), node("n2")],
        [
            [_packed("f1", nodeSelector=on("n1")), _packed("f2", 3, nodeSelector=on("n2"))],
            # the shape peaks at half full: n1 ends at 50% (score 100), n0 at 25% (50),
            # n2 at 100% (0)
            [_packed("p")],
            # n0 ends at 50% (100), n1 at 100% (0), n2 has no room
            [_packed("q", 2)],
        ],
        {"f1": "n1", "f2": "n2", "p": "n1", "q": "n0"},
        profile="ratio",
        peer="ratio",
    ),
    Case(
        "pack-gpu",
        [node("g0", gpus=8), node("g1", gpus=8), node("g2", gpus=8)],
        [
            [
                _packed("f0", gpus=2, nodeSelector=on("g0")),
                _packed("f1", gpus=5, nodeSelector=on("g1")),
            ],
            # gpu: g1 ends 7/8 full, g0 4/8, g2 2/8 (cpu and memory: g0 and g1 2/4)
            [_packed("p", gpus=2)],
            # g1 has 1 card left: g0 ends 6/8 (cpu 2/4), g2 4/8 (cpu 1/4)
            [_packed("q", gpus=4)],
            # a whole node is left for the 8-card pod
            [_packed("r", gpus=8)],
        ],
        {"f0": "g0", "f1": "g1", "p": "g1", "q": "g0", "r": "g2"},
        profile="pack",
        peer="pack",
    ),
    Case(
        "pack-cpu-on-gpu-nodes",
        [node("g0", gpus=8), node("g1", gpus=8)],
        [
            [
                _packed("f0", gpus=8, nodeSelector=on("g0")),
                _packed("f1", 2, nodeSelector=on("g1")),
            ],
            # a pod asking for no GPU is scored on cpu and memory only (kube-scheduler
            # leaves out an extended resource the pod does not request): g1 ends 3/4
            # full, g0 2/4, whatever g0's cards
            [_packed("p")],
        ],
        {"f0": "g0", "f1": "g1", "p": "g1"},
        profile="pack",
        peer="pack",
    ),
    *(_gpu_policy(p, "pack") for p in AS_MOST_ALLOCATED),
    *(_gpu_policy(p, None) for p in OWN_POLICIES),
]


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def peer(
    real_apiserver: RealApiServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeScheduler]:
    """kube-scheduler v1.37 with profile ``kube-peer`` and the packing ones, for the
    module."""
    binary = DEFAULT.binary("kube-scheduler")
    if not binary.is_file():
        pytest.skip(f"no kube-scheduler in {DEFAULT.cache} (./dev kube build)")
    scheduler = KubeScheduler(
        binary,
        real_apiserver.kubeconfig,
        tmp_path_factory.mktemp("kube-scheduler"),
        scheduler_name=PEER,
        profiles=[{"schedulerName": f"{PEER}-{k}", **v} for k, v in PACKING.items()],
    )
    scheduler.start()
    try:
        yield scheduler
    finally:
        scheduler.stop()


ALL = CASES + PACKING_CASES
PEERED = [c for c in ALL if c.peer is not None]
PEER_OUTCOMES: dict[str, dict[str, str]] = {}
"""kube-scheduler's outcome of each case it has an equivalent for (played once for the
module)."""


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


async def _play(runs: list[Run]) -> dict[str, dict[str, str]]:
    outcomes = await asyncio.gather(*(run.play() for run in runs))
    return {run.case.name: outcome for run, outcome in zip(runs, outcomes, strict=True)}


async def _verified(service: Service, shards: int) -> list[list[Envelope]]:
    """The log as recorded; it replays, every decision verified."""
    assert service.bus is not None
    parts = [await service.bus.read(p, 0) for p in range(service.bus.partitions)]
    verified = replay(parts[0], verify=True) if shards == 1 else replay_routed(parts, verify=True)
    assert verified.mismatch is None, verified.mismatch
    return parts


def _lumped(parts: list[list[Envelope]], runs: list[Run], shards: int) -> list[str]:
    """The cases whose nodes all went to one shard though they have several."""
    shard_of = {
        e.event.node.name: p
        for p, records in enumerate(parts[:shards])
        for e in records
        if isinstance(e.event, NodeAdded)
    }
    return [
        run.case.name
        for run in runs
        if len(run.case.nodes) > 1
        and len({shard_of.get(run.node(n["metadata"]["name"])) for n in run.case.nodes}) == 1
    ]


@pytest.mark.parametrize("shards", [1, 2, pytest.param(4, marks=SLOW), pytest.param(8, marks=SLOW)])
async def test_shoal_places_pods_as_kube_scheduler_does(
    real_apiserver: RealApiServer, peer: KubeScheduler, shards: int
) -> None:
    """Every case, kube-scheduler's run once for the module, shoal's at ``shards``:
    the same pods placed (on the same nodes where unique), pending and preempted, and
    both the one right answer; shoal's log replays."""
    real = real_apiserver
    real.empty()
    _priorities(real)
    # the cases side by side, each on nodes and in a namespace of its own, and
    # kube-scheduler's (once for the module) beside shoal's first
    theirs = [] if PEER_OUTCOMES else [Run(real, c, f"k-{c.name}", _peer(c)) for c in PEERED]
    async with serving(real, shards, _shoal_config()) as service:
        runs = [Run(real, c, f"s{shards}-{c.name}", _shoal(c)) for c in ALL]
        ours, peers = await asyncio.gather(_play(runs), _play(theirs))
        parts = await _verified(service, shards)
    PEER_OUTCOMES.update(peers)
    await asyncio.gather(*(asyncio.to_thread(run.remove) for run in runs + theirs))
    if shards > 1:
        assert not _lumped(parts, runs, shards), "a case's nodes all in one shard"
    differ = {
        name: (ours[name], PEER_OUTCOMES[name])
        for name in PEER_OUTCOMES
        if ours[name] != PEER_OUTCOMES[name]
    }
    assert not differ, f"shoal, kube-scheduler: {differ}"
    wrong = {
        name: PEER_OUTCOMES[name]
        for name in PEER_OUTCOMES
        if PEER_OUTCOMES[name] != _expected(name)
    }
    assert not wrong, f"kube-scheduler, not the one right answer: {wrong}"
    own = {c.name: ours[c.name] for c in ALL if c.peer is None and ours[c.name] != c.expected}
    assert not own, f"shoal, not what one shard does: {own}"


def _expected(name: str) -> dict[str, str]:
    return next(c.expected for c in ALL if c.name == name)
