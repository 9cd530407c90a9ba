"""One test per kind of answer the other tests leave out, each checking the facts its
words carry (numbers, names, the next step's values): quota reclaim, GPU shares,
topology, pod (anti-)affinity, spread, pools and tenants, host ports, cordoned and
named nodes, no nodes, no profile, a missing PodGroup, a group's next run, user plugins
(extenders: in ``test_extenders.py``). Through ``shoal simulate --json`` at 1 and 2
shards, replayed with ``--verify`` (:func:`tests.shards.coordinator_kit.shoal`), except
the user plugin's and the next run's, which run an engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.config import parse_config
from engine.engine import Engine
from engine.framework.userplugins import plugin_factory
from engine.plugins.registry import builtin_registry
from events.types import GroupSpec, PodGroupSubmitted, PodUnschedulable
from shards.cli import main
from tests.builders import env, make_node, make_pod
from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import gpu_node, gpu_pod, node, pod
from tests.shards.test_answers import one, quota
from tests.shards.test_one_scheduler import SHARDING

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "plugins"))  # the plugin classes themselves
from shoal_example_plugins.network import NetworkSpeed  # noqa: E402

SHARDS = (1, 2)


def pending(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, shards: int) -> Any:
    data, _ = shoal(tmp_path, capsys, text, shards)
    return {k: v.get("answer") for k, v in data["pods"].items() if v["phase"] == "Pending"}


def in_namespace(text: str, name: str, ns: str) -> str:
    return text.replace(f"name: {name}\n", f"name: {name}\n  namespace: {ns}\n", 1)


def never_preempts(text: str) -> str:
    return text.replace("spec:\n", "spec:\n  preemptionPolicy: Never\n", 1)


@pytest.mark.parametrize("shards", SHARDS)
def test_quota_reclaim_names_the_borrowers_and_what_they_borrow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """a and b each guarantee 4 of the node's 8 cards; b runs 8 (4 borrowed from idle
    a). a's pod (2 cards, within a's min) may not preempt: it waits for b to give back."""
    text = gpu_node("g0", 8) + quota("a", 4, 8) + quota("b", 4, 8)
    text += "".join(in_namespace(gpu_pod(f"b{i}", cards=2), f"b{i}", "b") for i in range(4))
    text += never_preempts(in_namespace(gpu_pod("mine", cards=2, at=60), "mine", "a"))
    answer = one(pending(tmp_path, capsys, text, shards), "a/mine", "quota-reclaim")
    assert answer["summary"] == (
        "quota a: 0 of min 4 nvidia.com/gpu in use, the pod needs 2, and the rest of its "
        "guaranteed nvidia.com/gpu is lent out"
    )
    assert answer["evidence"] == ["b (borrows 4 nvidia.com/gpu)"]
    assert answer["next_step"].startswith(
        "wait while b (borrows 4 nvidia.com/gpu) give(s) back what they borrow"
    )


@pytest.mark.parametrize("shards", SHARDS)
def test_a_gpu_share_answer_counts_cards_with_the_share_free(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """One card, 600m of it taken: a second 600m share finds no card with 600m free."""
    text = gpu_node("n0", 1) + gpu_pod("s0", milli=600) + gpu_pod("s1", milli=600, at=1)
    answer = one(pending(tmp_path, capsys, text, shards), "default/s1", "gpu-cards")
    assert answer["summary"] == (
        "no node has 1 GPU card(s) with 600m compute free (the pod's request)"
    )
    assert answer["next_step"] == (
        "free 1 GPU card(s) with 600m compute on one node, or add a node with 1 GPU "
        "card(s) with 600m compute free"
    )
    assert answer["evidence"] == [
        "1 node(s): Insufficient nvidia.com/gpu: cards with 600m compute free"
    ]


@pytest.mark.parametrize("shards", SHARDS)
def test_a_required_topology_no_domain_holds_names_the_level_and_the_roomiest(
    capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """examples/topology.yaml: slurm-5 needs 5 nodes of one leaf; leaf-a (4 nodes) is
    taken by slurm-4, leaf-b and leaf-c by flex-5: no leaf has a node free."""
    argv = ["simulate", str(ROOT / "examples" / "topology.yaml"), "--json", "--quiet"]
    assert main([*argv, "--shards", str(shards)]) == 0
    data = json.loads(capsys.readouterr().out)
    answer = data["groups"]["hpc/slurm-5"]["answer"]
    assert answer["kind"] == "topology"
    assert answer["summary"] == (
        "gang hpc/slurm-5: 3 of 5 members placeable; no example.com/leaf holds all 5 "
        "members (its required topology)"
    )
    assert answer["next_step"].startswith("free room for 5 members within one example.com/leaf")
    assert answer["next_step"].endswith(
        "or make the gang's topology example.com/leaf preferred instead of required"
    )


@pytest.mark.parametrize("shards", SHARDS)
def test_anti_affinity_answer_counts_the_nodes_it_rules_out(
    capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """examples/interpod.yaml: the fifth web replica, one per node, on four nodes."""
    argv = ["simulate", str(ROOT / "examples" / "interpod.yaml"), "--json", "--quiet"]
    assert main([*argv, "--shards", str(shards)]) == 0
    data = json.loads(capsys.readouterr().out)
    [answer] = [v["answer"] for v in data["pods"].values() if v["phase"] == "Pending"]
    assert answer["kind"] == "pod-affinity"
    assert answer["summary"] == "4 of 4 nodes: node(s) didn't match pod anti-affinity rules"
    assert answer["next_step"] == (
        "change the pod's (anti-)affinity rules, or add nodes in other domains"
    )


@pytest.mark.parametrize("shards", SHARDS)
def test_spread_answer_names_the_key_and_the_max_skew(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Zone a has two nodes, zone b one of 1 CPU, held for good by ``hog``. w0 goes to
    zone a; w1 there would make the skew 2 - 0 > maxSkew 1, and b0 has no room."""
    spread = (
        "  topologySpreadConstraints:\n  - {maxSkew: 1, topologyKey: zone, "
        "whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: w}}}\n"
    )
    text = node("a0", labels={"zone": "a"}) + node("a1", labels={"zone": "a"})
    text += node("b0", cpu=1, labels={"zone": "b"}) + pod("hog", cpu="1", node_name="b0").replace(
        "annotations: {", 'annotations: {shoal.io/migratable: "false", '
    )
    for i in range(3):
        text += (
            pod(f"w{i}", at=1 + i)
            .replace("labels: {}", "labels: {app: w}")
            .replace("spec:\n", "spec:\n" + spread, 1)
        )
    found = pending(tmp_path, capsys, text, shards)
    answer = one(found, "default/w1", "spread")
    assert answer["summary"] == "2 of 3 nodes would break the spread (zone maxSkew 1)"
    assert answer["next_step"] == "add room in the less used domains, or raise maxSkew"


@pytest.mark.parametrize("shards", SHARDS)
def test_a_tenants_answer_is_about_its_own_pools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """research owns pool new (one node of 4 CPU, 3 taken): its second pod is told
    about that node's room, not about the three old nodes it may not use."""
    text = SHARDING + "".join(node(f"old-{i}", cpu=4, labels={"hw": "old"}) for i in range(3))
    text += node("new-0", cpu=4, labels={"hw": "new"})
    text += pod("r0", ns="research", cpu="3") + pod("r1", ns="research", cpu="3", at=1)
    answer = one(pending(tmp_path, capsys, text, shards), "research/r1", "resources")
    assert answer["summary"] == (
        "no node has 3 CPU free (the pod's request); the most free on one node is 1 CPU, on new-0"
    )
    assert (
        answer["evidence"][0]
        == "namespace research runs on its tenant pool(s) new only (1 node(s))"
    )


@pytest.mark.parametrize("shards", SHARDS)
def test_a_tenant_whose_pools_have_no_node_is_told_to_add_some(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    text = SHARDING + "".join(node(f"old-{i}", cpu=4, labels={"hw": "old"}) for i in range(2))
    text += pod("r0", ns="research")
    answer = one(pending(tmp_path, capsys, text, shards), "research/r0", "pools")
    assert answer["summary"] == (
        "namespace research runs on its tenant pool(s) new only, which have no node"
    )
    assert answer["next_step"] == "add nodes to pool(s) new, or change the tenant's pools"


HOST_PORT = "  - name: c\n    ports: [{containerPort: 80, hostPort: 8080}]\n"
CORDONED = node("c0").replace("status:", "spec: {unschedulable: true}\nstatus:")

CASES = {
    "host-ports": (
        node("n0")
        + pod("a").replace("  - name: c\n", HOST_PORT)
        + pod("p", at=1).replace("  - name: c\n", HOST_PORT),
        "1 of 1 nodes have host port(s) 8080 taken",
        "free host port(s) 8080 on a node, or use another port",
    ),
    "cordoned": (
        CORDONED + node("n1", cpu=1) + pod("p", node_name="c0"),
        "the pod asks for node c0 (spec.nodeName), which is cordoned",
        "uncordon c0 (kubectl uncordon c0), or clear spec.nodeName",
    ),
    "node-name": (
        node("n0") + pod("p", node_name="gone"),
        "the pod asks for node gone (spec.nodeName), which does not exist",
        "clear spec.nodeName, or add node gone",
    ),
    "no-nodes": (pod("p"), "no nodes", "add nodes"),
    "profile": (
        node("n0") + pod("p", scheduler="batch"),
        "no scheduling profile serves schedulerName 'batch'",
        "set spec.schedulerName to a profile of this scheduler's configuration",
    ),
    "group-missing": (
        node("n0") + pod("p", group="ghost"),
        "pod group default/ghost does not exist",
        "create PodGroup default/ghost, or remove the pod's pod-group label",
    ),
}


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("kind", sorted(CASES))
def test_blocks_of_one_pod_name_what_blocks_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, kind: str
) -> None:
    text, summary, step = CASES[kind]
    answer = one(pending(tmp_path, capsys, text, shards), "default/p", kind)
    assert (answer["summary"], answer["next_step"]) == (summary, step)


def test_a_user_plugins_reason_is_counted_and_quoted() -> None:
    """The example NetworkSpeed plugin refuses nodes measured below 10000 Mbit/s: two
    of the three nodes; the third is full. Two pods alike wait: each answer points at
    its own pod."""
    registry = builtin_registry()
    registry.register("NetworkSpeed", plugin_factory(NetworkSpeed, "NetworkSpeed"))
    config = parse_config(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "profiles": [
                {
                    "plugins": {"multiPoint": {"enabled": [{"name": "NetworkSpeed"}]}},
                    "pluginConfig": [{"name": "NetworkSpeed", "args": {"minimumMbps": 10000}}],
                }
            ],
        }
    )
    engine = Engine(config, registry=registry)
    for name, mbps in (("slow-0", 1000), ("slow-1", 5000), ("fast", 25000)):
        added = make_node(name).cpu("4").annotate(**{"shoal.io/network-mbps": str(mbps)})
        engine.apply(env(added.added()))
    engine.apply(env(make_pod("hog").cpu("4").submitted()))
    engine.schedule()
    engine.apply(env(make_pod("p").cpu("1").submitted(), time=1))
    engine.apply(env(make_pod("q").cpu("1").submitted(), time=1))
    decisions = engine.schedule()
    answers = {d.pod: d.answer for d in decisions if isinstance(d, PodUnschedulable)}
    answer = answers["default/p"]
    assert answer is not None
    assert answer.kind == "other"
    assert answer.summary == "2 of 3 nodes: network slower than 10000 Mbit/s"
    assert answer.evidence == (
        "2 node(s): network slower than 10000 Mbit/s",
        "1 node(s): Insufficient cpu",
    )
    assert answer.next_step == (
        "see `shoal replay LOG --explain default/p` for each node's verdict"
    )
    other = answers["default/q"]  # a pod alike is pointed at itself, not at p
    assert other is not None
    assert other.next_step == "see `shoal replay LOG --explain default/q` for each node's verdict"


def test_pods_held_for_a_groups_next_run_are_answered() -> None:
    """A PodGroup created again (another uid) while the first run's pods run: the pods
    that come for it wait for that run (they were told so without an answer)."""
    engine = Engine()
    engine.apply(env(make_node("a").cpu("4").added()))
    first = GroupSpec(namespace="default", name="job", min_member=2, uid="g1")
    engine.apply(env(PodGroupSubmitted(group=first)))
    for i in (0, 1):
        pod = make_pod(f"w{i}").cpu("1").uid(f"a{i}").group("default/job").runtime(10)
        engine.apply(env(pod.submitted()))
    engine.schedule()
    again = GroupSpec(namespace="default", name="job", min_member=2, uid="g2")
    engine.apply(env(PodGroupSubmitted(group=again), time=1))
    for i in (0, 1):
        engine.apply(
            env(make_pod(f"v{i}").cpu("1").uid(f"b{i}").group("default/job").submitted(), time=1)
        )
    said = {d.pod: d.answer for d in engine.schedule() if isinstance(d, PodUnschedulable)}
    assert set(said) == {"default/v0", "default/v1"}
    answer = said["default/v0"]
    assert answer is not None and answer.kind == "next-run"
    assert answer.summary == "an earlier run of pod group default/job still has pods"
    assert answer.next_step == (
        "wait for the earlier run of default/job to finish, or delete its pods"
    )
