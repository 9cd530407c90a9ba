"""The workload a GPU policy learns, at several shards: the coordinator sends every shard
the shapes it learnt whenever they change (``WorkloadShapes``), so a shard, which holds
only some of the pods, judges against the workload one scheduler would; and no such
record where no profile learns its workload."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.engine import Engine
from engine.model.devices import SHOAL_MILLI
from engine.model.pods import pod_info
from engine.model.shapes import ShapeCounts
from events.types import SECOND, Envelope, PodSpec, SchedulerConfigured, WorkloadShapes
from tests.builders import make_node, make_pod
from tests.shards.coordinator_kit import records, shoal
from tests.shards.scenario_text import gpu_node, gpu_pod, rescheduler_config

GIVEN = """
  - name: ShoalGpu
    args: {targetWorkload: [{cpu: 1, gpuMilli: 500, weight: 1}]}"""


def scenario(millis: list[int], *, given_workload: bool = False, score: str = "ShoalGpu") -> str:
    """Four one-card nodes in pools p0 and p1 (one shard's each at 2 shards), a share of
    each of ``millis`` arriving one a second."""
    text = rescheduler_config("{}", score=score)
    if given_workload:
        text = text.replace("  pluginConfig:", "  pluginConfig:" + GIVEN)
    for i in range(4):
        text += gpu_node(f"node{i}", 1, pool=f"p{i % 2}")
    for j, milli in enumerate(millis):
        text += gpu_pod(f"pod{j}", milli=milli, at=j)
    return text


def learnt(millis: list[int]) -> dict[tuple[int, int, int, tuple[str, ...]], int]:
    """What one scheduler learns from these pods (in the order they come)."""
    counts = ShapeCounts()
    for milli in millis:
        counts.add_shape((1000, milli, 1, ()))
    return counts.learned


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(millis=st.lists(st.sampled_from([100, 250, 500, 700]), min_size=1, max_size=20))
def test_every_shard_is_sent_what_the_coordinator_learnt(
    capsys: pytest.CaptureFixture[str], millis: list[int]
) -> None:
    with tempfile.TemporaryDirectory() as where:
        data, parts = shoal(Path(where), capsys, scenario(millis), 2)
    assert len(data["pods"]) == len(millis)
    for shard in (0, 1):
        told = [env.event for env in parts[shard] if isinstance(env.event, WorkloadShapes)]
        # one record per change (at each power of two of the pods submitted), the last
        # what one scheduler has learnt from them
        assert len(told) == len(millis).bit_length()
        assert {(c, m, k, models): n for c, m, k, models, n in told[-1].learned} == learnt(millis)


@pytest.mark.parametrize("case", ["given workload", "no GPU policy"])
def test_nothing_is_sent_where_no_profile_learns_its_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    millis = [500, 250, 700, 100, 500]
    if case == "given workload":
        text = scenario(millis, given_workload=True)
    else:
        text = scenario(millis, score="NodeResourcesFit")
    _, parts = shoal(tmp_path, capsys, text, 2)
    assert not records(parts, WorkloadShapes)


def test_a_shard_learns_what_it_is_told_and_no_longer_from_its_own_pods() -> None:
    shard = Engine(shard=0)
    told = WorkloadShapes(learned=((1000, 500, 1, (), 3), (2000, 1000, 2, ("H100",), 1)))
    events = (told, make_pod("a").cpu("1").submitted(), make_pod("b").cpu("3").submitted())
    for offset, event in enumerate(events, 1):
        shard.apply(Envelope(event=event, time=SECOND, producer="router", offset=offset))
    assert shard.shapes.learned == {(1000, 500, 1, ()): 3, (2000, 1000, 2, ("H100",)): 1}
    assert shard.shapes.told and shard.shapes.total == 2


@pytest.mark.parametrize("score", ["ShoalGpu", "GpuFragmentation"])
def test_a_shard_judges_its_nodes_for_moves_against_the_workload_it_was_told(
    score: str,
) -> None:
    """A shard told a new workload judges its nodes for consolidation against it (the
    policy's potential) before it scores any pod: at several shards a pass may place
    only parts whose nodes the coordinator chose, and consolidate after it, where one
    scheduler has scored that pass's pods against the new workload (random GPU seed
    156: the shard judged every node against the workload it knew before, all zero,
    and made another move than one shard)."""
    config = json.dumps(yaml.safe_load(scenario([], score=score).split("---")[0]))
    shard = Engine(shard=0)
    told = WorkloadShapes(learned=((1000, 500, 1, (), 3), (1000, 700, 1, (), 1)))
    events = [
        SchedulerConfigured(config=config),
        make_node("n0").cpu("8").gpu(1).added(),
        make_node("n1").cpu("8").gpu(1).added(),
        told,
    ]
    for offset, event in enumerate(events, 1):
        shard.apply(Envelope(event=event, time=SECOND, producer="router", offset=offset))
    # a share placed where the coordinator chose (no pod scored here)
    spec = PodSpec(namespace="default", name="p", requests={"cpu": 1000, SHOAL_MILLI: 400})
    shard.state.ensure_rows()
    placed = pod_info(spec, shard.state.resources, 0)
    slot = shard.state.index["n0"]
    shard.state.assume(placed.key, slot, placed.request)
    judge = shard.profiles.frameworks["default-scheduler"].potential
    assert judge is not None
    slots = np.array([slot, shard.state.index["n1"]], dtype=np.int64)
    # n0's card, 600m free, fits one of the 500m pods the workload expects; n1's two
    assert judge.potential(shard.state, slots).tolist()[0] > 0
