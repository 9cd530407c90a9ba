"""checkov in a virtual environment of its own, outside the checkout, built once.

checkov pins dozens of packages (boto3, networkx, cyclonedx...) that the project does
not need and that would constrain its own test extras, so it is not among them. The
first run creates ``${XDG_CACHE_HOME:-~/.cache}/shoal/checkov-VERSION`` and installs the
pinned version into it, printing each step to the terminal (a few minutes on a slow
machine); later runs reuse it. A file lock keeps two test processes from building it
at once; a half-built environment (no ``.complete`` marker) is thrown away and rebuilt.

``checkov_binary()`` raises ``CheckovUnavailable`` only when PyPI cannot be reached;
any other failure of the install is an error, so that a broken pin shows up as one.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

VERSION = "3.3.30"
INSTALL_TIMEOUT_S = 1800
UNREACHABLE = (
    "NewConnectionError",
    "Max retries exceeded",
    "Connection refused",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "(from versions: none)",  # what pip says when no index answered at all
)
"""Signs in pip's output that the index could not be reached (a pinned version missing
from an index that answered, "from versions: 3.3.29, ...", is an error, not a reason
to skip)."""


class CheckovUnavailable(Exception):
    """checkov could not be installed because its package index is out of reach."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shoal" / f"checkov-{VERSION}"


def _say(message: str) -> None:
    # the real terminal: pytest captures sys.stderr, and a silent wait of minutes
    # looks like a hang
    stream = sys.__stderr__ or sys.stderr
    print(f"[checkov {VERSION}] {message}", file=stream, flush=True)


_unavailable: list[CheckovUnavailable] = []
"""Set once an install found PyPI out of reach: the other tests of this run skip at
once instead of trying again."""


def checkov_binary() -> Path:
    """The path of the ``checkov`` executable, installing it first if need be."""
    if _unavailable:
        raise _unavailable[0]
    try:
        return _install()
    except CheckovUnavailable as exc:
        _unavailable.append(exc)
        raise


def _install() -> Path:
    root = cache_dir()
    binary = root / "bin" / "checkov"
    marker = root / ".complete"
    if marker.exists() and binary.exists():
        return binary
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"checkov-{VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it
        if marker.exists() and binary.exists():
            return binary
        if root.exists():
            _say(f"removing a half-built environment at {root}")
            shutil.rmtree(root)
        started = time.monotonic()
        _say(f"one-time install into {root} (reused by later runs)")
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
        _say("installing checkov and its dependencies from PyPI...")
        result = subprocess.run(
            [
                str(root / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--progress-bar",
                "off",
                f"checkov=={VERSION}",
            ],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            output = result.stdout + result.stderr
            shutil.rmtree(root, ignore_errors=True)
            if any(sign in output for sign in UNREACHABLE):
                raise CheckovUnavailable(f"PyPI unreachable: {output.strip().splitlines()[-1]}")
            raise RuntimeError(f"installing checkov=={VERSION} failed:\n{output[-4000:]}")
        marker.write_text(f"{VERSION}\n")
        _say(f"installed in {time.monotonic() - started:.0f} s")
    return binary
