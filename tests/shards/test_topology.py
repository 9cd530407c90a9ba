"""Topology-aware gangs through ``shoal simulate`` at 1 and 2 shards, each log replayed
with ``--verify``: a required level keeps a gang in one domain, the tightest that holds
it (seed 001: the other leaves stay whole); a preferred level spans the fewest
domains; a gang no domain can hold waits with a reason naming the level. Leaves
straddle the two shards' pools, so the coordinator's parts go to both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shards.cli import main
from tests.shards.coordinator_kit import shoal
from tests.shards.scenario_text import node

SHARDS = (1, 2)
LEAF = "example.com/leaf"
SPINE = "example.com/spine"

CONFIG = f"""
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
topology:
  levels:
  - {{nodeLabel: {SPINE}, name: spine}}
  - {{nodeLabel: {LEAF}, name: leaf}}
---"""


def leaves(sizes: dict[str, int], spine: dict[str, str] | None = None) -> str:
    """Nodes of 8 cpu under leaves of the given sizes; pools alternate node by node, so
    every leaf of two nodes or more lies in both shards."""
    out = []
    i = 0
    for leaf, size in sizes.items():
        for k in range(size):
            labels = {
                LEAF: leaf,
                SPINE: (spine or {}).get(leaf, "s0"),
                "shoal.io/pool": f"p{i % 2}",
            }
            out.append(node(f"{leaf}-{k}", cpu=8, labels=labels))
            i += 1
    return "".join(out)


def gang(name: str, size: int, annotations: dict[str, str], *, at: float = 0, cpu: int = 6) -> str:
    notes = ", ".join(
        f'"{k}": "{v}"' for k, v in {**annotations, "shoal.io/arrive-at": f"{at:g}"}.items()
    )
    pods = "".join(
        f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}-{i}
  namespace: hpc
  labels: {{scheduling.x-k8s.io/pod-group: {name}}}
  annotations: {{shoal.io/arrive-at: "{at:g}"}}
spec: {{containers: [{{name: c, resources: {{requests: {{cpu: "{cpu}"}}}}}}]}}
---"""
        for i in range(size)
    )
    return f"""
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata: {{name: {name}, namespace: hpc, annotations: {{{notes}}}}}
spec: {{minMember: {size}}}
---{pods}"""


def leaf_of(data: dict[str, Any], pod: str) -> str:
    node_name = data["pods"][f"hpc/{pod}"]["node"]
    assert node_name is not None, data["pods"][f"hpc/{pod}"]
    return str(node_name).rsplit("-", 1)[0]


def used_leaves(data: dict[str, Any], name: str, size: int) -> set[str]:
    return {leaf_of(data, f"{name}-{i}") for i in range(size)}


@pytest.mark.parametrize("shards", SHARDS)
def test_required_leaf_takes_the_tightest_leaf_that_holds_the_gang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    # leaf-a 5 nodes, leaf-b 4, leaf-c 2; one pod per node (6 of 8 cpu). The gang of 4
    # goes to leaf-b (k = 4 - 4 = 0), not leaf-a (k = 1), so the gang of 5 that comes
    # next still finds leaf-a whole.
    text = (
        CONFIG
        + leaves({"leaf-a": 5, "leaf-b": 4, "leaf-c": 2})
        + gang("four", 4, {"shoal.io/topology-required": "leaf"})
        + gang("five", 5, {"shoal.io/topology-required": "leaf"}, at=1)
    )
    data, _ = shoal(tmp_path, capsys, text, shards)
    assert used_leaves(data, "four", 4) == {"leaf-b"}
    assert used_leaves(data, "five", 5) == {"leaf-a"}
    assert data["summary"]["bound"] == 9


@pytest.mark.parametrize("shards", SHARDS)
def test_preferred_leaf_spans_the_fewest_leaves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    # no leaf holds 6: under the spine, the fewest leaves that do are leaf-a (4) and
    # leaf-b (2, the tightest for the 2 left), so leaf-c (3) stays whole for the gang
    # of 3 that follows
    text = (
        CONFIG
        + leaves({"leaf-a": 4, "leaf-b": 2, "leaf-c": 3})
        + gang("six", 6, {"shoal.io/topology-preferred": "leaf"})
        + gang("three", 3, {"shoal.io/topology-required": "leaf"}, at=1)
    )
    data, _ = shoal(tmp_path, capsys, text, shards)
    assert used_leaves(data, "six", 6) == {"leaf-a", "leaf-b"}
    assert used_leaves(data, "three", 3) == {"leaf-c"}


@pytest.mark.parametrize("shards", SHARDS)
def test_preferred_leaf_stays_in_one_spine_when_one_holds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    # spine s0: leaf-a 2 + leaf-b 2; spine s1: leaf-c 3 + leaf-d 2. A gang of 5 fits
    # in s1 alone (two leaves), not in s0.
    spines = {"leaf-a": "s0", "leaf-b": "s0", "leaf-c": "s1", "leaf-d": "s1"}
    text = (
        CONFIG
        + leaves({"leaf-a": 2, "leaf-b": 2, "leaf-c": 3, "leaf-d": 2}, spines)
        + gang("five", 5, {"kueue.x-k8s.io/podset-preferred-topology": LEAF})
    )
    data, _ = shoal(tmp_path, capsys, text, shards)
    assert used_leaves(data, "five", 5) == {"leaf-c", "leaf-d"}


@pytest.mark.parametrize("shards", SHARDS)
def test_a_gang_larger_than_any_leaf_waits_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    text = (
        CONFIG
        + leaves({"leaf-a": 3, "leaf-b": 3})
        + gang("big", 4, {"kueue.x-k8s.io/podset-required-topology": LEAF})
    )
    data, _ = shoal(tmp_path, capsys, text, shards)
    for i in range(4):
        entry = data["pods"][f"hpc/big-{i}"]
        assert entry["node"] is None
        assert "no leaf holds its 4 members (required topology leaf)" in entry["reason"]
    assert "required topology leaf" in data["groups"]["hpc/big"]["reason"]
    assert data["summary"]["bound"] == 0


HYPERNODES = """
apiVersion: topology.volcano.sh/v1alpha1
kind: HyperNode
metadata: {name: leaf-a}
spec:
  tier: 1
  members:
  - {type: Node, selector: {regexMatch: {pattern: "^leaf-a-"}}}
---
apiVersion: topology.volcano.sh/v1alpha1
kind: HyperNode
metadata: {name: leaf-b}
spec:
  tier: 1
  members:
  - {type: Node, selector: {exactMatch: {name: leaf-b-0}}}
  - {type: Node, selector: {exactMatch: {name: leaf-b-1}}}
---
apiVersion: topology.volcano.sh/v1alpha1
kind: HyperNode
metadata: {name: leaf-c}
spec:
  tier: 1
  members:
  - {type: Node, selector: {labelMatch: {matchLabels: {example.com/leaf: leaf-c}}}}
---
apiVersion: topology.volcano.sh/v1alpha1
kind: HyperNode
metadata: {name: spine}
spec:
  tier: 2
  members:
  - {type: HyperNode, selector: {regexMatch: {pattern: "^leaf-"}}}
---"""


def volcano_gang(name: str, size: int, network: str) -> str:
    pods = "".join(
        f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}-{i}
  namespace: hpc
  annotations: {{scheduling.k8s.io/group-name: {name}}}
spec: {{containers: [{{name: c, resources: {{requests: {{cpu: "6"}}}}}}]}}
---"""
        for i in range(size)
    )
    return f"""
apiVersion: scheduling.volcano.sh/v1beta1
kind: PodGroup
metadata: {{name: {name}, namespace: hpc}}
spec: {{minMember: {size}, networkTopology: {network}}}
---{pods}"""


@pytest.mark.parametrize("shards", SHARDS)
def test_volcano_hypernodes_and_network_topology(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    # tier-1 HyperNodes by regex, names and labels: leaf-a 4 nodes, leaf-b 2, leaf-c 3.
    # hard within tier 1: the gang of 3 takes leaf-c whole; soft (tier 1 by default):
    # no leaf is left that holds 5, so the fewest under the spine: leaf-a (4), then
    # leaf-b for the one left.
    text = (
        HYPERNODES
        + leaves({"leaf-a": 4, "leaf-b": 2, "leaf-c": 3})
        + volcano_gang("hard", 3, "{mode: hard, highestTierAllowed: 1}")
        + volcano_gang("soft", 5, "{mode: soft}")
    )
    data, _ = shoal(tmp_path, capsys, text, shards)
    assert used_leaves(data, "hard", 3) == {"leaf-c"}
    assert used_leaves(data, "soft", 5) == {"leaf-a", "leaf-b"}


def test_a_level_nobody_declared_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        CONFIG + leaves({"leaf-a": 2}) + gang("g", 2, {"shoal.io/topology-required": "rack"})
    )
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", str(scenario)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "(PodGroup g)" in err
    assert 'metadata.annotations["shoal.io/topology-required"]' in err
    assert "names topology level 'rack', which is not declared (levels: spine, leaf" in err


@pytest.mark.parametrize("shards", SHARDS)
def test_a_gang_refused_before_the_filters_keeps_that_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    # the quota refuses the gang whatever its domain: that is why it waits, not topology
    quota = """
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: quota, namespace: hpc}
spec: {min: {cpu: "1"}, max: {cpu: "12"}}
---"""
    text = (
        CONFIG
        + quota
        + leaves({"leaf-a": 3, "leaf-b": 4})
        + gang("g", 3, {"shoal.io/topology-required": "leaf"})
    )
    data, _ = shoal(tmp_path, capsys, text, shards)
    reason = data["groups"]["hpc/g"]["reason"]
    assert "elastic quota hpc" in reason
    assert "topology" not in reason


@pytest.mark.parametrize("shards", SHARDS)
def test_the_example_does_what_it_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    text = (Path(__file__).parents[2] / "examples" / "topology.yaml").read_text()
    data, _ = shoal(tmp_path, capsys, text, shards)

    def on(name: str, size: int) -> set[str]:
        nodes = {data["pods"][f"hpc/{name}-{i}"]["node"] for i in range(size)}
        return {str(n)[:5] for n in nodes}

    assert on("slurm-2", 2) == {"gpu-b"}
    assert on("slurm-3", 3) == {"gpu-c"}
    assert on("slurm-4", 4) == {"gpu-a"}
    assert on("flex-5", 5) == {"gpu-b", "gpu-c"}
    assert data["groups"]["hpc/slurm-5"]["phase"] == "Pending"
    assert "no example.com/leaf holds its 5 members" in data["groups"]["hpc/slurm-5"]["reason"]


@pytest.mark.parametrize("shards", SHARDS)
def test_among_equal_leaves_the_coordinator_takes_one_shard_owns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    # leaf-a and leaf-b both hold the gang exactly (k = 0). leaf-a lies in both pools,
    # leaf-b in one: one scheduler takes leaf-a (ties by name), the coordinator of two
    # shards leaf-b, so that one shard holds the whole gang.
    def leaf(name: str, pools: list[str]) -> str:
        return "".join(
            node(f"{name}-{k}", cpu=8, labels={LEAF: name, SPINE: "s0", "shoal.io/pool": p})
            for k, p in enumerate(pools)
        )

    text = (
        CONFIG
        + leaf("leaf-a", ["p0", "p1", "p0"])
        + leaf("leaf-b", ["p1", "p1", "p1"])
        + gang("g", 3, {"shoal.io/topology-required": "leaf"})
    )
    data, _ = shoal(tmp_path, capsys, text, shards)
    assert used_leaves(data, "g", 3) == ({"leaf-a"} if shards == 1 else {"leaf-b"})
    if shards == 2:
        assert {data["pods"][f"hpc/g-{i}"]["shard"] for i in range(3)} == {1}


@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=4, unique=True),
    st.integers(1, 6),
    st.lists(st.integers(0, 1), min_size=20, max_size=20),
)
def test_one_and_two_shards_choose_the_same_leaf(
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    sizes: list[int],
    m: int,
    pools: list[int],
) -> None:
    # leaves of distinct sizes (no tie between them), nodes dealt to pools at random:
    # the leaf a required gang takes, or that it waits, does not depend on the shards
    text = CONFIG
    i = 0
    for leaf, size in enumerate(sizes):
        for k in range(size):
            labels = {LEAF: f"leaf-{leaf}", SPINE: "s0", "shoal.io/pool": f"p{pools[i]}"}
            text += node(f"leaf-{leaf}-{k}", cpu=8, labels=labels)
            i += 1
    text += gang("g", m, {"shoal.io/topology-required": "leaf"})
    outcomes = []
    for shards in SHARDS:
        data, _ = shoal(tmp_path_factory.mktemp("run"), capsys, text, shards)
        pods = [data["pods"][f"hpc/g-{i}"] for i in range(m)]
        outcomes.append({str(p["node"]).rsplit("-", 1)[0] if p["node"] else None for p in pods})
    assert outcomes[0] == outcomes[1]
    fitting = [size for size in sizes if size >= m]
    assert outcomes[0] == ({f"leaf-{sizes.index(min(fitting))}"} if fitting else {None})
