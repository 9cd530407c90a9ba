"""GPUs through DRA in ``shoal simulate``: ResourceSlices published as a GPU driver
would, claims and claim templates, at 1, 2 and 4 shards, each run replayed with
``--verify`` (:mod:`shards.inputs.dra`, :mod:`engine.model.dra`).

The report names the devices each pod got (``claims``: claim, request, driver, pool,
device); the oracle here reads the scenario's slices, not the engine's code.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shards.cli import main
from tests.shards.coordinator_kit import shoal
from tests.shards.dra_text import (
    DRIVER,
    claim,
    claim_template,
    device_class,
    node,
    pod,
    resource_slice,
)
from tests.shards.scenario_text import pod_group

SHARDS = (1, 2, 4)
MODEL = 'device.attributes["gpu.example.com"].productName == "{}"'


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, shards: int) -> Any:
    data, _ = shoal(tmp_path, capsys, text, shards)
    return data


def devices_of(view: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(c["driver"], c["pool"], c["device"]) for c in view.get("claims", [])]


@pytest.mark.parametrize("shards", SHARDS)
def test_claims_and_templates_get_devices_of_their_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Two nodes of 4 devices; a claim of 3, a template of 2 used by two pods, a claim
    of 1: 8 devices asked, 8 there, each given once, from the pod's own node."""
    text = device_class() + node("a") + node("b")
    text += resource_slice("a", 4) + resource_slice("b", 4)
    text += claim("three", 3) + claim("one", 1) + claim_template("two", 2)
    text += pod("p3", claim_name="three") + pod("p1", claim_name="one", at=1)
    text += pod("t1", template="two", at=2) + pod("t2", template="two", at=3)
    data = run(tmp_path, capsys, text, shards)
    pods = data["pods"]
    counts = {"default/p3": 3, "default/p1": 1, "default/t1": 2, "default/t2": 2}
    given_out: list[tuple[str, str, str]] = []
    for key, count in counts.items():
        view = pods[key]
        assert view["phase"] == "Bound", (key, view)
        devices = devices_of(view)
        assert len(devices) == count, view
        assert all(d[0] == DRIVER and d[1] == view["node"] for d in devices), view
        given_out += devices
    assert len(set(given_out)) == 8
    assert {c["claim"] for c in pods["default/t1"]["claims"]} == {"t1-gpu"}
    assert {c["request"] for c in pods["default/p3"]["claims"]} == {"gpus"}


@pytest.mark.parametrize("shards", SHARDS)
def test_an_attribute_selector_picks_the_nodes_whose_devices_match(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """H100 on a, A100 on b: a claim selecting A100 goes to b, and one asking for more
    A100s than b has waits, although a has room."""
    text = device_class() + node("a") + node("b")
    text += resource_slice("a", 4, model="H100") + resource_slice("b", 2, model="A100")
    text += claim("want-a100", 2, selector=MODEL.format("A100"))
    text += claim("too-many", 3, selector=MODEL.format("A100"))
    text += pod("x", claim_name="want-a100") + pod("y", claim_name="too-many", at=1)
    data = run(tmp_path, capsys, text, shards)
    x, y = data["pods"]["default/x"], data["pods"]["default/y"]
    assert x["phase"] == "Bound" and x["node"] == "b"
    assert y["phase"] == "Pending"


@pytest.mark.parametrize("shards", SHARDS)
def test_a_class_selecting_another_driver_finds_no_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    text = device_class() + device_class("nic", driver="nic.example.com")
    text += node("a") + resource_slice("a", 4)
    text += claim("c", 1, klass="nic") + pod("p", claim_name="c")
    data = run(tmp_path, capsys, text, shards)
    assert data["pods"]["default/p"]["phase"] == "Pending"


@pytest.mark.parametrize("shards", SHARDS)
def test_a_gang_of_claims_is_placed_whole_or_not_at_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Two nodes of 4 devices: a gang of two 4-device members fits; a gang of three
    does not, and none of it is bound."""
    text = device_class() + node("a") + node("b")
    text += resource_slice("a", 4) + resource_slice("b", 4)
    text += claim_template("four", 4)
    text += pod_group("fits", 2) + pod_group("too-big", 3, at=1)
    text += "".join(pod(f"f{i}", template="four", group="fits") for i in range(2))
    text += "".join(pod(f"t{i}", template="four", group="too-big", at=1) for i in range(3))
    data = run(tmp_path, capsys, text, shards)
    pods = data["pods"]
    assert {pods[f"default/f{i}"]["node"] for i in range(2)} == {"a", "b"}
    assert all(pods[f"default/t{i}"]["phase"] == "Pending" for i in range(3))


@pytest.mark.parametrize("shards", SHARDS)
def test_a_quota_on_nvidia_gpu_counts_claimed_devices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    quota = """
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: quota, namespace: team}
spec:
  min: {nvidia.com/gpu: "3"}
  max: {nvidia.com/gpu: "3"}
---"""
    text = quota + device_class() + node("a") + resource_slice("a", 8)
    text += claim("two", 2, namespace="team") + claim("more", 2, namespace="team")
    text += pod("p", claim_name="two", namespace="team")
    text += pod("q", claim_name="more", namespace="team", at=1)
    data = run(tmp_path, capsys, text, shards)
    assert data["pods"]["team/p"]["phase"] == "Bound"
    q = data["pods"]["team/q"]
    assert q["phase"] == "Pending" and "quota" in q["reason"].lower()


@pytest.mark.parametrize("shards", SHARDS)
def test_devices_are_packed_so_that_a_larger_claim_still_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Two nodes of 2 devices: two 1-device pods share a node (the GPU policy packs),
    so the 2-device pod that comes after finds a whole node."""
    text = device_class() + node("a") + node("b")
    text += resource_slice("a", 2) + resource_slice("b", 2)
    text += claim_template("one", 1) + claim_template("two", 2)
    text += pod("s1", template="one") + pod("s2", template="one", at=1)
    text += pod("big", template="two", at=2)
    data = run(tmp_path, capsys, text, shards)
    pods = data["pods"]
    assert pods["default/s1"]["node"] == pods["default/s2"]["node"]
    assert pods["default/big"]["phase"] == "Bound"


@pytest.mark.parametrize("shards", SHARDS)
def test_allocation_mode_all_takes_every_device_of_a_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Two nodes of 4 H100s and one of 2 A100s: All of the H100s is 4 devices, a whole
    node; a second one takes the other node; a third waits."""
    text = device_class() + node("a") + node("b") + node("c")
    text += resource_slice("a", 4) + resource_slice("b", 4) + resource_slice("c", 2, model="A100")
    text += claim_template("all-h100", 0, selector=MODEL.format("H100"), mode="All")
    text += "".join(pod(f"p{i}", template="all-h100", at=i) for i in range(3))
    data = run(tmp_path, capsys, text, shards)
    pods = data["pods"]
    placed = [pods[f"default/p{i}"] for i in range(2)]
    assert {p["node"] for p in placed} == {"a", "b"}
    assert all(len(devices_of(p)) == 4 for p in placed)
    assert pods["default/p2"]["phase"] == "Pending"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            claim("c", 1, selector='device.attributes["gpu.example.com"].index > 1')
            + pod("p", claim_name="c"),
            "CEL selector",
        ),
        (
            resource_slice("b", 4) + claim("c", 0, mode="All") + pod("p", claim_name="c"),
            "allocationMode All matches nodes of 2, 4 devices",
        ),
        (pod("p", claim_name="missing"), "ResourceClaim default/missing is not in the scenario"),
        (claim("c", 1) + pod("p", claim_name="c") + pod("q", claim_name="c"), "used by pod"),
        (resource_slice("a", 1, driver="nic.example.com"), "2 drivers"),
    ],
)
def test_what_is_out_of_scope_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, message: str
) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(device_class() + node("a") + resource_slice("a", 2) + extra)
    with pytest.raises(SystemExit) as exited:
        main(["simulate", str(scenario), "--json"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "s.yaml" in err, err


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    sizes=st.lists(st.integers(0, 4), min_size=1, max_size=3),
    counts=st.lists(st.integers(1, 3), min_size=1, max_size=6),
    shards=st.sampled_from((1, 2)),
)
def test_no_device_is_given_twice_and_each_pod_gets_its_count_from_its_node(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sizes: list[int],
    counts: list[int],
    shards: int,
) -> None:
    text = device_class()
    for i, size in enumerate(sizes):
        text += node(f"n{i}") + resource_slice(f"n{i}", size)
    for i, count in enumerate(counts):
        text += claim(f"c{i}", count) + pod(f"p{i}", claim_name=f"c{i}", at=i)
    data = run(Path(tempfile.mkdtemp(dir=tmp_path)), capsys, text, shards)
    published = {(DRIVER, f"n{i}", f"gpu-{d}") for i, size in enumerate(sizes) for d in range(size)}
    taken: list[tuple[str, str, str]] = []
    for i, count in enumerate(counts):
        view = data["pods"][f"default/p{i}"]
        if view["phase"] != "Bound":
            continue
        devices = devices_of(view)
        assert len(devices) == count
        assert all(d in published and d[1] == view["node"] for d in devices), view
        taken += devices
    assert len(taken) == len(set(taken))
    # every pod that waits could not have fitted: no node has its count free
    free = {f"n{i}": size for i, size in enumerate(sizes)}
    for _, pool, _ in taken:
        free[pool] -= 1
    for i, count in enumerate(counts):
        if data["pods"][f"default/p{i}"]["phase"] == "Pending":
            assert max(free.values()) < count
