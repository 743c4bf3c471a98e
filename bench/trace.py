"""Agent-task traces for the replay benchmark: data model, JSONL I/O, memory curves.

A trace is what one coding-agent task did, reduced to what matters for memory admission:
LLM waits (the sandbox idles) and tool calls (one `docker exec` each) with a memory profile.
The same profile drives three consumers, so its meaning is pinned down here once:

* the replay driver turns it into a `memload` command line (`memload_argv`);
* `memory_at` is the Python reference of the curve `bench/load/memload.c` draws;
* `profiled_peak` is what an oracle admission policy would reserve for the task.

See bench/TRACE_FORMAT.md for the on-disk format.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any, TextIO

from execgate.common.units import MiB

FORMAT = "execgate-trace/1"

# Shape vocabulary; kept tiny so memload.c can mirror it exactly.
SHAPES = ("ramp", "spike", "plateau", "sawtooth")
# A spike is a triangle of base width 2*SPIKE_HALF_WIDTH (fraction of the call's active time).
SPIKE_HALF_WIDTH = 0.1


class TraceError(ValueError):
    """A trace file or object is invalid; the message names the file, line and field."""


@dataclass(frozen=True)
class MemoryProfile:
    """Memory of one tool call's own process tree (what its exec cgroup would be charged).

    The curve goes from `baseline_bytes` (held from the first tick) to `peak_bytes`, following
    `shape`; the first peak is reached at `peak_at` (fraction of the call's active time) and held
    for `hold_s` seconds. For "sawtooth", `peak_at` is the tooth length, so it repeats.
    `retained_bytes` stays charged to the sandbox after the call exits (pip caches, files in
    tmpfs, a leftover daemon) and accumulates across the task's later steps.
    """

    baseline_bytes: int
    peak_bytes: int
    shape: str = "ramp"
    peak_at: float = 0.5
    cpu_share: float = 0.5
    retained_bytes: int = 0
    hold_s: float = 0.0

    def __post_init__(self) -> None:
        _check_bytes("baseline_bytes", self.baseline_bytes)
        _check_bytes("peak_bytes", self.peak_bytes)
        _check_bytes("retained_bytes", self.retained_bytes)
        if self.peak_bytes < self.baseline_bytes:
            raise ValueError(
                f"peak_bytes: must be >= baseline_bytes ({self.peak_bytes} < {self.baseline_bytes})"
            )
        if self.retained_bytes > self.peak_bytes:
            raise ValueError(
                f"retained_bytes: must be <= peak_bytes ({self.retained_bytes} > {self.peak_bytes})"
            )
        if self.shape not in SHAPES:
            raise ValueError(f"shape: must be one of {', '.join(SHAPES)} (got {self.shape!r})")
        _check_fraction("peak_at", self.peak_at)
        _check_fraction("cpu_share", self.cpu_share)
        _check_seconds("hold_s", self.hold_s)


@dataclass(frozen=True)
class ToolCall:
    """One agent tool call = one `docker exec`; `hint` is its AGENT_RESOURCE_HINT, if any."""

    command: str
    duration_s: float
    memory: MemoryProfile
    hint: str | None = None
    tool: str = "Bash"
    category: str = ""  # empty: derived from the command by trace_category

    def __post_init__(self) -> None:
        if not isinstance(self.command, str) or not self.command:
            raise ValueError("command: must be a non-empty string")
        if not self.category:
            object.__setattr__(self, "category", trace_category(self.command))
        _check_seconds("duration_s", self.duration_s)
        if self.memory.hold_s > self.duration_s:
            raise ValueError(
                f"memory.hold_s: must be <= duration_s ({self.memory.hold_s} > {self.duration_s})"
            )
        if self.category not in CATEGORIES:
            raise ValueError(f"category: must be one of {', '.join(CATEGORIES)}")


@dataclass(frozen=True)
class LlmWait:
    """Time the agent spends waiting for the model; the sandbox only holds its baseline."""

    duration_s: float

    def __post_init__(self) -> None:
        _check_seconds("duration_s", self.duration_s)


Step = ToolCall | LlmWait


@dataclass
class Task:
    """One agent task attempt; `baseline_bytes` is the framework's resident memory (~185 MB)."""

    id: str
    steps: list[Step]
    baseline_bytes: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError("id: must be a non-empty string")
        _check_bytes("baseline_bytes", self.baseline_bytes)

    @property
    def duration_s(self) -> float:
        """Wall time of the task when replayed without any queuing."""
        return sum(s.duration_s for s in self.steps)

    @property
    def llm_wait_s(self) -> float:
        return sum(s.duration_s for s in self.steps if isinstance(s, LlmWait))

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [s for s in self.steps if isinstance(s, ToolCall)]


# Coarse command classes: the characterisation's split into heavy (tests, installs, builds)
# and light (git/grep/ls/cat) calls. Order matters: first match wins.
CATEGORIES = ("install", "test", "build", "edit", "run", "light", "other")
# A program counts only in command position (start, after ;&|( or a runner such as `python -m`,
# `poetry run`, `timeout 60`, `VAR=x`), so "cat pytest/config.py" or "import pytest" stay light.
_CMD = r"(?:^|[;&|(`]|\s-m|\brun|\bexec|\bxargs|\btimeout\s+\S+|\b\w+=\S*)\s*"
_END = r"(?![\w./-])"
_INSTALL = r"(pip3?|uv pip|poetry|conda|npm|yarn|pnpm|apt(-get)?|cargo)\s+(install|add|ci|sync)"
_TEST = r"pytest|py\.test|tox|nox|(npm|yarn|go|cargo|make)\s+test|python[\d.]*\s+-m\s+unittest"
_BUILD = r"make|cmake|ninja|gcc|g\+\+|cargo build|go build|tsc"
_RUN = r"python[\d.]*|node|java|ruby|go run|bash|sh"
_LIGHT = (r"ls|cat|head|tail|grep|rg|find|git|wc|pwd|echo|sed|awk|tree|which|file|stat|diff|cd|"
          r"Read|Grep|Glob|LS|TodoWrite")  # fmt: skip


def _at_command(programs: str, anywhere: str | None = None) -> re.Pattern[str]:
    """`programs` in command position, or the `anywhere` pattern anywhere."""
    pattern = f"{_CMD}({programs}){_END}"
    return re.compile(f"{pattern}|{anywhere}" if anywhere else pattern)


_CATEGORY_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("install", _at_command(_INSTALL, r"\bsetup\.py\s+(develop|install)")),
    ("test", _at_command(_TEST, r"(?:^|[\s/])runtests(\.py)?" + _END)),
    ("build", _at_command(_BUILD, r"\bsetup\.py\s+build")),
    ("edit", re.compile(r"^\s*(sed\s+-i|patch\b|apply_patch|tee\b|(Edit|Write|MultiEdit)\b)")),
    ("run", _at_command(_RUN)),
    ("light", re.compile(rf"^\s*({_LIGHT})\b")),
)


def trace_category(command: str) -> str:
    """A trace's category of a command line, one of CATEGORIES (`ToolCall.category`).

    The benchmark's own taxonomy, for calibrating and generating traces; execgate's admission
    classes argv with `execgate.policy.estimate.classify_command`, which this does not mirror.
    """
    for name, pattern in _CATEGORY_PATTERNS:
        if pattern.search(command):
            return name
    return "other"


# ---------------------------------------------------------------------------------------------
# Memory curves (mirrored by bench/load/memload.c)


def _ramp(x: float, p: float) -> float:  # linear rise to the peak at p, then held to the end
    return 1.0 if p <= 0.0 else min(1.0, x / p)


def _spike(x: float, p: float) -> float:  # short triangle centred on p
    return max(0.0, 1.0 - abs(x - p) / SPIKE_HALF_WIDTH)


def _plateau(x: float, p: float) -> float:  # at peak from the start until p, then back down
    return 1.0 if x <= p else 0.0


def _sawtooth(x: float, p: float) -> float:  # teeth of length p, each a rise to the peak
    if p <= 0.0:
        return 1.0
    r = math.fmod(x, p)
    return 1.0 if (r == 0.0 and x > 0.0) else r / p


# Each shape's fraction of x in [0, 1] (a Curve keeps its own: no lookup per evaluation).
_FRACTIONS = {"ramp": _ramp, "spike": _spike, "plateau": _plateau, "sawtooth": _sawtooth}


def shape_fraction(shape: str, x: float, peak_at: float) -> float:
    """Where between baseline (0) and peak (1) the curve is at fraction x of the active time."""
    fraction = _FRACTIONS.get(shape)
    if fraction is None:
        raise ValueError(f"unknown shape {shape!r}")
    return fraction(min(1.0, max(0.0, x)), peak_at)


class Curve:
    """`memory_at` of one call: its constants computed once, for callers that evaluate the
    curve many times (the simulator, every period of every running call). Same arithmetic,
    same floats."""

    __slots__ = ("active", "baseline", "fraction", "hold", "peak", "peak_at", "span", "t_peak")

    def __init__(self, profile: MemoryProfile, duration_s: float) -> None:
        self.baseline, self.peak = profile.baseline_bytes, profile.peak_bytes
        self.fraction, self.peak_at = _FRACTIONS[profile.shape], profile.peak_at
        self.span = profile.peak_bytes - profile.baseline_bytes
        self.hold = min(profile.hold_s, duration_s)
        self.active = duration_s - self.hold
        self.t_peak = profile.peak_at * self.active

    def __call__(self, t: float) -> float:
        """Bytes the call holds t seconds after it started."""
        active = self.active
        if active <= 0.0:
            return float(self.peak)
        if t < self.t_peak:
            x = t / active
        elif t < self.t_peak + self.hold:
            return float(self.peak)
        else:
            x = (t - self.hold) / active
        return self.baseline + self.span * self.fraction(min(1.0, max(0.0, x)), self.peak_at)


def memory_at(profile: MemoryProfile, t: float, duration_s: float) -> float:
    """Bytes the call holds t seconds after it started; `hold_s` freezes the curve at peak_at."""
    return Curve(profile, duration_s)(t)


def profiled_peak(task: Task) -> int:
    """Peak sandbox memory the trace implies: baseline + retained so far + the largest burst."""
    retained = 0
    peak = task.baseline_bytes
    for step in task.steps:
        if isinstance(step, ToolCall):
            peak = max(peak, task.baseline_bytes + retained + step.memory.peak_bytes)
            retained += step.memory.retained_bytes
    return peak


def memory_curve(task: Task, dt: float = 0.25) -> list[tuple[float, float]]:
    """Sandbox memory sampled every dt seconds (plus each call's peak instant, so none is lost)."""
    if dt <= 0:
        raise ValueError("dt must be > 0")
    out: list[tuple[float, float]] = []
    start = 0.0
    retained = 0
    for step in task.steps:
        floor = task.baseline_bytes + retained
        n = max(1, math.ceil(step.duration_s / dt))
        times = [start + i * step.duration_s / n for i in range(n)]
        if isinstance(step, ToolCall):
            m = step.memory
            active = step.duration_s - min(m.hold_s, step.duration_s)
            times.append(start + m.peak_at * active)
            times.sort()
            curve = Curve(m, step.duration_s)
            out.extend((t, floor + curve(t - start)) for t in times)
            retained += m.retained_bytes
        else:
            out.extend((t, float(floor)) for t in times)
        start += step.duration_s
    out.append((start, float(task.baseline_bytes + retained)))
    return out


def mean_and_peak(curve: list[tuple[float, float]]) -> tuple[float, float]:
    """Time-weighted mean (each sample holds until the next) and maximum of a curve."""
    if not curve:
        return 0.0, 0.0
    total = curve[-1][0] - curve[0][0]
    peak = max(v for _, v in curve)
    if total <= 0:
        return curve[0][1], peak
    area = sum(v * (t2 - t1) for (t1, v), (t2, _) in pairwise(curve))
    return area / total, peak


def scale_time(task: Task, speed: float) -> Task:
    """Compress a trace by `speed` (2.0 = twice as fast): times / speed, memory unchanged.

    metadata["speed"] accumulates so results can be reported in wall and in trace time.
    """
    if not (isinstance(speed, int | float) and math.isfinite(speed) and speed > 0):
        raise ValueError(f"speed must be a finite number > 0 (got {speed!r})")
    steps: list[Step] = []
    for s in task.steps:
        if isinstance(s, LlmWait):
            steps.append(LlmWait(s.duration_s / speed))
        else:
            mem = replace(s.memory, hold_s=s.memory.hold_s / speed)
            steps.append(replace(s, duration_s=s.duration_s / speed, memory=mem))
    meta = dict(task.metadata)
    meta["speed"] = float(meta.get("speed", 1.0)) * speed
    return replace(task, steps=steps, metadata=meta)


def memload_argv(call: ToolCall, binary: str = "memload",
                 fill_ratio: float | None = None, hot: bool = False) -> list[str]:
    """The memload command line that reproduces `call` (sizes in MiB, fractional allowed);
    `fill_ratio`: the zstd ratio of the pages it writes (None: memload's default, 3); `hot`:
    its pages are read every tick (a working set in use, not written once and left)."""
    m = call.memory

    def mib(n: int) -> str:
        return f"{n / MiB:.3f}".rstrip("0").rstrip(".")

    opts = [
        ("--baseline-mib", mib(m.baseline_bytes)),
        ("--peak-mib", mib(m.peak_bytes)),
        ("--duration", f"{call.duration_s:.3f}"),
        ("--shape", m.shape),
        ("--peak-at", f"{m.peak_at:.4f}"),
        ("--hold", f"{m.hold_s:.3f}"),
        ("--cpu", f"{m.cpu_share:.3f}"),
        ("--retain-mib", mib(m.retained_bytes)),
    ]
    if fill_ratio is not None:
        opts.append(("--fill-ratio", f"{fill_ratio:g}"))
    return [binary, *(arg for pair in opts for arg in pair), *(["--hot"] if hot else [])]


# In a call's exec environment: memload ends with one `memload: timings ...` line on stderr.
TIMINGS_ENV = "MEMLOAD_TIMINGS=1"
_TIMINGS = re.compile(r"^memload: timings start=(\S+) full=(\S+) left=(\S+) end=(\S+)$", re.M)


def memload_timings(stderr: str) -> tuple[dict[str, float] | None, str]:
    """memload's own timings from a call's stderr (CLOCK_MONOTONIC seconds: start, full = first
    at its highest level, left = first below it, end), and the stderr without that line. None
    when it did not end on its own (killed, never started)."""
    m = _TIMINGS.search(stderr)
    if not m:
        return None, stderr
    try:
        values = [float(v) for v in m.groups()]
    except ValueError:
        return None, stderr
    rest = stderr[:m.start()] + stderr[m.end():].removeprefix("\n")
    return dict(zip(("start", "full", "left", "end"), values, strict=True)), rest


# ---------------------------------------------------------------------------------------------
# JSON (de)serialisation


def task_to_dict(task: Task) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    for s in task.steps:
        if isinstance(s, LlmWait):
            steps.append({"type": "llm", "duration_s": s.duration_s})
            continue
        m = s.memory
        steps.append(
            {
                "type": "tool",
                "tool": s.tool,
                "command": s.command,
                "category": s.category,
                "hint": s.hint,
                "duration_s": s.duration_s,
                "memory": {
                    "baseline_bytes": m.baseline_bytes,
                    "peak_bytes": m.peak_bytes,
                    "shape": m.shape,
                    "peak_at": m.peak_at,
                    "hold_s": m.hold_s,
                    "cpu_share": m.cpu_share,
                    "retained_bytes": m.retained_bytes,
                },
            }
        )
    return {
        "format": FORMAT,
        "id": task.id,
        "baseline_bytes": task.baseline_bytes,
        "metadata": task.metadata,
        "steps": steps,
    }


def task_from_dict(obj: Any, where: str = "task") -> Task:
    """Build a Task from parsed JSON; errors are TraceError naming the offending field."""
    d = _object(obj, where)
    _keys(d, where, required={"id", "steps"}, optional={"format", "baseline_bytes", "metadata"})
    if "format" in d and d["format"] != FORMAT:
        raise TraceError(f"{where}.format: expected {FORMAT!r} (got {d['format']!r})")
    steps_raw = d["steps"]
    if not isinstance(steps_raw, list):
        raise TraceError(f"{where}.steps: must be a list")
    steps = [_step_from_dict(s, f"{where}.steps[{i}]") for i, s in enumerate(steps_raw)]
    metadata = d.get("metadata", {})
    if not isinstance(metadata, dict):
        raise TraceError(f"{where}.metadata: must be an object")
    baseline = _int(d, "baseline_bytes", where, default=0)
    return _build(Task, where, id=d["id"], steps=steps, baseline_bytes=baseline, metadata=metadata)


def _step_from_dict(obj: Any, where: str) -> Step:
    d = _object(obj, where)
    kind = d.get("type")
    if kind == "llm":
        _keys(d, where, required={"type", "duration_s"}, optional=set())
        return _build(LlmWait, where, duration_s=_num(d, "duration_s", where))
    if kind != "tool":
        raise TraceError(f"{where}.type: must be 'llm' or 'tool' (got {kind!r})")
    _keys(
        d,
        where,
        required={"type", "command", "duration_s", "memory"},
        optional={"hint", "tool", "category"},
    )
    hint = d.get("hint")
    if hint is not None and not isinstance(hint, str):
        raise TraceError(f"{where}.hint: must be a string or null")
    for key in ("command", "tool", "category"):
        if key in d and not isinstance(d[key], str):
            raise TraceError(f"{where}.{key}: must be a string")
    mw = f"{where}.memory"
    m = _object(d["memory"], mw)
    _keys(
        m,
        mw,
        required={"baseline_bytes", "peak_bytes"},
        optional={"shape", "peak_at", "hold_s", "cpu_share", "retained_bytes"},
    )
    if "shape" in m and not isinstance(m["shape"], str):
        raise TraceError(f"{mw}.shape: must be a string")
    memory = _build(
        MemoryProfile,
        mw,
        baseline_bytes=_int(m, "baseline_bytes", mw),
        peak_bytes=_int(m, "peak_bytes", mw),
        shape=m.get("shape", "ramp"),
        peak_at=_num(m, "peak_at", mw, default=0.5),
        hold_s=_num(m, "hold_s", mw, default=0.0),
        cpu_share=_num(m, "cpu_share", mw, default=0.5),
        retained_bytes=_int(m, "retained_bytes", mw, default=0),
    )
    command = d["command"]
    return _build(
        ToolCall,
        where,
        command=command,
        duration_s=_num(d, "duration_s", where),
        memory=memory,
        hint=hint,
        tool=d.get("tool", "Bash"),
        category=d.get("category", ""),
    )


def load_tasks(path: str | Path) -> list[Task]:
    """Read a JSONL trace file (one task per line; blank lines ignored)."""
    with open(path, encoding="utf-8") as f:
        return list(iter_tasks(f, str(path)))


def iter_tasks(lines: Iterable[str], name: str = "<trace>") -> Iterator[Task]:
    """Parse JSONL lines lazily; a TraceError says `name:line: field: problem`."""
    seen: dict[str, int] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{name}:{lineno}: invalid JSON: {e.msg} (column {e.colno})") from e
        try:
            task = task_from_dict(obj)
        except TraceError as e:
            raise TraceError(f"{name}:{lineno}: {e}") from e
        if task.id in seen:
            raise TraceError(
                f"{name}:{lineno}: task.id: duplicate {task.id!r} (first on line {seen[task.id]})"
            )
        seen[task.id] = lineno
        yield task


def save_tasks(tasks: Iterable[Task], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        write_tasks(tasks, f)


def write_tasks(tasks: Iterable[Task], f: TextIO) -> None:
    for task in tasks:
        f.write(json.dumps(task_to_dict(task), separators=(",", ":"), allow_nan=False))
        f.write("\n")


# ---------------------------------------------------------------------------------------------
# Validation helpers


def _check_bytes(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{name}: must be an integer >= 0 (got {v!r})")


def _check_seconds(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{name}: must be a finite number >= 0 (got {v!r})")


def _check_fraction(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
        raise ValueError(f"{name}: must be a number in [0, 1] (got {v!r})")


def _object(obj: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: must be a JSON object (got {type(obj).__name__})")
    return obj


def _keys(d: Mapping[str, Any], where: str, required: set[str], optional: set[str]) -> None:
    missing = sorted(required - d.keys())
    if missing:
        raise TraceError(f"{where}.{missing[0]}: required field missing")
    unknown = sorted(d.keys() - required - optional)
    if unknown:
        raise TraceError(f"{where}.{unknown[0]}: unknown field")


def _num(d: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TraceError(f"{where}.{key}: must be a number (got {v!r})")
    return v


def _int(d: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = d.get(key, default)
    if isinstance(v, float) and v.is_integer():  # 1.5e8 written by another tool
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(f"{where}.{key}: must be an integer (got {v!r})")
    return v


def _build(cls: type, where: str, **kwargs: Any) -> Any:
    """Construct and re-raise __post_init__'s 'field: problem' as a located TraceError."""
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise TraceError(f"{where}.{e}") from e
