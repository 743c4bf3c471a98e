"""Control-plane cost: what `docker run`, `docker exec` and `docker rm` cost as sandboxes multiply.

In the VM sweep the control plane, not memory, set most of every makespan: under single-threaded
TCG a `docker run` took 6-12 s with <= 4 live sandboxes and ~110 s with >= 10, and each exec
added 2-80 s to its call. The simulator therefore needs these costs as a function of load, fitted
to what the VM measured, not guessed. The results file keeps, per run, the attempts (start, end),
every exec (start, end, traced duration) and the slice sampled every 150 ms with the number of
running tasks, so per operation we recover

* run: first exec's start - attempt start - the task's opening LLM wait (under execgate less
  the create's sandbox-admission wait, which the simulator adds itself);
* exec: exec end - start - the call's traced duration (successful calls; under execgate less
  the call's admission wait and growth-gate hold from the daemon's record, which the simulator
  adds itself; a daemon's run without those records gives no exec figure);
* rm: next attempt's start (or the task's end) - the attempt's end;

against n, the live sandboxes (running tasks, less those whose create the daemon holds: a held
create costs the VM nothing, and counting it made execgate's burst execs look 2-3x as costly
as they were) averaged over the operation (a docker run that starts alone and is joined by ten
more is slow because of the ten). The simulator uses
the fit as a *rate*: an operation progresses at 1/cost(n(t)) while n changes under it. Each is
fitted as ``a + b * clamp(n - k, 0, hi - k)``: flat while the control plane keeps up, linear in
the live sandboxes once it falls behind, flat again once the two vCPUs saturate; the knees k and
hi are chosen by least squares over integers. Stdlib only.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

from bench.trace import LlmWait, Task

OPS = ("run", "exec", "rm")
# A runtime's exec_during where none of its runs kept the slice's stall (boots before 4 Dec,
# the VM sweep): the median of the 13 fleet boots that did (runc 0.55-0.98, execgate 0.14-0.81).
UNMEASURED_EXEC_DURING = {"runc": 0.91, "execgate": 0.24}
# A runtime's points at this many distinct n or more fit their own shape (the VM sweep: 16);
# fewer (a burst: every docker run at n = 15-16) share one with the other's (`fit_level`).
OWN_SHAPE_NS = 5
# exec_before where no run kept memload's timings (every boot before 6 Dec, evening): the median
# of the ten light-load runs that did (docs/replay/light-load-slow-host-f622018: 0.935-0.969,
# runc and execgate alike).
UNMEASURED_EXEC_BEFORE = 0.96


@dataclass(frozen=True)
class Fit:
    """y = a + b1 * min(n, k) + b2 * clamp(n - k, 0, hi - k) seconds, and how well it fits."""

    a: float
    b1: float = 0.0
    b2: float = 0.0
    k: int = 0
    hi: int = 0
    n_points: int = 0
    rmse: float = 0.0
    r2: float = 0.0
    mean_y: float = 0.0

    def __call__(self, n: int) -> float:
        n = max(n, 0)
        return max(0.0, self.a + self.b1 * min(n, self.k)
                   + self.b2 * min(max(n - self.k, 0), self.hi - self.k))

    def describe(self) -> str:
        gentle = f" + {self.b1:.2f}*min(n,{self.k})" if self.b1 else ""
        return (f"{self.a:6.2f}{gentle} + {self.b2:5.2f}*clamp(n-{self.k},0,{self.hi - self.k})"
                f" s  (N={self.n_points}, RMSE {self.rmse:5.1f} s, R^2 {self.r2:.2f}, mean "
                f"{self.mean_y:5.1f} s)")


@dataclass(frozen=True)
class CostModel:
    """Seconds per control-plane operation given n live sandboxes; `exec` is added to a call."""

    run: Fit
    exec: Fit
    rm: Fit
    # Fraction of an exec's overhead spent before the tool process starts (the rest after it
    # ends): docker exec's setup (runtime, cgroup) vs. teardown and stream close. Fitted from
    # memload's own timings (`exec_split`) where the runs kept them; 0.94-0.97 in every run
    # that did, so a call's memory comes later in its exec than half-and-half put it.
    exec_before: float = 0.5
    # Fraction of an exec's overhead that is the tool process running slower, its trace
    # stretched over that time while it holds its memory (the rest is setup and teardown,
    # split by exec_before). Under TCG every process shares the emulated vCPU and the slice's
    # reclaim: among 27 sandboxes a 3.7 s call ran 529 s, filling memory as it went, and
    # calls overlapped until zram was full; as setup alone, the model's calls ran their traces
    # one after another and its zram never filled. 0 for fixed costs (a hardware host).
    exec_during: float = 0.0
    source: str = "fixed"

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "exec_before": self.exec_before,
                "exec_during": self.exec_during,
                **{op: getattr(self, op).__dict__ for op in OPS}}


def fixed(run_s: float = 0.0, exec_s: float = 0.0, rm_s: float = 0.0) -> CostModel:
    """Constant costs (0 = an ideal control plane; ~1, 0.05, 0.5 s is a hardware host)."""
    return CostModel(Fit(run_s), Fit(exec_s), Fit(rm_s),
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


def _call_wait(call: Mapping[str, Any], pure: bool, held: bool = True) -> float | None:
    """The daemon's share of a successful call's exec gap from its per-call record: its
    admission wait, and with `held` its growth-gate hold; 0 in a run where nothing waited
    (`pure`) and none was recorded; None for a failed call or an unknown wait."""
    if call["exit"] != 0:
        return None
    d = call.get("daemon") or {}
    waited, hold = d.get("waited_s"), d.get("held_s")
    if not isinstance(waited, int | float):
        return 0.0 if pure else None
    return float(waited) + (float(hold) if held and isinstance(hold, int | float) else 0.0)


def _exec_gap(call: Mapping[str, Any], pure: bool) -> float | None:
    """A successful call's exec overhead: its wall time beyond its trace, less the daemon's
    waits (`_call_wait`); None for a failed call or an unknown wait."""
    wait = _call_wait(call, pure)
    return None if wait is None else call["end"] - call["start"] - call["duration_s"] - wait


def _held_creates(run: Mapping[str, Any]) -> list[tuple[float, float]]:
    """The (start, end) of every create the daemon held (`_create_wait` > 0)."""
    return [(a["start"], a["start"] + w) for a in run["attempts"] if (w := _create_wait(run, a))]


def _create_wait(run: Mapping[str, Any], attempt: Mapping[str, Any]) -> float | None:
    """How long the daemon held the attempt's create (sandbox admission), which the simulator
    adds itself: 0 where nothing admitted sandboxes (no daemon, or a config without sandbox
    admission: runs from before it existed); None where it did but recorded no verdict for
    this create (the gap would hold an unknown wait; fitted with it, execgate's docker run
    cost every wait twice)."""
    admits = ((run.get("config") or {}).get("sandbox_admission") or {}).get("enabled", False)
    if not ((run.get("scheme_def") or {}).get("daemon") and admits):
        return 0.0
    verdict = attempt.get("sandbox_admission") or {}
    waited = verdict.get("waited_s")
    return float(waited) if isinstance(waited, int | float) else None


def stalled_overhead(results: Mapping[str, Any], runtime: str = "runc") -> tuple[float, float]:
    """(exec overhead, of it stalled on memory) in seconds, summed over the runtime's successful
    calls of runs that kept the slice's stall (PSI some, cumulative, in the samples): how much
    of what an exec costs beyond its trace is its process waiting with its pages, not the
    control plane. The fitted exec_during is their ratio."""
    total = stalled = 0.0
    for run in results["runs"]:
        cols = run["samples"].get("columns") or []
        rows = run["samples"]["rows"]
        if _runtime(run) != runtime or "stall_s" not in cols or not rows:
            continue
        col = cols.index("stall_s")
        times = [r[0] for r in rows]
        pure = _no_wait(run)

        def at(t: float, rows: list[list[Any]] = rows, times: list[float] = times,
               col: int = col) -> float:
            return float(rows[max(0, bisect.bisect_right(times, t) - 1)][col] or 0.0)

        for c in run["calls"]:
            gap = _exec_gap(c, pure)
            if gap is None or gap <= 0:
                continue
            total += gap
            stalled += min(max(at(c["end"]) - at(c["start"]), 0.0), gap)
    return total, stalled


def exec_split(results: Mapping[str, Any], runtime: str = "runc") -> tuple[float, float]:
    """(exec overhead before the tool process started, before + after it ended) in seconds,
    summed over the runtime's successful calls whose memload reported its timings (`ran`): the
    fitted exec_before is their ratio. The daemon's admission wait, which the simulator adds
    itself, comes out of the part before; a call without a known wait in a run where calls
    waited is left out."""
    before = total = 0.0
    for run in results["runs"]:
        if _runtime(run) != runtime:
            continue
        pure = _no_wait(run)
        for c in run["calls"]:
            ran, waited = c.get("ran"), _call_wait(c, pure, held=False)
            if waited is None or not isinstance(ran, Mapping):
                continue
            lead = max(ran["start"] - c["start"] - waited, 0.0)
            tail = max(c["end"] - ran["end"], 0.0)
            before, total = before + lead, total + lead + tail
    return before, total


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
        held = _held_creates(run)
        counts = [r[2] - sum(1 for s, e in held if s <= r[0] < e) for r in rows] if held \
            else [r[2] for r in rows]

        def live(t0: float, t1: float, counts: list[int] = counts,
                 times: list[float] = times) -> int:
            """Mean live sandboxes over [t0, t1] from the 150 ms samples, rounded."""
            if not counts:
                return 0
            i = max(0, bisect.bisect_right(times, t0) - 1)
            vals = counts[i:max(bisect.bisect_right(times, t1), i + 1)]
            return round(sum(vals) / len(vals))

        calls = {(c["task"], c["attempt"], c["call"]): c for c in run["calls"]}
        by_task: dict[str, list[dict[str, Any]]] = {}
        for a in run["attempts"]:
            by_task.setdefault(a["task_id"], []).append(a)
            first = calls.get((a["task_id"], a["attempt"], 1))
            task = tasks.get(a["task_id"])
            if first is None or task is None or not task.steps:
                continue
            opening = task.steps[0].duration_s if isinstance(task.steps[0], LlmWait) else 0.0
            end = first["start"] - opening
            waited = _create_wait(run, a)
            if waited is not None:
                out["run"].append((live(a["start"] + waited, end), end - a["start"] - waited))
        for c in run["calls"]:
            gap = _exec_gap(c, pure)
            if gap is not None:
                out["exec"].append((live(c["start"], c["end"]), gap))
        ends = {t["id"]: t.get("end_s") for t in run["tasks"]}
        for tid, atts in by_task.items():
            atts.sort(key=lambda a: a["attempt"])
            for a, b in pairwise(atts):
                out["rm"].append((live(a["end"], b["start"]), b["start"] - a["end"]))
            end = ends.get(tid)
            if atts and end is not None:
                out["rm"].append((live(atts[-1]["end"], end), end - atts[-1]["end"]))
    return out


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Gauss-Jordan elimination of the normal equations; None if singular."""
    n = len(v)
    a = [[*row, x] for row, x in zip(m, v, strict=True)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(a[r][c]))
        if abs(a[p][c]) < 1e-9:
            return None
        a[c], a[p] = a[p], a[c]
        for r in range(n):
            if r != c:
                f = a[r][c] / a[c][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c], strict=True)]
    return [a[r][n] / a[r][r] for r in range(n)]


def _lstsq(cols: list[list[float]], ys: Sequence[float]) -> list[float] | None:
    m = [[sum(x * y for x, y in zip(ci, cj, strict=True)) for cj in cols] for ci in cols]
    v = [sum(x * y for x, y in zip(ci, ys, strict=True)) for ci in cols]
    return _solve(m, v)


def fit(points: Sequence[tuple[int, float]], gentle: bool = False) -> Fit:
    """Least squares of y = a + b1 * min(n, k) + b2 * clamp(n - k, 0, hi - k) over a, b2 (and
    b1 if `gentle`; else b1 = 0) and the integers k < hi: flat (or gently rising) while the
    control plane keeps up, linear once it falls behind, flat once the two vCPUs are saturated
    (every operation then waits behind the same queue). On the VM sweep the gentle slope buys
    no accuracy (R^2 0.78/0.85/0.76 against 0.78/0.85/0.75), so the default leaves it out."""
    if not points:
        return Fit(0.0)
    ns = [n for n, _ in points]
    ys = [y for _, y in points]
    my = sum(ys) / len(ys)
    sst = sum((y - my) ** 2 for y in ys)
    best: Fit | None = None
    best_sse = math.inf
    top = max(ns)
    for k in range(0 if not gentle else 1, top):
        for hi in range(k + 1, top + 1):
            c1 = [float(min(n, k)) for n in ns]
            c2 = [float(min(max(n - k, 0), hi - k)) for n in ns]
            sol = _lstsq([[1.0] * len(ns), c1, c2] if gentle else [[1.0] * len(ns), c2], ys)
            if sol is None:
                continue
            a, b1, b2 = sol if gentle else (sol[0], 0.0, sol[1])
            if a < 0:  # a cost below 0 s with few sandboxes live: no knee, but no data there
                continue
            sse = sum((y - a - b1 * x1 - b2 * x2) ** 2
                      for x1, x2, y in zip(c1, c2, ys, strict=True))
            if sse < best_sse - 1e-9:
                best_sse = sse
                best = Fit(a, b1, b2, k, hi, len(ys), math.sqrt(sse / len(ys)),
                           1 - sse / sst if sst else 1.0, my)
    if best is None:  # too few distinct n: the mean
        return Fit(my, n_points=len(ys), rmse=math.sqrt(sst / len(ys)), mean_y=my)
    return best


def fit_level(points: Sequence[tuple[int, float]], other: Sequence[tuple[int, float]],
              gentle: bool = False, rounds: int = 20) -> tuple[Fit, Fit]:
    """runc's fit (`points`) and another runtime's (`other`). Where the other's points cover
    OWN_SHAPE_NS values of n or more it gets its own shape, fitted to its mean at each n (each
    n weighs alike: a burst's dozens of points at n = 16 otherwise set the intercept that the
    few at low n should, 34 s against 12-28 s measured on the VM sweep): execgate's execs cost
    15-28 s at every n from 9 to 16 on a 602adcf burst, where runc's shape jumps from 16 to
    87 s at n = 16, and runc's shape times a ratio made them 4 s below it (that boot simulated
    35 % fast). Otherwise one shape, the other's r times as high: a ratio, since on the burst
    boots execgate's execs cost 0.2-0.6 of runc's at the same n (its slice sat at memory.max
    6-25 % of the time against eager's 57-76 %), and where runc's points too cover fewer than
    OWN_SHAPE_NS values the shape is fitted to both sets (the other's brought back by r,
    alternating with r's own least squares)."""
    if not (points and other):
        f = fit([*points, *other], gentle)
        return f, f
    # No load at which both were measured: no ratio to learn, and a shape shared across the
    # gap lends one runtime's knee to the other's flat stretch (a 15x burst's execgate runs at
    # n = 23-27 gave reserve's and static-8's, measured at n = 1-8, one flat 24.8 s where they
    # took 3-5 s at n = 1-2 and 44 s at n = 8: reserve simulated +35 %). Each its own points.
    apart = max(n for n, _ in points) < min(n for n, _ in other) \
        or max(n for n, _ in other) < min(n for n, _ in points)
    if apart and len({n for n, _ in other}) < OWN_SHAPE_NS:
        return fit(points, gentle), fit(other, gentle)
    own = apart or len({n for n, _ in points}) >= OWN_SHAPE_NS
    shape, r = fit(points, gentle), 1.0
    for _ in range(1 if own else rounds):
        if not own:
            shape = fit([*points, *((n, y / r) for n, y in other)], gentle)
        fx = [shape(n) for n, _ in other]
        den = sum(x * x for x in fx)
        if den <= 0:
            break
        r = max(sum(x * y for x, (_, y) in zip(fx, other, strict=True)) / den, 1e-3)

    def stats(pts: Sequence[tuple[int, float]], r: float) -> Fit:
        f = replace(shape, a=shape.a * r, b1=shape.b1 * r, b2=shape.b2 * r)
        my = sum(y for _, y in pts) / len(pts)
        sse = sum((y - f(n)) ** 2 for n, y in pts)
        sst = sum((y - my) ** 2 for _, y in pts)
        return replace(f, n_points=len(pts), rmse=math.sqrt(sse / len(pts)),
                       r2=1 - sse / sst if sst else 1.0, mean_y=my)

    base = stats(points, 1.0)
    if len({n for n, _ in other}) >= OWN_SHAPE_NS:
        if not own:
            # The other gets its own shape: the shared one serves runc alone, lending its knee,
            # and runc's level and slope are its own points'. A reserve run keeps one or two
            # sandboxes live, its execs 2.4 s; the shape shared with execgate's 50-100 s
            # execs of a 15x burst gave it 11.6 s (reserve simulated +47 %).
            shape = _refit_on_knee(shape, points)
            base = stats(points, 1.0)
        by_n: dict[int, list[float]] = {}
        for n, y in other:
            by_n.setdefault(n, []).append(y)
        shape, r = fit([(n, sum(v) / len(v)) for n, v in by_n.items()], gentle), 1.0
    return base, stats(other, r)


def _refit_on_knee(shape: Fit, points: Sequence[tuple[int, float]]) -> Fit:
    """shape's knee and ceiling (k, hi) kept, its level a and slope b2 fitted to points (b2 >= 0,
    a >= 0); points at one value of the slope's column fit the level alone."""
    xs = [float(min(max(n - shape.k, 0), shape.hi - shape.k)) for n, _ in points]
    ys = [y - shape.b1 * min(n, shape.k) for n, y in points]
    sol = _lstsq([[1.0] * len(xs), xs], ys) if len(set(xs)) > 1 else None
    if sol is None:  # one load: its level under the shared slope
        a, b2 = sum(y - shape.b2 * x for x, y in zip(xs, ys, strict=True)) / len(ys), shape.b2
    elif sol[1] < 0:  # falling with load: no slope of its own to trust, its mean
        a, b2 = sum(ys) / len(ys), 0.0
    else:
        a, b2 = sol
    return replace(shape, a=max(a, 0.0), b2=b2)


def fit_results(results: Mapping[str, Any], tasks: Mapping[str, Task]) -> dict[str, CostModel]:
    """One model per runtime the results used: runc's and another runtime's (execgate) share
    one shape, a ratio apart per operation (`fit_level`)."""
    return fit_pooled([(results, tasks)], "the VM sweep's")


def fit_pooled(files: Sequence[tuple[Mapping[str, Any], Mapping[str, Task]]],
               what: str = "") -> dict[str, CostModel]:
    """fit_results over the runs of several results files at once (each with its own tasks):
    one model for several VM boots."""
    what = what or f"{len(files)} results files'"

    def obs(rt: str) -> dict[str, list[tuple[int, float]]]:
        out: dict[str, list[tuple[int, float]]] = {op: [] for op in OPS}
        for results, tasks in files:
            for op, pts in observations(results, tasks, rt).items():
                out[op] += pts
        return out

    def share(rt: str, split: Callable[[Mapping[str, Any], str], tuple[float, float]],
              unmeasured: float) -> float:
        """part / whole of split's (part, whole) summed over the files; unmeasured where none."""
        part = whole = 0.0
        for results, _ in files:
            p, w = split(results, rt)
            part, whole = part + p, whole + w
        return part / whole if whole else unmeasured

    def during(rt: str) -> float:
        """The runtime's exec_during: the share of its exec overhead stalled on memory."""
        return share(rt, lambda r, rt: stalled_overhead(r, rt)[::-1],
                     UNMEASURED_EXEC_DURING.get(rt, 0.0))

    def before(rt: str) -> float:
        """The runtime's exec_before: the share of its exec overhead before the tool ran."""
        return share(rt, exec_split, UNMEASURED_EXEC_BEFORE)

    runc_obs = obs("runc")
    others = sorted({_runtime(r) for results, _ in files for r in results["runs"]} - {"runc"})
    if not others:
        base = {op: fit(runc_obs[op]) for op in OPS}
        return {"runc": CostModel(base["run"], base["exec"], base["rm"],
                                  exec_before=before("runc"), exec_during=during("runc"),
                                  source=f"fitted to {what} runc runs")}
    models: dict[str, CostModel] = {}
    for rt in others:  # in practice one: execgate
        rt_obs = obs(rt)
        pairs = {op: fit_level(runc_obs[op], rt_obs[op]) for op in OPS}
        models.setdefault("runc", CostModel(*(pairs[op][0] for op in OPS),
                                            exec_before=before("runc"),
                                            exec_during=during("runc"),
                                            source=f"fitted to {what} runc and {rt} runs"))
        models[rt] = CostModel(*(pairs[op][1] for op in OPS), exec_before=before(rt),
                               exec_during=during(rt),
                               source=f"fitted to {rt}'s runs: per operation its own shape "
                                      f"where they cover >= {OWN_SHAPE_NS} values of n, else "
                                      "runc's x a ratio")
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
