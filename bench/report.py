#!/usr/bin/env python3
"""Tables and plots of a replay benchmark's results.json (written by bench/replay.py).

    python3 -m bench.report DIR/results.json [--out DIR] [--no-plots | --plots-optional] [--text]
    python3 -m bench.report A/results.json B/results.json --out DIR   # merge runs of one workload

Writes report.md and, with matplotlib (`pip install matplotlib`; the VM has none), one PNG per
load of memory and concurrency over time per scheme (timeline-N.png) and makespan / P50 latency /
failures per scheme and load (summary.png). The Markdown part is stdlib only: the runner prints
it at the end of a run inside the VM.

Several results files of the same workload (same traces, arrivals, budget and replay settings,
e.g. schemes split across VM boots to keep each boot short) merge into one results.json whose
report says so. `--text` prints a compact table for a terminal (the demo's).

Static-K is run for several K; tables and plots show the best K of each load: the fastest
(makespan) among the Ks that completed every task, or the one completing most if none did.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import cpu_ledger
from execgate.common.units import MiB

# Scheme colours, stable across plots; unknown schemes cycle through the rest.
COLOURS = {"eager": "#d62728", "eager+swap": "#ff9896", "static": "#7f7f7f",
           "reserve": "#9467bd", "agentcgroup": "#ff7f0e", "execgate": "#2ca02c",
           "execgate-noadmit": "#17becf", "execgate-nogrowth": "#bcbd22",
           "execgate-noresidency": "#8c564b", "execgate-nosandboxadmit": "#e377c2",
           "execgate-noswap": "#98df8a"}
_EXTRA = ("#1f77b4", "#aec7e8", "#c49c94", "#dbdb8d")
FAMILY_ORDER = ("eager", "eager+swap", "static", "reserve", "agentcgroup", "execgate-noadmit",
                "execgate-nogrowth", "execgate-noresidency", "execgate-nosandboxadmit",
                "execgate-noswap", "execgate")


def load(path: str | Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not str(data.get("format", "")).startswith("execgate-bench-results/"):
        raise ValueError(f"{path}: not a replay results file")
    return data


def _rank(run: dict[str, Any]) -> tuple[float, ...]:
    m = run["metrics"]
    return (m["tasks_failed"], m["makespan_s"], m["oom_kills"], run.get("k") or 0)


def best_static(runs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The static-K run to show: all tasks done and fastest; else most done."""
    static = [r for r in runs if r.get("family") == "static"]
    return min(static, key=_rank) if static else None


def _family_key(run: dict[str, Any]) -> tuple[int, str]:
    fam = run.get("family", run["scheme"])
    return (FAMILY_ORDER.index(fam) if fam in FAMILY_ORDER else len(FAMILY_ORDER), run["scheme"])


def shown_runs(results: dict[str, Any], point: int) -> list[dict[str, Any]]:
    """Runs of one load as the report shows them: every scheme, static-K collapsed to its best."""
    runs = [r for r in results["runs"] if r.get("point", 0) == point]
    out = [r for r in runs if r.get("family") != "static"]
    best = best_static(runs)
    if best:
        out.append(best)
    return sorted(out, key=_family_key)


def label(run: dict[str, Any]) -> str:
    return f"static (K={run['k']})" if run.get("family") == "static" else run["scheme"]


def colour(run: dict[str, Any], i: int = 0) -> str:
    return COLOURS.get(run.get("family", run["scheme"]), _EXTRA[i % len(_EXTRA)])


def _num(x: Any, fmt: str = "{:.1f}") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return fmt.format(x)


def _pct(x: Any) -> str:
    return _num(None if x is None else 100 * x, "{:.0f} %")


def _row(run: dict[str, Any]) -> list[str]:
    m = run["metrics"]
    return [
        label(run),
        f"{m['tasks_completed']}/{m['tasks_total']}",
        f"{_num(m['makespan_s'])} ({_num(m['makespan_trace_s'], '{:.0f}')})",
        f"{_num(m.get('latency_arrival_p50_s'))} / {_num(m.get('latency_arrival_p95_s'))}",
        str(m["oom_kills"]),
        f"{m['failed_attempts']}/{m['attempts']} ({_pct(m['attempt_failure_rate'])})",
        f"{_pct(m['mem_peak_util'])} / {_pct(m['mem_mean_util'])}",
        f"{m['concurrency_max']} / {_num(m['concurrency_mean'])}",
        _num(m.get("call_delay_p50_s"), "{:.2f}"),
    ]


HEADER = ["scheme", "tasks done", "makespan s (trace s)", "latency P50 / P95 s",
          "OOM kills", "failed attempts", "memory peak / mean", "tasks running max / mean",
          "call delay P50 s"]


WHY_HEADER = ["scheme", "kernel OOM kills: inits / calls", "sandboxes held / longest s",
              "calls waited / forced / held",
              "admission wait max s", "reclaimed MiB", "swap peak MiB", "zram ratio",
              "daemon CPU s"]


def _zram_ratio(run: dict[str, Any]) -> float | None:
    """orig / compr of what this run added to the zram device at its fullest (None: no zram,
    nothing in)."""
    sw = run.get("swap") or {}
    a, b = sw.get("zram_before") or {}, sw.get("zram_peak") or {}
    if not a or not b:
        return None
    orig = b.get("orig_bytes", 0) - a.get("orig_bytes", 0)
    compr = b.get("compr_bytes", 0) - a.get("compr_bytes", 0)
    return orig / compr if orig > 0 and compr > 0 else None


def _why_row(run: dict[str, Any]) -> list[str]:
    """What explains a run's losses: who the kernel killed, what the daemon decided."""
    m = run["metrics"]
    calls = run.get("calls", [])
    dec = [c["daemon"] for c in calls if c.get("daemon")]
    waited = sum((d.get("waited_s") or 0) >= 1 for d in dec)
    forced = sum(bool(d.get("forced")) for d in dec)
    held = sum((d.get("held_s") or 0) > 0 for d in dec)
    reclaimed = sum((c.get("residency") or {}).get("reclaimed_bytes", 0) for c in calls)
    sw = run.get("swap") or {}
    daemon = run.get("scheme_def", {}).get("daemon")
    held_boxes = [a["sandbox_admission"].get("waited_s") or 0 for a in run.get("attempts", [])
                  if a.get("sandbox_admission")]
    return [
        label(run),
        f"{m.get('kills_init', '–')} / {m.get('kills_call', '–')}"
        + (f" (+{m['kills_unattributed']} unattributed)" if m.get("kills_unattributed") else ""),
        (f"{sum(w >= 1 for w in held_boxes)} / {_num(max(held_boxes, default=0))}"
         if daemon else "–"),
        f"{waited} / {forced} / {held}" if daemon else "–",
        _num(m.get("admission_wait_max_s")) if daemon else "–",
        _num(reclaimed / MiB, "{:.0f}") if daemon else "–",
        _num(sw.get("swap_peak_bytes", 0) / MiB, "{:.0f}") if sw.get("on") else "off",
        _num(_zram_ratio(run), "{:.2f}") if sw.get("on") else "–",
        _daemon_cpu(m.get("daemon_cpu_s"), run.get("daemon_loop")) if daemon else "–",
    ]


def _daemon_cpu(total: float | None, loop: dict[str, Any] | None) -> str:
    """execgated's CPU over the run: its control loop's with the stage that spent most, then
    its loop thread's besides the loop (requests) and the other thread kind that spent most."""
    out = _num(total, "{:.0f}")
    stages = (loop or {}).get("stage_cpu_s") or {}
    if loop and loop.get("cpu_s") is not None and stages:
        top = max(stages, key=stages.__getitem__)
        out += f" (loop {loop['cpu_s']:.0f}; {top} {stages[top]:.0f}"
        threads = dict(loop.get("threads_cpu_s") or {})
        if "MainThread" in threads:
            out += f"; requests {max(threads.pop('MainThread') - loop['cpu_s'], 0):.0f}"
            if threads:
                kind = max(threads, key=threads.__getitem__)
                out += f"; {kind} {threads[kind]:.0f}"
        periods = loop.get("periods") or {}
        if sum(periods.values()):
            out += f"; {100 * periods.get('calm', 0) / sum(periods.values()):.0f} % calm"
        out += ")"
    return out


def _table(rows: list[list[str]], header: Sequence[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    """The whole report as Markdown (stdlib only)."""
    p = results.get("params", {})
    w = p.get("workload", {})
    out = ["# execgate trace-replay benchmark", ""]
    if results.get("command"):
        out += [f"`{results['command']}`", ""]
    for part in results.get("merged_from", []):
        out.append(f"- {', '.join(part['schemes'])}: `{part['command']}` ({part['created']})")
    if results.get("merged_from"):
        out += ["", f"Merged from {len(results['merged_from'])} runs of the same workload "
                "(same traces, arrivals and budget; one run per line above).", ""]
    out.append(
        f"Workload: seed {p.get('seed')}{' (trace ' + p['trace'] + ')' if p.get('trace') else ''}"
        f", {p.get('arrival')} arrivals (mean gap {p.get('mean_gap_trace_s')} trace s), replayed "
        f"{w.get('speed')}x faster, memory /{w.get('mem_scale')}, CPU x{w.get('cpu_scale')}"
        + (f", calls under {w['fold_bytes'] / MiB:g} MiB folded" if w.get("fold_bytes") else "")
        + (f", {w['max_calls']} heaviest calls per task" if w.get("max_calls") else "")
        + (f", idle time x{w['idle_scale']:g}" if w.get("idle_scale", 1) != 1 else
           ", LLM waits kept")
        + (f", memory filled to zstd {w['fill_ratio']:g}:1" if w.get("fill_ratio") else "")
        + f"; up to {p.get('retry_limit')} retries per task. Host: {results.get('host', {})}.")
    out += ["", "Latency is from a task's arrival to its completion (queueing and retries "
            "included), wall seconds; makespan in wall seconds (trace seconds in brackets). "
            "Memory is the slice's memory.current against the budget. Call delay: a tool call's "
            "wall time beyond its traced duration (runtime, admission wait, throttling).", ""]
    for i, point in enumerate(results.get("points", [])):
        runs = shown_runs(results, i)
        if not runs:
            continue
        out.append(f"## {point['label']}: budget {point['budget_bytes'] / MiB:.0f} MiB, "
                   f"oversubscription {point['oversubscription']:.2f}x, swap "
                   f"{point.get('swap', 'off')}")
        out += ["", _table([_row(r) for r in runs], HEADER), ""]
        out += ["Why (per call in results.json: `calls[].daemon`, `calls[].residency`, "
                "`kills`):", "", _table([_why_row(r) for r in runs], WHY_HEADER), ""]
        cpu = [(r, cpu_ledger.row(r)) for r in runs]
        if any(c for _r, c in cpu):
            out += ["Where the host's CPU went over each run (cgroup `cpu.stat`; under TCG "
                    "one host thread runs every vCPU, so CPU one party spends the others do "
                    "not get; `cpu_ledger` in results.json has every cgroup):", "",
                    _table([[label(r), *c] for r, c in cpu if c],
                           ["scheme", *cpu_ledger.HEADER]), ""]
        if point.get("skipped"):
            out += ["Not run at this point: " + "; ".join(point["skipped"]) + ".", ""]
        static = sorted((r for r in results["runs"]
                         if r.get("point", 0) == i and r.get("family") == "static"),
                        key=lambda r: r["k"])
        if len(static) > 1:
            out.append("Static-K sweep: " + "; ".join(
                f"K={r['k']}: {r['metrics']['tasks_completed']}/{r['metrics']['tasks_total']} "
                f"done, makespan {_num(r['metrics']['makespan_s'])} s, "
                f"{r['metrics']['oom_kills']} OOM kills" for r in static) + ".")
            out.append("")
        notes = [f"{r['scheme']}: {n}" for r in results["runs"] if r.get("point", 0) == i
                 for n in r.get("notes", [])]
        if notes:
            out += ["Notes:", *(f"- {n}" for n in notes), ""]
    if results.get("aborted"):
        out += ["**The run was interrupted: results are partial.**", ""]
    return "\n".join(out).rstrip() + "\n"


def _point_key(pt: dict[str, Any]) -> tuple[Any, ...]:
    return (pt.get("label"), pt.get("n_tasks"), pt.get("budget_bytes"),
            tuple(round(a, 6) for a in pt.get("arrivals_trace_s", [])))


def merge(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One results dict from several runs of the same workload (schemes split across runs).

    The workload must be identical: seed, trace, arrivals, replay transforms, retry limit and
    the loads (points). Runs keep their own point index, get `part` (index into `merged_from`),
    and a scheme measured twice is an error (which one would the table show?)."""
    if not parts:
        raise ValueError("nothing to merge")
    # (The arrival times themselves are compared with the points: a mean gap that a burst
    # ignores does not make another workload.)
    keys = ("seed", "trace", "workload", "retry_limit")
    first = parts[0]
    p0 = first.get("params", {})
    pts0 = [_point_key(pt) for pt in first.get("points", [])]
    for i, r in enumerate(parts[1:], 1):
        p = r.get("params", {})
        diff = [k for k in keys if p.get(k) != p0.get(k)]
        if diff:
            raise ValueError(f"part {i + 1} replays another workload ({', '.join(diff)} differ)")
        if [_point_key(pt) for pt in r.get("points", [])] != pts0:
            raise ValueError(f"part {i + 1} has other loads (points) than part 1")
    out = json.loads(json.dumps(first))
    out["runs"], seen = [], set()
    for i, r in enumerate(parts):
        for run in r.get("runs", []):
            key = (run.get("point", 0), run["scheme"])
            if key in seen:
                raise ValueError(f"{run['scheme']} (point {key[0]}) is in more than one part")
            seen.add(key)
            out["runs"].append({**run, "part": i})
    out["merged_from"] = [{"command": r.get("command"), "created": r.get("created"),
                           "host": r.get("host"), "elapsed_s": r.get("elapsed_s"),
                           "schemes": sorted({x["scheme"] for x in r.get("runs", [])},
                                             key=lambda n: _family_key({"scheme": n}))}
                          for r in parts]
    out["params"]["schemes"] = [x["scheme"] for x in out["runs"]]
    out["command"] = None
    out["aborted"] = any(r.get("aborted") for r in parts)
    out["elapsed_s"] = sum(r.get("elapsed_s") or 0 for r in parts)
    return out


TEXT_HEADER = ("scheme", "done", "makespan s", "latency P50/P95 s", "OOM kills",
               "failed attempts")


def text_table(results: dict[str, Any]) -> str:
    """A compact fixed-width table per load, for a terminal (the demo prints it)."""
    out: list[str] = []
    for i, point in enumerate(results.get("points", [])):
        runs = shown_runs(results, i)
        if not runs:
            continue
        rows = [TEXT_HEADER]
        for r in runs:
            m = r["metrics"]
            rows.append((
                label(r), f"{m['tasks_completed']}/{m['tasks_total']}", _num(m["makespan_s"]),
                f"{_num(m.get('latency_arrival_p50_s'))} / "
                f"{_num(m.get('latency_arrival_p95_s'))}",
                str(m["oom_kills"]),
                f"{m['failed_attempts']}/{m['attempts']} ({_pct(m['attempt_failure_rate'])})"))
        widths = [max(len(row[c]) for row in rows) for c in range(len(TEXT_HEADER))]
        out.append(f"{point['label']}: {point['n_tasks']} sandboxes, budget "
                   f"{point['budget_bytes'] / MiB:.0f} MiB, sum of task peaks "
                   f"{point['oversubscription']:.2f}x the budget")
        for j, row in enumerate(rows):
            out.append("  " + "  ".join(c.ljust(w) if k == 0 else c.rjust(w)
                                        for k, (c, w) in enumerate(zip(row, widths,
                                                                       strict=True))))
            if j == 0:
                out.append("  " + "  ".join("-" * w for w in widths))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------
# Plots (matplotlib, imported only here)


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_timeline(results: dict[str, Any], point: int, path: Path) -> Path:
    """Per scheme: memory (% of budget) and running tasks over wall time, OOM kills marked."""
    plt = _plt()
    runs = shown_runs(results, point)
    pt = results["points"][point]
    speed = results.get("params", {}).get("workload", {}).get("speed", 1.0)
    t_max = max((row[0] for r in runs for row in r["samples"]["rows"]), default=1.0)
    n_max = max((row[2] for r in runs for row in r["samples"]["rows"]), default=1)
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.9 * len(runs) + 1.0), sharex=True,
                             squeeze=False)
    for i, (run, ax) in enumerate(zip(runs, axes[:, 0], strict=True)):
        rows = run["samples"]["rows"]
        t = [r[0] for r in rows]
        mem = [100 * r[1] / pt["budget_bytes"] for r in rows]
        c = colour(run, i)
        ax.fill_between(t, mem, step="post", alpha=0.35, color=c, linewidth=0)
        ax.step(t, mem, where="post", color=c, linewidth=1.0)
        ax.axhline(100, color="black", linewidth=0.8, linestyle="--")
        ax.set_ylim(0, 115)
        ax.set_ylabel("memory %")
        ooms = [a["end"] for a in run["attempts"] if a.get("oom_kills")]
        if ooms:
            ax.plot(ooms, [104] * len(ooms), "v", color="#d62728", markersize=6,
                    label=f"OOM kill ({len(ooms)})")
            ax.legend(loc="upper right", fontsize=8, frameon=False)
        m = run["metrics"]
        ax.set_title(f"{label(run)}: {m['tasks_completed']}/{m['tasks_total']} done, makespan "
                     f"{m['makespan_s']:.0f} s, {m['oom_kills']} OOM kills, peak "
                     f"{100 * m['mem_peak_util']:.0f} %", fontsize=9, loc="left")
        ax2 = ax.twinx()
        ax2.step(t, [r[2] for r in rows], where="post", color="#1f77b4", linewidth=1.2)
        ax2.step(t, [r[3] for r in rows], where="post", color="#1f77b4", linewidth=0.6,
                 alpha=0.6, linestyle=":")
        ax2.set_ylim(0, max(n_max, 1) * 1.15 + 0.5)
        ax2.set_ylabel("tasks", color="#1f77b4")
        ax.set_xlim(0, t_max * 1.01 if t_max else 1)
    axes[-1, 0].set_xlabel(f"wall seconds (x{speed:g} = trace seconds)   "
                           "shaded: slice memory / budget;  blue: tasks running "
                           "(dotted: tool calls in flight)")
    fig.suptitle(f"{pt['label']}: budget {pt['budget_bytes'] / MiB:.0f} MiB, "
                 f"oversubscription {pt['oversubscription']:.1f}x", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_summary(results: dict[str, Any], path: Path) -> Path:
    """Makespan, P50 latency and failures per scheme: bars for one load, lines across loads."""
    plt = _plt()
    points = results.get("points", [])
    many = len(points) > 1
    panels = [("makespan_s", "makespan (s)"), ("latency_arrival_p50_s", "P50 latency (s)"),
              ("failed_attempts", "failed attempts (OOM kills "
                                  + ("dashed)" if many else "hatched)"))]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    series: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    for i, pt in enumerate(points):
        for run in shown_runs(results, i):
            series.setdefault(run.get("family", run["scheme"]), []).append(
                (pt["oversubscription"], run))
    names = sorted(series, key=lambda f: _family_key(series[f][0][1]))
    for ax, (key, title) in zip(axes, panels, strict=True):
        if not many:
            runs = [series[n][0][1] for n in names]
            xs = range(len(runs))
            vals = [r["metrics"].get(key, math.nan) for r in runs]
            ax.bar(xs, vals, color=[colour(r, j) for j, r in enumerate(runs)])
            if key == "failed_attempts":
                ax.bar(xs, [r["metrics"]["oom_kills"] for r in runs], color="none",
                       edgecolor="black", hatch="//", linewidth=0)
            ax.set_xticks(list(xs), [label(r) for r in runs], rotation=25, ha="right",
                          fontsize=8)
            for x, v in zip(xs, vals, strict=True):
                if isinstance(v, int | float) and not math.isnan(v):
                    ax.annotate(f"{v:.0f}", (x, v), ha="center", va="bottom", fontsize=8)
        else:
            for j, name in enumerate(names):
                pts = sorted(series[name], key=lambda p: p[0])
                xs_ = [p[0] for p in pts]
                c = colour(pts[0][1], j)
                ax.plot(xs_, [p[1]["metrics"].get(key, math.nan) for p in pts], "o-", color=c,
                        label="static (best K)" if name == "static" else name)
                if key == "failed_attempts":
                    ax.plot(xs_, [p[1]["metrics"]["oom_kills"] for p in pts], "--", color=c,
                            linewidth=0.8)
            ax.set_xlabel("oversubscription (sum of task peaks / budget)")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
    if many:
        axes[0].legend(fontsize=8)
    else:
        pt = points[0] if points else {"label": "", "oversubscription": math.nan}
        fig.suptitle(f"{pt['label']}: oversubscription {pt['oversubscription']:.1f}x",
                     fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render(results: dict[str, Any], out: Path, plots: bool = True) -> list[Path]:
    """report.md plus, if `plots`, timeline-N.png per load and summary.png."""
    out.mkdir(parents=True, exist_ok=True)
    md = out / "report.md"
    md.write_text(markdown(results), encoding="utf-8")
    files = [md]
    if plots and results.get("runs"):
        for i in range(len(results.get("points", []))):
            if shown_runs(results, i):
                files.append(plot_timeline(results, i, out / f"timeline-{i + 1}.png"))
        files.append(plot_summary(results, out / "summary.png"))
    return files


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/report.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+",
                    help="results.json written by bench/replay.py (several: merge them)")
    ap.add_argument("--out", help="output directory (default: next to results.json; required "
                                  "to merge)")
    plots = ap.add_mutually_exclusive_group()
    plots.add_argument("--no-plots", action="store_true", help="Markdown only (no matplotlib)")
    plots.add_argument("--plots-optional", action="store_true",
                       help="plots if matplotlib is importable, else Markdown only")
    ap.add_argument("--text", action="store_true", help="print the compact table")
    args = ap.parse_args(argv)
    if len(args.results) > 1 and not args.out:
        ap.error("--out is required to merge several results files")
    try:
        parts = [load(p) for p in args.results]
        results = merge(parts) if len(parts) > 1 else parts[0]
    except (OSError, ValueError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(args.results[0]).resolve().parent
    if len(parts) > 1:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    want_plots = not args.no_plots
    if args.plots_optional:
        try:
            _plt()
        except ImportError:
            want_plots = False
            print("report: no matplotlib here: Markdown only (pip install matplotlib, then "
                  f"python3 -m bench.report {out / 'results.json'})", file=sys.stderr)
    try:
        files = render(results, out, plots=want_plots)
    except ImportError:
        print("report: matplotlib is needed for plots (pip install matplotlib), or --no-plots",
              file=sys.stderr)
        return 2
    if args.text:
        print(text_table(results))
    for f in files:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
