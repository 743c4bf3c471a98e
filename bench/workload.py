"""The workloads the replay benchmark runs: pure transforms of tasks, and their arrivals.

The same for every scheme of a run, and free of I/O (the runner, bench/runner.py, adds Docker):
* transforms: memory scale (so 2-4 GB bursts fit a small VM), CPU scale, folding of light calls
  into idle time, LLM-wait scale, time compression (`trace.scale_time`), the hint a call declares;
* arrival schedules from a seed;
* load: how oversubscribed a budget is, and the budget for a target oversubscription.
Stdlib only: it runs in the test VM.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bench.trace import (
    LlmWait,
    Step,
    Task,
    ToolCall,
    memory_curve,
    profiled_peak,
    scale_time,
)
from execgate.common.units import MiB

# ---------------------------------------------------------------------------------------------
# Workload transforms


def scale_memory(task: Task, factor: float) -> Task:
    """Divide every byte count by `factor` so calibrated traces (bursts to 2-4 GB, 185 MB
    baselines) fit a small VM with their proportions intact; metadata["mem_scale"] accumulates."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"memory scale must be a finite number > 0 (got {factor!r})")

    def b(n: int) -> int:
        return round(n / factor)

    steps: list[Step] = []
    for s in task.steps:
        if isinstance(s, ToolCall):
            m = s.memory
            peak = b(m.peak_bytes)
            mem = replace(m, baseline_bytes=min(b(m.baseline_bytes), peak), peak_bytes=peak,
                          retained_bytes=min(b(m.retained_bytes), peak))
            steps.append(replace(s, memory=mem))
        else:
            steps.append(s)
    meta = dict(task.metadata)
    meta["mem_scale"] = float(meta.get("mem_scale", 1.0)) * factor
    return replace(task, steps=steps, baseline_bytes=b(task.baseline_bytes), metadata=meta)


def scale_cpu(task: Task, factor: float) -> Task:
    """Multiply every call's CPU share (clamped to 1): memload's busy loop is not what is measured
    and two TCG vCPUs cannot burn a dozen calls' worth without stalling Docker itself."""
    if not (math.isfinite(factor) and factor >= 0):
        raise ValueError(f"cpu scale must be a finite number >= 0 (got {factor!r})")
    steps: list[Step] = [
        replace(s, memory=replace(s.memory, cpu_share=min(1.0, s.memory.cpu_share * factor)))
        if isinstance(s, ToolCall) else s
        for s in task.steps
    ]
    return replace(task, steps=steps)


def fold_calls(task: Task, min_peak_bytes: int = 0, max_calls: int | None = None) -> Task:
    """Replay some calls as idle time of the same duration instead of a `docker exec`.

    A call is folded when its peak is below `min_peak_bytes`, or when it is not among the
    `max_calls` heaviest (by peak, ties to the earlier call). Light calls (git, grep, cat) barely
    touch memory, but under TCG each exec costs ~1-2 s of pure overhead that the trace does not
    have. A folded call's retained bytes are dropped. Adjacent idle steps are merged.
    """
    calls = [(i, s) for i, s in enumerate(task.steps) if isinstance(s, ToolCall)]
    keep = {i for i, s in calls if s.memory.peak_bytes >= min_peak_bytes}
    if max_calls is not None:
        if max_calls < 0:
            raise ValueError("max_calls must be >= 0")
        ranked = sorted((i for i, _ in calls if i in keep),
                        key=lambda i: (-task.steps[i].memory.peak_bytes, i))  # type: ignore[union-attr]
        keep = set(ranked[:max_calls])
    steps: list[Step] = []
    folded = 0
    for i, s in enumerate(task.steps):
        if isinstance(s, ToolCall) and i in keep:
            steps.append(s)
            continue
        folded += isinstance(s, ToolCall)
        if steps and isinstance(steps[-1], LlmWait):
            steps[-1] = LlmWait(steps[-1].duration_s + s.duration_s)
        else:
            steps.append(LlmWait(s.duration_s))
    meta = dict(task.metadata)
    meta["folded_calls"] = int(meta.get("folded_calls", 0)) + folded
    return replace(task, steps=steps, metadata=meta)


def scale_idle(task: Task, factor: float) -> Task:
    """Multiply idle time (LLM waits, folded calls) only: a faster model, or a denser burst of
    tool calls for a short demo. Tool calls keep their durations."""
    if not (math.isfinite(factor) and factor >= 0):
        raise ValueError(f"idle scale must be a finite number >= 0 (got {factor!r})")
    steps: list[Step] = [LlmWait(s.duration_s * factor) if isinstance(s, LlmWait) else s
                         for s in task.steps]
    meta = dict(task.metadata)
    meta["idle_scale"] = float(meta.get("idle_scale", 1.0)) * factor
    return replace(task, steps=steps, metadata=meta)


def hint_for(call: ToolCall, headroom: float = 0.05, extra_bytes: int = 2 * MiB) -> str:
    """AGENT_RESOURCE_HINT an accurate agent would declare: the call's profiled peak plus a little
    for memload's own process (page tables, stack), so AgentCgroup's memory.high does not
    throttle a call that behaves exactly as declared."""
    want = call.memory.peak_bytes * (1.0 + headroom) + extra_bytes
    return f"memory:{max(1, math.ceil(want / MiB))}m"


@dataclass(frozen=True)
class Workload:
    """How traces become what is replayed; recorded in the results."""

    speed: float = 20.0  # time compression (trace.scale_time)
    mem_scale: float = 8.0  # bytes divided by this
    cpu_scale: float = 0.25  # memload --cpu multiplied by this
    fold_bytes: int = 0  # calls with a (scaled) peak below this become idle time
    max_calls: int | None = None  # keep only the N heaviest calls of each task
    idle_scale: float = 1.0  # idle time (LLM waits, folded calls) multiplied by this
    fill_ratio: float = 3.0  # zstd ratio of the pages memload writes (0: one byte per page)
    hot_calls: bool = False  # calls read their pages every tick (memload --hot)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def prepare(tasks: Iterable[Task], w: Workload) -> list[Task]:
    """The tasks as replayed: memory scaled, calls folded, idle time and CPU scaled, time
    compressed."""
    out = []
    for t in tasks:
        t = scale_memory(t, w.mem_scale) if w.mem_scale != 1 else t
        if w.fold_bytes or w.max_calls is not None:
            t = fold_calls(t, w.fold_bytes, w.max_calls)
        t = scale_idle(t, w.idle_scale) if w.idle_scale != 1 else t
        t = scale_cpu(t, w.cpu_scale) if w.cpu_scale != 1 else t
        out.append(scale_time(t, w.speed) if w.speed != 1 else t)
    return out


# ---------------------------------------------------------------------------------------------
# Arrivals

ARRIVALS = ("burst", "staggered", "poisson")


def arrival_schedule(n: int, seed: int | str, kind: str = "poisson",
                     mean_gap_s: float = 30.0, window_s: float = 0.0) -> list[float]:
    """Arrival offsets in trace seconds (first at 0), a pure function of its arguments, so every
    scheme of a run sees the same schedule. burst: all within window_s (seeded uniform, sorted;
    0: all at once); staggered: every mean_gap_s; poisson: exponential gaps of mean mean_gap_s."""
    if n < 0:
        raise ValueError("n must be >= 0")
    if kind not in ARRIVALS:
        raise ValueError(f"arrival kind must be one of {', '.join(ARRIVALS)} (got {kind!r})")
    if not (math.isfinite(mean_gap_s) and mean_gap_s >= 0):
        raise ValueError("mean_gap_s must be a finite number >= 0")
    if not (math.isfinite(window_s) and window_s >= 0):
        raise ValueError("window_s must be a finite number >= 0")
    if kind == "burst" and window_s > 0 and n > 1:
        rng = random.Random(f"burst:{seed}")
        return [0.0, *sorted(round(rng.uniform(0, window_s), 6) for _ in range(n - 1))]
    if kind == "burst" or n == 0:
        return [0.0] * n
    if kind == "staggered":
        return [i * mean_gap_s for i in range(n)]
    rng = random.Random(f"arrivals:{seed}")
    out, t = [0.0], 0.0
    for _ in range(n - 1):
        t += rng.expovariate(1.0 / mean_gap_s) if mean_gap_s > 0 else 0.0
        out.append(round(t, 6))
    return out


# ---------------------------------------------------------------------------------------------
# Load


def oversubscription(tasks: Iterable[Task], budget: int) -> float:
    """Sum of the tasks' profiled peaks ÷ budget (the metric in bench/metrics.py)."""
    return sum(profiled_peak(t) for t in tasks) / budget


def budget_for_oversubscription(tasks: Sequence[Task], ratio: float,
                                floor_bytes: int = 0) -> int:
    """The budget (whole MiB) at which `tasks` oversubscribe it `ratio` times, but at least
    `floor_bytes` (a budget smaller than the largest task would make it impossible to run)."""
    if ratio <= 0:
        raise ValueError("ratio must be > 0")
    want = sum(profiled_peak(t) for t in tasks) / ratio
    return max(int(want) // MiB * MiB, floor_bytes, MiB)


def makespan_floor(tasks: Sequence[Task], arrivals_s: Sequence[float]) -> float:
    """No scheme finishes before the last of (arrival + the task's own duration): what bounds
    "a makespan at most half of the best static-K" (66 s on the 8.6x burst, more than half of
    static-8's 115 s at hardware costs). Control-plane costs come on top."""
    if len(tasks) != len(arrivals_s):
        raise ValueError("one arrival per task")
    return max((at + t.duration_s for t, at in zip(tasks, arrivals_s, strict=True)),
               default=0.0)


def eager_peak_estimate(tasks: Sequence[Task], arrivals_s: Sequence[float],
                        dt: float = 0.05) -> float:
    """Peak of the summed memory curves if every task started on arrival and nothing was slowed
    down: what eager would need, before any overhead. Only a planning aid."""
    if len(tasks) != len(arrivals_s):
        raise ValueError("one arrival per task")
    curves = []
    end = 0.0
    for task, at in zip(tasks, arrivals_s, strict=True):
        c = memory_curve(task, dt=dt)
        curves.append(([at + t for t, _ in c], [v for _, v in c]))
        end = max(end, at + c[-1][0])
    points = sorted({t for ts, _ in curves for t in ts})
    best = 0.0
    for t in points:
        total = 0.0
        for ts, vs in curves:
            if ts[0] <= t <= ts[-1]:
                total += vs[bisect.bisect_right(ts, t) - 1]
        best = max(best, total)
    return best
