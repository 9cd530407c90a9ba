"""Prometheus metrics of a ``shoal serve`` process, with ``prometheus_client``.

One registry per :class:`Metrics` (a test runs several services in one process), with
the client's process, platform and garbage-collector collectors (``process_*``,
``python_info``, ``python_gc_*``). Metrics are created on first use by name, help and
label names (sorted); every name gets the ``shoal_`` prefix:

- :meth:`Metrics.inc`: a counter (its samples end in ``_total``, whether or not the
  name given does; the client adds ``_created`` beside each);
- :meth:`Metrics.counted`: a counter whose value is read at scrape time from a count
  kept elsewhere (an extender client's calls), which must never go down;
- :meth:`Metrics.gauge`: a gauge read at scrape time (queue depth, consumer lag);
- :meth:`Metrics.observe`: a histogram with :data:`LATENCY_BUCKETS`.

Values keep full precision (``1234567.0``, not ``1.23457e+06``). ``/metrics`` answers
in the format the scraper asks for (:meth:`Metrics.exposition`): the Prometheus text
format by default, OpenMetrics when its ``Accept`` asks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

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


class _CountedElsewhere(Collector):
    """A counter family whose series are read from callbacks at scrape time."""

    def __init__(self, name: str, help_: str, labelnames: tuple[str, ...]) -> None:
        self.name = name
        self.help = help_
        self.labelnames = labelnames
        self.series: dict[tuple[str, ...], Callable[[], float]] = {}

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.help, labels=self.labelnames)

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for values, read in sorted(self.series.items()):
            family.add_metric(list(values), read())
        return [family]


class Metrics:
    """A registry; :meth:`exposition` gives the ``/metrics`` page."""

    def __init__(self, prefix: str = "shoal", *, process: bool = True) -> None:
        self.prefix = prefix
        self.registry = CollectorRegistry(auto_describe=True)
        if process:
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            GCCollector(registry=self.registry)
        self._metrics: dict[str, tuple[str, tuple[str, ...], Any]] = {}
        """Full name → (kind, label names, the client's metric)."""

    def __repr__(self) -> str:
        return f"Metrics({sorted(self._metrics)})"

    def _metric(self, kind: str, name: str, help_: str, names: tuple[str, ...]) -> Any:
        """The metric ``name``, created on first use; the same name again must be of
        the same kind and label names."""
        full = f"{self.prefix}_{name}"
        found = self._metrics.get(full)
        if found is None:
            metric = self._make(kind, full, help_, names)
            self._metrics[full] = (kind, names, metric)
            return metric
        if found[:2] != (kind, names):
            raise ValueError(f"metric {full} is a {found[0]} with labels {found[1]}")
        return found[2]

    def _make(self, kind: str, full: str, help_: str, names: tuple[str, ...]) -> Any:
        registry = self.registry
        if kind == "counter":
            return Counter(full, help_, names, registry=registry)
        if kind == "gauge":
            return Gauge(full, help_, names, registry=registry)
        if kind == "histogram":
            return Histogram(full, help_, names, registry=registry, buckets=LATENCY_BUCKETS)
        family = _CountedElsewhere(full, help_, names)
        registry.register(family)
        return family

    def _child(self, kind: str, name: str, help_: str, labels: dict[str, str] | None) -> Any:
        metric = self._metric(kind, name, help_, tuple(sorted(labels or {})))
        return metric.labels(**labels) if labels else metric

    def inc(
        self, name: str, help_: str, value: float = 1, labels: dict[str, str] | None = None
    ) -> None:
        self._child("counter", name, help_, labels).inc(value)

    def counted(
        self, name: str, help_: str, read: Callable[[], float], labels: dict[str, str] | None = None
    ) -> None:
        """A counter read from ``read`` at scrape time (replacing the series' reader,
        if it had one); what ``read`` gives must never go down."""
        pairs = sorted((labels or {}).items())
        family = self._metric("counted", name, help_, tuple(k for k, _ in pairs))
        family.series[tuple(v for _, v in pairs)] = read

    def gauge(
        self, name: str, help_: str, read: Callable[[], float], labels: dict[str, str] | None = None
    ) -> None:
        """A gauge read from ``read`` at scrape time (replacing its reader, if any)."""
        self._child("gauge", name, help_, labels).set_function(read)

    def observe(
        self, name: str, help_: str, value: float, labels: dict[str, str] | None = None
    ) -> None:
        self._child("histogram", name, help_, labels).observe(value)

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """The page and its content type, in the format ``accept`` asks for."""
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type

    def render(self) -> str:
        """The page in the Prometheus text format."""
        return self.exposition()[0].decode()
