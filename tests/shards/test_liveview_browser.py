"""The live view in a real browser: ``shoal replay LOG --serve`` of a small GPU
scenario, opened in Debian's chromium through Playwright; the page shows the nodes, the
cards the pods hold and the pending pod's answer.

Chromium is /usr/bin/chromium (``apt-get install chromium``; ``.ci/run`` installs it),
or $SHOAL_CHROMIUM. Without it the test is skipped, unless SHOAL_BROWSER=1 (CI sets it):
then it fails. ``playwright install`` is never needed: the driver is in the wheel.

``python -m tests.shards.test_liveview_browser OUT_DIR`` takes the screenshots of
docs/liveview.md with the same setup.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.shards.test_liveview import record

CHROMIUM = os.environ.get("SHOAL_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DEADLINE_MS = 60_000
"""How long a page may take to show something (a busy machine; never a pass/fail
timing)."""


def browser_or_skip() -> None:
    if Path(CHROMIUM).exists():
        return
    if os.environ.get("SHOAL_BROWSER") == "1":
        pytest.fail(f"SHOAL_BROWSER=1 but there is no chromium at {CHROMIUM}")
    pytest.skip(
        f"no chromium at {CHROMIUM} (apt-get install chromium; SHOAL_BROWSER=1 requires it)"
    )


def shoal(*argv: str) -> list[str]:
    return [sys.executable, "-m", "shards.cli", *argv]


@contextlib.contextmanager
def serving(log: Path, *extra: str) -> Iterator[str]:
    """``shoal replay LOG --serve`` on a free port; yields the page's URL."""
    proc = subprocess.Popen(
        shoal("replay", log.name, "--serve", "--listen", "127.0.0.1:0", *extra),
        cwd=log.parent,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    found: list[str] = []
    seen: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            match = re.search(r"at (http://\S+/ui/)", line)
            if match and not found:
                found.append(match.group(1))
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        ready.wait(DEADLINE_MS / 1000)
        assert found, f"replay --serve did not say where it serves: {''.join(seen)!r}"
        yield found[0]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(30)
        if proc.stderr is not None:
            proc.stderr.close()


# examples/gpu-sharing.yaml, a quota, and two pods more: one that takes most of gpu-a's cpu (its
# idle cards are stranded then) and one that waits for four cards.
MORE = """
---
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: team, namespace: default}
spec:
  min: {nvidia.com/gpu: "10"}
  max: {nvidia.com/gpu: "12"}
---
apiVersion: v1
kind: Pod
metadata: {name: cpu-hog, namespace: default, annotations: {shoal.io/arrive-at: "4"}}
spec:
  containers: [{name: c, resources: {requests: {cpu: "25"}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: whole-5, namespace: default, annotations: {shoal.io/arrive-at: "5"}}
spec:
  containers: [{name: c, resources: {requests: {cpu: "8", nvidia.com/gpu: "4"}}}]
"""


def record_example(directory: Path, scenario: str) -> Path:
    """``scenario`` simulated into a log (in a process of its own)."""
    path = directory / "scenario.yaml"
    path.write_text(scenario)
    log = directory / "gpu-sharing.log"
    argv = ["simulate", str(path), "--log", str(log)]
    subprocess.run(shoal(*argv), capture_output=True, check=True)
    return log


def test_the_page_shows_the_cluster_and_the_pending_pods_answer(tmp_path: Path) -> None:
    browser_or_skip()
    from playwright.sync_api import sync_playwright

    path, report = record(tmp_path, 1)
    log = Path(path)
    reason = report["pods"]["default/big"]["reason"]
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with serving(log, "--ui-token-file", str(token)) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            page.goto(url + "?token=s3cret", timeout=DEADLINE_MS)  # (passed on to /api/)
            page.wait_for_selector("body[data-loaded=true]", timeout=DEADLINE_MS)
            names = page.locator("#nodes .node .name").all_inner_texts()
            assert names == ["n0", "n1"]
            row = page.locator('#queue tr[data-pod="default/big"]')
            row.wait_for(timeout=DEADLINE_MS)
            assert reason in row.inner_text()
            held = page.locator("#nodes .card.full").all_inner_texts()
            assert sorted(held) == ["#0 default/small-0", "#0 default/small-1"]
            assert page.locator("#quotas tbody tr").count() == 1
            assert not page.locator("#timeline").is_hidden()
        finally:
            browser.close()


def screenshots(out: Path) -> None:
    """The pictures of docs/liveview.md: examples/gpu-sharing.yaml and :data:`MORE` at
    its end, and the test's scenario at an earlier point of its timeline."""
    from playwright.sync_api import sync_playwright

    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        gpu = Path(tmp) / "gpu"
        gpu.mkdir()
        example = (root / "examples/gpu-sharing.yaml").read_text().rstrip().rstrip("-")
        gpu_log = record_example(gpu, example + MORE)
        other = Path(tmp) / "replay"
        other.mkdir()
        replay_log = Path(record(other, 1)[0])  # (before playwright runs its event loop)
        with sync_playwright() as p:
            _shoot(p, out, gpu_log, replay_log)


def _shoot(p: Any, out: Path, gpu_log: Path, replay_log: Path) -> None:
    browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
    try:
        for log, name, query in (
            (gpu_log, "liveview-gpu.png", ""),
            (replay_log, "liveview-replay.png", "?offset=8"),
        ):
            with serving(log) as url:
                page = browser.new_page(viewport={"width": 1100, "height": 640})
                page.goto(url + query, timeout=DEADLINE_MS)
                page.wait_for_selector("body[data-loaded=true]", timeout=DEADLINE_MS)
                page.screenshot(path=str(out / name), full_page=True)
                page.close()
    finally:
        browser.close()


if __name__ == "__main__":
    screenshots(Path(sys.argv[1]))
