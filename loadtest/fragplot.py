"""The fragmentation benchmark's plot (``shoal loadtest fragmentation --plot FILE.png``).

The benchmark's headline is the GPU left unallocated when the arrived request reaches
100% of capacity. So each workload gets one panel zoomed on the arrival around it
(:data:`ZOOM`, % of the GPU capacity arrived) with a line at 100%: each policy's
allocation curve (mean over seeds at every whole percent of arrival, with a band from
the lowest to the highest seed) crosses that line at its result, which the legend gives
as unallocated GPU % mean ± standard deviation over seeds, best first; the right axis
reads allocation as unallocation (100 - allocated). The paper's FGD result at 100% is
marked on the line with its standard deviation over its seeds.

:func:`curves` and :func:`published_point` are plain arithmetic (tested without
matplotlib); :func:`draw` needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from events.errors import InputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ZOOM: Final = (90, 105)
"""The arrival shown, % of GPU capacity."""
HEADLINE_PCT: Final = 100
PUBLISHED_POLICY: Final = "fgd"


@dataclass(frozen=True, slots=True)
class PolicyCurve:
    """One policy on one workload, over its seeds."""

    policy: str
    seeds: int
    mean: tuple[float, ...]
    """Allocated GPU % once k% of capacity had arrived, mean over seeds (index k)."""
    low: tuple[float, ...]
    high: tuple[float, ...]
    unallocated: float
    """Unallocated GPU % at 100% arrival, mean over seeds."""
    spread: float
    """Its standard deviation over seeds (0 for one seed)."""

    @property
    def label(self) -> str:
        return f"{self.policy}: {self.unallocated:.2f} ± {self.spread:.2f}"


def curves(results: list[dict[str, Any]], workload: str) -> list[PolicyCurve]:
    """Each policy's curve on ``workload`` (the runs that have one), least unallocated
    GPU at 100% first."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if r["workload"] == workload and r.get("curve"):
            budget = r.get("moves_budget_pct")  # runs with moves: a curve per budget
            name = r["policy"] if budget is None else f"{r['policy']} {budget}%"
            runs.setdefault(name, []).append(r)
    out = []
    for policy, rows in runs.items():
        size = min(len(r["curve"]) for r in rows)
        columns = [[r["curve"][k] for r in rows] for k in range(size)]
        idle = [float(r["unallocated_pct_at_100"]) for r in rows]
        out.append(
            PolicyCurve(
                policy=policy,
                seeds=len(rows),
                mean=tuple(statistics.fmean(c) for c in columns),
                low=tuple(min(c) for c in columns),
                high=tuple(max(c) for c in columns),
                unallocated=statistics.mean(idle),  # as the table rounds it
                spread=statistics.stdev(idle) if len(idle) > 1 else 0.0,
            )
        )
    return sorted(out, key=lambda c: (c.unallocated, c.policy))


def published_point(
    workload: str,
    means: dict[tuple[str, str, int], float],
    stds: dict[tuple[str, str, int], float],
) -> tuple[float, float] | None:
    """The paper's FGD allocation % at 100% arrival on ``workload`` and its standard
    deviation, if it published one."""
    key = (workload, PUBLISHED_POLICY, HEADLINE_PCT)
    if key not in means:
        return None
    return means[key], stds.get(key, 0.0)


def draw(
    results: list[dict[str, Any]],
    means: dict[tuple[str, str, int], float],
    stds: dict[tuple[str, str, int], float],
) -> Figure:
    """One zoomed panel per workload of ``results`` (see the module's docstring)."""
    from matplotlib.figure import Figure

    chosen = list(dict.fromkeys(r["workload"] for r in results))
    cols = 1 if len(chosen) == 1 else 2
    rows = math.ceil(len(chosen) / cols)
    fig = Figure(figsize=(11 * cols, 6.5 * rows), layout="constrained")
    panels = list(fig.subplots(rows, cols, squeeze=False).flat)
    low, high = ZOOM
    for ax, workload in zip(panels, chosen, strict=False):
        lines = curves(results, workload)
        seeds = sorted({c.seeds for c in lines})
        x = list(range(low, high + 1))
        visible: list[float] = []
        for index, curve in enumerate(lines):
            color = f"C{index % 10}"
            end = min(high + 1, len(curve.mean))
            xs = x[: max(0, end - low)]
            ax.fill_between(xs, curve.low[low:end], curve.high[low:end], color=color, alpha=0.15)
            ax.plot(xs, curve.mean[low:end], color=color, marker=".", label=curve.label)
            visible += curve.low[low:end] + curve.high[low:end]
        point = published_point(workload, means, stds)
        if point is not None:
            alloc, std = point
            ax.errorbar(
                [HEADLINE_PCT],
                [alloc],
                yerr=[std],
                fmt="*",
                markersize=14,
                color="black",
                capsize=4,
                zorder=5,
                label=f"FGD published (ATC '23): {100 - alloc:.2f} ± {std:.2f}",
            )
            visible.append(alloc)
        ax.axvline(HEADLINE_PCT, color="black", linewidth=1, linestyle="--")
        ax.plot(x, x, color="grey", linewidth=0.8, linestyle=":", label="every GPU placed")
        ax.set_xlim(low, high)
        if visible:
            ax.set_ylim(math.floor(min(visible)) - 0.5, 100.5)  # allocation is at most 100
        ax.set_xlabel("arrived GPU request (% of capacity)")
        ax.set_ylabel("allocated GPU (% of capacity)")
        right = ax.secondary_yaxis("right", functions=(_flip, _flip))
        right.set_ylabel("unallocated GPU (% of capacity)")
        over = f"{seeds[0]} seeds" if len(seeds) == 1 else "seeds"
        ax.set_title(f"{workload}: allocation around 100% arrival (mean over {over})")
        ax.grid(alpha=0.3)
        ax.legend(
            title=f"unallocated GPU % at {HEADLINE_PCT}% arrival\n(mean ± std over {over};"
            "\nbands: lowest to highest seed)",
            loc="upper left",
            bbox_to_anchor=(1.12, 1.0),
            fontsize="medium",
        )
    for ax in panels[len(chosen) :]:
        ax.set_visible(False)  # a grid's unused panel
    return fig


def _flip(values: Any) -> Any:
    return 100 - values


def plot(
    results: list[dict[str, Any]],
    path: Path,
    means: dict[tuple[str, str, int], float],
    stds: dict[tuple[str, str, int], float],
) -> Figure:
    """Draw (:func:`draw`) and save to ``path``; the figure saved."""
    fig = draw(results, means, stds)
    try:
        fig.savefig(path, dpi=110)
    except OSError as err:
        raise InputError(f"cannot write: {err.strerror}", location=f"--plot {path}") from None
    return fig
