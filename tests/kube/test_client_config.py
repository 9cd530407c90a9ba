"""Where the API client's configuration comes from: --host, --kubeconfig, $KUBECONFIG,
the in-cluster service account, ~/.kube/config, in that order, and which one was used
is logged (issue #28, item 11)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client

from shards.kube.client import KubeError, api_client
from tests.kube.apiserver import FakeApiServer


def _kubeconfig(path: Path, server: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty home, no $KUBECONFIG, not in a pod."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "home"


async def _host(**kwargs: str) -> str:
    api = await api_client(**kwargs)
    try:
        await client.CoreV1Api(api).list_node()  # it works, too
        return str(api.configuration.host)
    finally:
        await api.close()


async def test_home_kubeconfig_is_read_when_nothing_else_is_given(
    apiserver: FakeApiServer, home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="shards.kube.client")
    _kubeconfig(home / ".kube" / "config", apiserver.url)
    assert await _host() == apiserver.url
    assert f"from=~/.kube/config host={apiserver.url}" in caplog.text


async def test_kubeconfig_variable_comes_before_the_home_file_and_the_flag_before_both(
    apiserver: FakeApiServer,
    home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="shards.kube.client")
    _kubeconfig(home / ".kube" / "config", "http://127.0.0.1:1")
    variable = _kubeconfig(tmp_path / "variable.yaml", apiserver.url)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent.yaml'}:{variable}")
    assert await _host() == apiserver.url
    assert f"from=$KUBECONFIG {tmp_path / 'absent.yaml'}:{variable}" in caplog.text
    flag = _kubeconfig(tmp_path / "flag.yaml", apiserver.url.replace("127.0.0.1", "localhost"))
    assert await _host(kubeconfig=str(flag)) == apiserver.url.replace("127.0.0.1", "localhost")


async def test_a_pod_without_its_service_account_falls_back_to_the_home_file(
    apiserver: FakeApiServer, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As controller-runtime does: the service account is tried only in a pod, and a
    failed try goes on to ~/.kube/config."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "1")
    _kubeconfig(home / ".kube" / "config", apiserver.url)
    assert await _host() == apiserver.url


async def test_no_configuration_at_all_names_every_place_looked(home: Path) -> None:
    with pytest.raises(KubeError) as caught:
        await api_client()
    for place in ("--host", "--kubeconfig", "$KUBECONFIG", "service account", "~/.kube/config"):
        assert place in str(caught.value)
    with pytest.raises(KubeError, match=r"kubeconfig /nowhere \(--kubeconfig\): no such file"):
        await api_client(kubeconfig="/nowhere")
