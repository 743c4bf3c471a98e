"""Trace model: validation with located errors, JSONL round trip, curves, time scaling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.trace import (
    FORMAT,
    LlmWait,
    MemoryProfile,
    Task,
    ToolCall,
    TraceError,
    load_tasks,
    mean_and_peak,
    memload_argv,
    memory_at,
    memory_curve,
    profiled_peak,
    save_tasks,
    scale_time,
    shape_fraction,
    task_to_dict,
    trace_category,
)
from execgate.common.units import MiB

MB = 1_000_000


def _task() -> Task:
    return Task(
        "t1",
        [
            LlmWait(5.0),
            ToolCall(
                "pytest -x",
                10.0,
                MemoryProfile(20 * MB, 300 * MB, "ramp", 0.5, 0.9, 50 * MB),
                hint="mem=512m",
            ),
            LlmWait(2.0),
            ToolCall("git status", 1.0, MemoryProfile(2 * MB, 10 * MB, "plateau", 1.0, 0.1)),
            ToolCall(
                "pip install -e .",
                4.0,
                MemoryProfile(0, 280 * MB, "spike", 0.5, 0.5, 0, hold_s=1.0),
            ),
        ],
        baseline_bytes=185 * MB,
        metadata={"source": "test"},
    )


def test_roundtrip(tmp_path: Path) -> None:
    tasks = [_task(), Task("t2", [LlmWait(1.5)])]
    path = tmp_path / "t.jsonl"
    save_tasks(tasks, path)
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[0])["format"] == FORMAT
    back = load_tasks(path)
    assert back == tasks
    assert back[0].tool_calls[0].category == "test"  # derived from the command
    assert back[0].tool_calls[0].hint == "mem=512m"


def test_defaults_and_integral_floats(tmp_path: Path) -> None:
    line = {
        "id": "x",
        "steps": [
            {
                "type": "tool",
                "command": "make -j4",
                "duration_s": 2,
                "memory": {"baseline_bytes": 0, "peak_bytes": 1.5e8},
            }
        ],
    }
    path = tmp_path / "t.jsonl"
    path.write_text("\n" + json.dumps(line) + "\n\n")
    (task,) = load_tasks(path)
    call = task.tool_calls[0]
    assert call.memory == MemoryProfile(0, 150_000_000, "ramp", 0.5, 0.5, 0, 0.0)
    assert call.category == "build" and call.tool == "Bash" and call.hint is None
    assert task.baseline_bytes == 0


def _bad(tmp_path: Path, obj: object, lineno: int = 2) -> str:
    good = json.dumps(task_to_dict(Task("ok", [LlmWait(1.0)])))
    path = tmp_path / "bad.jsonl"
    body = [good] * (lineno - 1) + [obj if isinstance(obj, str) else json.dumps(obj)]
    path.write_text("\n".join(body) + "\n")
    with pytest.raises(TraceError) as e:
        load_tasks(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:{lineno}: "), msg
    return msg


def test_errors_name_path_line_and_field(tmp_path: Path) -> None:
    d = task_to_dict(_task())
    d["steps"][1]["memory"]["peak_bytes"] = 1
    assert "task.steps[1].memory.peak_bytes: must be >= baseline_bytes" in _bad(tmp_path, d)

    d = task_to_dict(_task())
    d["steps"][4]["memory"]["shape"] = "square"
    assert "task.steps[4].memory.shape: must be one of" in _bad(tmp_path, d)

    d = task_to_dict(_task())
    d["steps"][0]["duration_s"] = "5"
    assert "task.steps[0].duration_s: must be a number" in _bad(tmp_path, d)

    d = task_to_dict(_task())
    d["steps"][0]["duration_s"] = -1
    assert "task.steps[0].duration_s: must be a finite number >= 0" in _bad(tmp_path, d)

    d = task_to_dict(_task())
    d["steps"][3]["memory"]["cpu_share"] = 1.5
    assert "task.steps[3].memory.cpu_share: must be a number in [0, 1]" in _bad(tmp_path, d)

    d = task_to_dict(_task())
    d["steps"][4]["memory"]["hold_s"] = 9.0
    assert "task.steps[4].memory.hold_s: must be <= duration_s" in _bad(tmp_path, d)

    d = task_to_dict(_task())
    d["steps"][1]["memroy"] = d["steps"][1].pop("memory")
    assert "task.steps[1].memory: required field missing" in _bad(tmp_path, d)

    d = task_to_dict(_task())
    d["steps"][2]["cmd"] = "x"
    assert "task.steps[2].cmd: unknown field" in _bad(tmp_path, d)

    d = task_to_dict(_task())
    d["steps"][2]["type"] = "sleep"
    assert "task.steps[2].type: must be 'llm' or 'tool'" in _bad(tmp_path, d)

    d = task_to_dict(_task())
    d["format"] = "other/2"
    assert "task.format: expected" in _bad(tmp_path, d)

    assert "invalid JSON" in _bad(tmp_path, "{not json", lineno=2)
    assert "task: must be a JSON object" in _bad(tmp_path, "[1, 2]", lineno=1)
    dup = task_to_dict(Task("ok", [LlmWait(1.0)]))
    assert "duplicate 'ok' (first on line 1)" in _bad(tmp_path, dup)


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="retained_bytes"):
        MemoryProfile(0, 10, retained_bytes=11)
    with pytest.raises(ValueError, match="baseline_bytes"):
        MemoryProfile(-1, 10)
    with pytest.raises(ValueError, match="peak_at"):
        MemoryProfile(0, 10, peak_at=1.2)
    with pytest.raises(ValueError, match="command"):
        ToolCall("", 1.0, MemoryProfile(0, 1))
    with pytest.raises(ValueError, match="id"):
        Task("", [])


@pytest.mark.parametrize(
    ("shape", "x", "p", "want"),
    [
        ("ramp", 0.0, 0.5, 0.0),
        ("ramp", 0.25, 0.5, 0.5),
        ("ramp", 0.9, 0.5, 1.0),
        ("ramp", 0.0, 0.0, 1.0),
        ("spike", 0.5, 0.5, 1.0),
        ("spike", 0.45, 0.5, 0.5),
        ("spike", 0.2, 0.5, 0.0),
        ("plateau", 0.0, 0.4, 1.0),
        ("plateau", 0.4, 0.4, 1.0),
        ("plateau", 0.41, 0.4, 0.0),
        ("sawtooth", 0.125, 0.25, 0.5),
        ("sawtooth", 0.25, 0.25, 1.0),
        ("sawtooth", 0.375, 0.25, 0.5),
    ],
)
def test_shape_fraction(shape: str, x: float, p: float, want: float) -> None:
    assert shape_fraction(shape, x, p) == pytest.approx(want)


def test_memory_at_with_hold() -> None:
    m = MemoryProfile(100, 1100, "ramp", 0.5, hold_s=2.0)
    # 10 s call, 8 s active: rise over 4 s, hold 2 s at peak, then ramp holds the peak.
    assert memory_at(m, 0.0, 10.0) == 100
    assert memory_at(m, 2.0, 10.0) == pytest.approx(600)
    assert memory_at(m, 5.0, 10.0) == 1100
    assert memory_at(m, 9.0, 10.0) == 1100
    spike = MemoryProfile(0, 1000, "spike", 0.5, hold_s=2.0)
    assert memory_at(spike, 3.0, 10.0) == pytest.approx(0)  # x=0.375, outside the triangle
    assert memory_at(spike, 3.5, 10.0) == pytest.approx(375)  # x=0.4375
    assert memory_at(spike, 3.8, 10.0) == pytest.approx(750)  # x=0.475
    assert memory_at(spike, 5.9, 10.0) == 1000  # holding
    assert memory_at(spike, 6.2, 10.0) == pytest.approx(750)  # x=(6.2-2)/8=0.525
    assert memory_at(spike, 9.0, 10.0) == 0
    assert memory_at(MemoryProfile(0, 7), 0.0, 0.0) == 7  # zero-length call: its peak


def test_profiled_peak_counts_retained_memory() -> None:
    # 185 + 300 (first call), then 185 + 50 retained + 280 = 515 for the spike.
    assert profiled_peak(_task()) == 515 * MB
    assert profiled_peak(Task("idle", [LlmWait(3.0)], baseline_bytes=7)) == 7


def test_memory_curve_hits_peak_and_mean() -> None:
    task = _task()
    curve = memory_curve(task, dt=0.1)
    mean, peak = mean_and_peak(curve)
    assert peak == profiled_peak(task)
    assert curve[0] == (0.0, 185 * MB)
    assert curve[-1] == (pytest.approx(22.0), 235 * MB)  # baseline + retained after the end
    # By hand: 185 MB for all 22 s; pytest ramps 20->300 MB over 5 s (mean 160) then holds 300
    # for 5 s; git holds 10 MB for 1 s; 50 MB retained for the 7 s after pytest; the spike is
    # 280 MB for its 1 s hold plus a triangle of area 280 MB * 0.1 * 3 s active.
    exact = (185 * 22 + 160 * 5 + 300 * 5 + 10 * 1 + 50 * 7 + 280 * 1.3) * MB / 22
    assert mean == pytest.approx(exact, rel=0.005)


def test_scale_time_keeps_memory() -> None:
    task = _task()
    fast = scale_time(task, 4.0)
    assert fast.duration_s == pytest.approx(task.duration_s / 4)
    assert fast.llm_wait_s == pytest.approx(task.llm_wait_s / 4)
    assert fast.tool_calls[2].memory.hold_s == pytest.approx(0.25)
    assert [c.memory.peak_bytes for c in fast.tool_calls] == [
        c.memory.peak_bytes for c in task.tool_calls
    ]
    assert profiled_peak(fast) == profiled_peak(task)
    assert fast.metadata["speed"] == 4.0 and "speed" not in task.metadata
    assert scale_time(fast, 0.5).metadata["speed"] == 2.0
    with pytest.raises(ValueError):
        scale_time(task, 0)


def test_memload_argv() -> None:
    call = ToolCall(
        "pytest",
        2.0,
        MemoryProfile(10 * MiB, 512 * MiB + MiB // 2, "spike", 0.6, 0.5, 64 * MiB, hold_s=0.5),
    )
    argv = memload_argv(call, "/opt/memload")
    assert argv[0] == "/opt/memload" and "--hot" not in argv
    assert memload_argv(call, "/opt/memload", hot=True) == [*argv, "--hot"]
    opts = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert opts == {
        "--baseline-mib": "10",
        "--peak-mib": "512.5",
        "--duration": "2.000",
        "--shape": "spike",
        "--peak-at": "0.6000",
        "--hold": "0.500",
        "--cpu": "0.500",
        "--retain-mib": "64",
    }


@pytest.mark.parametrize(
    ("cmd", "cat"),
    [
        ("pip install -e .", "install"),
        ("npm ci", "install"),
        ("python setup.py develop", "install"),
        ("python -m pytest tests -x", "test"),
        ("tox -e py311", "test"),
        ("go test ./...", "test"),
        ("make -j4", "build"),
        ("sed -i 's/a/b/' f.py", "edit"),
        ("git diff", "light"),
        ("grep -rn foo .", "light"),
        ("cat setup.py", "light"),
        ("python reproduce.py", "run"),
        ("Read /x", "light"),
        ("frobnicate", "other"),
        ("cat pytest/config.py", "light"),
        ("python -c 'import pytest'", "run"),
        ("cd /testbed && python -m pytest -x", "test"),
        ("PYTHONPATH=. pytest tests", "test"),
        ("grep -rn make_dataset .", "light"),
        ("python runtests.py", "test"),
        ("cd x && python r.py", "run"),
    ],
)
def test_trace_category(cmd: str, cat: str) -> None:
    assert trace_category(cmd) == cat


def test_memload_timings_are_taken_out_of_a_calls_stderr() -> None:
    from bench.trace import memload_timings

    err = ("[execgate] This call waited 3 s before starting\n"
           "memload: timings start=10.5 full=11.25 left=16.5 end=16.75\nbye\n")
    t, rest = memload_timings(err)
    assert t == {"start": 10.5, "full": 11.25, "left": 16.5, "end": 16.75}
    assert rest == "[execgate] This call waited 3 s before starting\nbye\n"
    assert memload_timings("Killed\n") == (None, "Killed\n")
    assert memload_timings("memload: timings start=x full=1 left=2 end=3") == (
        None, "memload: timings start=x full=1 left=2 end=3")
