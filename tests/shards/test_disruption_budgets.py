"""Pod disruption budgets known to the engine, through ``shoal simulate`` at 1, 2 and 4
shards, replayed with ``--verify``: the rescheduler never plans moves that take a budget
below what it allows (moves of one plan counted together), preemption prefers victims
whose eviction breaks no budget, and a malformed budget is refused naming its field."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from engine.model.disruption import allowed
from engine.model.pools import Sharding
from engine.snapshot import encode_state
from events.memory import MemoryLog
from events.types import BudgetSpec, Envelope, PodMigrated
from shards.cli import main
from shards.inputs.scenario import load_scenario
from shards.replay import replay, replay_routed
from shards.simulate import simulate
from shards.worker import ShardWorker
from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import gpu_node, gpu_pod
from tests.shards.test_rescheduler import defrag_config

SHARDS = (1, 2, 4)


def budget(
    name: str,
    app: str,
    *,
    version: str = "policy/v1",
    min_available: int | str | None = None,
    max_unavailable: int | str | None = None,
    selector: str | None = None,
) -> str:
    fields = [
        f"  selector: {selector if selector is not None else f'{{matchLabels: {{app: {app}}}}}'}"
    ]
    if min_available is not None:
        fields.append(f"  minAvailable: {min_available!r}".replace("'", '"'))
    if max_unavailable is not None:
        fields.append(f"  maxUnavailable: {max_unavailable!r}".replace("'", '"'))
    body = "\n".join(fields)
    return f"""
apiVersion: {version}
kind: PodDisruptionBudget
metadata: {{name: {name}, namespace: default}}
spec:
{body}
---"""


def seed(**b_args: Any) -> str:
    """Seed 001: node1 runs podA (4 cards) and podB (3), node2 podD (5, stays); podC
    (4) fits once podB moves to node2."""
    text = gpu_node("node1", 8) + gpu_node("node2", 8)
    text += gpu_pod("podA", cards=4, on="node1", migratable=False)
    text += gpu_pod("podB", cards=3, on="node1", labels={"app": "b"}, **b_args)
    text += gpu_pod("podD", cards=5, on="node2", migratable=False)
    return text + gpu_pod("podC", cards=4, at=10, priority=0)


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(
    ("pdb", "moves"),
    [
        (budget("b", "b", min_available=1), False),  # its one pod must stay up
        (budget("b", "b"), False),  # neither given: minAvailable 1
        (budget("b", "b", min_available="100%"), False),
        (budget("b", "b", max_unavailable=0), False),
        (budget("b", "b", max_unavailable=1), True),
        (budget("b", "b", min_available=0), True),
        (budget("b", "b", max_unavailable="1%"), True),  # 1% of 1 rounds up to 1
        (budget("b", "other", min_available=1), True),  # picks another app's pods
        # an empty selector: in policy/v1beta1 it picks no pod, in policy/v1 every pod
        # of the namespace
        (budget("b", "", version="policy/v1beta1", selector="{}", min_available="100%"), True),
        (budget("b", "", version="policy/v1", selector="{}", min_available="100%"), False),
    ],
)
def test_a_move_never_breaks_a_disruption_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, pdb: str, moves: bool
) -> None:
    data, _ = shoal(tmp_path, capsys, pdb + seed(), shards)
    pods = data["pods"]
    if moves:
        assert data["migrations"] == [
            {"pod": "default/podB", "from": "node1", "to": "node2", "by": "default/podC"}
        ]
        assert pods["default/podC"]["node"] == "node1"
    else:
        assert data["migrations"] == []
        assert pods["default/podC"]["phase"] == "Pending"
        assert pods["default/podB"]["node"] == "node1"
        assert (
            "PodDisruptionBudget default/b allows no more disruptions"
            in (pods["default/podC"]["reason"])
        )


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(("max_unavailable", "moves"), [(1, 0), (2, 2)])
def test_the_moves_of_one_plan_count_together(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shards: int,
    max_unavailable: int,
    moves: int,
) -> None:
    """node1 runs two 3-card pods of app w; node2 has 6 cards free. A 7-card pod needs
    both moved: a budget allowing one disruption refuses that plan as a whole (each
    move alone would pass), one allowing two takes it."""
    text = budget("w", "w", max_unavailable=max_unavailable)
    text += gpu_node("node1", 8) + gpu_node("node2", 8)
    text += "".join(gpu_pod(f"w-{i}", cards=3, on="node1", labels={"app": "w"}) for i in range(2))
    text += gpu_pod("stay", cards=2, on="node2", migratable=False)
    text += gpu_pod("big", cards=7, at=10)
    data, _ = shoal(tmp_path, capsys, text, shards)
    assert len(data["migrations"]) == moves
    big = data["pods"]["default/big"]
    if moves:
        assert big["node"] == "node1"
    else:
        assert big["phase"] == "Pending" and "PodDisruptionBudget default/w" in big["reason"]


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("protected", [False, True])
def test_preemption_chooses_victims_that_break_no_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, protected: bool
) -> None:
    """Two equal candidates, one low-priority pod on each node; without a budget the
    tie goes to the first node (its victim). A budget on that victim (it may not go)
    turns the choice to the other node, as kube-scheduler picks the node with the
    fewest budget violations first."""
    text = budget("a", "a", min_available=1) if protected else ""
    text += gpu_node("node1", 8) + gpu_node("node2", 8)
    text += gpu_pod("low-a", cards=8, on="node1", labels={"app": "a"}, migratable=False)
    text += gpu_pod("low-b", cards=8, on="node2", migratable=False)
    text += gpu_pod("high", cards=8, at=10, priority=100)
    data, _ = shoal(tmp_path, capsys, text, shards)
    victim, node = ("default/low-b", "node2") if protected else ("default/low-a", "node1")
    assert [(p["pod"], p["node"]) for p in data["preemptions"]] == [(victim, node)]
    assert data["pods"]["default/high"]["node"] == node


@pytest.mark.parametrize("shards", SHARDS)
def test_preemption_still_evicts_when_every_candidate_breaks_a_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """A budget is a preference for preemption, not a wall (kube-scheduler's too)."""
    text = budget("a", "a", min_available=2)
    text += gpu_node("node1", 8) + gpu_node("node2", 8)
    text += gpu_pod("low-a", cards=8, on="node1", labels={"app": "a"}, migratable=False)
    text += gpu_pod("low-b", cards=8, on="node2", labels={"app": "a"}, migratable=False)
    text += gpu_pod("high", cards=8, at=10, priority=100)
    data, _ = shoal(tmp_path, capsys, text, shards)
    assert len(data["preemptions"]) == 1
    assert data["pods"]["default/high"]["phase"] == "Bound"


@pytest.mark.parametrize(
    ("shards", "max_unavailable", "moved"),
    # at several shards the coordinator defragments, counting the budget over every
    # shard, as one shard does (before, each shard defragmented its own machines and,
    # unable to count a budget, left the pods it picks where they were)
    [(1, 1, 0), (1, 2, 2), (2, 1, 0), (2, 2, 2), (4, 1, 0), (4, 2, 2)],
)
def test_defragmentation_keeps_within_disruption_budgets(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shards: int,
    max_unavailable: int,
    moved: int,
) -> None:
    text = defrag_config(10, 4) + budget("s", "s", max_unavailable=max_unavailable)
    text += gpu_node("spare", 8) + gpu_node("busy", 8)
    text += gpu_pod("small-0", cards=1, on="spare", labels={"app": "s"})
    text += gpu_pod("small-1", cards=1, on="spare", labels={"app": "s"})
    text += gpu_pod("big-0", cards=5, on="busy", migratable=False)
    data, _ = shoal(tmp_path, capsys, text, shards)
    assert len(data["migrations"]) == moved


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("{selector: {matchLabels: {app: a}}, minAvailble: 1}", "spec.minAvailble"),
        ("{minAvailable: 1, maxUnavailable: 1}", "spec.maxUnavailable"),
        ('{minAvailable: "150%"}', "spec.minAvailable"),
        ("{maxUnavailable: -1}", "spec.maxUnavailable"),
        ("{minAvailable: 1.5}", "spec.minAvailable"),
        ("{selector: {matchLabel: {app: a}}}", "spec.selector.matchLabel"),
        (
            "{selector: {matchExpressions: [{key: app, operator: Near}]}}",
            "spec.selector.matchExpressions[0].operator",
        ),
    ],
)
def test_a_malformed_budget_is_refused_naming_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, field: str
) -> None:
    scenario = tmp_path / "bad.yaml"
    scenario.write_text(
        gpu_node("node1", 8)
        + f"""
apiVersion: policy/v1beta1
kind: PodDisruptionBudget
metadata: {{name: bad}}
spec: {spec}
"""
    )
    with pytest.raises(SystemExit) as exited:
        main(["simulate", str(scenario), "--json"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert str(scenario) in err[0] and "document 2" in err[0] and field in err[0], err


@pytest.mark.parametrize(
    ("min_available", "max_unavailable", "expected", "healthy", "allows"),
    [
        (1, None, 3, 3, 2),  # 3 up, 1 must stay
        (1, None, 3, 1, 0),
        ("50%", None, 3, 3, 1),  # 50% of 3 rounds up to 2 must stay
        (None, "50%", 3, 3, 2),  # 50% of 3 rounds up to 2 may be down: 1 must stay
        (None, 1, 4, 3, 0),  # one is already down
        (None, 0, 4, 4, 0),
        ("0%", None, 2, 2, 2),
        (3, None, 0, 0, 0),  # nothing expected: nothing allowed
    ],
)
def test_disruptions_allowed_round_as_kubernetes_does(
    min_available: int | str | None,
    max_unavailable: int | str | None,
    expected: int,
    healthy: int,
    allows: int,
) -> None:
    spec = BudgetSpec(
        namespace="default",
        name="b",
        min_available=min_available,
        max_unavailable=max_unavailable,
    )
    assert allowed(spec, expected, healthy) == allows


@pytest.mark.parametrize("shards", [1, 3])
def test_budgets_are_in_snapshots_and_a_restored_engine_counts_them_alike(
    tmp_path: Path, shards: int
) -> None:
    """Snapshots taken every few records hold the budgets (and, at several shards, what
    the coordinator counted for a pod it handed over): recovery from the newest one
    reaches the state of a full replay, and replay checks every snapshot."""
    scenario_file = tmp_path / "pdb.yaml"
    scenario_file.write_text(budget("b", "b", max_unavailable=1) + seed())
    scenario = load_scenario([str(scenario_file)])

    async def go() -> list[list[Envelope]]:
        log = MemoryLog(shards + 1 if shards > 1 else 1)
        sharding = Sharding(shards=shards) if shards > 1 else None
        await simulate(scenario, log, sharding=sharding, snapshot_every=2)
        return [await log.read(p, 0) for p in range(log.partitions)]

    parts = asyncio.run(go())
    assert any(isinstance(e.event, PodMigrated) for part in parts for e in part)
    if shards == 1:
        (records,) = parts

        async def recover() -> ShardWorker:
            log = MemoryLog()
            await log.append(records)
            return await ShardWorker.recover(log)

        worker = asyncio.run(recover())
        assert worker.restored_from >= 0 and len(worker.engine.budgets) == 1
        full = replay(records, verify=True)
        assert full.mismatch is None and full.snapshots > 0
        assert encode_state(worker.engine) == encode_state(full.engine)
    else:
        result = replay_routed(parts, verify=True)
        assert result.mismatch is None and result.snapshots > 0
