"""Without matplotlib, ``--plot`` says how to install it: a name pip finds on PyPI
(``shoal`` is not published there), and the extra for a checkout (issue #28, item 12)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from events.errors import InputError
from loadtest.defragbench import _plot
from shards.cli import main

TRACE = Path(__file__).parent.parent / "fixtures" / "gputrace"
HINT = "needs matplotlib: pip install matplotlib (in a checkout of shoal: pip install -e '.[plot]')"


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails


@pytest.mark.usefixtures("no_matplotlib")
def test_fragmentation_plot_names_an_installable_package(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["loadtest", "fragmentation", "--trace", str(TRACE), "--workload", "tiny"]
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--plot", str(tmp_path / "p.png")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert HINT in err and "'shoal[plot]'" not in err, err


@pytest.mark.usefixtures("no_matplotlib")
def test_defrag_plot_names_an_installable_package(tmp_path: Path) -> None:
    with pytest.raises(InputError) as refused:
        _plot([], tmp_path / "p.png")
    assert HINT in str(refused.value)
