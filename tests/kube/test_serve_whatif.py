"""``shoal whatif JOB.yaml --serve URL``: a running ``shoal serve`` dry-runs a job on a
copy of its state (``POST /api/whatif``), and the job, then really submitted, lands
where the dry run said; the endpoint's refusals and the client's one-line errors."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from engine.model.pools import POOL_LABEL
from events.errors import InputError
from shards import dryruncmd, dryrunserve
from shards.cli import build_parser
from shards.dryrunserve import MAX_JOB_BYTES
from shards.serve import ServeOptions, Service
from tests.kube.apiserver import FakeApiServer
from tests.kube.test_ingest import eventually, node, pod
from tests.kube.test_serve import running

TOKEN = "s3cret"


def _cluster(apiserver: FakeApiServer) -> None:
    """Two 4-cpu nodes, one pool each (a shard each at 2 shards); pods another
    scheduler bound take 3 cpu of n1 (the one with disk=ssd) and 1 of n2."""
    for name, pool in (("n1", "a"), ("n2", "b")):
        item = node(name)
        item["metadata"]["labels"][POOL_LABEL] = pool
        if name == "n1":
            item["metadata"]["labels"]["disk"] = "ssd"
        apiserver.put("Node", item)
    for name, where, cpu in (("busy", "n1", "3"), ("run2", "n2", "1")):
        running_pod = _cpu(pod(name, node_name=where, scheduler="other"), cpu)
        running_pod["status"]["phase"] = "Running"
        apiserver.put("Pod", running_pod)


def _cpu(obj: dict[str, Any], cpu: str) -> dict[str, Any]:
    obj["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
    return obj


def _job() -> list[dict[str, Any]]:
    """Each pod has one node it can go to, whatever the order: 3 cpu only n2 has free,
    1 cpu on an ssd node (n1), and 100 cpu no node has."""
    big = _cpu(pod("j-big"), "3")
    ssd = _cpu(pod("j-ssd"), "1")
    ssd["spec"]["nodeSelector"] = {"disk": "ssd"}
    huge = _cpu(pod("j-huge"), "100")
    return [{"apiVersion": "v1", "kind": "Pod", **p} for p in (big, ssd, huge)]


def _write(tmp_path: Path, docs: list[dict[str, Any]]) -> str:
    path = tmp_path / "job.yaml"
    path.write_text("\n---\n".join(json.dumps(d) for d in docs))
    return str(path)


async def _whatif(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    args = build_parser().parse_args(["whatif", "--quiet", *argv])
    assert await dryruncmd.run(args) == 0
    return capsys.readouterr().out


async def _settled(service: Service) -> None:
    """The service's shards hold the pods another scheduler bound."""

    def held() -> bool:
        pods = {key for w in service.workers.values() for key in w.engine.pods}
        return {"default/busy", "default/run2"} <= pods

    await eventually(held, timeout=20)


@pytest.mark.parametrize("shards", [1, 2])
async def test_whatif_against_serve_agrees_with_the_real_submission(
    apiserver: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    _cluster(apiserver)
    job = _job()
    path = _write(tmp_path, job)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    async with running(apiserver, shards=shards, ui_token=TOKEN) as service:
        await _settled(service)
        out = await _whatif(
            [path, "--serve", service.url, "--token-file", str(token), "--json"], capsys
        )
        answer = json.loads(out)
        said = {row["pod"]: row for row in answer["pods"]}
        assert answer["source"] == "live" and answer["shards"] == shards
        assert "shoal.io/runtime" in answer["note"]
        assert {key: row["node"] for key, row in said.items()} == {
            "default/j-big": "n2",
            "default/j-ssd": "n1",
            "default/j-huge": None,
        }
        assert said["default/j-big"]["wait_seconds"] == 0
        assert "Insufficient cpu" in said["default/j-huge"]["reason"]
        # the dry run left the cluster and the log alone: nothing of the job exists
        assert apiserver.get("Pod", "j-big", "default") is None
        assert not any("default/j-big" in w.engine.pods for w in service.workers.values())

        for obj in job:
            apiserver.put("Pod", obj)

        def bound(name: str) -> str:
            found = apiserver.get("Pod", name, "default") or {}
            return str(found.get("spec", {}).get("nodeName") or "")

        await eventually(lambda: bool(bound("j-big") and bound("j-ssd")), timeout=20)
        assert {"default/j-big": bound("j-big"), "default/j-ssd": bound("j-ssd")} == {
            "default/j-big": "n2",
            "default/j-ssd": "n1",
        }
        assert bound("j-huge") == ""

        # asked again, the service's state now holds the job: the same pods again
        # find no room (the table form)
        again = _write(tmp_path, [_rename(d, "k-") for d in job])
        text = await _whatif([again, "--serve", service.url, "--token-file", str(token)], capsys)
        assert f"state, {shards} shard{'s' if shards > 1 else ''}: 0 of 3 pods placed" in text
        assert "default/k-big" in text and "Insufficient cpu" in text


def _rename(doc: dict[str, Any], prefix: str) -> dict[str, Any]:
    meta = dict(doc["metadata"], name=prefix + doc["metadata"]["name"].removeprefix("j-"))
    return {**doc, "metadata": meta}


async def test_whatif_refuses_a_wrong_token_a_job_too_large_and_a_second_at_once(
    apiserver: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cluster(apiserver)
    path = _write(tmp_path, _job())
    wrong = tmp_path / "wrong"
    wrong.write_text("nope")
    async with running(apiserver, ui_token=TOKEN) as service, aiohttp.ClientSession() as session:
        url = f"{service.url}/api/whatif"
        async with session.post(url, data=b"{}") as response:
            assert response.status == 401
        big = io.BytesIO(b"#" * (MAX_JOB_BYTES + 1))
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with session.post(url, data=big, headers=headers) as response:
            assert response.status == 413
        async with session.post(url, data=b"kind: Nope\n", headers=headers) as response:
            assert response.status == 400
            assert "job.yaml: document 1" in await response.text()
        with pytest.raises(InputError, match="refused the token"):
            await dryruncmd.run(_args([path, "--serve", service.url, "--token-file", str(wrong)]))
        with pytest.raises(InputError, match="asks for a token"):
            await dryruncmd.run(_args([path, "--serve", service.url]))

        # one dry run at a time: a second while one runs is told to come back
        entered, release = threading.Event(), threading.Event()

        def held(*_: object) -> dict[str, object]:
            entered.set()
            release.wait(30)
            return {"pods": []}

        monkeypatch.setattr(dryrunserve, "answer", held)
        body = Path(path).read_bytes()
        first = asyncio.create_task(session.post(url, data=body, headers=headers))
        try:
            await eventually(entered.is_set)
            async with session.post(url, data=body, headers=headers) as response:
                assert response.status == 429
        finally:
            release.set()
        async with await first as response:
            assert response.status == 200


async def test_whatif_waits_for_pods_that_say_when_they_end(
    apiserver: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A running pod with shoal.io/runtime ends that long after it was bound; one
    without runs on: the job pod that needs the first's room waits for it, the one that
    would need the second's never goes."""
    for name in ("n1", "n2"):
        apiserver.put("Node", node(name))
    for name, where, runtime in (("ends", "n1", "600"), ("stays", "n2", "")):
        obj = _cpu(pod(name, node_name=where, scheduler="other"), "3")
        obj["status"]["phase"] = "Running"
        if runtime:
            obj["metadata"]["annotations"] = {"shoal.io/runtime": runtime}
        apiserver.put("Pod", obj)
    job = [{"apiVersion": "v1", "kind": "Pod", **_cpu(pod(n), "3")} for n in ("first", "second")]
    async with running(apiserver) as service:
        await eventually(lambda: "default/stays" in service.workers[0].engine.pods, timeout=20)
        await eventually(lambda: "default/ends" in service.workers[0].engine.pods, timeout=20)
        out = await _whatif([_write(tmp_path, job), "--serve", service.url, "--json"], capsys)
    said = {row["pod"]: row for row in json.loads(out)["pods"]}
    assert said["default/first"]["node"] == "n1"
    assert 0 < said["default/first"]["wait_seconds"] <= 600
    assert said["default/second"]["node"] is None
    assert "Insufficient cpu" in said["default/second"]["reason"]


def _args(argv: list[str]) -> Any:
    return build_parser().parse_args(["whatif", "--quiet", *argv])


def test_only_a_process_with_the_whole_view_dry_runs() -> None:
    assert Service(ServeOptions(role="all", shards=2)).whatif_refusal() is None
    assert (
        Service(ServeOptions(role="coordinator", shards=2, bus="file:x")).whatif_refusal() is None
    )
    refusal = Service(ServeOptions(role="shard", shards=2, bus="file:x")).whatif_refusal()
    assert refusal is not None and "--role coordinator" in refusal
    refusal = Service(ServeOptions(role="binder", bus="file:x")).whatif_refusal()
    assert refusal is not None and "--role shard" in refusal


@pytest.fixture
async def not_serve() -> AsyncIterator[str]:
    """An HTTP server that is not shoal serve: 404 everywhere but /slow, which answers
    only once the test is over."""

    done = asyncio.Event()

    async def slow(_: web.Request) -> web.Response:
        await done.wait()
        return web.Response(text="late")

    app = web.Application()
    app.router.add_post("/slow/api/whatif", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    done.set()
    await runner.cleanup()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_whatif_client_errors_are_one_line(tmp_path: Path, not_serve: str) -> None:
    path = _write(tmp_path, _job())
    cases = [
        (["--serve", "ftp://somewhere"], "expected http://HOST:PORT"),
        (["--serve", "not a url"], "expected http://HOST:PORT"),
        (["--serve", f"http://127.0.0.1:{_closed_port()}"], "is not answering"),
        (["--serve", not_serve], "is not a shoal serve"),
        (["--serve", not_serve, "--at", "3"], "its state now"),
    ]
    for argv, expected in cases:
        with pytest.raises(InputError, match=expected) as caught:
            await dryruncmd.run(_args([path, *argv]))
        assert "\n" not in str(caught.value)
    with pytest.raises(InputError, match=r"did not answer within 0\.3s"):
        await dryruncmd.run(_args([path, "--serve", f"{not_serve}/slow", "--timeout", "0.3"]))


async def test_whatif_says_whom_the_job_preempts_and_the_cluster_agrees(
    apiserver: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two low-priority pods fill n1; n2 holds a high-priority one: a high-priority job
    pod that needs a whole node can only have n1, by preempting both."""
    classes = [
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", **c}
        for c in (
            {"metadata": {"name": "low"}, "value": 100},
            {"metadata": {"name": "high"}, "value": 1000},
        )
    ]
    for c in classes:
        apiserver.put(
            "PriorityClass", {k: v for k, v in c.items() if k not in ("apiVersion", "kind")}
        )
    for name in ("n1", "n2"):
        apiserver.put("Node", node(name, cpu="2"))
    for name, at, level in (
        ("low-1", "n1", "low"),
        ("low-2", "n1", "low"),
        ("mid", "n2", "high"),
    ):
        obj = pod(name, node_name=at, priority_class=level)
        obj["status"]["phase"] = "Running"
        apiserver.put("Pod", obj)
    urgent = _cpu(pod("urgent", priority_class="high"), "2")
    job = [*classes, {"apiVersion": "v1", "kind": "Pod", **urgent}]
    async with running(apiserver) as service:
        await eventually(
            lambda: (
                {"default/low-1", "default/low-2", "default/mid"}
                <= set(service.workers[0].engine.pods)
            ),
            timeout=20,
        )
        out = await _whatif([_write(tmp_path, job), "--serve", service.url, "--json"], capsys)
        said = json.loads(out)["pods"][0]
        assert said["node"] == "n1"
        assert sorted(p["pod"] for p in said["preempts"]) == ["default/low-1", "default/low-2"]
        apiserver.put("Pod", urgent)

        def where(name: str) -> str:
            found = apiserver.get("Pod", name, "default") or {}
            return str(found.get("spec", {}).get("nodeName") or "")

        def terminating() -> list[str]:
            return [
                name
                for name in ("low-1", "low-2", "mid")
                if (apiserver.get("Pod", name, "default") or {})
                .get("metadata", {})
                .get("deletionTimestamp")
            ]

        await eventually(lambda: len(terminating()) == 2, timeout=20)
        assert terminating() == ["low-1", "low-2"]
        for name in terminating():  # the kubelet, done with them
            apiserver.remove("Pod", name, "default")
        await eventually(lambda: bool(where("urgent")), timeout=20)
        assert where("urgent") == "n1"
