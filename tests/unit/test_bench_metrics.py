"""Metrics against values computed by hand."""

from __future__ import annotations

import math

import pytest

from bench.metrics import (
    RETRY_LIMIT,
    AttemptRecord,
    concurrency_timeline,
    percentile,
    should_retry,
    summarize,
)
from bench.trace import LlmWait, MemoryProfile, Task, ToolCall


def _task(tid: str, baseline: int, peak: int) -> Task:
    call = ToolCall("pytest", 1.0, MemoryProfile(0, peak))
    return Task(tid, [LlmWait(1.0), call], baseline_bytes=baseline)


TASKS = [_task("A", 100, 300), _task("B", 100, 500), _task("C", 0, 200)]  # peaks 400+600+200
ATTEMPTS = [
    AttemptRecord("A", 1, 0.0, 10.0, ok=False, oom_kills=1),
    AttemptRecord("A", 2, 10.0, 30.0, ok=True),
    AttemptRecord("B", 1, 0.0, 20.0, ok=True),
    AttemptRecord("C", 1, 5.0, 15.0, ok=False, oom_kills=2),
    AttemptRecord("C", 2, 15.0, 25.0, ok=False, oom_kills=1),
]
# Uneven sampling on purpose: 200 for 10 s, 800 for 2 s, 900 for 18 s; the last has no width.
SAMPLES = [(12.0, 900.0), (0.0, 200.0), (30.0, 0.0), (10.0, 800.0)]


def test_percentile_linear_interpolation() -> None:
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([1, 2, 3, 4], 95) == pytest.approx(3.85)  # 3 + 0.85 * (4 - 3)
    assert percentile([1, 2, 3, 4], 0) == 1
    assert percentile([1, 2, 3, 4], 100) == 4
    assert percentile([7.0], 95) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_summarize_by_hand() -> None:
    r = summarize(ATTEMPTS, SAMPLES, 1000, TASKS, speed=2.0)
    assert r["tasks_total"] == 3
    assert r["tasks_completed"] == 2
    assert r["tasks_failed"] == 1  # C never succeeded
    assert r["attempts"] == 5
    assert r["failed_attempts"] == 3
    assert r["attempt_failure_rate"] == pytest.approx(0.6)
    assert r["retries"] == 2
    assert r["oom_kills"] == 4
    assert r["makespan_s"] == 30.0
    assert r["makespan_trace_s"] == 60.0
    # Latencies: A 0 -> 30 (its OOM-killed first attempt counts), B 0 -> 20.
    assert r["latency_p50_s"] == pytest.approx(25.0)
    assert r["latency_p95_s"] == pytest.approx(29.5)
    assert r["latency_p50_trace_s"] == pytest.approx(50.0)
    assert r["latency_p95_trace_s"] == pytest.approx(59.0)
    assert r["mem_peak_bytes"] == 900.0
    assert r["mem_peak_util"] == pytest.approx(0.9)
    assert r["mem_mean_bytes"] == pytest.approx((200 * 10 + 800 * 2 + 900 * 18) / 30)
    assert r["mem_mean_util"] == pytest.approx(0.66)
    assert r["concurrency_timeline"] == [(0.0, 2), (5.0, 3), (20.0, 2), (25.0, 1), (30.0, 0)]
    assert r["concurrency_max"] == 3
    assert r["concurrency_mean"] == pytest.approx((2 * 5 + 3 * 15 + 2 * 5 + 1 * 5) / 30)
    assert r["oversubscription"] == pytest.approx(1.2)


def test_back_to_back_retry_does_not_double_count() -> None:
    recs = [AttemptRecord("A", 1, 0.0, 10.0, False, 1), AttemptRecord("A", 2, 10.0, 12.0, True)]
    assert concurrency_timeline(recs) == [(0.0, 1), (12.0, 0)]


def test_timeline_is_relative_to_first_start() -> None:
    recs = [AttemptRecord("A", 1, 1000.0, 1004.0, True), AttemptRecord("B", 1, 1002, 1003, True)]
    r = summarize(recs, [(1000.0, 10.0)], 100)
    assert r["concurrency_timeline"] == [(0.0, 1), (2.0, 2), (3.0, 1), (4.0, 0)]
    assert r["mem_mean_bytes"] == 10.0  # a single sample is its own mean
    assert r["tasks_total"] == 2 and r["oversubscription"] == 0.0  # no tasks given


def test_tasks_without_attempts_count_as_not_completed() -> None:
    r = summarize([], [], 1000, TASKS)
    assert (r["tasks_total"], r["tasks_completed"], r["tasks_failed"]) == (3, 0, 3)
    assert r["attempt_failure_rate"] == 0.0 and r["makespan_s"] == 0.0
    assert math.isnan(r["latency_p50_s"]) and math.isnan(r["mem_peak_util"])


def test_validation() -> None:
    with pytest.raises(ValueError, match="duplicate attempt"):
        summarize([ATTEMPTS[0], ATTEMPTS[0]], [], 1)
    with pytest.raises(ValueError):
        summarize([], [], 0)
    with pytest.raises(ValueError):
        AttemptRecord("A", 0, 0.0, 1.0, True)
    with pytest.raises(ValueError):
        AttemptRecord("A", 1, 2.0, 1.0, True)


def test_should_retry_up_to_limit() -> None:
    assert RETRY_LIMIT == 5
    assert should_retry(AttemptRecord("A", 1, 0, 1, False, 1))
    assert should_retry(AttemptRecord("A", 5, 0, 1, False, 1))  # 5th attempt fails: 5th retry
    assert not should_retry(AttemptRecord("A", 6, 0, 1, False, 1))  # retries used up
    assert not should_retry(AttemptRecord("A", 1, 0, 1, True))
