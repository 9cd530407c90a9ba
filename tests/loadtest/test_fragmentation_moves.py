"""``shoal loadtest fragmentation --moves``: the trace's protocol with running pods moved
within a budget in percent of the pods placed so far, on small random slices of
trace-like pods (GPU shares, whole cards, cpu-only pods) and a few trace nodes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import parse_config
from engine.engine import Engine
from engine.passes.consolidate import BY
from events.types import (
    BudgetSpec,
    DisruptionBudgetSet,
    Envelope,
    Event,
    LabelSelector,
    NodeAdded,
    PodBound,
    PodDeleted,
    PodMigrated,
    PodSubmitted,
)
from loadtest.fragmentation import Run, profile_config, run_one
from loadtest.gputrace import TraceNode, TracePod

TRACE = Path(__file__).parent.parent / "fixtures" / "gputrace"
NODES = [TraceNode(f"node-{i}", 32_000, 128 << 10, 2 + 2 * (i % 2), "T4") for i in range(4)]

pods_st = st.lists(
    st.builds(
        TracePod,
        name=st.just("p"),
        cpu=st.sampled_from([1000, 4000, 8000]),
        memory_mib=st.sampled_from([1024, 8192]),
        gpus=st.sampled_from([0, 1, 1, 1, 2]),
        milli=st.sampled_from([200, 300, 500, 700, 1000]),
        models=st.just(()),
    ).map(
        lambda p: (
            p
            if p.gpus == 1
            else TracePod(p.name, p.cpu, p.memory_mib, p.gpus, 1000 if p.gpus else 0, ())
        )
    ),
    min_size=6,
    max_size=40,
)


def _engine(pods: list[TracePod], policy: str, percent: int, protected: bool) -> Engine:
    config = profile_config(policy, 1, pods, percent, consolidate=True)
    engine = Engine(parse_config(config))
    if protected:  # every pod of the namespace stays: no disruption allowed
        spec = BudgetSpec(
            namespace="default", name="all", selector=LabelSelector(), min_available="100%"
        )
        engine.apply(Envelope(event=DisruptionBudgetSet(budget=spec), producer="ingest"))
    for node in NODES:
        engine.apply(Envelope(event=NodeAdded(node=node.spec()), producer="ingest"))
    engine.schedule()
    return engine


def _fragmentation(engine: Engine) -> int:
    framework = engine.profiles.frameworks["default-scheduler"]
    assert framework.potential is not None
    slots = engine.state.index.values()
    return int(framework.potential.potential(engine.state, np.array(sorted(slots))).sum())


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pods=pods_st,
    percent=st.sampled_from([0, 10, 50, 100]),
    policy=st.sampled_from(["fgd", "shoal"]),
    protected=st.booleans(),
)
def test_moves_stay_in_budget_lower_fragmentation_and_respect_budgets(
    pods: list[TracePod], percent: int, policy: str, protected: bool
) -> None:
    engine = _engine(pods, policy, percent, protected)
    # a replica folds the decisions one by one: each consolidation move must lower the
    # fragmentation its profile's score measures
    replica = _engine(pods, policy, percent, protected)
    placed = moved = 0
    for i, pod in enumerate(pods):
        spec = pod.spec(f"{pod.name}-{i}")
        submitted: Event = PodSubmitted(pod=spec)
        engine.apply(Envelope(event=submitted, producer="ingest"))
        replica.apply(Envelope(event=submitted, producer="ingest"))
        decisions = engine.schedule()
        for decision in decisions:
            before = _fragmentation(replica)
            replica.apply(Envelope(event=decision, producer="shard"))
            if isinstance(decision, PodMigrated):
                moved += 1
                assert not protected, decision  # the budget allows no disruption
                if decision.by == BY:
                    assert _fragmentation(replica) < before, decision
            placed += isinstance(decision, PodBound)
        # each move counted, never more than the budget allows
        assert (engine.placed_total, engine.moved_total) == (placed, moved)
        assert moved * 100 <= placed * percent
        if not any(isinstance(d, PodBound) for d in decisions):
            gone: Event = PodDeleted(pod=spec.key)
            engine.apply(Envelope(event=gone, producer="ingest"))
            replica.apply(Envelope(event=gone, producer="ingest"))


def test_a_run_with_moves_reports_them() -> None:
    row = run_one(TRACE, Run("tiny", "shoal", 42, 5))
    again = run_one(TRACE, Run("tiny", "shoal", 42, 5))
    keep = [k for k in row if k not in ("cpu_seconds", "pods_per_second")]
    assert {k: row[k] for k in keep} == {k: again[k] for k in keep}
    assert row["moves_budget_pct"] == 5
    assert row["moves"] * 100 <= row["bound"] * 5
    for key in ("placed_by_moves", "nodes_moved_from", "most_moves_off_one_node"):
        assert 0 <= row[key] <= max(row["moves"], 0)
