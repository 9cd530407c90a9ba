"""A quota's ``nvidia.com/gpu`` bounds every request that takes a card, shares
included (issue #28, item 2), at 1, 2 and 4 shards, each run replayed with ``--verify``.

The rule (:mod:`engine.model.quota`): whole cards and HAMi vGPUs count one card each
(their ``nvidia.com/gpu``, whatever ``gpucores``/``gpumem``), as CapacityScheduling
counts them; a milli-card share (``shoal.io/gpu-milli``, Koordinator's ``gpu-core``
below 100) counts its part of a card. The oracle here is written out independently of
the engine's code.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.pools import POOL_LABEL, Sharding
from events.memory import MemoryLog
from events.types import Envelope, PodSubmitted, QuotaDefined, QuotaSpec
from shards.inputs.scenario import Scenario, TimedEvent
from shards.replay import replay
from shards.simulate import simulate
from tests.builders import make_node, make_pod
from tests.shards.coordinator_kit import at, shoal, simulated
from tests.shards.scenario_text import node

SHARDS = (1, 2, 4)


def quota(ns: str, gpus: int) -> str:
    return f"""
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: ElasticQuota
metadata: {{name: quota, namespace: {ns}}}
spec:
  min: {{nvidia.com/gpu: "{gpus}"}}
  max: {{nvidia.com/gpu: "{gpus}"}}
---"""


def gpu_pod(name: str, ns: str, requests: dict[str, str]) -> str:
    text = ", ".join(f'{k}: "{v}"' for k, v in requests.items())
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}}}
spec:
  containers:
  - name: c
    resources: {{requests: {{cpu: "1", {text}}}, limits: {{{text}}}}}
---"""


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize(
    "requests",
    [
        {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "99"},  # the pods
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "10"},
        {"nvidia.com/gpu": "1"},
    ],
    ids=["hami-cores", "hami-memory", "device-plugin"],
)
def test_a_hami_vgpu_counts_one_card_in_the_quota(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int, requests: dict[str, str]
) -> None:
    """Four pods of one card each (HAMi shares or whole cards) in a namespace allowed
    two cards, on two nodes of two cards: two run, two wait for the quota."""
    text = node("a", gpu=2, labels={POOL_LABEL: "pa"}) + node("b", gpu=2, labels={POOL_LABEL: "pb"})
    text += quota("team", 2)
    text += "".join(gpu_pod(f"p{i}", "team", requests) for i in range(4))
    data, _ = shoal(tmp_path, capsys, text, shards)
    pods = data["pods"]
    running = [k for k, v in pods.items() if v["phase"] == "Bound"]
    assert len(running) == 2, pods
    waiting = [v["reason"] for v in pods.values() if v["phase"] == "Pending"]
    assert all("elastic quota team" in r for r in waiting), waiting


@pytest.mark.parametrize("shards", SHARDS)
def test_milli_card_shares_count_their_part_of_a_card(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """A namespace allowed one card runs four 250m shares (one card between them), and
    a fifth waits, though the cluster has cards to spare."""
    text = node("a", gpu=2, labels={POOL_LABEL: "pa"}) + node("b", gpu=2, labels={POOL_LABEL: "pb"})
    text += quota("team", 1)
    text += "".join(gpu_pod(f"p{i}", "team", {"shoal.io/gpu-milli": "250"}) for i in range(5))
    data, _ = shoal(tmp_path, capsys, text, shards)
    phases = sorted(v["phase"] for v in data["pods"].values())
    assert phases == ["Bound"] * 4 + ["Pending"]


# ------------------------------------------------------------------------- the property


def _one_shard(events: list[TimedEvent]) -> dict[str, Any]:
    """One engine (no coordinator): each pod's view, the run replayed with verify."""

    async def go() -> tuple[dict[str, Any], list[Envelope]]:
        log = MemoryLog()
        result = await simulate(Scenario(events=events), log)
        result.cluster.check_invariants()
        return result.report.to_json(), await log.read(0, 0)

    data, records = asyncio.run(go())
    assert replay(records, verify=True).mismatch is None
    views: dict[str, Any] = data["pods"]
    return views


_CONVENTIONS = st.one_of(
    st.tuples(st.just("device"), st.integers(1, 2), st.just(0)),
    st.tuples(st.just("hami"), st.integers(1, 2), st.integers(0, 100)),
    st.tuples(st.just("shoal"), st.just(1), st.integers(1, 1000)),
    st.tuples(st.just("koordinator"), st.just(1), st.sampled_from([10, 30, 50, 99, 100, 200])),
)


def _requests(convention: str, cards: int, share: int) -> dict[str, int]:
    if convention == "device":
        return {"nvidia.com/gpu": cards}
    if convention == "hami":
        return {"nvidia.com/gpu": cards, "nvidia.com/gpucores": share}
    if convention == "shoal":
        return {"shoal.io/gpu-milli": share}
    return {"koordinator.sh/gpu-core": share}


def _milli(convention: str, cards: int, share: int) -> int:
    """Milli-cards a pod counts in quotas, by the documented rule."""
    if convention in ("device", "hami"):
        return 1000 * cards
    if convention == "shoal":
        return share
    return share * 10


@settings(max_examples=12, deadline=None)
@given(
    shards=st.sampled_from(SHARDS),
    cards=st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=3),
    limit=st.integers(1, 4),
    pods=st.lists(st.tuples(_CONVENTIONS, st.booleans()), min_size=1, max_size=10),
)
def test_a_quota_max_is_never_exceeded_however_cards_are_shared(
    shards: int, cards: list[int], limit: int, pods: list[tuple[tuple[str, int, int], bool]]
) -> None:
    nodes = [
        make_node(f"n{i}").cpu("64").gpu(n).label(POOL_LABEL, f"p{i}").added()
        for i, n in enumerate(cards)
    ]
    spec = QuotaSpec(
        namespace="team",
        name="quota",
        min={"nvidia.com/gpu": limit},
        max={"nvidia.com/gpu": limit},
    )
    submitted: list[PodSubmitted] = []
    counted: dict[str, int] = {}
    for i, ((convention, n, share), ours) in enumerate(pods):
        ns = "team" if ours else "other"
        builder = make_pod(f"p{i}", ns).cpu("1")
        builder.fields["requests"].update(_requests(convention, n, share))
        submitted.append(builder.submitted())
        if ours:
            counted[f"team/p{i}"] = _milli(convention, n, share)
    events = at(0, [*nodes, QuotaDefined(quota=spec)]) + at(1, submitted, order=100)
    if shards == 1:
        views = _one_shard(events)
    else:
        pools = tuple((f"p{i}", i % shards) for i in range(len(cards)))
        data, _ = simulated(events, Sharding(shards=shards, pools=pools))
        views = data["pods"]
    used = sum(m for key, m in counted.items() if views[key]["phase"] == "Bound")
    assert used <= 1000 * limit, (used, views)
