"""Prometheus' text exposition format (version 0.0.4), written out by hand.

Not prometheus-client: the daemon's dependencies reach an offline host, and the test VM, as
wheels that install.sh is handed (PIP_NO_INDEX), and every one more is one more to carry; the
daemon reads its numbers from the engine's own state at scrape time, so all it needs is the
format: families of gauges, counters and histograms with escaped labels.
https://prometheus.io/docs/instrumenting/exposition_formats/
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Labels = Mapping[str, str]


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() or abs(v) >= 1e15 else str(int(v))


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels | None) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_label(str(v))}"' for k, v in labels.items()) + "}"


class Histogram:
    """Cumulative buckets (upper bounds, seconds or bytes), a sum and a count."""

    def __init__(self, buckets: Iterable[float]) -> None:
        self.bounds = sorted(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1


class Writer:
    """One scrape's text: families added in order, each with its HELP and TYPE once."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def _head(self, name: str, kind: str, help_: str) -> None:
        self.lines.append(f"# HELP {name} {help_.replace(chr(92), chr(92) * 2)}")
        self.lines.append(f"# TYPE {name} {kind}")

    def gauge(self, name: str, help_: str, value: float | None = None,
              samples: Iterable[tuple[Labels, float]] = ()) -> None:
        self._samples(name, "gauge", help_, value, samples)

    def counter(self, name: str, help_: str, value: float | None = None,
                samples: Iterable[tuple[Labels, float]] = ()) -> None:
        """name ends in _total (the convention; the type line names it too, as 0.0.4 does)."""
        self._samples(name, "counter", help_, value, samples)

    def _samples(self, name: str, kind: str, help_: str, value: float | None,
                 samples: Iterable[tuple[Labels, float]]) -> None:
        self._head(name, kind, help_)
        if value is not None:
            self.lines.append(f"{name} {_value(value)}")
        for labels, v in samples:
            self.lines.append(f"{name}{_labels(labels)} {_value(v)}")

    def histogram(self, name: str, help_: str, h: Histogram) -> None:
        self._head(name, "histogram", help_)
        total = 0
        for bound, n in zip([*h.bounds, math.inf], h.counts, strict=True):
            total += n
            self.lines.append(f'{name}_bucket{{le="{_value(bound)}"}} {total}')
        self.lines.append(f"{name}_sum {_value(h.sum)}")
        self.lines.append(f"{name}_count {h.count}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
