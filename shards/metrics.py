"""Prometheus metrics in the text exposition format, with no client library.

Counters, gauges and histograms with fixed buckets; labels as sorted key=value pairs.
Gauges may be callbacks read at scrape time (queue depth, consumer lag).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


def _labels(labels: dict[str, str] | None) -> Labels:
    return tuple(sorted((labels or {}).items()))


def _render(labels: Labels, extra: tuple[tuple[str, str], ...] = ()) -> str:
    pairs = [*labels, *extra]
    if not pairs:
        return ""
    escaped = (
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in pairs
    )
    return "{" + ",".join(escaped) + "}"


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.counts):
            self.counts[index] += 1
        self.total += value
        self.count += 1


class Metrics:
    """A registry; ``render()`` gives the ``/metrics`` page."""

    def __init__(self, prefix: str = "shoal") -> None:
        self.prefix = prefix
        self._help: dict[str, tuple[str, str]] = {}
        self._counters: dict[str, dict[Labels, float]] = {}
        self._gauges: dict[str, dict[Labels, Callable[[], float]]] = {}
        self._histograms: dict[str, dict[Labels, _Histogram]] = {}

    def __repr__(self) -> str:
        return f"Metrics({sorted(self._help)})"

    def _name(self, name: str, kind: str, help_: str) -> str:
        full = f"{self.prefix}_{name}"
        self._help.setdefault(full, (kind, help_))
        return full

    def inc(
        self, name: str, help_: str, value: float = 1, labels: dict[str, str] | None = None
    ) -> None:
        series = self._counters.setdefault(self._name(name, "counter", help_), {})
        key = _labels(labels)
        series[key] = series.get(key, 0) + value

    def gauge(
        self, name: str, help_: str, read: Callable[[], float], labels: dict[str, str] | None = None
    ) -> None:
        self._gauges.setdefault(self._name(name, "gauge", help_), {})[_labels(labels)] = read

    def observe(
        self,
        name: str,
        help_: str,
        value: float,
        labels: dict[str, str] | None = None,
        buckets: tuple[float, ...] = LATENCY_BUCKETS,
    ) -> None:
        series = self._histograms.setdefault(self._name(name, "histogram", help_), {})
        key = _labels(labels)
        if key not in series:
            series[key] = _Histogram(buckets)
        series[key].observe(value)

    def render(self) -> str:
        lines: list[str] = []
        for full in sorted(self._help):
            kind, help_ = self._help[full]
            lines.append(f"# HELP {full} {help_}")
            lines.append(f"# TYPE {full} {kind}")
            if kind == "counter":
                for labels, value in sorted(self._counters.get(full, {}).items()):
                    lines.append(f"{full}{_render(labels)} {value:g}")
            elif kind == "gauge":
                for labels, read in sorted(self._gauges.get(full, {}).items()):
                    lines.append(f"{full}{_render(labels)} {read():g}")
            else:
                for labels, hist in sorted(self._histograms.get(full, {}).items()):
                    running = 0
                    for bound, count in zip(
                        hist.buckets, hist.counts or [0] * len(hist.buckets), strict=True
                    ):
                        running += count
                        lines.append(
                            f"{full}_bucket{_render(labels, (('le', f'{bound:g}'),))} {running}"
                        )
                    lines.append(f"{full}_bucket{_render(labels, (('le', '+Inf'),))} {hist.count}")
                    lines.append(f"{full}_sum{_render(labels)} {hist.total:g}")
                    lines.append(f"{full}_count{_render(labels)} {hist.count}")
        return "\n".join(lines) + "\n"
