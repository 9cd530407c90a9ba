"""``shoal --version`` (issue #28, item 12)."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from shards.cli import main


def test_version_prints_the_installed_version_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out == f"shoal {version('shoal')}\n"
