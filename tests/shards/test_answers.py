"""One answer per waiting unit, end to end: ``shoal simulate --json`` at 1 and 2 shards
(replayed with ``--verify``, so replay re-derives each answer), one scenario per kind
of reason. Each test checks the facts the wording carries (numbers, names, the next
step's value), and that the answer is the same at every shard count. And every pod
left pending by the examples gets an answer with a next step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shards.cli import main
from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import gpu_node, gpu_pod, node, pod, pod_group

ROOT = Path(__file__).resolve().parents[2]
SHARDS = (1, 2)


def answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, shards: int
) -> dict[str, Any]:
    """Each pending pod's answer (and each pending group's, under ``@group``)."""
    data, _ = shoal(tmp_path, capsys, text, shards)
    out = {k: v.get("answer") for k, v in data["pods"].items() if v["phase"] == "Pending"}
    for key, group in data["groups"].items():
        if group["phase"] == "Pending":
            out[f"@{key}"] = group.get("answer")
    return out


def one(found: dict[str, Any], key: str, kind: str) -> dict[str, Any]:
    answer = found[key]
    assert answer is not None, f"{key} pending without an answer"
    assert answer["kind"] == kind, answer
    assert answer["next_step"], answer
    assert answer["text"] == f"{answer['summary']}: {answer['next_step']}"
    return dict(answer)


def quota(ns: str, min_gpu: int, max_gpu: int) -> str:
    return f"""
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: ElasticQuota
metadata: {{name: quota, namespace: {ns}}}
spec:
  min: {{nvidia.com/gpu: "{min_gpu}"}}
  max: {{nvidia.com/gpu: "{max_gpu}"}}
---"""


def tainted(name: str) -> str:
    return f"""
apiVersion: v1
kind: Node
metadata: {{name: {name}}}
spec: {{taints: [{{key: dedicated, value: infra, effect: NoSchedule}}]}}
status: {{allocatable: {{cpu: "16", memory: 64Gi}}}}
---"""


@pytest.mark.parametrize("shards", SHARDS)
def test_quota_max_names_use_max_need_the_new_max_and_the_pod_to_wait_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Three 2-card pods use 6 of the quota's max 8 cards; a gang of two 2-card members
    arriving at 600 s needs 4: raise max to 6 + 4 = 10, and min too (the only quota
    guarantees 8, and use beyond every quota's min is borrowed from the others'), or
    wait for the pod that has run longest (run-0, since 0 s: 10 min)."""
    text = gpu_node("g0", 8) + gpu_node("g1", 8) + quota("default", 8, 8)
    text += "".join(gpu_pod(f"run-{i}", cards=2) for i in range(3))
    text += pod_group("train", 2, at=600)
    text += "".join(gpu_pod(f"train-{i}", cards=2, group="train", at=600) for i in range(2))
    found = answers(tmp_path, capsys, text, shards)
    assert set(found) == {"default/train-0", "default/train-1", "@default/train"}
    answer = one(found, "default/train-0", "quota-max")
    assert answer["summary"] == (
        "quota default: 6 of max 8 nvidia.com/gpu in use, gang default/train needs 4"
    )
    assert answer["next_step"] == (
        "raise max nvidia.com/gpu of quota default to 10 and its min to 10, or wait for "
        "default/run-0 (running 10 min)"
    )
    assert found["default/train-1"] == found["@default/train"] == answer


@pytest.mark.parametrize("shards", SHARDS)
def test_a_gang_short_of_room_says_how_many_members_fit_and_how_many_nodes_to_free(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Three members of 8 cards each, two nodes of 8 cards: room for 2 of the 3, so
    one more node with 8 cards free is what it takes."""
    text = gpu_node("g0", 8) + gpu_node("g1", 8) + pod_group("big", 3)
    text += "".join(gpu_pod(f"big-{i}", cards=8, group="big") for i in range(3))
    found = answers(tmp_path, capsys, text, shards)
    answer = one(found, "@default/big", "gpu-cards")
    assert answer["summary"].startswith("gang default/big: 2 of 3 members placeable; ")
    assert "the nodes have room for 2 of the 3 members still needed" in answer["summary"]
    assert "each member needs 8 GPU card(s) free" in answer["summary"]
    assert answer["next_step"] == (
        "free 8 GPU card(s) on 1 more node(s), or add 1 node(s) with 8 GPU card(s) free"
    )
    assert all(found[f"default/big-{i}"] == answer for i in range(3))


@pytest.mark.parametrize("shards", SHARDS)
def test_whole_cards_answer_counts_whole_cards_not_the_scalar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Every card of both nodes holds a 600m share: the scalar says 2 cards free per
    node, but no card is whole; the pod asking for 2 whole cards is told so."""
    text = gpu_node("n0", 2) + gpu_node("n1", 2)
    text += "".join(gpu_pod(f"s{i}", milli=600) for i in range(4))
    text += gpu_pod("two", cards=2, at=1)
    found = answers(tmp_path, capsys, text, shards)
    answer = one(found, "default/two", "gpu-cards")
    assert answer["summary"] == "no node has 2 whole GPU card(s) free (the pod's request)"
    assert answer["next_step"] == (
        "free 2 whole GPU card(s) on one node, or add a node with 2 whole GPU card(s) free"
    )
    assert "2 node(s): Insufficient nvidia.com/gpu: whole cards" in answer["evidence"]


@pytest.mark.parametrize("shards", SHARDS)
def test_cpu_answer_names_the_most_free_node_and_the_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """32 CPU asked, nodes of 16 and 8: n0 has the most free, 16 short."""
    text = node("n0", cpu=16) + node("n1", cpu=8) + pod("big", cpu="32")
    found = answers(tmp_path, capsys, text, shards)
    answer = one(found, "default/big", "resources")
    assert answer["summary"] == (
        "no node has 32 CPU free (the pod's request); the most free on one node is 16 CPU, on n0"
    )
    assert answer["next_step"] == "free 16 CPU more on n0, or add a node with 32 CPU free"


@pytest.mark.parametrize("shards", SHARDS)
def test_taint_answer_spells_the_toleration_and_the_nodes_to_untaint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    text = tainted("t0") + tainted("t1") + tainted("t2") + pod("p")
    found = answers(tmp_path, capsys, text, shards)
    answer = one(found, "default/p", "taint")
    assert answer["summary"] == (
        "3 node(s) have taint dedicated=infra:NoSchedule, which the pod does not tolerate"
    )
    assert answer["next_step"] == (
        "add a toleration for dedicated=infra:NoSchedule to the pod, "
        "or remove the taint from the 3 node(s)"
    )


@pytest.mark.parametrize("shards", SHARDS)
def test_node_selector_answer_names_the_label_to_add(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    text = node("a0", labels={"zone": "a"}) + node("a1", labels={"zone": "a"})
    text += pod("p", selector={"zone": "b"})
    found = answers(tmp_path, capsys, text, shards)
    answer = one(found, "default/p", "node-affinity")
    assert answer["summary"] == "2 of 2 nodes do not match the pod's node selector zone=b"
    assert answer["next_step"].startswith("label nodes with zone=b")


@pytest.mark.parametrize("shards", SHARDS)
def test_dependency_answer_names_it_and_how_long_it_has_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """``second`` arrives at 30 s and depends on ``first``, running since 0 s."""
    text = node("n0") + pod("first") + pod("second", at=30, depends_on="first")
    found = answers(tmp_path, capsys, text, shards)
    answer = one(found, "default/second", "dependency")
    assert answer["summary"] == "depends on default/first, which is Running"
    assert answer["next_step"] == (
        "wait for default/first to succeed (running 30 s), or remove it from the dependencies"
    )


@pytest.mark.parametrize("shards", SHARDS)
def test_gang_short_of_members_says_how_many_to_submit_or_the_min_to_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    text = node("n0") + pod_group("g", 3) + pod("m0", group="g") + pod("m1", group="g")
    found = answers(tmp_path, capsys, text, shards)
    answer = one(found, "default/m0", "gang-members")
    assert answer["summary"] == "gang default/g: 2 of minMember 3 members submitted"
    assert answer["next_step"] == (
        "submit 1 more member(s) of default/g, or lower its minMember to 2"
    )


WAITING_EXAMPLES = ("interpod.yaml", "quickstart.yaml", "topology.yaml")
"""The examples that leave pods pending on purpose (anti-affinity with nowhere left to
go, a cordoned node and a pod too big, a required topology no leaf holds); the others
(batch, gpu-sharing, workloads) end with every pod placed or finished."""


@pytest.mark.parametrize("example", WAITING_EXAMPLES)
def test_every_pending_pod_of_the_examples_gets_an_answer_with_a_next_step(
    capsys: pytest.CaptureFixture[str], example: str
) -> None:
    assert main(["simulate", str(ROOT / "examples" / example), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    pending = {k: v for k, v in data["pods"].items() if v["phase"] == "Pending"}
    assert pending, "the example leaves no pod pending any more: update WAITING_EXAMPLES"
    for key, view in pending.items():
        answer = view.get("answer")
        assert answer and answer["next_step"], (key, view)
        assert answer["kind"] != "other", (key, answer)


def test_replay_explain_shows_the_answer_on_top(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tainted("t0") + pod("p")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(text)
    log = tmp_path / "run.log"
    assert main(["simulate", str(scenario), "--log", str(log), "--json"]) == 0
    capsys.readouterr()
    assert main(["replay", str(log), "--explain", "default/p"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (
        "answer: 1 node(s) have taint dedicated=infra:NoSchedule, which the pod does not "
        "tolerate: add a toleration for dedicated=infra:NoSchedule to the pod, or remove "
        "the taint from the 1 node(s)"
    )


@pytest.mark.parametrize("shards", SHARDS)
def test_quota_borrow_names_use_min_and_the_guarantees_all_quotas_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Quotas a and b each guarantee 4 cards; a runs 8 (4 borrowed from idle b), so all
    8 guaranteed cards are in use: a's next 2-card pod has none to borrow, though the
    nodes have 8 more. Raising a's min to 8 + 2 = 10 lets it in."""
    text = gpu_node("g0", 8) + gpu_node("g1", 8) + quota("a", 4, 12) + quota("b", 4, 12)
    text += "".join(
        gpu_pod(f"run-{i}", cards=2).replace("name: run", "namespace: a\n  name: run")
        for i in range(4)
    )
    text += gpu_pod("more", cards=2, at=60).replace("name: more", "namespace: a\n  name: more")
    found = answers(tmp_path, capsys, text, shards)
    assert set(found) == {"a/more"}
    answer = one(found, "a/more", "quota-borrow")
    assert answer["summary"] == (
        "quota a: 8 nvidia.com/gpu in use (min 4), the pod needs 2 more, and all quotas use "
        "8 of 8 guaranteed: none idle to borrow"
    )
    assert answer["next_step"] == (
        "raise min nvidia.com/gpu of quota a to 10, or wait for other quotas to use less"
    )
