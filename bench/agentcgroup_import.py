"""Import AgentCgroup attempt directories (resources.json + tool_calls.json) as traces.

AgentCgroup sampled `docker stats` of each sandbox at ~1 Hz (resources.json: samples with a unix
`epoch`) and logged the agent's tool calls with ISO timestamps in UTC (tool_calls.json). The two
are aligned on epoch seconds: a 'Z' (or offset-less) timestamp is read as UTC, never as local
time, or every burst would be attributed to the wrong call on a non-UTC machine.

Derivation, per attempt:

* task baseline = 10th percentile of the samples outside every tool window (the framework's
  resident memory, ~185 MB in the published data); all samples if none are outside;
* a call's window is [start, end]; if no sample falls inside (calls shorter than the sampling
  interval), the first sample after start within one interval stands in;
* level before a call = last sample before its start (else the baseline plus what earlier calls
  retained); burst peak = max(window) - level, floor = min(window) - level (both >= 0);
* retained = first sample after the call (before the next one starts) - level before, when that
  is at least RETAIN_MIN_BYTES (smaller rises are docker-stats noise), capped at the peak;
* shape: <3 samples -> 'plateau' held to the end (conservative: the peak lasts the whole call);
  else 'spike' if at most a third of the samples are in the upper half of the burst, 'sawtooth'
  if the burst falls and rises again twice, 'ramp' if it stays high after its peak, else
  'plateau' ending where the burst last was high; cpu_share = mean cpu% / 100 capped at 1;
* gaps between calls (and before the first / after the last) become LLM waits; overlapping
  (parallel) calls are serialised with a zero gap and counted in metadata.

A task's id is `<task>/<attempt>`, led by its experiment folder (and further parents) when the
same task is imported from several, as in the published layout
experiments/<experiment>/<task>/attempt_N; a directory reached through two DIRs counts once.

Usage, from the repository root (or with PYTHONPATH set to it; stdlib only, nothing installed):

    python3 -m bench.agentcgroup_import EXPERIMENTS_DIR... -o tasks.jsonl [--bash-only]
    python3 -m bench.replay plan --trace tasks.jsonl --tasks N
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from bench.metrics import percentile
from bench.trace import (
    LlmWait,
    MemoryProfile,
    Step,
    Task,
    ToolCall,
    trace_category,
    write_tasks,
)

RETAIN_MIN_BYTES = 16 * 1000 * 1000
BASELINE_PERCENTILE = 10.0

# Docker/podman print sizes with go-units: HumanSize is decimal (kB, MB, GB: powers of 1000),
# BytesSize is binary (KiB, MiB, GiB: powers of 1024). Take each suffix at its word.
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "pb": 1000**5,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "pib": 1024**5,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d+))?\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | float) -> int:
    """Bytes from a docker-stats size ('185MB', '1.2GiB', '512KiB', '0B') or usage pair
    ('185MB / 134.5GB' -> the usage). Raises ValueError on anything else (e.g. '--')."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int | float):
        if text < 0:
            raise ValueError(f"negative size: {text!r}")
        return int(text)
    usage = text.split("/", 1)[0]
    m = _SIZE_RE.match(usage)
    unit = m.group(3).lower() if m else ""
    if not m or unit not in _SIZE_UNITS:
        raise ValueError(f"not a size: {text!r}")
    value = float(m.group(1) + (f"e{m.group(2)}" if m.group(2) else ""))
    return round(value * _SIZE_UNITS[unit])


def parse_percent(value: Any) -> float:
    """CPU percent from '12.5%', '12.5' or 12.5; 0.0 if unparseable (docker prints '--')."""
    if isinstance(value, bool):
        return 0.0
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value).strip().rstrip("%"))
    except ValueError:
        return 0.0


def parse_utc(ts: str) -> float:
    """Unix seconds from an ISO-8601 timestamp; no offset means UTC (AgentCgroup logs UTC)."""
    dt = datetime.fromisoformat(ts.strip())
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


@dataclass(frozen=True)
class Sample:
    t: float
    mem: int
    cpu: float


@dataclass(frozen=True)
class _Call:
    tool: str
    command: str
    start: float
    end: float


def load_samples(resources: Any, where: str = "resources.json") -> tuple[list[Sample], int]:
    """Samples sorted by time, and how many were skipped as unparseable."""
    if not isinstance(resources, dict) or not isinstance(resources.get("samples"), list):
        raise ValueError(f"{where}: expected an object with a 'samples' list")
    out: list[Sample] = []
    skipped = 0
    for s in resources["samples"]:
        try:
            if isinstance(s.get("epoch"), int | float) and not isinstance(s["epoch"], bool):
                t = float(s["epoch"])
            else:
                t = parse_utc(s["timestamp"])
            out.append(Sample(t, parse_size(s["mem_usage"]), parse_percent(s.get("cpu_percent"))))
        except (AttributeError, KeyError, TypeError, ValueError):
            skipped += 1
    out.sort(key=lambda x: x.t)
    return out, skipped


def _command_of(entry: dict[str, Any]) -> str:
    """The shell command of a Bash call; a readable stand-in for the framework's other tools."""
    tool = str(entry.get("tool") or "Unknown")
    inp = entry.get("input") if isinstance(entry.get("input"), dict) else {}
    if isinstance(inp.get("command"), str) and inp["command"].strip():
        return inp["command"]
    for key in ("file_path", "path", "pattern", "url", "query"):
        if isinstance(inp.get(key), str):
            return f"{tool} {inp[key]}"
    return tool


def load_calls(tool_calls: Any, where: str = "tool_calls.json") -> list[_Call]:
    if not isinstance(tool_calls, list):
        raise ValueError(f"{where}: expected a list of tool calls")
    calls = []
    for i, e in enumerate(tool_calls):
        if not isinstance(e, dict) or not isinstance(e.get("timestamp"), str):
            raise ValueError(f"{where}[{i}].timestamp: missing or not a string")
        start = parse_utc(e["timestamp"])
        end_ts = e.get("end_timestamp")
        end = parse_utc(end_ts) if isinstance(end_ts, str) else start
        calls.append(_Call(str(e.get("tool") or "Unknown"), _command_of(e), start, max(start, end)))
    calls.sort(key=lambda c: c.start)
    return calls


def _shape(rel: Sequence[tuple[float, int]], burst: int, dur: float) -> tuple[str, float]:
    """Classify the (seconds since start, bytes over level) samples of one call's window."""
    if len(rel) < 3 or burst <= 0 or dur <= 0:
        return "plateau", 1.0
    vals = [v for _, v in rel]
    high = [v >= burst / 2 for v in vals]
    i_max = vals.index(max(vals))
    peak_at = min(1.0, max(0.0, rel[i_max][0] / dur))
    swings = sum(
        1
        for a, b, c in zip(vals, vals[1:], vals[2:], strict=False)
        if b < a - 0.3 * burst and c > b + 0.3 * burst
    )
    if sum(high) <= len(vals) / 3:
        return "spike", peak_at
    if swings >= 2:
        return "sawtooth", min(1.0, max(0.05, peak_at))
    if all(high[i_max:]) and i_max > 0:
        return "ramp", peak_at
    last_high = max(i for i, h in enumerate(high) if h)
    return "plateau", min(1.0, max(0.0, rel[last_high][0] / dur))


def build_task(
    task_id: str,
    samples: Sequence[Sample],
    calls: Sequence[_Call],
    *,
    bash_only: bool = False,
    metadata: dict[str, Any] | None = None,
) -> Task:
    """Turn aligned samples and tool calls into a Task (see the module docstring)."""
    if bash_only:
        calls = [c for c in calls if c.tool == "Bash"]
    if not samples:
        raise ValueError(f"{task_id}: no usable resource samples")
    times = [s.t for s in samples]
    gaps = [b - a for a, b in pairwise(times) if b > a]
    interval = percentile(gaps, 50) if gaps else 1.0

    def inside(s: Sample) -> bool:
        return any(c.start <= s.t <= c.end for c in calls)

    outside = [s.mem for s in samples if not inside(s)] or [s.mem for s in samples]
    baseline = int(percentile(outside, BASELINE_PERCENTILE))

    steps: list[Step] = []
    cursor = min(times[0], calls[0].start) if calls else times[0]
    retained_total = 0
    overlaps = 0
    for i, c in enumerate(calls):
        if c.start < cursor:
            overlaps += 1
        elif c.start > cursor:
            steps.append(LlmWait(round(c.start - cursor, 6)))
        before = [s for s in samples if s.t < c.start]
        level = before[-1].mem if before else baseline + retained_total
        window = [s for s in samples if c.start <= s.t <= c.end]
        if not window:
            window = [s for s in samples if c.start <= s.t <= c.end + interval][:1]
        dur = round(c.end - c.start, 6)
        if window:
            burst = max(0, max(s.mem for s in window) - level)
            floor = min(max(0, min(s.mem for s in window) - level), burst)
            cpu = min(1.0, max(0.0, sum(s.cpu for s in window) / len(window) / 100))
            shape, peak_at = _shape([(s.t - c.start, s.mem - level) for s in window], burst, dur)
        else:
            burst = floor = 0
            cpu, shape, peak_at = 0.0, "plateau", 1.0
        next_start = calls[i + 1].start if i + 1 < len(calls) else float("inf")
        after = [s for s in samples if c.end < s.t < next_start]
        retained = after[0].mem - level if after else 0
        retained = min(retained, burst) if retained >= RETAIN_MIN_BYTES else 0
        retained_total += retained
        memory = MemoryProfile(floor, burst, shape, peak_at, cpu, retained)
        steps.append(ToolCall(c.command, dur, memory, None, c.tool, trace_category(c.command)))
        cursor = max(cursor, c.start) + dur
    end = max(times[-1], calls[-1].end if calls else times[-1])
    if end > cursor:
        steps.append(LlmWait(round(end - cursor, 6)))
    meta = {
        "source": "agentcgroup",
        "n_samples": len(samples),
        "sample_interval_s": interval,
        "overlapping_calls": overlaps,
        "start_epoch": min(times[0], calls[0].start) if calls else times[0],
    }
    meta.update(metadata or {})
    return Task(task_id, steps, baseline, meta)


def task_ids(attempts: Sequence[Path]) -> list[str]:
    """One id per attempt directory: `<task>/<attempt>`, led by as many parent folders (the
    experiment's first) as it takes to tell apart attempts of the same name.

    In the published layout (experiments/<experiment>/<task>/attempt_N) a task runs in several
    experiments, and the replayer refuses a trace whose ids repeat.
    """
    parts = [p.resolve().parts for p in attempts]
    depth = [2 if p.name.startswith("attempt") else 1 for p in attempts]
    while True:
        ids = ["/".join(pp[-n:]) for pp, n in zip(parts, depth, strict=True)]
        seen = Counter(ids)
        clashing = [i for i, x in enumerate(ids) if seen[x] > 1]
        if not clashing:
            return ids
        grown = False
        for i in clashing:
            if depth[i] < len(parts[i]) - 1:  # up to the top folder, never the root '/'
                depth[i] += 1
                grown = True
        if not grown:
            raise ValueError(f"{ids[clashing[0]]}: the same attempt directory twice")


def import_attempt(
    path: str | Path, *, bash_only: bool = False, task_id: str | None = None
) -> Task:
    """Read one AgentCgroup attempt directory (e.g. .../<task>/attempt_1) into a Task;
    `task_id` defaults to `task_ids`' for the directory alone."""
    d = Path(path)
    with open(d / "resources.json", encoding="utf-8") as f:
        resources = json.load(f)
    with open(d / "tool_calls.json", encoding="utf-8") as f:
        tool_calls = json.load(f)
    samples, skipped = load_samples(resources, str(d / "resources.json"))
    calls = load_calls(tool_calls, str(d / "tool_calls.json"))
    task_id = task_id or task_ids([d])[0]
    meta: dict[str, Any] = {"path": str(d), "skipped_samples": skipped}
    results = d / "results.json"
    if results.is_file():
        try:
            with open(results, encoding="utf-8") as f:
                r = json.load(f)
            meta.update({k: r[k] for k in ("success", "claude_time") if k in r})
        except (OSError, ValueError, TypeError):
            pass
    return build_task(task_id, samples, calls, bash_only=bash_only, metadata=meta)


def find_attempts(root: str | Path) -> list[Path]:
    """`root` itself if it is an attempt directory, else every attempt directory below it."""
    r = Path(root)
    if (r / "resources.json").is_file():
        return [r]
    return sorted(
        p.parent for p in r.rglob("resources.json") if (p.parent / "tool_calls.json").is_file()
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.agentcgroup_import",
        description="Convert AgentCgroup attempt directories into an execgate JSONL trace.",
    )
    ap.add_argument(
        "dirs", nargs="+", metavar="DIR", help="attempt directory, or a directory searched for them"
    )
    ap.add_argument("-o", "--output", default="-", help="output JSONL (default: stdout)")
    ap.add_argument("--bash-only", action="store_true", help="keep only Bash tool calls")
    args = ap.parse_args(argv)
    attempts: dict[Path, Path] = {}  # a directory reached through two roots counts once
    for root in args.dirs:
        found = find_attempts(root)
        if not found:
            print(f"agentcgroup_import: {root}: no attempt directories found", file=sys.stderr)
            return 1
        for d in found:
            attempts.setdefault(d.resolve(), d)
    dirs = list(attempts.values())
    tasks = []
    for d, task_id in zip(dirs, task_ids(dirs), strict=True):
        try:
            tasks.append(import_attempt(d, bash_only=args.bash_only, task_id=task_id))
        except (OSError, ValueError) as e:
            print(f"agentcgroup_import: {d}: {e}", file=sys.stderr)
            return 1
    if args.output == "-":
        write_tasks(tasks, sys.stdout)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            write_tasks(tasks, f)
    print(f"agentcgroup_import: {len(tasks)} task(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
