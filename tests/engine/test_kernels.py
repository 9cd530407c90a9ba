"""The compiled refresh (engine/kernels.py) gives exactly the numpy plugins' results."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.config import parse_config
from engine.engine import Engine
from engine.framework.cycle import CycleState
from engine.model.pods import make_request, pod_info
from engine.model.state import ClusterState
from engine.plugins.kernels import ResourceKernel, refresh_kernel
from events.types import PodSpec
from tests.builders import env, make_node, make_pod
from tests.engine.test_properties import events, run

pytestmark = pytest.mark.skipif(refresh_kernel() is None, reason="numba is not available")

HEADER = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
STRATEGY = st.sampled_from(["LeastAllocated", "MostAllocated"])
RESOURCES = st.sampled_from(
    [
        None,
        [{"name": "cpu", "weight": 3}, {"name": "memory", "weight": 1}],
        [{"name": "cpu", "weight": 1}, {"name": "nvidia.com/gpu", "weight": 2}],
        [{"name": "nvidia.com/gpu", "weight": 1}],
    ]
)


def _engine(strategy: str, fit: Any, balanced: Any, weights: tuple[int, int]) -> Engine:
    args: dict[str, Any] = {"scoringStrategy": {"type": strategy}}
    if fit is not None:
        args["scoringStrategy"]["resources"] = fit
    plugins: list[dict[str, Any]] = [
        {"name": "NodeResourcesFit", "args": args},
    ]
    balanced_args = {} if balanced is None else {"resources": balanced}
    raw = {
        **HEADER,
        "profiles": [
            {
                "schedulerName": "default-scheduler",
                "plugins": {
                    "score": {
                        "disabled": [
                            {"name": "NodeResourcesFit"},
                            {"name": "NodeResourcesBalancedAllocation"},
                        ],
                        "enabled": [
                            {"name": "NodeResourcesFit", "weight": weights[0]},
                            {"name": "NodeResourcesBalancedAllocation", "weight": weights[1]},
                        ],
                    }
                },
                "pluginConfig": [
                    *plugins,
                    {"name": "NodeResourcesBalancedAllocation", "args": balanced_args},
                ],
            }
        ],
    }
    return Engine(parse_config(raw, "test"))


@given(
    STRATEGY,
    RESOURCES,
    st.sampled_from(
        [None, [{"name": "cpu", "weight": 1}, {"name": "nvidia.com/gpu", "weight": 1}]]
    ),
    st.tuples(st.integers(1, 5), st.integers(1, 5)),
    st.lists(
        st.tuples(
            st.sampled_from(["0", "1", "3", "64"]),
            st.sampled_from(["0", "1Gi", "64Gi"]),
            st.integers(0, 8),
        ),
        min_size=1,
        max_size=12,
    ),
    st.lists(
        st.tuples(st.sampled_from(["0", "100m", "2", "5"]), st.sampled_from(["0", "3Gi"])),
        max_size=30,
    ),
    st.tuples(
        st.sampled_from(["0", "250m", "4"]), st.sampled_from(["0", "1Gi"]), st.integers(0, 2)
    ),
)
def test_the_kernel_equals_the_plugins_slot_by_slot(
    strategy: str,
    fit: Any,
    balanced: Any,
    weights: tuple[int, int],
    nodes: list[tuple[str, str, int]],
    placed: list[tuple[str, str]],
    asked: tuple[str, str, int],
) -> None:
    """Nodes without a scored resource, nodes over-committed, requests of nothing,
    requests above any capacity: filter verdicts and weighted scores are the same
    integers as the numpy plugins give."""
    engine = _engine(strategy, fit, balanced, weights)
    for i, (cpu, memory, gpus) in enumerate(nodes):
        node = make_node(f"n{i}").cpu(cpu).memory(memory)
        engine.apply(env(node.gpu(gpus).added() if gpus else node.added(), i))
    state = engine.state
    for i, (cpu, memory) in enumerate(placed):  # assumed as is: may over-commit
        spec = make_pod(f"q{i}").cpu(cpu).memory(memory).spec()
        info = pod_info(spec, state.resources, i)
        state.ensure_rows()
        state.assume(info.key, i % len(nodes), info.request)
    framework = engine.profiles.frameworks["default-scheduler"]
    kernel = framework.kernel
    assert isinstance(kernel, ResourceKernel)
    cpu, memory, gpus = asked
    spec = make_pod("x").cpu(cpu).memory(memory).gpu(gpus).spec()
    pod = pod_info(spec, state.resources, 999)
    state.ensure_rows()  # as Engine.submit does: a resource no node has gets its row
    static = framework.static_feasible(pod, state)
    cycle = CycleState()
    expected_ok = static.copy()
    for f in framework.dynamic_filters:
        expected_ok &= f.filter(cycle, pod, state)
    expected = np.zeros(state.capacity, dtype=np.int64)
    for entry in framework.scores:
        if entry.plugin.local:
            expected += entry.plugin.score(cycle, pod, state, expected_ok) * entry.weight
    params = kernel.params(pod.request, state)
    if params is None:  # BalancedAllocation over other than two resources: numpy's
        assert balanced is not None
        return
    ok = np.zeros(state.capacity, dtype=bool)
    local = np.full(state.capacity, -7, dtype=np.int64)
    masked = np.full(state.capacity, -7, dtype=np.int64)
    slots = list(range(len(nodes)))
    kernel.run(slots, static, state, params, ok, local, masked)
    n = len(nodes)
    assert ok[:n].tolist() == expected_ok[:n].tolist()
    assert local[:n].tolist() == expected[:n].tolist()
    assert masked[:n].tolist() == np.where(expected_ok, expected, -1)[:n].tolist()
    assert (local[n:] == -7).all(), "slots not asked for are left alone"


@given(events)
def test_the_kernel_decides_as_the_numpy_refresh(sequence: list[Any]) -> None:
    with_kernel = run(sequence, incremental=True)
    assert with_kernel == run(sequence, incremental=True, kernel=False)


def test_profiles_the_kernel_does_not_cover_keep_numpy() -> None:
    raw = {
        **HEADER,
        "profiles": [
            {
                "schedulerName": "default-scheduler",
                "pluginConfig": [
                    {
                        "name": "NodeResourcesFit",
                        "args": {
                            "scoringStrategy": {
                                "type": "RequestedToCapacityRatio",
                                "requestedToCapacityRatio": {
                                    "shape": [
                                        {"utilization": 0, "score": 0},
                                        {"utilization": 100, "score": 10},
                                    ]
                                },
                            }
                        },
                    }
                ],
            }
        ],
    }
    assert Engine(parse_config(raw, "test")).profiles.frameworks["default-scheduler"].kernel is None
    assert Engine().profiles.frameworks["default-scheduler"].kernel is not None


def _probe(code: str, **env: str) -> str:
    """What ``code`` prints in a fresh interpreter (from the repository root)."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
        env={**os.environ, **env},
    )
    return out.stdout


def test_shoal_no_jit_keeps_numpy() -> None:
    """The switch is read at the edge (``shards``), not by the engine."""
    kernel = "print(Engine().profiles.frameworks['default-scheduler'].kernel is None)\n"
    engine = "from engine.engine import Engine\n"
    assert _probe("import shards\n" + engine + kernel, SHOAL_NO_JIT="1").strip() == "True"
    if importlib.util.find_spec("numba") is not None:
        assert _probe(engine + kernel, SHOAL_NO_JIT="1").strip() == "False"
        assert _probe("import shards\n" + engine + kernel).strip() == "False"


def test_a_small_run_never_loads_numba() -> None:
    """Refreshes of a few nodes stay in plain Python until the kernel is needed, so a
    small simulation does not pay the half second numba costs to load."""
    probe = (
        "import asyncio, sys\n"
        "from events.memory import MemoryLog\n"
        "from shards.inputs.scenario import load_scenario\n"
        "from shards.simulate import simulate\n"
        "scenario = load_scenario(['examples/quickstart.yaml'])\n"
        "result = asyncio.run(simulate(scenario, MemoryLog()))\n"
        "print(result.engine.stats()['attempts'] > 0, 'numba' in sys.modules)\n"
    )
    assert _probe(probe).split() == ["True", "False"]


def _placements(add: Any) -> tuple[Any, dict[int, Any]]:
    """A state after placing and releasing pods, resources registered in between, with
    ``add`` as the column update (None: numpy)."""
    from engine.model import state as state_module

    saved = state_module._compiled_add
    state_module.use_compiled_columns(add)
    try:
        state = ClusterState()
        for i in range(4):
            state.add_node(make_node(f"n{i}").cpu("8").memory("16Gi").gpu(2).spec())
        for i in range(12):
            spec = make_pod(f"p{i}").cpu(f"{i % 3 + 1}").memory("1Gi").spec()
            state.assume(f"p{i}", i % 4, make_request(spec, state.resources), i % 2 * 100)
        # a resource registered after some placements: their deltas are padded
        fpga = PodSpec(namespace="default", name="f", requests={"example.com/fpga": 1})
        fpga_request = make_request(fpga, state.resources)
        state.ensure_rows()
        for i in range(0, 12, 3):
            state.forget(f"p{i}")
        state.assume("f", 3, fpga_request)
        state.assume("p0", 2, make_request(make_pod("p0").gpu(1).spec(), state.resources))
        state.check_invariants()
        return state._columns.copy(), {p: u.copy() for p, u in state.used_by_priority.items()}
    finally:
        state_module.use_compiled_columns(saved)


def test_compiled_column_updates_leave_the_state_numpy_leaves() -> None:
    """``assume`` and ``forget`` with the compiled column update end in the same arrays,
    element for element, as with numpy's."""
    if refresh_kernel() is None:
        pytest.skip("numba is not available")
    from engine.model import state as state_module

    compiled = state_module._compiled_add
    assert compiled is not None, "loading the kernels installs the compiled update"
    columns, by_priority = _placements(compiled)
    numpy_columns, numpy_by_priority = _placements(None)
    assert np.array_equal(columns, numpy_columns)
    assert by_priority.keys() == numpy_by_priority.keys()
    assert all(np.array_equal(by_priority[p], numpy_by_priority[p]) for p in by_priority)
