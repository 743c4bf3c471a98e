#!/usr/bin/env python3
"""Trace-replay benchmark: the same agent tasks, on the same arrival schedule, under each scheme.

Each task gets its own sandbox (`docker run -d --runtime R --cgroup-parent SLICE`) when it
starts; LLM waits are sleeps here; tool calls are `docker exec [-e AGENT_RESOURCE_HINT=…] CID
memload …`, sequential within a task and concurrent across tasks. The slice's memory.max is the
memory budget; a call OOM-killed at its boundary (exit 137) restarts the task from scratch in a
fresh sandbox, up to metrics.RETRY_LIMIT retries, and the retries count in its latency.

    python3 -m bench.replay run --schemes eager,static,execgate --tasks 8 --seed 1 --speed 20 \\
        --mem-scale 8 --budget 768m --out DIR
    python3 -m bench.replay sweep --tasks 12 --oversub 2,4,8.6 --out DIR
    python3 -m bench.replay demo --out DIR        # a few minutes: eager vs execgate
    python3 -m bench.replay plan --tasks 8 ...     # what a run would replay (no Docker)

Needs root, Docker on cgroup v2 with execgate installed (runtime `execgate`, execgated under
systemd) and an image with /bin/memload (tests/vm/guest-run.sh builds execgate-test:latest).
It edits /etc/execgate/config.toml and restarts execgated per scheme, and restores both at exit.
Writes DIR/results.json (raw), DIR/report.md and DIR/replayed.jsonl; plots come from
`python3 -m bench.report DIR/results.json` on a host with matplotlib. Stdlib only.

This module is the command line; the host setup is `bench/host.py`, the run loop
`bench/runner.py`, the loads and sweeps `bench/sweep.py`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from bench.host import CLIENTS, CONFIG, BenchError
from bench.schemes import DEFAULT_SCHEMES, DEFAULT_STATIC_K, parse_schemes
from bench.sweep import SWAP_MODES, build_points, execute, int_list, print_plan, workload_of
from bench.workload import ARRIVALS

# The demo: a burst of five sandboxes into a 384 MiB slice. Five generated tasks (seed 13), memory
# /6, each cut to its three heaviest tool calls with the think time between them shrunk 20x, then
# replayed 2x faster: 15 calls of 1-20 s, sum of task peaks 1.7x the budget, and eager would need
# 153 % of it if nothing were slowed down (`plan` with these values shows it). Under TCG a call's
# admission wait is bounded at 300 s (the default 30 s is ~10x more in emulated time).
DEMO = {"tasks": 5, "seed": 13, "speed": 2.0, "mem_scale": 6.0, "cpu_scale": 0.0,
        "fold_mib": 0.0, "max_calls": 3, "idle_scale": 0.05, "budget": "384m",
        "arrival": "burst", "mean_gap": 0.0, "schemes": "eager,execgate", "admission_wait": 300.0}

# Named workloads: defaults for the options they name (an option given on the command line
# wins). burst: TenonAgent's regime, every task arriving within 10 trace seconds, each cut to its
# three heaviest calls with every LLM wait kept, compressed by --speed like the calls.
WORKLOADS = {"burst": {"arrival": "burst", "burst_window": 10.0, "keep_waits": True,
                       "max_calls": 3}}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bench/replay.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, demo: bool = False) -> None:
        d = DEMO if demo else {}
        g = p.add_argument_group("workload")
        g.add_argument("--tasks", type=int, default=d.get("tasks", 8), help="tasks per point")
        g.add_argument("--seed", default=str(d.get("seed", 1)),
                       help="traces and arrivals (same seed, same run)")
        g.add_argument("--trace", help="replay this JSONL (bench/TRACE_FORMAT.md) instead of "
                                       "generating")
        g.add_argument("--speed", type=float, default=d.get("speed", 20.0),
                       help="time compression (default %(default)s)")
        g.add_argument("--mem-scale", type=float, default=d.get("mem_scale", 8.0),
                       help="divide all bytes by this (default %(default)s)")
        g.add_argument("--cpu-scale", type=float, default=d.get("cpu_scale", 0.25),
                       help="multiply memload's CPU share (default %(default)s)")
        g.add_argument("--fold-mib", type=float, default=d.get("fold_mib", 0.0),
                       help="replay calls peaking below this (scaled MiB) as idle time")
        g.add_argument("--max-calls", type=int, default=d.get("max_calls", 0),
                       help="keep only each task's N heaviest calls (0: all)")
        g.add_argument("--idle-scale", type=float, default=d.get("idle_scale", 1.0),
                       help="multiply idle time (LLM waits, folded calls) by this")
        g.add_argument("--keep-waits", action="store_true",
                       help="keep the LLM waits: compressed by --speed like the calls, never "
                            "scaled by --idle-scale (which must then be 1)")
        g.add_argument("--workload", choices=sorted(WORKLOADS),
                       help="a named workload: burst = --arrival burst --burst-window 10 "
                            "--keep-waits --max-calls 3 (options given here win)")
        g.add_argument("--arrival", choices=ARRIVALS, default=d.get("arrival", "poisson"))
        g.add_argument("--mean-gap", type=float, default=d.get("mean_gap", 30.0),
                       help="mean gap between arrivals, trace seconds (default %(default)s)")
        g.add_argument("--burst-window", type=float, default=d.get("burst_window", 0.0),
                       help="burst arrivals spread (seeded uniform) over this many trace "
                            "seconds (default %(default)s: all at once)")
        g.add_argument("--fill-ratio", type=float, default=3.0,
                       help="zstd ratio of the memory sandboxes and calls hold (default "
                            "%(default)s; real process memory 2.5-3.5; 0: nearly empty pages)")
        g.add_argument("--hot-calls", action="store_true",
                       help="calls read every page they hold each tick (memload --hot): a "
                            "working set in use, which swap cannot take from a running call "
                            "for free")
        g.add_argument("--budget", default=d.get("budget", "768m"),
                       help="memory budget = the slice's memory.max (default %(default)s)")
        s = p.add_argument_group("schemes and host")
        s.add_argument("--schemes", default=d.get("schemes", DEFAULT_SCHEMES),
                       help="comma-separated (default %(default)s); static = sweep --static-k")
        s.add_argument("--static-k", default=",".join(map(str, DEFAULT_STATIC_K)))
        s.add_argument("--admission-wait", type=float, default=d.get("admission_wait"),
                       help="execgated's max_admission_wait_s during the run (default: as "
                            "configured)")
        s.add_argument("--no-scale-daemon", action="store_true",
                       help="don't divide execgated's byte tunables by --mem-scale")
        s.add_argument("--swap", choices=sorted(SWAP_MODES), default="off",
                       help="every scheme of a point with swap on, or off; both: each load "
                            "twice (default %(default)s)")
        s.add_argument("--zram-size", default="2g",
                       help="the zram swap device made when the host has no swap (default "
                            "%(default)s; the host's own swap is used as it is)")
        s.add_argument("--zram-algorithm", default="zstd")
        s.add_argument("--slice", default="egbench.slice")
        s.add_argument("--image", default=os.environ.get("EXECGATE_BENCH_IMAGE",
                                                         "execgate-test:latest"))
        s.add_argument("--config", default=CONFIG)
        s.add_argument("--sample-ms", type=float, default=150.0)
        s.add_argument("--docker-client", choices=CLIENTS, default="api",
                       help="drive Docker through its Engine API, or a `docker` CLI process "
                            "per operation as rounds before 6 Dec did (default %(default)s)")
        s.add_argument("--quiet", action="store_true", help="one line per scheme only")
        if p.prog.split()[-1] != "plan":
            s.add_argument("--out", help="results directory (required unless --dry-run)")
            s.add_argument("--dry-run", action="store_true",
                           help="print what would be replayed and exit (no Docker)")

    common(sub.add_parser("run", help="one load, every scheme"))
    sw = sub.add_parser("sweep", help="several loads (task counts x budgets, or oversubscription)")
    common(sw)
    sw.add_argument("--task-counts", help="e.g. 4,8,16 (instead of --tasks)")
    sw.add_argument("--budgets", help="e.g. 1g,768m,512m (instead of --budget)")
    sw.add_argument("--oversub", help="e.g. 2,4,8.6: budget = sum of task peaks / ratio")
    sw.add_argument("--points", help="run only these loads (1-based, in oversubscription "
                    "order), e.g. to finish a sweep in another boot: every load is still "
                    "described, so bench/report.py merges the parts")
    common(sub.add_parser("demo", help="a few minutes: a burst on a small budget, eager vs "
                                       "execgate"), demo=True)
    pl = sub.add_parser("plan", help="print what would be replayed (no Docker)")
    common(pl)
    pl.add_argument("--task-counts")
    pl.add_argument("--budgets")
    pl.add_argument("--oversub")
    return ap


def _apply_workload(ap: argparse.ArgumentParser, args: argparse.Namespace,
                    argv: Sequence[str]) -> None:
    """--workload's defaults for the options not given, then --keep-waits."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    for key, value in WORKLOADS.get(args.workload or "", {}).items():
        if "--" + key.replace("_", "-") not in given:
            setattr(args, key, value)
    if args.keep_waits:
        if args.idle_scale != 1.0:
            raise ValueError("--keep-waits keeps the LLM waits: --idle-scale must be 1")
        args.idle_scale = 1.0


def main(argv: Sequence[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        _apply_workload(ap, args, sys.argv[1:] if argv is None else list(argv))
    except ValueError as e:
        ap.error(str(e))
    dry = args.command == "plan" or args.dry_run
    if not dry and not args.out:
        ap.error("--out is required")
    args.seed = int(args.seed) if args.seed.lstrip("-").isdigit() else args.seed
    try:
        points = build_points(args)
        if dry:
            n = max(len(p.tasks) for p in points)
            print_plan(points, parse_schemes(args.schemes, int_list(args.static_k), n),
                       workload_of(args))
            return 0
        cmd = "bench/replay.py " + " ".join(sys.argv[1:] if argv is None else argv)
        results = execute(args, points, cmd)
    except (BenchError, ValueError) as e:
        print(f"replay: {e}", file=sys.stderr)
        return 2
    return 1 if results.get("aborted") else 0


if __name__ == "__main__":
    sys.exit(main())
