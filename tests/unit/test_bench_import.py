"""AgentCgroup importer: size parsing, UTC alignment on epoch, burst/wait derivation, CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from bench.agentcgroup_import import (
    Sample,
    _Call,
    build_task,
    import_attempt,
    main,
    parse_percent,
    parse_size,
    parse_utc,
)
from bench.trace import LlmWait, ToolCall, load_tasks, profiled_peak
from execgate.common.units import MiB

FIXTURE = Path(__file__).parent / "fixtures" / "agentcgroup" / "attempt1"
MB = 1_000_000
EPOCH = 1735725600  # 2025-01-01T10:00:00Z, the fixture's first sample


@pytest.fixture
def non_utc_tz(monkeypatch: pytest.MonkeyPatch):
    """Run in UTC+05:30 so that any naive-local parsing would shift calls by 5.5 hours."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("185MB", 185 * MB),
        ("185MB / 134.5GB", 185 * MB),
        ("1.2GiB", round(1.2 * 2**30)),
        ("512KiB", 512 * 1024),
        ("0B", 0),
        ("12.5kB", 12_500),
        ("7.674GiB", round(7.674 * 2**30)),
        ("185.2MiB / 7.674GiB", round(185.2 * MiB)),
        ("1.5e3MB", 1500 * MB),
        (" 3 GB ", 3 * 10**9),
        ("4096", 4096),
        (2048, 2048),
    ],
)
def test_parse_size(text: str | int, want: int) -> None:
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["--", "", "MB", "12XB", "-5MB", "1.2.3MB", "5 M B"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_parse_percent() -> None:
    assert parse_percent("12.5%") == 12.5
    assert parse_percent(" 150.0% ") == 150.0
    assert parse_percent(3) == 3.0
    assert parse_percent("--") == 0.0
    assert parse_percent(None) == 0.0


def test_parse_utc_ignores_local_zone(non_utc_tz: None) -> None:
    naive_local = datetime.strptime("2025-01-01T10:00:10", "%Y-%m-%dT%H:%M:%S").timestamp()
    assert naive_local == EPOCH + 10 - 5.5 * 3600  # what a naive parse would get here
    assert parse_utc("2025-01-01T10:00:10.500Z") == EPOCH + 10.5
    assert parse_utc("2025-01-01T10:00:10") == EPOCH + 10  # offset-less: UTC, not local
    assert parse_utc("2025-01-01T15:30:10+05:30") == EPOCH + 10


def test_import_fixture(non_utc_tz: None) -> None:
    task = import_attempt(FIXTURE)
    assert task.id == "agentcgroup/attempt1"
    assert task.baseline_bytes == 185 * MB
    assert task.metadata["skipped_samples"] == 1  # the '--' sample
    assert task.metadata["n_samples"] == 40
    assert task.metadata["start_epoch"] == EPOCH
    kinds = [type(s).__name__ for s in task.steps]
    assert kinds == ["LlmWait", "ToolCall"] * 4 + ["LlmWait"]
    waits = [s.duration_s for s in task.steps if isinstance(s, LlmWait)]
    assert waits == pytest.approx([5.2, 4.9, 4.5, 4.7, 5.0])
    assert task.duration_s == pytest.approx(40.0)

    git, pytest_call, read, pip = task.tool_calls
    assert (git.command, git.category, git.duration_s) == ("git status", "light", 0.4)
    # No sample inside a 0.4 s call: the next sample (197 MB) stands in.
    assert git.memory.peak_bytes == 12 * MB
    assert (git.memory.shape, git.memory.peak_at) == ("plateau", 1.0)
    assert git.memory.retained_bytes == 0  # 12 MB is below the noise threshold
    assert git.memory.cpu_share == pytest.approx(0.2)

    m = pytest_call.memory
    assert pytest_call.category == "test" and pytest_call.duration_s == 10.0
    assert m.peak_bytes == 300 * MB  # 485 MB at the peak over 185 MB just before
    assert m.baseline_bytes == int(37.5 * MB)
    assert (m.shape, m.peak_at) == ("ramp", pytest.approx(0.75))
    assert m.cpu_share == pytest.approx(0.95)
    assert m.retained_bytes == 20 * MB  # 205 MB after vs 185 MB before

    # Non-Bash tools keep a readable command; a '+05:30' timestamp lands on the same instant.
    assert (read.tool, read.command) == ("Read", "Read /testbed/setup.py")
    assert read.memory.peak_bytes == 0
    assert read.duration_s == pytest.approx(0.3)

    # Binary units in the samples (512MiB, 524288KiB, 0.5GiB) against 205 MB before.
    assert pip.category == "install" and pip.duration_s == 5.0  # naive end: UTC
    assert pip.memory.peak_bytes == 512 * MiB - 205 * MB
    assert (pip.memory.shape, pip.memory.peak_at) == ("plateau", pytest.approx(0.6))
    assert pip.memory.cpu_share == pytest.approx(0.6)
    assert profiled_peak(task) == 185 * MB + 20 * MB + 512 * MiB - 205 * MB


def test_bash_only() -> None:
    task = import_attempt(FIXTURE, bash_only=True)
    assert [c.tool for c in task.tool_calls] == ["Bash"] * 3
    assert task.duration_s == pytest.approx(40.0)  # the Read call's time became LLM wait


def test_overlapping_calls_are_serialised() -> None:
    samples = [Sample(float(t), 100, 0.0) for t in range(11)]
    calls = [_Call("Bash", "ls", 1.0, 4.0), _Call("Grep", "Grep x", 2.0, 3.0)]
    task = build_task("ov", samples, calls)
    assert task.metadata["overlapping_calls"] == 1
    assert [s.duration_s for s in task.steps] == [1.0, 3.0, 1.0, 5.0]
    assert isinstance(task.steps[2], ToolCall)


def test_spike_and_sawtooth_shapes() -> None:
    level = [100] * 3
    spike = [*level, 100, 100, 900, 100, 100, 100, *level]
    saw = [*level, 400, 900, 200, 800, 200, 900, *level]
    for series, shape in ((spike, "spike"), (saw, "sawtooth")):
        samples = [Sample(float(t), v * MB, 50.0) for t, v in enumerate(series)]
        task = build_task("s", samples, [_Call("Bash", "make", 2.5, 8.5)])
        (call,) = task.tool_calls
        assert call.memory.shape == shape
        assert call.memory.peak_bytes == 800 * MB
    samples = [Sample(float(t), 100 * MB, 50.0) for t in range(3)]
    (call,) = build_task("s", samples, [_Call("Bash", "x", 1.0, 2.0)]).tool_calls
    assert call.memory.peak_bytes == 0  # no burst at all


def test_cli_recurses_and_writes_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "runs"
    shutil.copytree(FIXTURE, root / "django__django-1" / "attempt_1")
    shutil.copytree(FIXTURE, root / "flask__flask-2" / "attempt_2")
    out = tmp_path / "out.jsonl"
    assert main([str(root), "-o", str(out)]) == 0
    tasks = load_tasks(out)
    assert [t.id for t in tasks] == ["django__django-1/attempt_1", "flask__flask-2/attempt_2"]
    assert "2 task(s)" in capsys.readouterr().err
    assert main([str(tmp_path / "nothing-here")]) == 1


def test_a_task_in_two_experiment_folders_gets_two_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The published layout: experiments/<experiment>/<task>/attempt_N, the same task run in
    # several experiments. The replayer refuses a trace whose ids repeat.
    root = tmp_path / "experiments"
    for experiment in ("all_images_haiku", "all_images_local"):
        shutil.copytree(FIXTURE, root / experiment / "django__django-1" / "attempt_1")
    shutil.copytree(FIXTURE, root / "all_images_local" / "flask__flask-2" / "attempt_1")
    out = tmp_path / "out.jsonl"
    assert main([str(root), "-o", str(out)]) == 0
    assert [t.id for t in load_tasks(out)] == [
        "all_images_haiku/django__django-1/attempt_1",
        "all_images_local/django__django-1/attempt_1",
        "flask__flask-2/attempt_1",
    ]
    # The same when each experiment folder is given on its own, and a folder given twice
    # (directly and through its parent) is imported once.
    experiments = [str(root / "all_images_haiku"), str(root / "all_images_local")]
    assert main([*experiments, str(root), "-o", str(out)]) == 0
    assert len({t.id for t in load_tasks(out)}) == 3
    assert "3 task(s)" in capsys.readouterr().err


def test_runs_from_a_checkout_with_the_stdlib_only() -> None:
    # python3 -m bench.agentcgroup_import from the repository root: no install, no PYTHONPATH
    # (-S: no site-packages either).
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, "-S", "-m", "bench.agentcgroup_import", "--help"],
                       cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "usage:" in p.stdout


def test_bad_input_is_reported(tmp_path: Path) -> None:
    d = tmp_path / "attempt_1"
    shutil.copytree(FIXTURE, d)
    (d / "tool_calls.json").write_text(json.dumps([{"tool": "Bash"}]))
    with pytest.raises(ValueError, match=r"tool_calls.json\[0\].timestamp"):
        import_attempt(d)
    assert main([str(d)]) == 1
