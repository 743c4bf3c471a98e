"""Benchmark metrics from per-attempt records and a memory time series.

Metrics take *attempts*, not tasks, because a task whose tool call is OOM-killed is restarted
from scratch (up to RETRY_LIMIT times): the wasted attempts must show up both in the failure
rate and in the task's latency, or a scheme that OOMs often would look cheap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from bench.trace import Task, profiled_peak

RETRY_LIMIT = 5  # retries after the first attempt, so at most 6 attempts per task


@dataclass(frozen=True)
class AttemptRecord:
    """One run of a task from its first step; times are seconds on one clock (e.g. monotonic)."""

    task_id: str
    attempt: int  # 1 = first try, 2 = first retry, ...
    start: float
    end: float
    ok: bool
    oom_kills: int = 0

    def __post_init__(self) -> None:
        if self.attempt < 1:
            raise ValueError(f"attempt must be >= 1 (got {self.attempt})")
        if self.end < self.start:
            raise ValueError(f"end {self.end} is before start {self.start}")
        if self.oom_kills < 0:
            raise ValueError("oom_kills must be >= 0")


def should_retry(record: AttemptRecord, retry_limit: int = RETRY_LIMIT) -> bool:
    """Whether the driver restarts the task after this attempt."""
    return not record.ok and record.attempt <= retry_limit


def percentile(values: Iterable[float], q: float) -> float:
    """q-th percentile (0..100) by linear interpolation between closest ranks.

    Same definition as numpy's default ('linear'): position (n-1)*q/100 in the sorted values.
    Chosen over nearest-rank because it is continuous in q and in the data, which keeps P95 of
    small task counts (20-50) from jumping between neighbouring samples. NaN for no values.
    """
    xs = sorted(values)
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100] (got {q})")
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def concurrency_timeline(attempts: Sequence[AttemptRecord]) -> list[tuple[float, int]]:
    """(t, running attempts) at every change (`overlap_timeline`)."""
    return overlap_timeline([(a.start, a.end) for a in attempts])


def overlap_timeline(spans: Sequence[tuple[float, float]]) -> list[tuple[float, int]]:
    """(t, spans open) at every change; a span ending at t closes before one starting at t
    opens, so back-to-back retries don't count twice."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans],
                    key=lambda e: (e[0], e[1]))
    out: list[tuple[float, int]] = []
    n = 0
    for t, d in events:
        n += d
        if out and out[-1][0] == t:
            out[-1] = (t, n)
        else:
            out.append((t, n))
        if len(out) >= 2 and out[-1][1] == out[-2][1]:  # a retry took over the slot: no change
            out.pop()
    return out


def _time_weighted(points: Sequence[tuple[float, float]]) -> float:
    """Mean of a step function: each value holds until the next point; the last has no width."""
    span = points[-1][0] - points[0][0]
    if span <= 0:
        return float(points[-1][1])
    return sum(v * (t2 - t1) for (t1, v), (t2, _) in pairwise(points)) / span


def summarize(
    attempts: Iterable[AttemptRecord],
    mem_samples: Iterable[tuple[float, float]],
    budget_bytes: int,
    tasks: Iterable[Task] = (),
    *,
    speed: float = 1.0,
) -> dict[str, Any]:
    """All benchmark metrics as a flat, JSON-ready dict.

    `mem_samples` are (t, bytes) of the memory all sandboxes use together, on the attempts'
    clock. Utilisation is against `budget_bytes`; the mean is time-weighted (sample-and-hold), so
    uneven sampling doesn't bias it. Latency of a task = end of its last attempt - start of its
    first, so retries count; P50/P95 are over completed tasks only (a task that exhausted its
    retries has no completion time; it is counted in tasks_failed). `speed` is the replay's time
    compression: `*_trace_s` keys convert wall seconds back to the original trace's time.
    """
    if budget_bytes <= 0:
        raise ValueError("budget_bytes must be > 0")
    recs = sorted(attempts, key=lambda a: (a.task_id, a.attempt))
    task_list = list(tasks)
    samples = sorted(mem_samples)

    by_task: dict[str, list[AttemptRecord]] = {t.id: [] for t in task_list}
    for a in recs:
        by_task.setdefault(a.task_id, []).append(a)
        if len(by_task[a.task_id]) > 1 and by_task[a.task_id][-2].attempt == a.attempt:
            raise ValueError(f"duplicate attempt {a.attempt} for task {a.task_id!r}")

    latencies = []
    completed = 0
    for runs in by_task.values():
        if any(r.ok for r in runs):
            completed += 1
            first_ok_end = min(r.end for r in runs if r.ok)
            latencies.append(first_ok_end - min(r.start for r in runs))

    failed = sum(1 for a in recs if not a.ok)
    start = min((a.start for a in recs), default=0.0)
    end = max((a.end for a in recs), default=0.0)
    makespan = end - start

    timeline = concurrency_timeline(recs)
    conc_mean = _time_weighted([(t, float(n)) for t, n in timeline]) if timeline else 0.0

    if samples:
        mem_peak = max(v for _, v in samples)
        mem_mean = _time_weighted(samples)
    else:
        mem_peak = mem_mean = math.nan

    p50, p95 = percentile(latencies, 50), percentile(latencies, 95)
    return {
        "tasks_total": len(by_task),
        "tasks_completed": completed,
        "tasks_failed": len(by_task) - completed,
        "attempts": len(recs),
        "failed_attempts": failed,
        "attempt_failure_rate": failed / len(recs) if recs else 0.0,
        "retries": sum(max(0, len(r) - 1) for r in by_task.values()),
        "oom_kills": sum(a.oom_kills for a in recs),
        "makespan_s": makespan,
        "makespan_trace_s": makespan * speed,
        "latency_p50_s": p50,
        "latency_p95_s": p95,
        "latency_p50_trace_s": p50 * speed,
        "latency_p95_trace_s": p95 * speed,
        "speed": speed,
        "mem_budget_bytes": budget_bytes,
        "mem_peak_bytes": mem_peak,
        "mem_mean_bytes": mem_mean,
        "mem_peak_util": mem_peak / budget_bytes,
        "mem_mean_util": mem_mean / budget_bytes,
        "concurrency_max": max((n for _, n in timeline), default=0),
        "concurrency_mean": conc_mean,
        "concurrency_timeline": [(t - start, n) for t, n in timeline],
        "oversubscription": sum(profiled_peak(t) for t in task_list) / budget_bytes,
    }
