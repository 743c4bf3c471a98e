"""Training rows for the demand model: finished calls from a journal, the daemon's history
store or execgate-trace/1 files, and their causal features.

Every source becomes `CallRow`s with an arrival and an end on one timeline; `features` replays
them in time order through one `CallHistory`, computing each call's vector at its arrival and
teaching the history its peak at its end, exactly as the daemon does live. So no row sees
itself or a later call, and a model trained here sees the vectors the daemon will compute.

Trace files are read here, not with bench.trace (bench is not installed): only the fields a
predictor needs (the command, hint, duration and the memory profile's peak and mean).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from execgate.common import records
from execgate.common.hints import parse as parse_hint
from execgate.policy.estimate import EstimateConfig
from execgate.policy.predictor_features import CallHistory

# A zero-length call still ends after it arrives (its own peak must not be in its features).
_EPSILON_S = 1e-6


@dataclass(frozen=True)
class CallRow:
    """One finished call. `group` is its task (a sandbox's life): the unit of a causal split."""

    group: str
    sandbox: str
    argv: tuple[str, ...]
    declared_bytes: int | None
    arrive: float
    end: float
    peak_bytes: int
    avg_bytes: int | None
    oom_killed: bool = False
    call: str = ""  # the journal's call id ("" for a trace's step)

    @property
    def duration_s(self) -> float:
        return self.end - self.arrive


def _declared(hint: Any) -> int | None:
    if isinstance(hint, dict):
        v = hint.get("memory_bytes")
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
    if isinstance(hint, str):
        parsed = parse_hint(hint).hint
        return parsed.memory_bytes if parsed is not None else None
    return None


def journal_row(entry: dict[str, Any], avg: int | None = None) -> CallRow | None:
    """A journal entry as a row; None for a call that never ran (the daemon skips it too)."""
    peak = entry.get("memory_peak")
    start = entry.get("start")
    if not entry.get("pids_peak") or not isinstance(peak, int) or \
            not isinstance(start, int | float):
        return None
    end = entry.get("end")
    if not isinstance(end, int | float):
        end = start + float(entry.get("duration") or 0)
    sandbox = str(entry.get("sandbox") or entry.get("container") or "")
    return CallRow(sandbox, sandbox, tuple(str(a) for a in entry.get("argv") or []),
                   _declared(entry.get("hint")), float(start),
                   max(float(end), float(start) + _EPSILON_S), peak,
                   avg if isinstance(avg, int) else None, bool(entry.get("oom_killed")),
                   str(entry.get("call") or ""))


def journal_rows(path: str) -> list[CallRow]:
    """The rows of one journal file, read a line at a time."""
    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    return [r for e in records.read_journal(path) if (r := journal_row(e)) is not None]


def store_rows(path: str) -> list[CallRow]:
    """The daemon's history store (history.sqlite: the journal's entries with the averages
    the daemon sampled), read-only."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT entry, memory_avg FROM calls").fetchall()
    finally:
        db.close()
    return [r for entry, avg in rows if (r := journal_row(json.loads(entry), avg)) is not None]


def _mean_fraction(memory: dict[str, Any], duration: float) -> float:
    """Mean of a trace profile's level between its baseline (0) and peak (1); TRACE_FORMAT.md's
    shapes, integrated."""
    p = float(memory.get("peak_at", 0.5))
    shape = memory.get("shape", "ramp")
    f = {"ramp": 1 - p / 2, "spike": 0.1, "plateau": p, "sawtooth": 0.5}.get(shape, 0.5)
    hold = min(float(memory.get("hold_s", 0.0)), duration)
    return (f * (duration - hold) + hold) / duration if duration > 0 else 1.0


def trace_rows(path: str) -> list[CallRow]:
    """The tool calls of an execgate-trace/1 file; tasks run one after another, in the order of
    their `metadata.start_epoch` where every task has one (imported traces), else file order."""
    tasks = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                task = json.loads(line)
                tasks.append((task["id"], task.get("metadata") or {}, task["steps"]))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a trace task ({e})") from None
    if tasks and all(isinstance(m.get("start_epoch"), int | float) for _, m, _ in tasks):
        tasks.sort(key=lambda t: t[1]["start_epoch"])
    rows, t = [], 0.0
    for task_id, _meta, steps in tasks:
        for step in steps:
            dur = max(float(step.get("duration_s", 0.0)), 0.0)
            if step.get("type") == "tool":
                mem = step["memory"]
                base, peak = int(mem.get("baseline_bytes", 0)), int(mem["peak_bytes"])
                avg = base + round((peak - base) * _mean_fraction(mem, dur))
                rows.append(CallRow(str(task_id), str(task_id),
                                    ("sh", "-c", str(step["command"])),
                                    _declared(step.get("hint")), t,
                                    t + max(dur, _EPSILON_S), peak, avg))
            t += dur
    return rows


def rows_from(paths: Iterable[str]) -> list[CallRow]:
    """Rows of every file: *.sqlite a history store, a file of journal entries (a `call` key)
    or of trace tasks (`steps`), told apart by their first line. A call found twice (the
    journal and the store beside it) counts once, with its average if either has it."""
    out: list[CallRow] = []
    for path in paths:
        if path.endswith((".sqlite", ".db")):
            out += store_rows(path)
            continue
        with open(path, encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
        try:
            head = json.loads(first) if first else {}
        except ValueError:
            head = {}
        out += trace_rows(path) if isinstance(head, dict) and "steps" in head \
            else journal_rows(path)
    seen: dict[str, int] = {}
    unique: list[CallRow] = []
    for r in out:
        if not r.call:
            unique.append(r)
        elif r.call not in seen:
            seen[r.call] = len(unique)
            unique.append(r)
        elif r.avg_bytes is not None and unique[seen[r.call]].avg_bytes is None:
            unique[seen[r.call]] = r
    return unique


# Journals (calls.jsonl, and the daemon's rotated calls.jsonl.N), stores, trace files.
SOURCE = re.compile(r"\.(jsonl(\.[0-9]+)?|sqlite)$")


def find_sources(root: str) -> list[str]:
    """Journals (calls.jsonl and its rotated files), stores and trace files (*.jsonl) below a
    directory."""
    if os.path.isfile(root):
        return [root]
    found = []
    for d, _dirs, files in os.walk(root):
        found += [os.path.join(d, n) for n in files if SOURCE.search(n)]
    return sorted(found)


def features(rows: Sequence[CallRow], oom_factor: float = EstimateConfig.oom_peak_factor,
             ) -> tuple[list[CallRow], list[list[float]]]:
    """The rows in arrival order and each one's causal vector (see the module docstring)."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i].arrive, i))
    events = sorted([(rows[i].arrive, 1, i) for i in order]
                    + [(rows[i].end, 0, i) for i in order])
    history = CallHistory()
    vec: dict[int, list[float]] = {}
    for _t, kind, i in events:
        r = rows[i]
        if kind == 1:
            vec[i] = history.features(r.sandbox, r.argv, r.declared_bytes)
        else:
            # An OOM-killed call's peak is scaled as HistoryEstimator.observe scales it.
            peak = round(r.peak_bytes * (oom_factor if r.oom_killed else 1))
            history.observe(r.sandbox, r.argv, peak, r.duration_s)
    return [rows[i] for i in order], [vec[i] for i in order]


def causal_split(rows: Sequence[CallRow], train_fraction: float) -> tuple[set[str], set[str]]:
    """Groups (tasks) in the order of their first call: the first `train_fraction` to train
    on, the later ones to test on."""
    first: dict[str, float] = {}
    for r in rows:
        first[r.group] = min(first.get(r.group, r.arrive), r.arrive)
    groups = sorted(first, key=lambda g: (first[g], g))
    cut = min(max(1, round(len(groups) * train_fraction)), len(groups))
    return set(groups[:cut]), set(groups[cut:])
