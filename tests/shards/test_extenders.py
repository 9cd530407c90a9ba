"""HTTP extenders, client side: ``shoal simulate`` against a real extender on 127.0.0.1.

kube-scheduler's rules, as the tests check them: an extender is called after the
filters, on the nodes that passed them; its filter keeps the nodes it returns; its
prioritize adds ``score * weight * 10`` (MaxNodeScore / MaxExtenderPriority) to each
node's total; a failure is skipped when ``ignorable`` and fails the attempt otherwise.
The answers are in the log: ``replay --verify`` runs with the extender stopped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.shards.extender_server import Behaviour, ExtenderServer
from tests.shards.scenario_text import node, pod

ROOT = Path(__file__).resolve().parents[2]
SHARDS = (1, 2)


def shoal(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shards.cli", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture
def extender() -> Iterator[ExtenderServer]:
    server = ExtenderServer().start()
    try:
        yield server
    finally:
        server.stop()


def config(*extenders: str, profiles: str = "") -> str:
    return (
        "apiVersion: kubescheduler.config.k8s.io/v1\n"
        "kind: KubeSchedulerConfiguration\n"
        + (profiles or "")
        + "extenders:\n"
        + "".join(extenders)
    )


def entry(url: str, **fields: Any) -> str:
    lines = [f"- urlPrefix: {url}"]
    lines += [f"  {k}: {json.dumps(v)}" for k, v in fields.items()]
    return "\n".join(lines) + "\n"


def run(
    tmp_path: Path, cluster: str, cfg: str, shards: int, *extra: str
) -> tuple[dict[str, Any], Path]:
    (tmp_path / "cluster.yaml").write_text(cluster)
    (tmp_path / "config.yaml").write_text(cfg)
    log = tmp_path / f"run-{shards}.events"
    proc = shoal(
        "simulate",
        str(tmp_path / "cluster.yaml"),
        "--config",
        str(tmp_path / "config.yaml"),
        "--shards",
        str(shards),
        "--json",
        "--log",
        str(log),
        "--overwrite",
        *extra,
    )
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data, log


def nodes_of(data: dict[str, Any]) -> dict[str, str | None]:
    return {key: p["node"] for key, p in data["pods"].items()}


def verify(log: Path) -> None:
    proc = shoal("replay", str(log), "--verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr


FOUR = "".join(node(f"n{i}") for i in range(4))


@pytest.mark.parametrize("shards", SHARDS)
def test_the_filter_decides_where_pods_go_and_replay_needs_no_extender(
    tmp_path: Path, shards: int
) -> None:
    server = ExtenderServer(Behaviour(reject=lambda n: "" if n == "n2" else "not n2")).start()
    try:
        cluster = FOUR + "".join(pod(f"p{i}") for i in range(3))
        data, log = run(tmp_path, cluster, config(entry(server.url, filterVerb="filter")), shards)
        calls = server.verbs("filter")
    finally:
        server.stop()
    assert nodes_of(data) == {f"default/p{i}": "n2" for i in range(3)}
    # three pods alike in all but their names: asked once, with every node that fits
    assert len(calls) == 1
    assert sorted(n["metadata"]["name"] for n in calls[0]["Nodes"]["items"]) == [
        "n0",
        "n1",
        "n2",
        "n3",
    ]
    assert calls[0]["Pod"]["metadata"]["namespace"] == "default"
    assert calls[0]["Pod"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"
    verify(log)  # the extender is gone


@pytest.mark.parametrize("shards", SHARDS)
def test_an_extender_that_rejects_every_node_leaves_the_pod_pending_with_its_reasons(
    tmp_path: Path, shards: int, extender: ExtenderServer
) -> None:
    extender.behaviour = Behaviour(reject=lambda n: "rack is draining", unresolvable=True)
    cluster = FOUR + pod("lonely")
    data, log = run(tmp_path, cluster, config(entry(extender.url, filterVerb="filter")), shards)
    outcome = data["pods"]["default/lonely"]
    assert outcome["node"] is None
    assert outcome["phase"] == "Pending"
    assert "4 rack is draining" in outcome["reason"]
    answer = outcome["answer"]  # the extender's reason, counted, and where to look
    assert (answer["kind"], answer["summary"]) == ("other", "4 of 4 nodes: rack is draining")
    assert answer["next_step"] == (
        "see `shoal replay LOG --explain default/lonely` for each node's verdict"
    )
    verify(log)
    if shards > 1:
        return  # (--explain replays the shards' attempts; the coordinator decided this one)
    explain = shoal("replay", str(log), "--explain", "default/lonely")
    assert explain.returncode == 0, explain.stderr
    assert "rack is draining" in explain.stdout
    assert f"extender {extender.url}" in explain.stdout


@pytest.mark.parametrize("shards", SHARDS)
def test_scores_are_weighted_and_scaled_as_kube_scheduler_does(
    tmp_path: Path, shards: int, extender: ExtenderServer
) -> None:
    # n3 has half the room of the others: the built-in scores put a pod elsewhere.
    # The extender gives n3 1 point (of MaxExtenderPriority 10), weight 3: n3 gains
    # 1 * 3 * (100 / 10) = 30, and the others 0, which turns the choice.
    cluster = "".join(node(f"n{i}", cpu=16 if i < 3 else 8) for i in range(4)) + pod("p")
    extender.behaviour = Behaviour(score=lambda n: 1 if n == "n3" else 0)
    cfg = config(entry(extender.url, prioritizeVerb="prioritize", weight=3))
    data, log = run(tmp_path, cluster, cfg, shards)
    assert nodes_of(data) == {"default/p": "n3"}
    verify(log)
    if shards > 1:
        return  # (--explain replays the shards' attempts; the coordinator decided this one)
    top = {t["node"]: t for t in explained(log, "default/p")[-1]["top"]}
    assert top["n3"]["plugins"]["extenders"] == 30
    assert all(top[n]["plugins"]["extenders"] == 0 for n in ("n0", "n1", "n2"))
    builtin = {n: t["total"] - t["plugins"]["extenders"] for n, t in top.items()}
    assert max(builtin, key=lambda n: builtin[n]) != "n3"
    assert top["n3"]["total"] == builtin["n3"] + 30
    assert extender.verbs("prioritize")[0]["Nodes"]["items"]


@pytest.mark.parametrize("shards", SHARDS)
def test_a_prioritize_verb_that_fails_is_skipped(
    tmp_path: Path, shards: int, extender: ExtenderServer
) -> None:
    extender.behaviour = Behaviour(status=500)
    data, log = run(
        tmp_path, FOUR + pod("p"), config(entry(extender.url, prioritizeVerb="p", weight=1)), shards
    )
    assert data["pods"]["default/p"]["phase"] == "Bound"
    verify(log)


def explained(log: Path, key: str) -> list[dict[str, Any]]:
    proc = shoal("replay", str(log), "--explain", key, "--json")
    assert proc.returncode == 0, proc.stderr
    attempts: list[dict[str, Any]] = json.loads(proc.stdout)["attempts"]
    return attempts


@pytest.mark.parametrize("shards", SHARDS)
def test_an_ignorable_extender_that_times_out_does_not_block(
    tmp_path: Path, shards: int, extender: ExtenderServer
) -> None:
    extender.behaviour = Behaviour(reject=lambda n: "never", delay=3)
    cluster = FOUR + pod("p")
    cfg = config(entry(extender.url, filterVerb="filter", ignorable=True, httpTimeout="200ms"))
    data, log = run(tmp_path, cluster, cfg, shards)
    assert data["pods"]["default/p"]["phase"] == "Bound"
    verify(log)


@pytest.mark.parametrize("shards", SHARDS)
def test_an_extender_that_fails_blocks_only_the_pods_of_the_profiles_it_serves(
    tmp_path: Path, shards: int, extender: ExtenderServer
) -> None:
    extender.behaviour = Behaviour(status=500)
    profiles = "profiles:\n- schedulerName: default-scheduler\n- schedulerName: guarded\n"
    cfg = config(entry(extender.url, filterVerb="filter", profiles=["guarded"]), profiles=profiles)
    cluster = FOUR + pod("free") + pod("guarded", scheduler="guarded")
    data, log = run(tmp_path, cluster, cfg, shards)
    assert data["pods"]["default/free"]["phase"] == "Bound"
    guarded = data["pods"]["default/guarded"]
    assert guarded["phase"] == "Pending"
    assert "HTTP 500" in guarded["reason"]
    assert extender.url in guarded["reason"]
    assert all(body["Pod"]["metadata"]["name"] == "guarded" for body in extender.verbs("filter"))
    verify(log)


def test_node_cache_capable_extenders_get_node_names(
    tmp_path: Path, extender: ExtenderServer
) -> None:
    extender.behaviour = Behaviour(reject=lambda n: "" if n == "n1" else "no")
    cfg = config(entry(extender.url, filterVerb="filter", nodeCacheCapable=True))
    data, _ = run(tmp_path, FOUR + pod("p"), cfg, 1)
    assert nodes_of(data) == {"default/p": "n1"}
    (body,) = extender.verbs("filter")
    assert sorted(body["NodeNames"]) == ["n0", "n1", "n2", "n3"]
    assert body.get("Nodes") is None


def test_managed_resources_limit_the_pods_an_extender_is_asked_about(
    tmp_path: Path, extender: ExtenderServer
) -> None:
    extender.behaviour = Behaviour(reject=lambda n: "" if n == "g1" else "no")
    cfg = config(
        entry(
            extender.url,
            filterVerb="filter",
            managedResources=[{"name": "nvidia.com/gpu", "ignoredByScheduler": False}],
        )
    )
    cluster = node("g0", gpu=4) + node("g1", gpu=4) + pod("cpu-only") + pod("trainer", gpu=1)
    data, _ = run(tmp_path, cluster, cfg, 1)
    assert data["pods"]["default/trainer"]["node"] == "g1"
    assert data["pods"]["default/cpu-only"]["phase"] == "Bound"
    assert [b["Pod"]["metadata"]["name"] for b in extender.verbs("filter")] == ["trainer"]


@pytest.mark.parametrize("shards", SHARDS)
def test_a_gang_is_placed_only_where_the_extender_lets_its_members_go(
    tmp_path: Path, shards: int, extender: ExtenderServer
) -> None:
    extender.behaviour = Behaviour(reject=lambda n: "" if n in ("n1", "n3") else "no")
    group = """
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata: {name: g, namespace: default}
spec: {minMember: 2}
---"""
    cluster = FOUR + group + pod("a", cpu="12", group="g") + pod("b", cpu="12", group="g")
    data, log = run(tmp_path, cluster, config(entry(extender.url, filterVerb="filter")), shards)
    assert sorted(nodes_of(data).values()) == ["n1", "n3"]  # type: ignore[type-var]
    verify(log)


def test_malformed_answers_are_failures_not_crashes(
    tmp_path: Path, extender: ExtenderServer
) -> None:
    extender.behaviour = Behaviour(status=200, error="boom")
    data, log = run(tmp_path, FOUR + pod("p"), config(entry(extender.url, filterVerb="filter")), 1)
    assert data["pods"]["default/p"]["phase"] == "Pending"
    assert "boom" in data["pods"]["default/p"]["reason"]
    verify(log)
