"""Control-plane cost: what `docker run`, `docker exec` and `docker rm` cost as sandboxes multiply.

In the VM sweep the control plane, not memory, set most of every makespan: under single-threaded
TCG a `docker run` took 6-12 s with <= 4 live sandboxes and ~110 s with >= 10, and each exec
added 2-80 s to its call. The simulator therefore needs these costs as a function of load, fitted
to what the VM measured, not guessed. The results file keeps, per run, the attempts (start, end),
every exec (start, end, traced duration) and the slice sampled every 150 ms with the number of
running tasks, so per operation we recover

* run: first exec's start - attempt start - the task's opening LLM wait;
* exec: exec end - start - the call's traced duration (successful calls, runc schemes: under
  execgate the same gap also holds the admission wait, which the simulator adds itself);
* rm: next attempt's start (or the task's end) - the attempt's end;

against n, the running tasks (live or starting sandboxes) when it began. Each is fitted as
``a + b * clamp(n - lo, 0, hi - lo)``: flat while the control plane keeps up, linear in the live
sandboxes, flat again once the two vCPUs saturate; lo and hi are chosen by least squares over
integers. Stdlib only.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from bench.trace import LlmWait, Task

OPS = ("run", "exec", "rm")


@dataclass(frozen=True)
class Fit:
    """y = a + b * clamp(n - lo, 0, hi - lo) seconds, with how well it fits."""

    a: float
    b: float
    lo: int = 0
    hi: int = 0
    n_points: int = 0
    rmse: float = 0.0
    r2: float = 0.0
    mean_y: float = 0.0

    def __call__(self, n: int) -> float:
        return max(0.0, self.a + self.b * min(max(n - self.lo, 0), self.hi - self.lo))

    def describe(self) -> str:
        return (f"{self.a:6.2f} + {self.b:5.2f}*clamp(n-{self.lo},0,{self.hi - self.lo}) s  "
                f"(N={self.n_points}, RMSE {self.rmse:5.1f} s, R^2 {self.r2:.2f}, "
                f"mean {self.mean_y:5.1f} s)")


@dataclass(frozen=True)
class CostModel:
    """Seconds per control-plane operation given n live sandboxes; `exec` is added to a call."""

    run: Fit
    exec: Fit
    rm: Fit
    # Fraction of an exec's overhead spent before the tool process starts (the rest after it
    # ends): docker exec's setup (runtime, cgroup, admission) vs. teardown and stream close.
    exec_before: float = 0.5
    source: str = "fixed"

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "exec_before": self.exec_before,
                **{op: getattr(self, op).__dict__ for op in OPS}}


def fixed(run_s: float = 0.0, exec_s: float = 0.0, rm_s: float = 0.0) -> CostModel:
    """Constant costs (0 = an ideal control plane; ~1, 0.05, 0.5 s is a hardware host)."""
    return CostModel(Fit(run_s, 0.0), Fit(exec_s, 0.0), Fit(rm_s, 0.0),
                     source=f"fixed run {run_s:g} s, exec {exec_s:g} s, rm {rm_s:g} s")


def load_results(path: str | Path) -> dict[str, Any]:
    """A replay results.json, gzipped or not."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as f:
        return json.load(f)


def _runtime(run: Mapping[str, Any]) -> str:
    return str((run.get("scheme_def") or {}).get("runtime") or "runc")


def _no_wait(run: Mapping[str, Any]) -> bool:
    """Whether a run's exec gaps are pure overhead: no daemon, or one that made no call wait
    (admission_wait_max_s from execgate's journal under a second)."""
    if not (run.get("scheme_def") or {}).get("daemon"):
        return True
    wait = run["metrics"].get("admission_wait_max_s")
    return isinstance(wait, int | float) and wait < 1.0


def observations(results: Mapping[str, Any], tasks: Mapping[str, Task], runtime: str = "runc",
                 ) -> dict[str, list[tuple[int, float]]]:
    """(n live sandboxes, seconds) per operation, from the runs on `runtime`; exec gaps only
    from runs in which no call waited for admission (they would hold the wait)."""
    out: dict[str, list[tuple[int, float]]] = {op: [] for op in OPS}
    for run in results["runs"]:
        if _runtime(run) != runtime:
            continue
        pure = _no_wait(run)
        rows = run["samples"]["rows"]
        times = [r[0] for r in rows]

        def live(t: float, rows: list[Any] = rows, times: list[float] = times) -> int:
            return int(rows[max(0, bisect.bisect_right(times, t) - 1)][2]) if rows else 0

        calls = {(c["task"], c["attempt"], c["call"]): c for c in run["calls"]}
        by_task: dict[str, list[dict[str, Any]]] = {}
        for a in run["attempts"]:
            by_task.setdefault(a["task_id"], []).append(a)
            first = calls.get((a["task_id"], a["attempt"], 1))
            task = tasks.get(a["task_id"])
            if first is None or task is None or not task.steps:
                continue
            opening = task.steps[0].duration_s if isinstance(task.steps[0], LlmWait) else 0.0
            out["run"].append((live(a["start"]), first["start"] - a["start"] - opening))
        for c in run["calls"]:
            if c["exit"] == 0 and pure:
                out["exec"].append((live(c["start"]), c["end"] - c["start"] - c["duration_s"]))
        ends = {t["id"]: t.get("end_s") for t in run["tasks"]}
        for tid, atts in by_task.items():
            atts.sort(key=lambda a: a["attempt"])
            for a, b in pairwise(atts):
                out["rm"].append((live(a["end"]), b["start"] - a["end"]))
            if atts and ends.get(tid) is not None:
                out["rm"].append((live(atts[-1]["end"]), ends[tid] - atts[-1]["end"]))
    return out


def _linear(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, 0.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


def fit(points: Sequence[tuple[int, float]]) -> Fit:
    """Least squares of y = a + b * clamp(n - lo, 0, hi - lo) over a, b and integer lo < hi:
    flat while the control plane keeps up, linear in the live sandboxes, flat again once the
    two vCPUs are saturated (every operation then waits behind the same queue)."""
    if not points:
        return Fit(0.0, 0.0)
    ns = [n for n, _ in points]
    ys = [y for _, y in points]
    my = sum(ys) / len(ys)
    sst = sum((y - my) ** 2 for y in ys)
    best: Fit | None = None
    best_sse = math.inf
    top = max(ns)
    for lo in range(0, top):
        for hi in range(lo + 1, top + 1):
            xs = [min(max(n - lo, 0), hi - lo) for n in ns]
            a, b = _linear(xs, ys)
            sse = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
            if sse < best_sse - 1e-9:
                best_sse = sse
                best = Fit(a, b, lo, hi, len(ys), math.sqrt(sse / len(ys)),
                           1 - sse / sst if sst else 1.0, my)
    if best is None:  # a single n: the mean
        return Fit(my, 0.0, 0, 0, len(ys), math.sqrt(sst / len(ys)), 0.0, my)
    return best


def fit_results(results: Mapping[str, Any], tasks: Mapping[str, Task]) -> dict[str, CostModel]:
    """One model per runtime the results used. runc's is fitted as above; another runtime's
    (execgate: its wrapper starts a Python process per create and per exec, which TCG makes
    cost seconds) is runc's shape plus one constant per operation, the mean of its own
    measurements' residuals against runc's fit: its runs are fewer and, at 8.6x, chaotic
    (sandboxes dying mid-create), too few for a shape of their own."""
    runc_obs = observations(results, tasks, "runc")
    base = {op: fit(runc_obs[op]) for op in OPS}
    models = {"runc": CostModel(base["run"], base["exec"], base["rm"],
                                source="fitted to the VM sweep's runc runs")}
    for rt in sorted({_runtime(r) for r in results["runs"]} - {"runc"}):
        obs = observations(results, tasks, rt)
        fits = {}
        for op in OPS:
            f = base[op]
            res = [y - f(n) for n, y in obs[op]]
            if not res:
                fits[op] = f
                continue
            d = sum(res) / len(res)
            rmse = math.sqrt(sum((r - d) ** 2 for r in res) / len(res))
            fits[op] = Fit(f.a + d, f.b, f.lo, f.hi, len(res), rmse, 0.0,
                           sum(y for _, y in obs[op]) / len(res))
        models[rt] = CostModel(fits["run"], fits["exec"], fits["rm"],
                               source=f"runc's fit + a constant per operation from {rt}'s runs")
    return models


def residual_table(results: Mapping[str, Any], tasks: Mapping[str, Task],
                   model: CostModel, runtime: str = "runc") -> list[str]:
    """Per operation and n: count, measured median and mean, and the fit (Markdown rows)."""
    from bench.metrics import percentile

    obs = observations(results, tasks, runtime)
    lines = [f"| {runtime} op | n live | N | measured p50 s | measured mean s | fit s |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for op in OPS:
        by_n: dict[int, list[float]] = {}
        for n, y in obs[op]:
            by_n.setdefault(n, []).append(y)
        f: Fit = getattr(model, op)
        for n in sorted(by_n):
            ys = by_n[n]
            lines.append(f"| {op} | {n} | {len(ys)} | {percentile(ys, 50):.1f} | "
                         f"{sum(ys) / len(ys):.1f} | {f(n):.1f} |")
    return lines
