"""Metric families for one scrape, encoded by prometheus-client.

The daemon reads its numbers from the engine's own state at scrape time, so it keeps no
instruments: each scrape builds the families anew (gauges, counters, histograms with their
labels) and prometheus-client writes them in the format the scraper asks for (its Accept
header: the 0.0.4 text format, or OpenMetrics). Only the daemon imports this, never the runtime.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder

Labels = Mapping[str, str]


class Histogram:
    """Cumulative buckets (upper bounds, seconds or bytes), a sum and a count: what the daemon
    observes between scrapes (and `execgatectl status` reads)."""

    def __init__(self, buckets: Iterable[float]) -> None:
        self.bounds = sorted(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1


class Scrape:
    """One scrape's families, in order; a prometheus-client collector of them."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def gauge(self, name: str, help_: str, value: float | None = None,
              samples: Iterable[tuple[Labels, float]] = ()) -> None:
        self._add(GaugeMetricFamily, name, help_, value, samples)

    def counter(self, name: str, help_: str, value: float | None = None,
                samples: Iterable[tuple[Labels, float]] = ()) -> None:
        """name ends in _total (the convention)."""
        self._add(CounterMetricFamily, name, help_, value, samples)

    def _add(self, kind: type[GaugeMetricFamily] | type[CounterMetricFamily], name: str,
             help_: str, value: float | None, samples: Iterable[tuple[Labels, float]]) -> None:
        rows = list(samples)
        family = kind(name, help_, value=value) if value is not None else \
            kind(name, help_, labels=list(rows[0][0]) if rows else [])
        for labels, v in rows:
            family.add_metric([str(x) for x in labels.values()], v)
        self.families.append(family)

    def histogram(self, name: str, help_: str, h: Histogram) -> None:
        buckets, total = [], 0
        for bound, n in zip([*h.bounds, math.inf], h.counts, strict=True):
            total += n
            buckets.append(("+Inf" if math.isinf(bound) else str(float(bound)), total))
        self.families.append(HistogramMetricFamily(name, help_, buckets=buckets,
                                                   sum_value=h.sum))

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)

    def encode(self, accept: str = "") -> tuple[bytes, str]:
        """The body and its Content-Type, in the format the Accept header asks for."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        encoder, content_type = choose_encoder(accept)
        return encoder(registry), content_type
