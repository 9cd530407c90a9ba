"""Lower bounds on the fragmentation benchmark's headline figure: the unallocated GPU % at
100% arrival that no placement policy can beat, with any number of moves.

At the 100% reading the pods that arrived ask for the cluster's whole GPU capacity ``C``
(or a little more: the last pod passes it), so the idle GPU is the GPU of the pods not
placed, less that overshoot; and a card that holds GPU shares idles whatever of it its
shares leave. The bounds here count cards only (no CPU, memory, GPU model or node
boundaries, all of which can only make things worse), so each holds for every policy,
with or without moves, and even for one that knew the whole arrival sequence:

- ``lp``: pods may be left out at will (the cheapest way to avoid a card's idle rest is
  to leave a pod out and give the card to a whole-card pod): the linear relaxation of
  "place a subset of the arrived pods on the ``K`` cards, most GPU allocated", solved by
  column generation (Gilmore and Gomory's cutting-stock LP: one column per way of filling
  one card with shares, priced by a knapsack over the shares' sizes). With ``refusable``
  only the share pods among those may be left out (e.g. those arriving after 95%,
  since before that every pod fits somewhere in these runs), or none (every share
  pod placed, as a policy must when one fits).

The LP is small (one row per distinct share size, two per size with bounds; a column
per filling found) and solved by a dense simplex with Bland's rule (no solver needed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from loadtest.gputrace import TracePod, arrivals

WHOLE: Final = 1000
EPS: Final = 1e-7
BIG: Final = 1e5
"""Cost of an artificial column (a share that may not be left out, not yet placed)."""
MAX_COLUMNS: Final = 2000
"""Fillings generated at most (each a knapsack over the sizes); reached only on absurd
inputs, and then the bound returned is still a bound (see :func:`lp_bound`)."""

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Arrived:
    """What had arrived at the 100% reading of one run."""

    shares: tuple[int, ...]
    """milli-GPU of each share pod (one card, less than a whole one)."""
    whole_cards: int
    """Cards asked for by whole-card pods (one or several cards each)."""
    gpu: int
    """milli-GPU asked for in all (at least the capacity: the last pod passes it)."""
    late: tuple[tuple[int, tuple[int, ...]], ...] = ()
    """(percent, the shares that arrived after that percent of capacity had arrived)."""


def arrived_at_100(
    pods: Sequence[TracePod], cards: int, seed: int, after: Iterable[int] = ()
) -> Arrived:
    """The pods of the protocol's sequence for ``seed`` up to its 100% reading."""
    capacity = cards * WHOLE
    marks = sorted(set(after))
    shares: list[int] = []
    late: dict[int, list[int]] = {m: [] for m in marks}
    whole = total = 0
    for pod in arrivals(list(pods), capacity, seed):
        total += pod.gpu_milli
        if pod.gpus == 1 and pod.milli < WHOLE:
            shares.append(pod.milli)
            for mark in marks:
                if total * 100 > capacity * mark:
                    late[mark].append(pod.milli)
        elif pod.gpus:
            whole += pod.gpus
        if total >= capacity:
            break
    return Arrived(tuple(shares), whole, total, tuple((m, tuple(late[m])) for m in marks))


def lp_bound(arrived: Arrived, cards: int, refusable: Sequence[int] | None = None) -> float:
    """Unallocated % at least, with any pod left out at will (or, with ``refusable``,
    the whole-card pods and only those share pods): the LP relaxation's optimum (see the
    module docstring). Stopped early (``MAX_COLUMNS``), the LP's value is no longer a
    bound; then Farley's bound from the last duals is returned, which is one."""
    capacity = cards * WHOLE
    count = Counter(arrived.shares)
    sizes = sorted(count)
    m = len(sizes)
    have = np.array([count[s] for s in sizes], dtype=np.float64)
    drop = have if refusable is None else np.array([Counter(refusable)[s] for s in sizes], float)
    fills: list[Floats] = [np.eye(m)[i] * min(WHOLE // s, count[s]) for i, s in enumerate(sizes)]
    while True:
        value, duals, uncovered = _master(fills, sizes, have, drop, arrived.whole_cards, cards)
        filling, price = _knapsack(sizes, have, duals[:m])
        gain = price + duals[m]  # a filling's reduced cost is -(gain)
        if uncovered and (gain <= 1e-7 or len(fills) >= MAX_COLUMNS):
            raise ValueError("the shares that may not be left out fit on no cards")
        if gain <= 1e-7 or len(fills) >= MAX_COLUMNS:
            allocated = -value + float(np.dot(sizes, have))
            if gain > 1e-7:  # not optimal: -value understates what may be allocated
                allocated += gain * cards
            return 100 * max(capacity - allocated, 0.0) / capacity
        fills.append(filling)


def _master(
    fills: list[Floats],
    sizes: list[int],
    have: Floats,
    drop: Floats,
    whole: int,
    cards: int,
) -> tuple[float, Floats, bool]:
    """min  sum_i s_i d_i - 1000 z  over fillings x, whole cards z, shares left out d:
    fillings cover the shares placed, at most ``cards`` cards, z <= whole, d <= drop.
    Its optimum, the duals of the cover rows and of the card row, and whether some
    share that may not be left out is still uncovered (no filling found yet holds it)."""
    m, f = len(sizes), len(fills)
    # columns: x (f), z, d (m), surplus of cover rows (m), slack of card row, slack of
    # z's bound, slack of d's bounds (m)
    n = f + 1 + m + m + 1 + 1 + m
    rows = m + 1 + 1 + m
    a = np.zeros((rows, n))
    b = np.zeros(rows)
    c = np.zeros(n)
    for j, filling in enumerate(fills):
        a[:m, j] = filling
        a[m, j] = 1
    z, d, surplus, card, zs, ds = f, f + 1, f + 1 + m, f + 1 + 2 * m, f + 2 + 2 * m, f + 3 + 2 * m
    c[z] = -WHOLE
    c[d : d + m] = np.asarray(sizes, dtype=np.float64)
    for i in range(m):
        a[i, d + i] = 1
        a[i, surplus + i] = -1
        b[i] = have[i]
        a[m + 2 + i, d + i] = 1
        a[m + 2 + i, ds + i] = 1
        b[m + 2 + i] = drop[i]
    a[m, z] = 1
    a[m, card] = 1
    b[m] = cards
    a[m + 1, z] = 1
    a[m + 1, zs] = 1
    b[m + 1] = whole
    # a first basis: the cover rows take d_i = have_i, the bound rows their slacks; where
    # d_i is capped below have_i, an artificial column (big-M cost) takes the cover row
    # and d_i, at its cap, the bound row
    short = [i for i in range(m) if drop[i] < have[i]]
    art = np.zeros((rows, len(short)))
    basis = [d + i for i in range(m)] + [card, zs] + [ds + i for i in range(m)]
    for k, i in enumerate(short):
        art[i, k] = 1
        basis[i] = n + k
        basis[m + 2 + i] = d + i
    a = np.hstack([a, art])
    c = np.concatenate([c, np.full(len(short), BIG)])
    x = _simplex(a, b, c, basis)
    y: Floats = c[basis] @ np.linalg.inv(a[:, basis])
    return float(c[:n] @ x[:n]), y[: m + 1], bool(np.any(x[n:] > 1e-6))


def _simplex(a: Floats, b: Floats, c: Floats, basis: list[int]) -> Floats:
    """min c x, a x = b, x >= 0 from the feasible ``basis`` (updated in place); Bland's
    rule, so it ends."""
    rows, n = a.shape
    while True:
        inv = np.linalg.inv(a[:, basis])
        x_b = inv @ b
        y = c[basis] @ inv
        reduced = c - y @ a
        reduced[basis] = 0
        entering = next((j for j in range(n) if reduced[j] < -EPS), -1)
        if entering < 0:
            x = np.zeros(n)
            x[basis] = x_b
            return x
        direction = inv @ a[:, entering]
        ratios = [(x_b[r] / direction[r], basis[r]) for r in range(rows) if direction[r] > EPS]
        if not ratios:
            raise ValueError("unbounded")  # cannot happen: every column is bounded
        low = min(q for q, _ in ratios)
        leaving = min(j for q, j in ratios if q <= low + EPS)
        basis[basis.index(leaving)] = entering


def _knapsack(sizes: list[int], have: Floats, duals: Floats) -> tuple[Floats, float]:
    """The filling of one card (at most ``have`` of each size) of the highest summed
    dual, and that sum."""
    best = np.zeros(WHOLE + 1)
    take = np.zeros((WHOLE + 1, len(sizes)))
    for i, size in enumerate(sizes):
        if duals[i] <= EPS:
            continue
        for _ in range(int(min(have[i], WHOLE // size))):
            candidate = best[:-size] + duals[i]
            better = np.flatnonzero(candidate > best[size:] + EPS)
            if better.size == 0:
                break
            chosen = take[better].copy()
            chosen[:, i] += 1
            best[better + size] = candidate[better]
            take[better + size] = chosen
    top = int(np.argmax(best))
    return take[top], float(best[top])


LATE: Final = 95
"""The arrival percent after which share pods may be left out, for ``lp_late``."""


def bounds(pods: Sequence[TracePod], cards: int, seed: int) -> dict[str, float | None]:
    """The bounds of one run (workload ``pods``, ``seed``) in unallocated GPU % at 100%
    arrival, from :func:`lp_bound`: ``placed`` (every share pod placed), ``late`` (only
    shares arriving after ``LATE``% left out, besides whole-card pods), ``any`` (any
    pod left out); None where the shares that may not be left out fit on no cards
    (then no policy places them all)."""
    arrived = arrived_at_100(pods, cards, seed, (LATE,))
    out: dict[str, float | None] = {}
    for name, refusable in (("placed", ()), ("late", dict(arrived.late)[LATE]), ("any", None)):
        try:
            out[name] = round(lp_bound(arrived, cards, refusable), 3)
        except ValueError:
            out[name] = None
    return out


def bounds_table(rows: Sequence[tuple[str, int, dict[str, float | None]]]) -> str:
    """Per workload, the means over seeds of :func:`bounds` ("-" where a seed has none)."""
    lines = [
        f"{'workload':<12} {'seeds':>5}  {'every share placed':>18}"
        f"  {f'shares after {LATE}% left out':>27}  {'any pod left out':>16}"
    ]
    groups: dict[str, list[dict[str, float | None]]] = {}
    for workload, _, row in rows:
        groups.setdefault(workload, []).append(row)
    for workload, values in groups.items():
        mean = {k: _mean([v[k] for v in values]) for k in ("placed", "late", "any")}
        lines.append(
            f"{workload:<12} {len(values):>5}  {mean['placed']:>18}"
            f"  {mean['late']:>27}  {mean['any']:>16}"
        )
    return "\n".join(lines)


def _mean(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{sum(known) / len(known):.2f}%" if len(known) == len(values) else "-"
