"""Would run if, as users see it: the ``counterfactual`` of each pending unit's answer
in ``simulate --json`` (at 1 and 2 shards), its line under the table, in ``replay
--explain`` and in ``whatif``; each names the change with its numbers and names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from shards.cli import main
from shards.web.app import add_routes
from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import gpu_node, gpu_pod, node, pod, pod_group
from tests.shards.test_answers import quota, tainted
from tests.shards.test_liveview import record, source_of

SHARDS = (1, 2)


def counterfactuals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, shards: int
) -> dict[str, Any]:
    """Each pending pod's (and group's, under ``@``) counterfactual in ``--json``."""
    data, _ = shoal(tmp_path, capsys, text, shards)
    out = {
        k: v["answer"]["counterfactual"] for k, v in data["pods"].items() if v["phase"] == "Pending"
    }
    for key, group in data["groups"].items():
        if group["phase"] == "Pending":
            out[f"@{key}"] = group["answer"]["counterfactual"]
    return out


@pytest.mark.parametrize("shards", SHARDS)
def test_a_gang_over_its_quota_would_run_with_min_and_max_raised_to_what_it_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """6 of min and max 8 cards in use, the gang needs 4: min and max 10 (the only
    quota guarantees all there is to borrow), and nothing else."""
    text = gpu_node("g0", 8) + gpu_node("g1", 8) + quota("default", 8, 8)
    text += "".join(gpu_pod(f"run-{i}", cards=2) for i in range(3))
    text += pod_group("train", 2, at=600)
    text += "".join(gpu_pod(f"train-{i}", cards=2, group="train", at=600) for i in range(2))
    found = counterfactuals(tmp_path, capsys, text, shards)
    cf = found["@default/train"]
    assert cf["kind"] == "quota-min"
    assert cf["text"] == (
        "would run if: quota default has min nvidia.com/gpu 10 (not 8) and max "
        "nvidia.com/gpu 10 (not 8)"
    )
    assert cf["events"] == [
        {
            "type": "quota",
            "quota": {
                "namespace": "default",
                "name": "quota",
                "min": {"nvidia.com/gpu": 10},
                "max": {"nvidia.com/gpu": 10},
            },
        }
    ]
    assert cf["at_seconds"] == 601
    assert found["default/train-0"] == found["default/train-1"] == cf


@pytest.mark.parametrize("shards", SHARDS)
def test_with_room_to_borrow_max_raised_alone_is_enough(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """As above, with an idle quota guaranteeing 8 more cards to borrow from."""
    text = gpu_node("g0", 8) + gpu_node("g1", 8) + quota("default", 8, 8) + quota("idle", 8, 8)
    text += "".join(gpu_pod(f"run-{i}", cards=2) for i in range(3))
    text += pod_group("train", 2, at=600)
    text += "".join(gpu_pod(f"train-{i}", cards=2, group="train", at=600) for i in range(2))
    found = counterfactuals(tmp_path, capsys, text, shards)
    cf = found["@default/train"]
    assert (cf["kind"], cf["tried"]) == ("quota-max", 1)
    assert cf["text"] == "would run if: quota default has max nvidia.com/gpu 10 (not 8)"


@pytest.mark.parametrize("shards", SHARDS)
def test_the_fewest_pods_of_no_higher_priority_to_leave_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """n0 (8 CPU) runs ``small`` (2) and ``mid`` (4), n1 (4 CPU) runs ``big`` (4);
    ``wide`` (6) arrives later: on n0 one pod leaving is enough (``mid``: 2 + 4 free =
    6), on n1 none would do. Nothing of a higher priority is named."""
    text = node("n0", cpu=8) + node("n1", cpu=4)
    text += pod("small", cpu="2") + pod("mid", cpu="4") + pod("big", cpu="4")
    text += pod("wide", cpu="6", at=5)
    found = counterfactuals(tmp_path, capsys, text, shards)
    cf = found["default/wide"]
    assert cf["kind"] == "pods-leave"
    assert cf["leaving"] == ["default/mid"]
    assert cf["text"] == "would run if: default/mid leaves (room on n0)"


@pytest.mark.parametrize("shards", SHARDS)
def test_one_constraint_relaxed_or_nodes_added_as_the_last_resort(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """``picky`` asks for zone b, which no node has: dropping the selector is enough.
    ``huge`` asks for 12 CPU, which every node has but none has free: another node like
    the roomiest is the only change that places it."""
    text = node("a0", cpu=16, labels={"zone": "a"}) + node("a1", cpu=8, labels={"zone": "a"})
    text += pod("filler", cpu="10") + pod("filler-2", cpu="6", priority=100)
    text += pod("picky", cpu="1", selector={"zone": "b"}, at=1)
    text += pod("huge", cpu="12", at=2, priority=50)
    found = counterfactuals(tmp_path, capsys, text, shards)
    assert found["default/picky"]["text"] == ("would run if: the pod's nodeSelector drops zone=b")
    assert found["default/picky"]["events"][0] == {"type": "pod-", "pod": "default/picky"}
    assert found["default/huge"]["kind"] == "nodes"
    assert found["default/huge"]["text"] == "would run if: 1 node(s) like a0 is added"


def test_simulate_prints_would_run_if_under_the_table_and_replay_explain_under_the_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(tainted("t0") + pod("p"))
    log = tmp_path / "run.log"
    assert main(["simulate", str(scenario), "--log", str(log), "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "default/p would run if: the pod tolerates dedicated=infra:NoSchedule"
    assert main(["replay", str(log), "--explain", "default/p"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("answer: 1 node(s) have taint dedicated=infra:NoSchedule")
    assert "would run if: the pod tolerates dedicated=infra:NoSchedule" in lines[1:4]
    assert main(["replay", str(log), "--explain", "default/p", "--json"]) == 0
    cf = json.loads(capsys.readouterr().out)["final"]["answer"]["counterfactual"]
    assert cf["kind"] == "relax"
    assert cf["events"][1]["pod"]["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}
    ]


@pytest.mark.parametrize("shards", SHARDS)
def test_whatif_says_what_would_let_a_job_pod_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """The recorded run holds n0's 4 CPU with ``hog`` for good; the job's pod of the
    same priority would run if ``hog`` left."""
    base, job, log = tmp_path / "base.yaml", tmp_path / "job.yaml", tmp_path / "run.log"
    base.write_text(node("n0", cpu=4) + pod("hog", cpu="4"))
    job.write_text(pod("job", cpu="2"))
    argv = ["simulate", str(base), "--shards", str(shards), "--log", str(log), "--quiet"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["whatif", str(job), "--log", str(log), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["pods"]
    assert row["counterfactual"]["text"] == "would run if: default/hog leaves (room on n0)"
    assert main(["whatif", str(job), "--log", str(log)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "default/job: would run if: default/hog leaves (room on n0)" in lines


@pytest.fixture(scope="module")
def view_logs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """The live view's scenario recorded at 1 and 2 shards."""
    return {n: record(tmp_path_factory.mktemp(f"view{n}"), n)[0] for n in SHARDS}


@pytest.mark.parametrize("shards", SHARDS)
async def test_the_live_view_answers_would_run_if_when_asked(
    view_logs: dict[int, str], shards: int
) -> None:
    """The live view's scenario (two 4-card nodes, one card of each held for good; a
    pod needing 4 waits): ``/api/wouldrun`` names the pod to leave, behind the token."""
    app = web.Application()
    add_routes(app, await source_of(view_logs[shards]), token="s3cret")
    auth = {"Authorization": "Bearer s3cret"}
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/api/wouldrun?pod=default/big")).status == 401
        answer = await client.get("/api/wouldrun?pod=default/big", headers=auth)
        assert answer.status == 200, await answer.text()
        data = await answer.json()
        assert (data["pod"], data["unit"]) == ("default/big", "default/big")
        assert data["counterfactual"]["kind"] == "pods-leave"
        assert data["counterfactual"]["leaving"] in (["default/small-0"], ["default/small-1"])
        bad = await client.get("/api/wouldrun?pod=big", headers=auth)
        assert bad.status == 400
        if shards == 1:
            early = await client.get("/api/wouldrun?pod=default/big&offset=3", headers=auth)
            assert (await early.json())["counterfactual"] is None  # not submitted yet
