"""Synthetic traces: calibration against the published characterisation, determinism, CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.generate import GenConfig, calibration_stats, generate, main
from bench.trace import (
    iter_tasks,
    load_tasks,
    memory_at,
    task_to_dict,
    trace_category,
)


@pytest.fixture(scope="module")
def stats() -> dict[str, Any]:
    return calibration_stats(generate(200, seed=1))


def test_baseline_near_185mb(stats: dict[str, Any]) -> None:
    b = stats["baseline_mb"]
    assert 175 <= b["mean"] <= 195
    assert b["min"] >= 150 and b["max"] <= 230


def test_bursts_mostly_10_to_500mb_with_a_tail(stats: dict[str, Any]) -> None:
    assert stats["frac_bursts_10_500mb"] >= 0.75
    assert 10 <= stats["burst_mb"]["p50"] <= 500
    assert stats["n_bursts_ge_2gb"] >= 3  # a tail exists...
    assert stats["n_bursts_ge_2gb"] / stats["n_tool_calls"] < 0.01  # ...and stays a tail
    assert stats["burst_mb"]["max"] <= 4000
    hold = stats["tail_hold_s"]
    assert hold["min"] >= 1.0 - 1e-9 and hold["max"] <= 2.0 + 1e-9  # 2-4 GB lasts 1-2 s


def test_peak_to_average_up_to_15x(stats: dict[str, Any]) -> None:
    r = stats["peak_to_avg"]
    assert r["max"] <= 15.0 + 1e-6
    assert r["max"] >= 8.0  # tail tasks do get far above their average
    assert 1.2 <= r["p50"] <= 5.0


def test_peak_to_average_cap_clips_the_highest_call() -> None:
    cfg = GenConfig(max_peak_to_avg=5.0, tail_prob=0.05)
    assert calibration_stats(generate(30, seed=2, config=cfg))["peak_to_avg"]["max"] <= 5.0 + 1e-6
    assert (
        calibration_stats(generate(30, seed=2, config=GenConfig(tail_prob=0.05)))["peak_to_avg"][
            "max"
        ]
        > 5.0
    )


def test_durations_and_llm_share(stats: dict[str, Any]) -> None:
    d, w = stats["duration_min"], stats["llm_wait_share"]
    assert d["min"] >= 5.0 and d["max"] <= 11.0
    assert d["max"] - d["min"] >= 4.0  # spread over the range, not one value
    assert w["min"] >= 0.26 and w["max"] <= 0.44


def test_heavy_vs_light(stats: dict[str, Any]) -> None:
    cat = stats["category_mean_burst_mb"]
    for heavy in ("test", "install"):
        for light in ("light", "edit"):
            assert cat[heavy] > 5 * cat[light], (heavy, light, cat)
    assert stats["heavy_mean_burst_mb"] > 10 * stats["light_mean_burst_mb"]
    calls = stats["category_calls"]
    assert calls["light"] > calls["test"] > calls["install"] > 0


def test_retry_loops_accumulate(stats: dict[str, Any]) -> None:
    assert 0.4 <= stats["frac_tasks_with_retry_loop"] <= 0.9
    assert stats["frac_tasks_with_accumulating_retry"] >= 0.4
    assert stats["max_retry_repeats"] >= 3


def test_generated_loop_retains_more_each_run() -> None:
    (task,) = generate(1, seed=3, config=GenConfig(retry_prob=1.0))
    runs = task.metadata["retry_loop_runs"]
    assert runs >= 3
    tests = [c for c in task.tool_calls if c.category == "test"]
    loop = next(
        tests[i : i + runs]
        for i in range(len(tests))
        if len({c.command for c in tests[i : i + runs]}) == 1 and len(tests[i : i + runs]) == runs
    )
    peaks = [c.memory.peak_bytes for c in loop]
    assert peaks == sorted(peaks) and peaks[-1] > peaks[0]
    assert all(c.memory.retained_bytes > 0 for c in loop)


def test_deterministic_and_prefix_stable() -> None:
    a = [task_to_dict(t) for t in generate(10, seed=42)]
    b = [task_to_dict(t) for t in generate(10, seed=42)]
    assert a == b
    assert [task_to_dict(t) for t in generate(4, seed=42)] == a[:4]
    assert a != [task_to_dict(t) for t in generate(10, seed=43)]
    assert len({t["id"] for t in a}) == 10


def test_commands_classify_as_their_category() -> None:
    for task in generate(20, seed=5):
        for c in task.tool_calls:
            assert trace_category(c.command) == c.category, c.command


def test_profiles_are_replayable() -> None:
    for task in generate(20, seed=9):
        for c in task.tool_calls:
            m = c.memory
            assert m.hold_s <= c.duration_s
            assert 0 <= memory_at(m, c.duration_s / 2, c.duration_s) <= m.peak_bytes


def test_hints() -> None:
    (task,) = generate(1, seed=1, config=GenConfig(hints="size"))
    assert all(c.hint and c.hint.startswith("mem=") for c in task.tool_calls)
    (task,) = generate(1, seed=1, config=GenConfig(hints="class"))
    assert {c.hint for c in task.tool_calls} <= {"memory:low", "memory:medium", "memory:high"}
    assert all(c.hint is None for c in generate(1, seed=1)[0].tool_calls)
    with pytest.raises(ValueError):
        generate(1, seed=1, config=GenConfig(hints="exact"))


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "traces.jsonl"
    assert main(["-n", "3", "--seed", "1", "-o", str(out), "--stats"]) == 0
    tasks = load_tasks(out)
    assert [t.id for t in tasks] == ["syn-1-0000", "syn-1-0001", "syn-1-0002"]
    assert [task_to_dict(t) for t in tasks] == [task_to_dict(t) for t in generate(3, 1)]
    assert json.loads(capsys.readouterr().err)["n_tasks"] == 3
    assert main(["-n", "2", "--seed", "1"]) == 0
    assert len(list(iter_tasks(capsys.readouterr().out.splitlines()))) == 2
