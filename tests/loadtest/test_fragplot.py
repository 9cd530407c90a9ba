"""The fragmentation plot: one panel zoomed around 100% arrival, each policy's result
and spread over seeds in the legend, the published FGD point on the 100% line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loadtest.fragplot import ZOOM, curves, plot, published_point
from loadtest.fragreport import published
from loadtest.tracefiles import BUNDLED

WORKLOAD = "default"


def _run(policy: str, seed: int, level: float, idle: float) -> dict[str, Any]:
    """A run whose allocation follows the arrival up to ``level`` and stays there."""
    curve = [float(min(k, level)) for k in range(131)]
    return {
        "workload": WORKLOAD,
        "policy": policy,
        "seed": seed,
        "unallocated_pct_at_100": idle,
        "alloc_pct_at_130": level,
        "curve": curve,
    }


# fgd: seeds at 95 and 96 (idle 5 and 4); random: 86 and 88 (idle 14 and 12)
RESULTS = [
    _run("random", 1, 86.0, 14.0),
    _run("random", 2, 88.0, 12.0),
    _run("fgd", 1, 95.0, 5.0),
    _run("fgd", 2, 96.0, 4.0),
]
# the paper's FGD on default: 95.227 allocated at 100% arrival, std 0.106 over 10 seeds
PAPER = ({(WORKLOAD, "fgd", 100): 95.227}, {(WORKLOAD, "fgd", 100): 0.106})


def test_curves_are_means_over_seeds_least_idle_first() -> None:
    fgd, rand = curves(RESULTS, WORKLOAD)
    assert (fgd.policy, fgd.seeds, rand.policy) == ("fgd", 2, "random")
    assert (fgd.mean[100], fgd.low[100], fgd.high[100]) == (95.5, 95.0, 96.0)
    assert fgd.mean[90] == 90.0  # everything placed so far
    # std of 4 and 5 = sqrt(0.5) = 0.707; of 12 and 14 = sqrt(2) = 1.414
    assert fgd.label == "fgd: 4.50 ± 0.71"
    assert rand.label == "random: 13.00 ± 1.41"


def test_runs_with_moves_get_a_curve_per_budget() -> None:
    """Budgets are not merged into one curve: each is a curve of its own, named as the
    table names it."""
    moved = [
        {**_run("shoal", seed, level, 100.0 - level), "moves_budget_pct": budget}
        for seed in (1, 2)
        for budget, level in ((0, 95.0), (2, 97.0))
    ]
    two, none = curves(moved, WORKLOAD)
    assert (two.policy, two.seeds, two.mean[100]) == ("shoal 2%", 2, 97.0)
    assert (none.policy, none.seeds, none.mean[100]) == ("shoal 0%", 2, 95.0)


def test_the_published_fgd_point_comes_from_the_bundled_trace() -> None:
    means, stds = published(BUNDLED), published(BUNDLED, "alloc_pct_std")
    assert published_point(WORKLOAD, means, stds) == (95.227, 0.106)
    assert published_point("mine", means, stds) is None


def test_the_plot_is_one_zoomed_panel_with_the_values_in_its_legend(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    fig = plot(RESULTS, tmp_path / "plot.png", *PAPER)
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (panel,) = [ax for ax in fig.axes if ax.get_legend() is not None]
    assert panel.get_xlim() == ZOOM == (90, 105)
    vertical = [line for line in panel.get_lines() if list(line.get_xdata()) == [100, 100]]
    assert vertical, "a line at 100% arrival"
    legend = [t.get_text() for t in panel.get_legend().get_texts()]
    assert legend == [
        "fgd: 4.50 ± 0.71",
        "random: 13.00 ± 1.41",
        "every GPU placed",
        "FGD published (ATC '23): 4.77 ± 0.11",
    ]
    assert "at 100% arrival" in panel.get_legend().get_title().get_text()
    (star,) = panel.containers  # the published point, on the 100% line
    assert star[0].get_xydata().tolist() == [[100.0, 95.227]]
