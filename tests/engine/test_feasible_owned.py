"""``Framework.feasible`` hands back an array the caller owns: consolidation, defrag and
the rescheduler's chains bar slots in what it returns, which must not reach the
framework's cached static mask or ``state.valid``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.config import parse_config
from engine.engine import Engine
from engine.framework.cycle import CycleState
from engine.framework.runtime import Framework
from engine.model.pods import pod_info
from engine.model.state import ClusterState
from engine.plugins.registry import builtin_registry
from tests.builders import make_node, make_pod


def framework(disabled: list[str]) -> Framework:
    raw: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"plugins": {"filter": {"disabled": [{"name": name} for name in disabled]}}}],
    }
    return Framework(parse_config(raw).profiles[0], builtin_registry(), Engine())


def not_static() -> list[str]:
    """The default filters whose verdict changes with more than the nodes' specs."""
    return [f.name for f in framework([]).filters if not f.static]


@pytest.mark.parametrize("disabled", [["*"], "dynamic"], ids=["no-filters", "static-only"])
def test_feasible_is_the_callers_own(disabled: list[str] | str) -> None:
    fw = framework(not_static() if disabled == "dynamic" else disabled)  # type: ignore[arg-type]
    assert not fw.dynamic_filters and not fw.conditional
    state = ClusterState()
    for name in "abc":
        state.add_node(make_node(name).spec())
    state.ensure_rows()
    pod = pod_info(make_pod("p").spec(), state.resources, 0)
    valid = state.valid.copy()
    first = fw.feasible(CycleState(), pod, state)
    first[:] = False  # what consolidate.py and defrag.py do with a source slot
    assert np.array_equal(state.valid, valid)
    assert np.array_equal(fw.feasible(CycleState(), pod, state), valid)
    assert np.array_equal(fw.static_feasible(pod, state), valid)
