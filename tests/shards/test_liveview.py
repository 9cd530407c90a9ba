"""The live view's snapshots and endpoints (``shards.web``): what a replayed log shows
at 1 and 2 shards, at an offset, behind a token; the serving options ``replay``
refuses. The page itself in a browser: test_liveview_browser.py."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from events.filelog import FileLog
from events.types import Envelope
from shards.cli import main
from shards.replay import recorded_config, replay
from shards.web import sources
from shards.web.app import ViewError, add_routes
from shards.web.sources import LiveSource, ReplaySource
from tests.shards.scenario_text import gpu_node, gpu_pod

QUOTA = """
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: team, namespace: default}
spec:
  min: {nvidia.com/gpu: "6"}
  max: {nvidia.com/gpu: "8"}
---"""

# Two nodes of four cards; two one-card pods that stay where they are put (spread, one a
# node), then one that needs a whole node: it waits, with the report's answer.
SCENARIO = (
    QUOTA
    + gpu_node("n0", 4)
    + gpu_node("n1", 4)
    + gpu_pod("small-0", cards=1, at=0, migratable=False)
    + gpu_pod("small-1", cards=1, at=1, migratable=False)
    + gpu_pod("big", cards=4, at=10)
)
PROFILE = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: LeastAllocated
        resources: [{name: nvidia.com/gpu, weight: 1}]
"""


def record(directory: Path, shards: int) -> tuple[str, Any]:
    """The scenario simulated into a log; (its path, ``simulate --json``'s report)."""
    scenario = directory / "scenario.yaml"
    scenario.write_text(SCENARIO)
    config = directory / "spread.yaml"
    config.write_text(PROFILE)
    log = str(directory / f"run-{shards}.log")
    argv = ["simulate", str(scenario), "--config", str(config), "--shards", str(shards)]
    out = io.TextIOWrapper(io.BytesIO())
    with contextlib.redirect_stdout(out):
        assert main([*argv, "--log", log, "--json"]) == 0
    out.flush()
    return log, json.loads(out.buffer.getvalue())


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[str, Any]]:
    """The scenario recorded at 1 and 2 shards (once for the module)."""
    return {n: record(tmp_path_factory.mktemp(f"shards{n}"), n) for n in (1, 2)}


async def parts_of(path: str) -> list[list[Envelope]]:
    log = FileLog(path, readonly=True)
    try:
        return [await log.read(p, 0) for p in range(log.partitions)]
    finally:
        await log.close()


async def source_of(path: str) -> ReplaySource:
    parts = await parts_of(path)
    return ReplaySource(path, parts, recorded_config(parts[-1]), None)


@pytest.mark.parametrize("shards", [1, 2])
async def test_the_end_of_a_log_shows_nodes_cards_queue_and_quotas(
    logs: dict[int, tuple[str, Any]], shards: int
) -> None:
    path, report = logs[shards]
    state = await (await source_of(path)).state(None)
    assert [n["name"] for n in state["nodes"]] == ["n0", "n1"]
    holders = {
        h["pod"]: (n["name"], c["index"])
        for n in state["nodes"]
        for c in n["cards"]
        for h in c["holders"]
    }
    for pod in ("default/small-0", "default/small-1"):
        bound = report["pods"][pod]
        assert holders[pod] == (bound["node"], bound["devices"][0])
    statuses = sorted(c["status"] for n in state["nodes"] for c in n["cards"])
    assert statuses == ["full"] * 2 + ["idle"] * 6
    [pending] = state["queue"]
    assert pending["pod"] == "default/big"
    assert pending["reason"] == report["pods"]["default/big"]["reason"]
    if shards == 1:  # (with several, the router holds it: no shard's engine has it)
        assert pending["gpu"] == {"cards": 4, "milli": 1000}
    [quota] = state["quotas"]
    [gpu] = quota["resources"]
    assert (quota["namespace"], gpu) == (
        "default",
        {"name": "nvidia.com/gpu", "used": 2, "min": 6, "max": 8, "borrowed": 0},
    )
    assert state["summary"]["pending"] == 1
    assert any("PodBound pod=default/small-1" in d["text"] for d in state["decisions"])


async def test_a_one_shard_log_is_shown_at_each_offset_of_its_timeline(
    logs: dict[int, tuple[str, Any]],
) -> None:
    path, _ = logs[1]
    source = await source_of(path)
    points = (await source.timeline())["offsets"]
    bound = [p["offset"] for p in points if p["kind"] == "PodBound"]
    assert len(bound) == 2
    first = await source.state(bound[0])
    assert first["offset"] == bound[0]
    assert first["summary"]["bound"] == 1
    assert [d["offset"] for d in first["decisions"]][-1] == bound[0]
    before = await source.state(bound[0] - 1)
    assert before["summary"]["bound"] == 0
    assert (await source.state(None))["summary"]["bound"] == 2


async def test_a_log_of_several_shards_is_shown_at_its_end_only(
    logs: dict[int, tuple[str, Any]],
) -> None:
    path, _ = logs[2]
    source = await source_of(path)
    timeline = await source.timeline()
    assert timeline["offsets"] == []
    assert "2 shards" in timeline["note"]
    with pytest.raises(ViewError, match="at its end only"):
        await source.state(3)


async def test_the_endpoints_serve_the_page_and_ask_for_the_token(
    logs: dict[int, tuple[str, Any]],
) -> None:
    path, _ = logs[1]
    app = web.Application()
    add_routes(app, await source_of(path), token="s3cret")
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/api/state")).status == 401
        assert (await client.get("/api/timeline?token=wrong")).status == 401
        page = await client.get("/ui/?token=s3cret")
        assert page.status == 200
        assert "app.js" in await page.text()
        assert (await client.get("/api/state?token=s3cret")).status == 200
        auth = {"Authorization": "Bearer s3cret"}
        script = await client.get("/ui/app.js")  # (the page's files hold no data)
        assert script.status == 200
        assert script.headers["Content-Type"].startswith("text/javascript")
        assert (await client.get("/ui/../serve.py", headers=auth)).status == 404
        state = await client.get("/api/state", headers=auth)
        assert (await state.json())["queue"][0]["pod"] == "default/big"
        bad = await client.get("/api/state?offset=-1", headers=auth)
        assert bad.status == 400
        timeline = await client.get("/api/timeline", headers=auth)
        assert (await timeline.json())["offsets"]


@pytest.mark.parametrize("chunk", [3, 5000])
async def test_a_live_source_folds_the_bus_as_it_grows(
    logs: dict[int, tuple[str, Any]], chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running service's view: the log's report, read in chunks, and the engines."""
    monkeypatch.setattr(sources, "CHUNK", chunk)
    path, report = logs[1]
    log = FileLog(path, readonly=True)
    try:
        ended = await (await source_of(path)).state(None)
        engines = [replay(await log.read(0, 0)).engine]  # (a service's: its shards')
        engine_source = LiveSource(lambda: log, lambda: engines, 1)
        state = await engine_source.state(None)
        assert state["source"] == "live"
        assert [n["name"] for n in state["nodes"]] == ["n0", "n1"]
        assert [q["pod"] for q in state["queue"]] == ["default/big"]
        assert state["queue"][0]["reason"] == report["pods"]["default/big"]["reason"]
        assert state["summary"] == ended["summary"]
        assert (await engine_source.state(None))["summary"] == ended["summary"]  # read once
        with pytest.raises(ViewError):
            await engine_source.state(0)
    finally:
        await log.close()


@pytest.mark.parametrize(
    "extra",
    [["--listen", "127.0.0.1:0"], ["--serve", "--verify"], ["--serve", "--until", "3"]],
)
def test_replay_refuses_serving_options_it_would_ignore(
    logs: dict[int, tuple[str, Any]], capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    path, _ = logs[1]
    try:
        code = main(["replay", path, *extra])
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 2
    assert "--" in capsys.readouterr().err
