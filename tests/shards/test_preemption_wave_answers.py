"""A wave of identical preemptors decides and answers the same whether each failed
attempt is diagnosed in full or briefly (:mod:`engine.framework.rejecting`): same
placements, same victims, same answers for the pods left waiting, at 1, 2 and 4 shards,
each run replayed with ``--verify``; and the preemptors placed are never diagnosed in
full, on the coordinator either."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import engine.passes.pods as pods_pass
from engine.framework.runtime import Framework
from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import node, pod

SHARDS = (1, 2, 4)


def wave() -> str:
    """Eight nodes in four pools, full of low-priority pods; sixteen urgent pods that
    each need half a node of tier a: room for twelve, by preemption, and four left
    waiting with an answer (their preemption finds nothing); then one that needs most
    of a node, and one that may evict nothing."""
    text = ""
    for i in range(8):
        text += node(
            f"n{i}", cpu=4, labels={"shoal.io/pool": f"p{i % 4}", "tier": "a" if i < 6 else "b"}
        )
    for i in range(16):
        text += pod(f"low-{i}", cpu="2", priority=10 * (i % 3))
    for i in range(16):
        text += pod(f"urgent-{i}", cpu="2", priority=1000, at=1, selector={"tier": "a"})
    text += pod("picky", cpu="3", priority=1000, at=2)
    text += pod("peer", cpu="2", priority=10, at=3)
    return text


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int) -> dict[str, Any]:
    tmp_path.mkdir()
    data, _ = shoal(tmp_path, capsys, wave(), shards)
    return {"pods": data["pods"], "preemptions": data["preemptions"]}


@pytest.mark.parametrize("shards", SHARDS)
def test_a_wave_answers_the_same_with_brief_failures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    brief = _run(tmp_path / "brief", capsys, shards)
    with mock.patch.object(pods_pass, "preempts_only", lambda *_: False):
        full = _run(tmp_path / "full", capsys, shards)
    assert brief == full
    assert len(brief["preemptions"]) >= 8
    waiting = [v for v in brief["pods"].values() if v["phase"] == "Pending"]
    assert waiting and all(v.get("reason") for v in waiting)


@pytest.mark.parametrize("shards", SHARDS)
def test_preemptors_that_are_placed_are_never_diagnosed_in_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """A preemptor whose preemption succeeds needs no reasons, on a shard or on the
    coordinator: its failed attempt is brief, and the attempt after its evictions
    looks at the changed nodes only. Only the pods left waiting are diagnosed."""
    diagnosed: list[str] = []
    original = Framework._failure

    def counted(self: Framework, cycle: Any, pod: Any, *rest: Any) -> Any:
        diagnosed.append(pod.key)
        return original(self, cycle, pod, *rest)

    with mock.patch.object(Framework, "_failure", counted):
        run = _run(tmp_path / "run", capsys, shards)
    bound = {k for k, v in run["pods"].items() if v["phase"] == "Bound"}
    urgent = {k for k in bound if "/urgent-" in k}
    assert len(urgent) >= 8
    assert not urgent & set(diagnosed)
