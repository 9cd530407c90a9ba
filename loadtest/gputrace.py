"""The Alibaba GPU trace (cluster-trace-gpu-v2023) as nodes, pods and FGD's protocol.

Reads ``openb_node_list_gpu_node.csv`` and ``openb_pod_list_<workload>.csv`` from the
trace (a folder, or the archive the package ships: :mod:`loadtest.tracefiles`;
``data/alibaba-gpu-v2023/PROTOCOL.md`` describes the benchmark) and builds, per seed, the
arrival sequence the protocol prescribes:

1. nodes in an order shuffled with the seed;
2. the file's pods shuffled with the seed; then, while the GPU requested stays within
   130% of the cluster's GPUs, pods drawn uniformly with replacement are appended,
   stopping before the first that would pass 130%; a file already above 130% has
   pods drawn at random removed until it is within.

Randomness is numpy's PCG64 seeded with the seed (the published runs' Go streams cannot
be reproduced, so only means over seeds compare).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

import numpy as np

from engine.model.devices import GPU, MODEL_LABEL, SHOAL_MILLI, WHOLE
from engine.plugins.gpu.workload import Shape, TargetWorkload
from events.errors import InputError
from events.types import NodeSelectorRequirement, NodeSelectorTerm, NodeSpec, PodSpec
from loadtest.tracefiles import location, names, read_text

NODE_FILE: Final = "openb_node_list_gpu_node.csv"
PUBLISHED_FILE: Final = "fgd_published_summary.csv"
POD_PREFIX: Final = "openb_pod_list_"
TARGET_PCT: Final = 130
MIB: Final = 1 << 20
NODE_PODS: Final = 1_000_000
"""``pods`` allocatable of every node: the trace bounds nodes by cpu, memory and GPU only."""
POLICIES: Final = {
    "random": "GpuRandom",
    "dotprod": "GpuDotProduct",
    "gpuclustering": "GpuClustering",
    "gpupacking": "GpuPacking",
    "bestfit": "GpuBestFit",
    "fgd": "GpuFragmentation",
    "m-minus-n": "GpuMMinusN",
    "shoal": "ShoalGpu",
}
"""``--policy`` name → the score plugin that is the policy."""
PUBLISHED_NAMES: Final = {
    "random": "01-Random",
    "dotprod": "02-DotProd",
    "gpuclustering": "03-GpuClustering",
    "gpupacking": "04-GpuPacking",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
}
_NODE_COLUMNS: Final = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
_POD_COLUMNS: Final = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu: int
    memory_mib: int
    gpus: int
    model: str

    def spec(self) -> NodeSpec:
        allocatable = {"cpu": self.cpu, "memory": self.memory_mib * MIB, "pods": NODE_PODS}
        labels = {}
        if self.gpus:
            allocatable[GPU] = self.gpus
            labels[MODEL_LABEL] = self.model
        return NodeSpec(name=self.name, allocatable=allocatable, labels=labels)


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu: int
    memory_mib: int
    gpus: int
    milli: int
    """milli-GPU per card (1000 for whole cards; 0 without GPU)."""
    models: tuple[str, ...]

    @property
    def gpu_milli(self) -> int:
        """The GPU it asks for in all, in milli-GPU."""
        return self.gpus * self.milli

    def shape(self) -> Shape:
        if not self.gpus:
            return Shape(self.cpu, 0, 0)
        return Shape(self.cpu, self.milli, self.gpus, self.models)

    def spec(self, name: str) -> PodSpec:
        requests = {"cpu": self.cpu, "memory": self.memory_mib * MIB}
        if self.gpus > 1 or self.milli >= WHOLE:
            requests[GPU] = self.gpus
        elif self.gpus == 1:
            requests[SHOAL_MILLI] = self.milli
        affinity = None
        if self.models:
            requirement = NodeSelectorRequirement(
                key=MODEL_LABEL, operator="In", values=self.models
            )
            affinity = (NodeSelectorTerm(match_expressions=(requirement,)),)
        return PodSpec(
            namespace="default", name=name, requests=requests, required_affinity=affinity
        )


def rows(trace: Path, name: str, columns: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """The rows of CSV file ``name`` of ``trace`` with their line numbers; refused, naming
    the file, if one of ``columns`` is missing."""
    reader = csv.DictReader(io.StringIO(read_text(trace, name), newline=""))
    missing = [c for c in columns if c not in (reader.fieldnames or ())]
    if missing:
        raise InputError(f"missing column {missing[0]!r}", location=location(trace, name))
    yield from enumerate(reader, start=2)


def _int(row: dict[str, str], column: str, where: str, low: int, high: int) -> int:
    raw = row.get(column) or ""
    try:
        value = int(raw)
    except ValueError:
        raise InputError(f"not an integer: {raw[:40]!r}", location=f"{where}: {column}") from None
    if not low <= value <= high:
        raise InputError(f"must be {low}..{high}, got {value}", location=f"{where}: {column}")
    return value


def read_nodes(trace: Path) -> list[TraceNode]:
    path = location(trace, NODE_FILE)
    out = []
    for line, row in rows(trace, NODE_FILE, _NODE_COLUMNS):
        where = f"{path}: line {line}"
        gpus = _int(row, "gpu", where, 0, 64)
        model = (row.get("model") or "").strip()
        if gpus and not model:
            raise InputError("a node with GPUs needs a model", location=f"{where}: model")
        cpu = _int(row, "cpu_milli", where, 0, 2**40)
        memory = _int(row, "memory_mib", where, 0, 2**30)
        out.append(TraceNode(row["sn"], cpu, memory, gpus, model))
    if not out:
        raise InputError("no nodes", location=path)
    return out


def read_pods(trace: Path, workload: str) -> list[TracePod]:
    name = f"{POD_PREFIX}{workload}.csv"
    path = location(trace, name)
    out = []
    for line, row in rows(trace, name, _POD_COLUMNS):
        where = f"{path}: line {line}"
        gpus = _int(row, "num_gpu", where, 0, 64)
        milli = _int(row, "gpu_milli", where, 0, WHOLE)
        if gpus == 0:
            milli = 0
        elif gpus > 1 or milli == 0:
            milli = WHOLE  # several cards are whole cards
        spec = (row.get("gpu_spec") or "").strip()
        models = tuple(sorted({m for m in spec.split("|") if m})) if gpus else ()
        cpu = _int(row, "cpu_milli", where, 0, 2**40)
        memory = _int(row, "memory_mib", where, 0, 2**30)
        out.append(TracePod(row["name"], cpu, memory, gpus, milli, models))
    if not out:
        raise InputError("no pods", location=path)
    return out


def workloads(trace: Path) -> list[str]:
    """The workload names the trace folder has (``default`` first)."""
    found = [
        n[len(POD_PREFIX) : -4]
        for n in names(trace)
        if n.startswith(POD_PREFIX) and n.endswith(".csv")
    ]
    return sorted(found, key=lambda n: (n != "default", n))


def target_workload(pods: list[TracePod], memory: bool = False) -> TargetWorkload:
    """FGD's target workload of a pod file (PROTOCOL.md: shapes covering 95% of pods);
    with ``memory``, each shape also carries the median memory of its pods (bytes)."""
    workload = TargetWorkload.of_shapes(pod.shape() for pod in pods)
    if not memory:
        return workload
    sizes: dict[Shape, list[int]] = {}
    for pod in pods:
        sizes.setdefault(pod.shape(), []).append(pod.memory_mib * MIB)
    shapes = []
    for shape in workload.shapes:
        ordered = sorted(sizes[shape])
        shapes.append(replace(shape, memory=ordered[(len(ordered) - 1) // 2]))
    return TargetWorkload(tuple(shapes), workload.weights)


def arrivals(pods: list[TracePod], capacity_milli: int, seed: int) -> list[TracePod]:
    """The protocol's arrival sequence for ``seed`` (see the module's docstring)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    order = rng.permutation(len(pods))
    out = [pods[int(i)] for i in order]
    limit = capacity_milli * TARGET_PCT // 100
    total = sum(p.gpu_milli for p in out)
    if total > limit:
        while total > limit:
            gone = out.pop(int(rng.integers(len(out))))
            total -= gone.gpu_milli
        return out
    while True:
        pod = pods[int(rng.integers(len(pods)))]
        if total + pod.gpu_milli > limit:
            return out
        out.append(pod)
        total += pod.gpu_milli


def node_order(nodes: list[TraceNode], seed: int) -> list[TraceNode]:
    rng = np.random.Generator(np.random.PCG64(seed + 1_000_003))
    return [nodes[int(i)] for i in rng.permutation(len(nodes))]
