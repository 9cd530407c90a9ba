"""``shoal extender`` against callers it should not serve: without a token or a client
certificate, with a body too large, hanging up mid-body, binding a pod it never judged;
and a large request does not hold up ``/healthz``."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import socket
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from events.errors import InputError
from events.memory import MemoryLog
from events.types import PodSpec
from shards import extendercmd
from shards.cli import build_parser
from shards.extenders.access import Access, check_exposure
from shards.extenders.core import ExtenderCore
from shards.extenders.server import ExtenderServer
from tests.shards.test_extender_server import (
    DEADLINE,
    args,
    free_port,
    pod,
    start,
    stop,
)

LIMIT = 100_000


def _call(
    url: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    context: ssl.SSLContext | None = None,
    timeout: float = DEADLINE,
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _filter_body(name: str = "web") -> bytes:
    return json.dumps(args(pod(name, "1"))).encode()


def test_every_verb_needs_the_bearer_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token-for-the-scheduler\n")
    s = start(tmp_path, "--token-file", str(token))
    url = f"http://127.0.0.1:{s.port}"
    try:
        for verb in ("filter", "prioritize", "bind"):
            assert _call(f"{url}/{verb}", _filter_body())[0] == 401
            wrong = {"Authorization": "Bearer s3cret-token-for-the-schedulerX"}
            assert _call(f"{url}/{verb}", _filter_body(), wrong)[0] == 401
        right = {"Authorization": "Bearer s3cret-token-for-the-scheduler"}
        assert _call(f"{url}/filter", _filter_body(), right)[0] == 200
        assert _call(f"{url}/healthz")[0] == 200  # probes need no token
    finally:
        stop(s)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a serving certificate for 127.0.0.1 and a client certificate it signed, and
    a client certificate of another CA (openssl, EC keys: quick)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make certificates with")
    d = tmp_path_factory.mktemp("pki")

    def openssl(*argv: str) -> None:
        subprocess.run(["openssl", *argv], cwd=d, check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", *ec, "-days", "2", "-subj", f"/CN={ca}", "-keyout", f"{ca}.key",
                "-out", f"{ca}.crt")  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, ca, ext in (("server", "ca", ["-extfile", "san.ext"]), ("client", "ca", []),
                          ("stranger", "other-ca", [])):  # fmt: skip
        openssl("req", *ec, "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
                "-CAcreateserial", "-days", "2", *ext, "-out", f"{name}.crt")  # fmt: skip
    return d


def _client_context(pki: Path, cert: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert is not None:
        context.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    return context


def test_mutual_tls_as_kube_schedulers_tls_config_speaks_it(tmp_path: Path, pki: Path) -> None:
    """kube-scheduler's ``tlsConfig``: ``caFile`` verifies this server, ``certFile`` and
    ``keyFile`` are its client certificate."""
    s = start(
        tmp_path,
        *("--tls-cert", str(pki / "server.crt"), "--tls-key", str(pki / "server.key")),
        *("--client-ca", str(pki / "ca.crt")),
    )
    url = f"https://127.0.0.1:{s.port}"
    try:
        assert (
            _call(f"{url}/filter", _filter_body(), context=_client_context(pki, "client"))[0] == 200
        )
        # no client certificate: the handshake passes (probes), every verb is refused
        assert _call(f"{url}/filter", _filter_body(), context=_client_context(pki, None))[0] == 401
        assert _call(f"{url}/healthz", context=_client_context(pki, None))[0] == 200
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            _call(f"{url}/filter", _filter_body(), context=_client_context(pki, "stranger"))
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            _call(f"http://127.0.0.1:{s.port}/filter", _filter_body())  # plain HTTP
    finally:
        stop(s)


@pytest.mark.parametrize(
    "flags",
    [
        ["--listen", "0.0.0.0:0"],
        ["--tls-cert", "x.crt"],
        ["--client-ca", "ca.crt"],
        ["--token-file", "/nonexistent/token"],
        ["--max-body", "0"],
    ],
)
async def test_an_exposed_or_half_configured_server_does_not_start(flags: list[str]) -> None:
    """Exit 2 and one line naming the flag (the command line turns an InputError into
    that); nothing is served."""
    parsed = build_parser().parse_args(["extender", *flags])
    with pytest.raises(InputError) as refused:
        async with asyncio.timeout(DEADLINE):
            await extendercmd.run(parsed)
    assert refused.value.location == flags[0]


@pytest.mark.parametrize(
    ("host", "access", "tls", "allowed", "warning"),
    [
        ("127.0.0.1", Access(), False, False, ""),
        ("::1", Access(), False, False, ""),
        ("localhost", Access(), False, False, ""),
        ("0.0.0.0", Access(), False, True, ""),
        ("10.0.0.1", Access(client_certs=True), True, False, ""),
        ("10.0.0.1", Access(token=b"t"), True, False, ""),
        ("10.0.0.1", Access(token=b"t"), False, False, "clear text"),
    ],
)
def test_who_may_be_served_where(
    host: str, access: Access, tls: bool, allowed: bool, warning: str
) -> None:
    said = check_exposure(host, access, tls, allowed)
    assert (warning in said) if warning else said == ""


def _raw(port: int, head: bytes, body: bytes = b"", hang_up: bool = False) -> bytes:
    """Send ``head`` and ``body`` as they are; the answer (nothing if ``hang_up``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as sock:
        sock.sendall(head + body)
        if hang_up:
            return b""
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


async def _serve(server: ExtenderServer) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def test_a_body_over_the_limit_is_refused_before_it_is_read() -> None:
    server = ExtenderServer(ExtenderCore(), MemoryLog(), max_body=LIMIT)
    runner, port = await _serve(server)
    try:
        # declared too large, and not one byte of it sent: answered at once
        head = (
            b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000\r\n\r\n"
        )
        assert (await asyncio.to_thread(_raw, port, head)).startswith(b"HTTP/1.1 413")
        # undeclared (chunked): stopped at the limit
        chunked = b"POST /bind HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        piece = b"%x\r\n%s\r\n" % (50_000, b" " * 50_000)
        answer = await asyncio.to_thread(_raw, port, chunked, piece * 3)
        assert answer.startswith(b"HTTP/1.1 413")
        url = f"http://127.0.0.1:{port}/filter"
        assert (await asyncio.to_thread(_call, url, _filter_body()))[0] == 200
    finally:
        await runner.cleanup()
        await server.close()


async def test_a_client_hanging_up_mid_body_is_one_quiet_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = ExtenderServer(ExtenderCore(), MemoryLog())
    runner, port = await _serve(server)
    try:
        head = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
        with caplog.at_level(logging.INFO, logger="shards.extenders.server"):
            await asyncio.to_thread(_raw, port, head, b"{" * 1000, True)
            async with asyncio.timeout(DEADLINE):
                while not server.counters.get("hung_up") and not server.counters["error"]:
                    await asyncio.sleep(0.01)
        assert server.counters["error"] == 0
        lines = [r for r in caplog.records if r.name == "shards.extenders.server"]
        assert len(lines) == 1 and lines[0].levelno == logging.INFO and not lines[0].exc_info
        assert "hung up" in lines[0].getMessage()
    finally:
        await runner.cleanup()
        await server.close()


class _Parked(ExtenderCore):
    """Judging parks on the pod until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.parked = threading.Event()
        self.release = threading.Event()

    def learn_pod(self, doc: Mapping[str, Any], now: int) -> PodSpec:
        self.parked.set()
        self.release.wait(DEADLINE)
        return super().learn_pod(doc, now)


async def test_healthz_answers_while_a_request_is_judged() -> None:
    core = _Parked()
    server = ExtenderServer(core, MemoryLog())
    runner, port = await _serve(server)
    url = f"http://127.0.0.1:{port}"

    def meanwhile() -> tuple[int | str, int]:
        judged: list[int] = []
        big = threading.Thread(
            target=lambda: judged.append(_call(f"{url}/filter", _filter_body())[0])
        )
        big.start()
        try:
            assert core.parked.wait(DEADLINE)
            try:
                health: int | str = _call(f"{url}/healthz", timeout=20)[0]
            except OSError as exc:  # a time-out: the event loop is held
                health = repr(exc)
        finally:
            core.release.set()
            big.join(DEADLINE)
        return health, judged[0]

    try:
        assert await asyncio.to_thread(meanwhile) == (200, 200)
    finally:
        core.release.set()
        await runner.cleanup()
        await server.close()


async def test_bind_takes_only_pods_it_judged_onto_nodes_it_passed() -> None:
    server = ExtenderServer(ExtenderCore(), MemoryLog())
    runner, port = await _serve(server)

    async def post(verb: str, body: Any) -> Any:
        url = f"http://127.0.0.1:{port}/{verb}"
        status, answer = await asyncio.to_thread(_call, url, json.dumps(body).encode())
        assert status == 200, answer
        return json.loads(answer)

    async def bind(name: str, node: str, uid: str | None = None) -> str:
        body = {"PodName": name, "PodNamespace": "default", "PodUID": uid or f"uid-{name}",
                "Node": node}  # fmt: skip
        error: str = (await post("bind", body))["Error"]
        return error

    try:
        assert "not filtered or prioritized" in await bind("stranger", "big")
        result = await post("filter", args(pod("web", "4")))  # fits big only
        assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["big"]
        assert "node small is not one" in await bind("web", "small")
        assert "uid other" in await bind("web", "big", uid="other")
        assert await bind("web", "big") == ""
        assert "not filtered or prioritized" in await bind("web", "big")  # bound: once
        # prioritize alone (a configuration without filterVerb): the nodes it scored
        await post("prioritize", args(pod("db", "1")))
        assert await bind("db", "small") == ""
        assert server.counters["bind_refused"] == 4
    finally:
        await runner.cleanup()
        await server.close()
