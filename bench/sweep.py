"""The replay benchmark's loads and sweeps: points to measure, what they replay, every run saved.

A point is one offered load (prepared tasks, their arrivals and a budget); `build_points` makes
them from the command line (task counts x budgets, or oversubscription ratios), `print_plan`
shows what they would replay without Docker, and `execute` runs every scheme on every point,
saving results.json after each run so an interrupted sweep keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench import report
from bench.generate import generate
from bench.host import BenchError, Host, Log
from bench.metrics import RETRY_LIMIT
from bench.runner import RunSettings, run_scheme
from bench.schemes import Scheme, parse_schemes, schemes_at
from bench.trace import Task, load_tasks, profiled_peak, save_tasks
from bench.workload import (
    Workload,
    arrival_schedule,
    budget_for_oversubscription,
    eager_peak_estimate,
    makespan_floor,
    oversubscription,
    prepare,
)
from execgate.common.hints import parse_size
from execgate.common.units import MiB

RESULTS_FORMAT = "execgate-bench-results/1"


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@dataclass(frozen=True)
class Point:
    """One offered load: tasks (already prepared) and a budget."""

    label: str
    tasks: tuple[Task, ...]
    budget: int
    arrivals_trace: tuple[float, ...]
    swap: bool = False  # every scheme of the point runs with swap on, or every one without

    def describe(self, speed: float) -> dict[str, Any]:
        return {"label": self.label, "n_tasks": len(self.tasks), "budget_bytes": self.budget,
                "swap": "on" if self.swap else "off",
                "oversubscription": oversubscription(self.tasks, self.budget),
                "arrivals_trace_s": list(self.arrivals_trace),
                "arrivals_wall_s": [a / speed for a in self.arrivals_trace],
                "max_task_peak_bytes": max((profiled_peak(t) for t in self.tasks), default=0)}


def float_list(s: str) -> list[float]:
    """A comma-separated option's numbers (e.g. --oversub 2,4,8.6)."""
    return [float(x) for x in s.split(",") if x.strip()]


def int_list(s: str) -> list[int]:
    """A comma-separated option's integers (e.g. --static-k 1,2,4)."""
    return [int(x) for x in s.split(",") if x.strip()]


SWAP_MODES = {"off": (False,), "on": (True,), "both": (False, True)}


def workload_of(args: argparse.Namespace) -> Workload:
    """The replay transforms the command line asks for."""
    return Workload(speed=args.speed, mem_scale=args.mem_scale, cpu_scale=args.cpu_scale,
                    fold_bytes=int(args.fold_mib * MiB), max_calls=args.max_calls or None,
                    idle_scale=args.idle_scale, fill_ratio=args.fill_ratio,
                    hot_calls=getattr(args, "hot_calls", False))


def _source_tasks(args: argparse.Namespace, n: int) -> list[Task]:
    if args.trace:
        tasks = load_tasks(args.trace)
        if n > len(tasks):
            raise BenchError(f"{args.trace} has {len(tasks)} tasks, {n} asked")
        return tasks[:n]
    return generate(n, args.seed)


def build_points(args: argparse.Namespace) -> list[Point]:
    """The loads to measure: --task-counts x --budgets, or --oversub ratios at --tasks."""
    w = workload_of(args)
    seed = args.seed
    counts = int_list(args.task_counts) if getattr(args, "task_counts", None) else [args.tasks]
    points: list[Point] = []
    for n in counts:
        tasks = tuple(prepare(_source_tasks(args, n), w))
        arrivals = tuple(arrival_schedule(n, seed, args.arrival, args.mean_gap,
                                          args.burst_window))
        biggest = max((profiled_peak(t) for t in tasks), default=MiB)
        if getattr(args, "oversub", None):
            for ratio in float_list(args.oversub):
                b = budget_for_oversubscription(tasks, ratio, floor_bytes=int(biggest * 1.1))
                got = oversubscription(tasks, b)
                name = f"{n} tasks, x{ratio:g}"
                if got < ratio * 0.98:  # the budget cannot go below the largest task
                    name += f" (capped at x{got:.2f}: largest task {biggest / MiB:.0f} MiB)"
                points.append(Point(name, tasks, b, arrivals))
        else:
            budgets = [parse_size(b) for b in args.budgets.split(",")] if getattr(
                args, "budgets", None) else [parse_size(args.budget)]
            for b in budgets:
                points.append(Point(f"{n} tasks, {b / MiB:.0f} MiB", tasks, b, arrivals))
    swaps = SWAP_MODES[args.swap]
    points = [replace(p, label=f"{p.label}, swap {'on' if sw else 'off'}", swap=sw)
              if len(swaps) > 1 else replace(p, swap=sw) for p in points for sw in swaps]
    return sorted(points, key=lambda p: (oversubscription(p.tasks, p.budget), p.swap))


def print_plan(points: Sequence[Point], schemes: Sequence[Scheme], w: Workload) -> None:
    """What a run would replay, per point and task (`plan`, `--dry-run`: no Docker)."""
    print(f"schemes: {', '.join(s.name for s in schemes)}")
    print(f"workload: speed {w.speed:g}x, memory /{w.mem_scale:g}, cpu x{w.cpu_scale:g}, "
          f"fold < {w.fold_bytes / MiB:g} MiB, max calls {w.max_calls or 'all'}, "
          f"idle x{w.idle_scale:g}"
          + (" (LLM waits kept: compressed like the calls)" if w.idle_scale == 1 else "")
          + (f", pages zstd {w.fill_ratio:g}:1" if w.fill_ratio else ", pages nearly empty"))
    for p in points:
        wall = [a / w.speed for a in p.arrivals_trace]
        est = eager_peak_estimate(p.tasks, wall)
        calls = sum(len(t.tool_calls) for t in p.tasks)
        idle = sum(t.duration_s - sum(c.duration_s for c in t.tool_calls) for t in p.tasks)
        total = sum(t.duration_s for t in p.tasks) or 1.0
        print(f"\n{p.label}: budget {p.budget / MiB:.0f} MiB, oversubscription "
              f"{oversubscription(p.tasks, p.budget):.2f}x, swap {'on' if p.swap else 'off'}, "
              f"{calls} tool calls, idle (LLM waits, folded calls) {idle / total:.0%} of task "
              f"time, arrivals over {max(wall, default=0):.1f}s, eager would peak at "
              f"{est / MiB:.0f} MiB ({est / p.budget:.0%} of the budget, no overheads), no "
              f"scheme can finish before {makespan_floor(p.tasks, wall):.1f}s (the last arrival "
              "plus its task alone)")
        runs, skipped = schemes_at(schemes, p.swap)
        print(f"  runs {', '.join(sc.name for sc, _ in runs) or 'nothing'}"
              + (f"; not here: {'; '.join(skipped)}" if skipped else ""))
        for t, a in zip(p.tasks, wall, strict=True):
            print(f"  {t.id}  arrives {a:6.1f}s  {t.duration_s:6.1f}s  {len(t.tool_calls):3d} calls"
                  f"  peak {profiled_peak(t) / MiB:6.1f} MiB  baseline "
                  f"{t.baseline_bytes / MiB:5.1f} MiB")


def execute(args: argparse.Namespace, points: Sequence[Point], command: str) -> dict[str, Any]:
    """Run every scheme on every point; results are saved after each run."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    w = workload_of(args)
    max_n = max(len(p.tasks) for p in points)
    schemes = parse_schemes(args.schemes, int_list(args.static_k), max_n)
    settings = RunSettings(sample_s=args.sample_ms / 1000, admission_wait_s=args.admission_wait,
                           scale_daemon=not args.no_scale_daemon)
    log = Log(out / "progress.log", quiet=args.quiet)
    host = Host(args.slice, args.image, args.config, log, client=args.docker_client)
    host.check(schemes)
    save_tasks(max(points, key=lambda p: len(p.tasks)).tasks, out / "replayed.jsonl")
    results: dict[str, Any] = {
        "format": RESULTS_FORMAT, "command": command, "created": _now_iso(),
        "host": {"kernel": platform.release(), "cpus": os.cpu_count(),
                 "python": platform.python_version()},
        "params": {"seed": args.seed, "trace": args.trace, "arrival": args.arrival,
                   "mean_gap_trace_s": args.mean_gap, "burst_window_trace_s": args.burst_window,
                   "workload_name": args.workload, "swap": args.swap,
                   "zram_size_bytes": parse_size(args.zram_size),
                   "slice": args.slice, "image": args.image,
                   "docker_client": args.docker_client,
                   "schemes": [s.name for s in schemes], "retry_limit": RETRY_LIMIT,
                   "workload": w.to_dict(), "settings": settings.__dict__.copy()},
        "points": [p.describe(w.speed) for p in points],
        "runs": [],
    }
    abort = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log(f"signal {signum}: stopping after the running calls, then restoring the host")
        abort.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    host.save_state()
    t_start = time.monotonic()
    only = set(int_list(args.points)) if getattr(args, "points", None) else None
    try:
        if any(p.swap for i, p in enumerate(points) if only is None or i + 1 in only):
            results["host"]["swap"] = host.setup_swap(parse_size(args.zram_size),
                                                      args.zram_algorithm)
        for i, p in enumerate(points):
            if only is not None and i + 1 not in only:
                continue
            log(f"### point {i + 1}/{len(points)}: {p.label} (budget {p.budget / MiB:.0f} MiB, "
                f"oversubscription {oversubscription(p.tasks, p.budget):.2f}x, "
                f"swap {'on' if p.swap else 'off'})")
            wall = [a / w.speed for a in p.arrivals_trace]
            runs, skipped = schemes_at(schemes, p.swap)
            results["points"][i]["skipped"] = skipped
            for why in skipped:
                log(f"   not run here: {why}")
            for s, sw in runs:
                if s.k is not None and s.k > len(p.tasks):
                    continue
                if abort.is_set():
                    break
                events = out / f"events-{len(results['runs']) + 1}.jsonl"
                r = run_scheme(host, s, p.tasks, wall, p.budget, w, settings, log, abort,
                               swap=sw, events_path=str(events))
                r["point"] = i
                results["runs"].append(r)
                results["elapsed_s"] = time.monotonic() - t_start
                _save(out / "results.json", results)
    finally:
        host.restore()
        for s, h in old.items():
            signal.signal(s, h)
        results["elapsed_s"] = time.monotonic() - t_start
        results["aborted"] = abort.is_set()
        _save(out / "results.json", results)
        md = report.markdown(results)
        (out / "report.md").write_text(md, encoding="utf-8")
        log.close()
    print()
    # The demo's reader gets the compact table (report.md has the full one).
    print(report.text_table(results) if args.command == "demo" else md)
    return results


def _save(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=_json_default), encoding="utf-8")
    os.replace(tmp, path)


def _json_default(o: Any) -> Any:
    if isinstance(o, tuple | set):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")
