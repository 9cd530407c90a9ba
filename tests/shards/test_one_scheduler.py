"""One scheduler at any number of shards: scenarios a new user tried, each run at 1, 2
and 4 shards through ``shoal simulate``, checked against what one scheduler must do and
replayed with ``--verify``.

Each scenario is a rule, written with numbers of its own (the scenarios vary them):
cross-shard gangs that fit are placed and every run ends; elastic quotas reclaim what
others borrow, however large the cluster; the profile's scores choose between shards as
between nodes; preemption chooses its victims across the whole cluster in
kube-scheduler's order and lets a gang of any size preempt; quotas are global; tenants' pools are theirs at one shard too;
a pod waits in one queue, so room freed anywhere reaches it.

Why one module of over 500 lines: one scenario per symptom of the issue it closes,
with the scenario text they share; each test is short.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from shards.cli import main
from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import node, pod
from tests.shards.scenario_text import pod_group as podgroup

SHARDS = (1, 2, 4)


# ----------------------------------------------------------------------------- scenario text


def quota(ns: str, minimum: dict[str, str], maximum: dict[str, str]) -> str:
    def mapping(values: dict[str, str]) -> str:
        return "{" + ", ".join(f'{k}: "{v}"' for k, v in values.items()) + "}"

    return f"""
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: ElasticQuota
metadata: {{name: quota, namespace: {ns}}}
spec:
  min: {mapping(minimum)}
  max: {mapping(maximum)}
---"""


def config(profile: str) -> str:
    return f"""
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
{profile}
---"""


# ----------------------------------------------------------------------------- running


def simulate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, shards: int
) -> dict[str, Any]:
    """``shoal simulate --shards N --json``, then ``shoal replay --verify`` of its log."""
    data, _ = shoal(tmp_path, capsys, text, shards)
    return data


def phase(data: dict[str, Any], key: str) -> str:
    return str(data["pods"][key]["phase"])


def bound(data: dict[str, Any], keys: Iterable[str]) -> list[str]:
    return [k for k in keys if phase(data, k) == "Bound"]


def preempted(data: dict[str, Any]) -> set[str]:
    return {p["pod"] for p in data["preemptions"]}


def outcome(data: dict[str, Any]) -> dict[str, str]:
    """Each pod's phase: what one scheduler and N shards must agree on."""
    return {key: view["phase"] for key, view in data["pods"].items()}


# --------------------------------------------------------------- 1. cross-shard gangs end


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(
    ("nodes", "cards", "hogged", "members"),
    [(4, 8, 1, 3), (6, 4, 2, 4), (5, 2, 1, 4)],
)
def test_a_gang_that_fits_beside_a_hog_is_placed_and_the_run_ends(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shards: int,
    nodes: int,
    cards: int,
    hogged: int,
    members: int,
) -> None:
    """Whole-node GPU members and CPU hogs pinned to some nodes: the gang fits exactly on
    the nodes the hogs leave, whichever shard owns which."""
    text = "".join(node(f"n{i}", cpu=16, gpu=cards) for i in range(nodes))
    text += "".join(pod(f"hog-{i}", cpu="14", node_name=f"n{i}") for i in range(hogged))
    text += podgroup("train", members)
    text += "".join(
        pod(f"train-{i}", cpu="4", gpu=cards, group="train", at=1) for i in range(members)
    )
    data = simulate(tmp_path, capsys, text, shards)
    keys = [f"default/train-{i}" for i in range(members)]
    assert bound(data, keys) == keys
    assert data["groups"]["default/train"]["phase"] == "Scheduled"
    used = {data["pods"][k]["node"] for k in keys}
    assert used.isdisjoint({f"n{i}" for i in range(hogged)})


# --------------------------------------------------------------- 2. elastic-quota reclaim


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(
    ("nodes", "cards", "minimum", "maximum", "used", "asked"),
    [
        (1, 12, 4, 8, 8, 4),  # one node larger than the quotas' min together
        (3, 4, 5, 10, 10, 3),  # the borrower spread over three nodes
        (2, 8, 5, 12, 10, 5),  # a cluster larger than the mins, the owner needs all of its
    ],
)
def test_a_namespace_within_its_min_takes_back_what_others_borrow(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shards: int,
    nodes: int,
    cards: int,
    minimum: int,
    maximum: int,
    used: int,
    asked: int,
) -> None:
    """``borrower`` runs ``used`` one-card pods, more than its min, started one after the
    other; ``owner`` then asks for ``asked`` cards within its own min. The newest of the
    borrower's pods go, no more than the guarantee needs, and never below its min."""
    text = "".join(node(f"n{i}", gpu=cards) for i in range(nodes))
    text += quota("borrower", {"nvidia.com/gpu": str(minimum)}, {"nvidia.com/gpu": str(maximum)})
    text += quota("owner", {"nvidia.com/gpu": str(minimum)}, {"nvidia.com/gpu": str(maximum)})
    text += "".join(pod(f"b{i}", ns="borrower", gpu=1, at=i) for i in range(used))
    text += "".join(pod(f"o{i}", ns="owner", gpu=1, at=100) for i in range(asked))
    data = simulate(tmp_path, capsys, text, shards)
    owners = [f"owner/o{i}" for i in range(asked)]
    assert bound(data, owners) == owners
    total_min = 2 * minimum
    must_go = max(used + asked - total_min, used + asked - nodes * cards, 0)
    newest = {f"borrower/b{i}" for i in range(used - must_go, used)}
    assert preempted(data) == newest
    kept = bound(data, [f"borrower/b{i}" for i in range(used)])
    assert len(kept) == used - must_go >= minimum


@pytest.mark.parametrize("shards", SHARDS)
def test_reclaim_looks_only_at_the_resources_being_reclaimed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """The quotas' min names cpu and memory too; the borrower uses less cpu than its min
    but borrows cards: the cards come back all the same."""
    text = node("n0", cpu=64, memory="256Gi", gpu=10)
    minimum = {"cpu": "20", "memory": "64Gi", "nvidia.com/gpu": "4"}
    maximum = {"cpu": "40", "memory": "128Gi", "nvidia.com/gpu": "8"}
    text += quota("borrower", minimum, maximum) + quota("owner", minimum, maximum)
    text += "".join(pod(f"b{i}", ns="borrower", gpu=1, at=i) for i in range(7))
    text += "".join(pod(f"o{i}", ns="owner", gpu=1, at=50) for i in range(4))
    data = simulate(tmp_path, capsys, text, shards)
    assert bound(data, [f"owner/o{i}" for i in range(4)]) == [f"owner/o{i}" for i in range(4)]
    # 7 borrowed + 4 owned must fit the 8 guaranteed cards: the newest 3 go
    assert preempted(data) == {"borrower/b4", "borrower/b5", "borrower/b6"}


@pytest.mark.parametrize("shards", SHARDS)
def test_reclaim_when_the_quota_admits_but_no_node_has_room(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """The mins add up to more than the cluster holds: the owner's pod is admitted by its
    quota, but the borrower fills every node at the same priority. Reclaim takes the
    borrower's newest pods, as many as the owner needs."""
    text = node("n0", gpu=4) + node("n1", gpu=4)
    text += quota("borrower", {"nvidia.com/gpu": "6"}, {"nvidia.com/gpu": "8"})
    text += quota("owner", {"nvidia.com/gpu": "6"}, {"nvidia.com/gpu": "8"})
    text += "".join(pod(f"b{i}", ns="borrower", gpu=1, at=i) for i in range(8))
    text += pod("o0", ns="owner", gpu=1, at=20) + pod("o1", ns="owner", gpu=1, at=21)
    data = simulate(tmp_path, capsys, text, shards)
    assert bound(data, ["owner/o0", "owner/o1"]) == ["owner/o0", "owner/o1"]
    assert preempted(data) == {"borrower/b6", "borrower/b7"}


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(("cards", "low", "high"), [(1, 10, 60), (2, 0, 5), (3, 40, 41)])
def test_reclaim_takes_the_least_valuable_borrower_whatever_its_node(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shards: int,
    cards: int,
    low: int,
    high: int,
) -> None:
    """The owner's pod fits a node with room (``cards`` free beside a borrower's pod of
    priority ``high``) but its quota is one card short; a borrower's one-card pod of
    priority ``low`` runs on another node. Evicting either frees the card; the least
    valuable goes, although the other shares the owner's node."""
    text = node("n0", gpu=1, labels={"slot": "a"}) + node("n1", gpu=2 * cards, labels={"slot": "b"})
    text += quota("borrower", {"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "99"})
    text += quota("owner", {"nvidia.com/gpu": str(2 * cards - 1)}, {"nvidia.com/gpu": "99"})
    text += pod("low", ns="borrower", gpu=1, priority=low, selector={"slot": "a"})
    text += pod("high", ns="borrower", gpu=cards, priority=high, selector={"slot": "b"}, at=1)
    text += pod("o0", ns="owner", gpu=cards, selector={"slot": "b"}, at=10)
    data = simulate(tmp_path, capsys, text, shards)
    assert bound(data, ["owner/o0", "borrower/high"]) == ["owner/o0", "borrower/high"]
    assert preempted(data) == {"borrower/low"}


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(("gang", "cards", "spare"), [(2, 2, 1), (3, 1, 2), (2, 1, 0)])
def test_reclaim_counts_a_gang_whole_against_the_borrowers_min(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shards: int,
    gang: int,
    cards: int,
    spare: int,
) -> None:
    """The borrower runs a gang (low priority, ``gang`` members of ``cards`` cards) and,
    later, single pods of higher priority; it borrows exactly one pod's cards. Taking
    one gang member would take the whole gang and the borrower below its min: reclaim
    takes the newest single pod instead, however the members are spread."""
    per_node = gang * cards
    nodes = 2
    text = "".join(node(f"n{i}", gpu=per_node) for i in range(nodes))
    singles = (nodes * per_node - gang * cards) // cards
    used = gang * cards + singles * cards
    minimum = used - cards  # borrows exactly one pod's cards
    text += quota("borrower", {"nvidia.com/gpu": str(minimum)}, {"nvidia.com/gpu": str(used)})
    text += quota("owner", {"nvidia.com/gpu": str(cards + spare)}, {"nvidia.com/gpu": "99"})
    text += podgroup("g", gang, ns="borrower")
    text += "".join(
        pod(f"g{i}", ns="borrower", gpu=cards, group="g", priority=10) for i in range(gang)
    )
    text += "".join(
        pod(f"s{i}", ns="borrower", gpu=cards, priority=50, at=1 + i) for i in range(singles)
    )
    text += pod("o0", ns="owner", gpu=cards, at=100)
    data = simulate(tmp_path, capsys, text, shards)
    assert bound(data, ["owner/o0"]) == ["owner/o0"]
    assert preempted(data) == {f"borrower/s{singles - 1}"}
    assert bound(data, [f"borrower/g{i}" for i in range(gang)]) == [
        f"borrower/g{i}" for i in range(gang)
    ]


# ------------------------------------------------------ 3. the profile's scores across shards


MOST_ALLOCATED_GPU = """
- schedulerName: default-scheduler
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources: [{name: nvidia.com/gpu, weight: 1}]"""

RATIO_GPU = """
- schedulerName: default-scheduler
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: RequestedToCapacityRatio
        resources: [{name: nvidia.com/gpu, weight: 1}]
        requestedToCapacityRatio:
          shape: [{utilization: 0, score: 0}, {utilization: 100, score: 10}]"""


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("profile", [MOST_ALLOCATED_GPU, RATIO_GPU], ids=["most", "ratio"])
@pytest.mark.parametrize(("nodes", "small", "size"), [(4, 4, 2), (3, 8, 1), (6, 12, 1)])
def test_bin_packing_profiles_pack_across_shards(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shards: int,
    profile: str,
    nodes: int,
    small: int,
    size: int,
) -> None:
    """Small GPU pods are packed onto as few nodes as they need, so that the whole-node
    jobs that come later find whole nodes free."""
    text = config(profile) + "".join(node(f"n{i}", gpu=8) for i in range(nodes))
    text += "".join(pod(f"small-{i}", gpu=size, at=i) for i in range(small))
    whole = nodes - -(-small * size // 8)  # the nodes the small pods need not use
    text += "".join(pod(f"big-{i}", gpu=8, at=100) for i in range(whole))
    data = simulate(tmp_path, capsys, text, shards)
    assert all(view["phase"] == "Bound" for view in data["pods"].values()), data["pods"]


# ------------------------------------------------------------------------- 4. preemption


@pytest.mark.parametrize("shards", SHARDS)
def test_preemption_takes_the_fewest_victims_in_the_whole_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Node a holds a two-pod gang, node b one pod (all low priority, a's pool first, so
    that a's shard is asked first); the urgent pod needs a whole node: one victim (b's
    pod) beats two."""
    text = node("a", cpu=8, labels={"shoal.io/pool": "pa"}) + node(
        "b", cpu=8, labels={"shoal.io/pool": "pb"}
    )
    text += podgroup("pair", 2)
    text += pod("pair-0", cpu="4", group="pair", priority=1, selector={"shoal.io/pool": "pa"})
    text += pod("pair-1", cpu="4", group="pair", priority=1, selector={"shoal.io/pool": "pa"})
    text += pod("single", cpu="8", priority=1, selector={"shoal.io/pool": "pb"})
    text += pod("urgent", cpu="8", priority=100, at=10)
    data = simulate(tmp_path, capsys, text, shards)
    assert phase(data, "default/urgent") == "Bound"
    assert data["pods"]["default/urgent"]["node"] == "b"
    assert preempted(data) == {"default/single"}
    assert bound(data, ["default/pair-0", "default/pair-1"]) == [
        "default/pair-0",
        "default/pair-1",
    ]


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(("size", "single_priority"), [(2, 20), (3, 50), (2, 5)])
def test_on_one_node_the_lower_priority_goes_even_a_whole_gang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, size: int, single_priority: int
) -> None:
    """One node holds a gang of ``size`` one-card pods of priority 10 and a single pod
    of ``size`` cards; the urgent pod needs ``size`` cards. Evicting one member takes
    the whole gang (``size`` pods). As kube-scheduler reprieves victims, the most
    valuable first, priority decides before the number of victims: a single pod above
    the gang's priority stays and the gang goes whole; one below it goes alone."""
    text = node("n0", gpu=2 * size)
    text += podgroup("g", size)
    text += "".join(pod(f"g-{i}", gpu=1, group="g", priority=10) for i in range(size))
    text += pod("single", gpu=size, priority=single_priority)
    text += pod("urgent", gpu=size, priority=100, at=10)
    data = simulate(tmp_path, capsys, text, shards)
    assert phase(data, "default/urgent") == "Bound"
    members = [f"default/g-{i}" for i in range(size)]
    if single_priority > 10:
        assert preempted(data) == set(members)
        assert phase(data, "default/single") == "Bound"
    else:
        assert preempted(data) == {"default/single"}
        assert bound(data, members) == members


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(("nodes", "wide", "narrow"), [(4, 4, 2), (6, 5, 3)])
def test_a_gang_across_shards_preempts_like_any_gang(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shards: int,
    nodes: int,
    wide: int,
    narrow: int,
) -> None:
    """Low-priority pods fill every node; a priority-1000 gang as wide as ``wide`` nodes
    and a priority-50 gang of ``narrow`` arrive together. The 1000 gang goes first,
    preempts what it needs, and runs; the 50 gang cannot preempt it and waits."""
    text = "".join(node(f"n{i}", gpu=4, labels={"shoal.io/pool": f"p{i}"}) for i in range(nodes))
    text += "".join(pod(f"low-{i}", gpu=4, priority=0, at=i) for i in range(nodes))
    text += podgroup("high", wide, at=10) + podgroup("mid", narrow, at=10)
    text += "".join(
        pod(f"high-{i}", gpu=4, priority=1000, group="high", at=10) for i in range(wide)
    )
    text += "".join(pod(f"mid-{i}", gpu=4, priority=50, group="mid", at=10) for i in range(narrow))
    data = simulate(tmp_path, capsys, text, shards)
    highs = [f"default/high-{i}" for i in range(wide)]
    assert bound(data, highs) == highs
    assert data["groups"]["default/high"]["phase"] == "Scheduled"
    free_after = nodes - wide
    mids_bound = bound(data, [f"default/mid-{i}" for i in range(narrow)])
    assert mids_bound == [] or narrow <= free_after
    # the newest low pods go first, and only as many as the high gang needs
    assert len(preempted(data)) == wide + (narrow if narrow <= free_after else 0)


@pytest.mark.parametrize("shards", SHARDS)
def test_preemption_policy_never_evicts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    text = node("a", cpu=4) + node("b", cpu=4)
    text += pod("low-0", cpu="4", priority=0) + pod("low-1", cpu="4", priority=0, at=1)
    text += pod("polite", cpu="4", priority=100, never=True, at=5)
    data = simulate(tmp_path, capsys, text, shards)
    assert phase(data, "default/polite") == "Pending"
    assert preempted(data) == set()


# ---------------------------------------------------------------- 5. seed 002 at any shards


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(("nodes", "cards"), [(5, 2), (10, 1), (2, 5)])
def test_seed_002_user_b_takes_back_its_guarantee_with_a_gang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, nodes: int, cards: int
) -> None:
    """User A (min 4, max 6 cards) borrows up to its max while B is idle; B (min 6,
    max 8) submits a 6-card distributed job as one gang: it gets its 6 back from A,
    which keeps its 4."""
    text = "".join(node(f"n{i}", gpu=cards) for i in range(nodes))
    text += quota("user-a", {"nvidia.com/gpu": "4"}, {"nvidia.com/gpu": "6"})
    text += quota("user-b", {"nvidia.com/gpu": "6"}, {"nvidia.com/gpu": "8"})
    text += "".join(pod(f"a{i}", ns="user-a", gpu=1, at=i) for i in range(7))
    text += podgroup("job", 6, ns="user-b", at=20)
    text += "".join(pod(f"b{i}", ns="user-b", gpu=1, group="job", at=20) for i in range(6))
    data = simulate(tmp_path, capsys, text, shards)
    job = [f"user-b/b{i}" for i in range(6)]
    assert bound(data, job) == job
    assert phase(data, "user-a/a6") == "Pending"  # beyond A's max: never admitted
    assert preempted(data) == {"user-a/a4", "user-a/a5"}
    assert len(bound(data, [f"user-a/a{i}" for i in range(7)])) == 4


# --------------------------------------------------------------- 6. pools and tenants


SHARDING = """
apiVersion: shoal.io/v1alpha1
kind: ShardingConfiguration
pools:
- {name: old, nodeSelector: {hw: old}}
- {name: new, nodeSelector: {hw: new}}
tenants:
- {namespace: research, pools: [new]}
---"""


@pytest.mark.parametrize("shards", SHARDS)
def test_a_tenants_pools_are_its_own_at_any_number_of_shards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    text = SHARDING
    text += "".join(node(f"old-{i}", cpu=4, labels={"hw": "old"}) for i in range(2))
    text += "".join(node(f"new-{i}", cpu=4, labels={"hw": "new"}) for i in range(2))
    text += "".join(pod(f"dev-{i}", ns="dev", cpu="2", at=i) for i in range(6))
    text += "".join(pod(f"r-{i}", ns="research", cpu="2", at=10 + i) for i in range(6))
    data = simulate(tmp_path, capsys, text, shards)
    for i in range(6):
        dev = data["pods"][f"dev/dev-{i}"]
        assert dev["node"] is None or dev["node"].startswith("old-"), dev
        research = data["pods"][f"research/r-{i}"]
        assert research["node"] is None or research["node"].startswith("new-"), research
    assert len(bound(data, [f"dev/dev-{i}" for i in range(6)])) == 4
    assert len(bound(data, [f"research/r-{i}" for i in range(6)])) == 4


@pytest.mark.parametrize("shards", SHARDS)
def test_a_pool_pinned_to_a_shard_that_does_not_exist_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    text = f"""
apiVersion: shoal.io/v1alpha1
kind: ShardingConfiguration
pools:
- {{name: far, shard: {shards}, nodeSelector: {{hw: far}}}}
---""" + node("n0", labels={"hw": "far"})
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", str(path), "--shards", str(shards), "--json"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"shard {shards}" in err and "pools[0]" in err, err


# ----------------------------------------------------------- 7. one queue, one set of nodes


@pytest.mark.parametrize("shards", SHARDS)
def test_room_freed_on_any_shard_reaches_the_waiting_pod_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Every node is full when ``late`` arrives; the first pod to finish frees a node
    (in some shard): ``late`` is bound there at that moment, as one scheduler does."""
    text = "".join(node(f"n{i}", cpu=4, labels={"shoal.io/pool": f"p{i}"}) for i in range(4))
    text += "".join(pod(f"busy-{i}", cpu="4", runtime=10 + 10 * i) for i in range(4))
    text += pod("late", cpu="4", at=1)
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(text)
    log = tmp_path / "run.log"
    assert (
        main(["simulate", str(scenario), "--shards", str(shards), "--log", str(log), "--quiet"])
        == 0
    )
    capsys.readouterr()
    assert main(["replay", str(log), "--json"]) == 0
    events = json.loads(capsys.readouterr().out)["events"]

    def binds(key: str) -> list[dict[str, Any]]:
        return [e for e in events if e["event"]["type"] == "bind" and e["event"]["pod"] == key]

    late = binds("default/late")
    assert [b["time"] for b in late] == [10_000_000_000]
    assert late[0]["event"]["node"] == binds("default/busy-0")[0]["event"]["node"]


@pytest.mark.parametrize("shards", SHARDS)
def test_a_pod_that_fits_nowhere_is_told_about_every_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Two nodes and four shards: the reason names the cluster's nodes, never a shard's
    empty set ("0/0 nodes")."""
    text = node("n0", cpu=4) + node("n1", cpu=4) + pod("huge", cpu="8")
    data = simulate(tmp_path, capsys, text, shards)
    reason = data["pods"]["default/huge"]["reason"]
    assert reason.startswith("0/2 nodes are available: 2 Insufficient cpu"), reason
    assert "0/0" not in reason


@pytest.mark.parametrize("shards", SHARDS)
def test_a_pod_without_scheduler_name_is_the_default_schedulers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Kubernetes sets ``schedulerName: default-scheduler`` on a pod that names none; a
    configuration whose only profile is ``gpu-scheduler`` does not serve it (and ``shoal
    serve`` would not see it): it waits, saying so."""
    text = config("- schedulerName: gpu-scheduler") + node("n0", cpu=4)
    text += pod("plain", cpu="1") + pod("ours", cpu="1", scheduler="gpu-scheduler")
    data = simulate(tmp_path, capsys, text, shards)
    assert phase(data, "default/ours") == "Bound"
    assert phase(data, "default/plain") == "Pending"
    assert "default-scheduler" in data["pods"]["default/plain"]["reason"]


# ----------------------------------------------------------- the same outcome at every count


@pytest.mark.parametrize("example", ["batch.yaml", "quickstart.yaml"])
def test_the_examples_end_the_same_at_every_shard_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], example: str
) -> None:
    text = (Path(__file__).parents[2] / "examples" / example).read_text()
    outcomes = [outcome(simulate(tmp_path, capsys, text, shards)) for shards in SHARDS]
    assert outcomes[1] == outcomes[0]
    assert outcomes[2] == outcomes[0]
