"""The policy simulator's command line.

    python3 -m bench.sim validate docs/replay/sweep/results.json.gz [--out DIR]
    python3 -m bench.sim sweep --sandboxes 1000 --budget 64g [--schemes ...] [--out DIR]
    python3 -m bench.sim fit docs/replay/sweep/results.json.gz     # the cost model only
    python3 -m bench.sim replay [--cost C] [--swap-bandwidth-mib B] -- BENCH.REPLAY SWEEP ARGS

`replay` simulates the points `python3 -m bench.replay sweep ARGS` would run in the VM (the same
tasks, arrivals, budgets and swap; zram's size as memory.swap.max) before any VM run exists;
`validate` reruns a VM results file's points in the simulator and prints VM vs sim per scheme
and point; `sweep` runs the generator's calibrated tasks (unscaled: 185 MB baselines, bursts to
4 GB, every call, real time) under every scheme on one budget and prints the wall time it took.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench.generate import generate, generate_task
from bench.metrics import RETRY_LIMIT
from bench.schemes import bench_config
from bench.sim import policy_rev
from bench.sim import schemes as sim_schemes
from bench.sim.cost import CostModel, fit_pooled, fit_results, fixed, load_results
from bench.sim.memory import MemoryConfig
from bench.sim.run import SimSettings, simulate
from bench.sim.validate import (
    VM_SWAP_IN_BPS,
    VM_SWAP_OUT_BPS,
    cost_lines,
    summary,
    table,
    tasks_of,
    validate,
)
from bench.trace import Task
from bench.workload import arrival_schedule, oversubscription
from execgate.common.hints import parse_size
from execgate.common.units import MiB


def _write(out: str | None, name: str, text: str) -> None:
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text(text, encoding="utf-8")


def _policy_line() -> str:
    rev = policy_rev.active()
    return (f"policy: execgate at {rev} (git archive)" if rev
            else "policy: execgate of the working tree")


def cmd_validate(args: argparse.Namespace) -> int:
    extra = [x for x in (args.extra or "").split(",") if x.strip()]
    res = validate(args.results, tick_s=args.tick, extra=extra, per_part=args.per_part,
                   swap_out_bps=args.swap_bandwidth_mib * MiB,
                   swap_in_bps=args.swap_in_bandwidth_mib * MiB, draws=args.draws)
    lines = [_policy_line(), "", *table(res["rows"]), "", *summary(res["rows"])]
    lines += ["", f"simulated {len(res['rows'])} runs in {res['wall_s']:.1f} s wall", "",
              "cost model (n = live sandboxes, averaged over the operation):"]
    lines += cost_lines(res["costs"], res["results"], res["tasks"])
    for part, costs in sorted(res["part_costs"].items(), key=lambda kv: str(kv[0])):
        lines += ["", f"per-boot fit, part {part}:"]
        lines += [f"  {rt} {op:<4} {getattr(m, op).describe()}" for rt, m in costs.items()
                  for op in ("run", "exec", "rm")]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    stem = "validate" + (f"-{args.policy_rev}" if args.policy_rev else "") + (
        "-per-part" if args.per_part else "") + (f"-draws{args.draws}" if args.draws else "")
    _write(args.out, f"{stem}.md", text)
    if args.out:
        rows = [{k: v for k, v in r.items()} for r in res["rows"]]
        data = {"source": res["source"], "rows": rows,
                "costs": {k: m.to_dict() for k, m in res["costs"].items()}}
        _write(args.out, f"{stem}.json", json.dumps(data, indent=1, default=str) + "\n")
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    results = load_results(args.results)
    tasks = {t.id: t for t in tasks_of(results)}
    print("\n".join(cost_lines(fit_results(results, tasks), results, tasks)))
    return 0


def _cost(spec: str) -> tuple[CostModel, dict[str, CostModel]]:
    """hw (a hardware host: run 1 s, exec 0.05 s, rm 0.5 s), none, fixed:RUN,EXEC,RM, or
    results files to fit, comma-separated (the VM's TCG costs: minutes per docker run beyond a
    few sandboxes; several files: one fit over all their runs)."""
    if spec == "hw":
        return fixed(1.0, 0.05, 0.5), {}
    if spec == "none":
        return fixed(), {}
    if spec.startswith("fixed:"):
        a, b, c = (float(x) for x in spec.removeprefix("fixed:").split(","))
        return fixed(a, b, c), {}
    paths = [x for x in spec.split(",") if x]
    files = [(r, {t.id: t for t in tasks_of(r)}) for r in map(load_results, paths)]
    costs = (fit_results(*files[0]) if len(files) == 1
             else fit_pooled(files, f"{len(files)} VM results files'"))
    return costs["runc"], costs


# What every scheme of a sweep shares (tasks, arrivals, budget, settings), set before the pool
# starts: forked workers inherit it instead of unpickling 1,000 tasks per scheme.
_SHARED: tuple[Any, ...] = ()


def _one(job: tuple[Any, ...]) -> tuple[dict[str, Any], float]:
    """One scheme of a sweep (in a worker process): its result and its own wall time."""
    scheme, cfg, *load = job
    tasks, arrivals, budget, settings = load or _SHARED
    t0 = time.perf_counter()
    r = simulate(scheme, tasks, arrivals, budget, settings, cfg)
    return r, time.perf_counter() - t0


def _swap_in(args: argparse.Namespace) -> float | None:
    mib = args.swap_in_bandwidth_mib
    return None if mib is None else mib * MiB


def _generate(n: int, seed: int | str, jobs: int) -> list[Task]:
    """The generator's n tasks, on `jobs` processes when there are many (each task depends on
    (seed, index) alone: the same list as `generate`; 1,000 took 3.3 s, before any run)."""
    if jobs <= 1 or n < 200:
        return generate(n, seed)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(functools.partial(generate_task, seed), range(n),
                             chunksize=max(n // (4 * jobs), 1)))


def cmd_sweep(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    n = args.sandboxes
    tasks = _generate(n, args.seed, args.jobs)
    arrivals = arrival_schedule(n, args.seed, args.arrival, args.mean_gap)
    budget = parse_size(args.budget)
    ks = [int(k) for k in args.static_k.split(",") if k.strip()]
    schemes = sim_schemes.parse(args.schemes, ks, n)
    cost, by_rt = _cost(args.cost)
    mem = MemoryConfig(swap=args.swap, swap_ratio=args.swap_ratio,
                       swap_bandwidth_bps=args.swap_bandwidth_mib * MiB,
                       swap_in_bandwidth_bps=_swap_in(args), zram=args.zram,
                       hot_protection=args.hot_protection)
    settings = SimSettings(cost=cost, cost_by_runtime=by_rt, memory=mem, tick_s=args.tick,
                           retry_limit=RETRY_LIMIT, immediate_steps=args.immediate,
                           sandbox_period_s=args.sandbox_period, hot_calls=args.hot_calls)
    over = oversubscription(tasks, budget)
    lines = [f"{n} sandboxes (generator seed {args.seed}, calibrated, unscaled), budget "
             f"{budget / (1 << 30):.1f} GiB, oversubscription {over:.2f}x, arrivals "
             f"{args.arrival} mean gap {args.mean_gap:g} s; cost {cost.source}; swap "
             f"{('on (zram)' if args.zram else 'on (zswap)') if args.swap else 'off'}; tick "
             f"{args.tick:g} s, {'hot' if args.hot_calls else 'cold'} calls, sandbox "
             "admission every "
             f"{args.sandbox_period:g} s, admission steps "
             f"{'on every submit/release' if args.immediate else 'once per tick'}"
             + ("" if args.start_wait is None else f", max start wait {args.start_wait:g} s"),
             "",
             "| scheme | done | OOM kills | init kills | attempts | makespan s | P50 s | P95 s | "
             "peak mem | wall s |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
             "---: | ---: |"]
    out: list[dict[str, Any]] = []
    global _SHARED
    _SHARED = (tasks, arrivals, budget, settings)
    cfgs = {s.name: bench_config({}, s, domain="/sim", admission_wait_s=args.admission_wait)
            if s.daemon or s.runtime == "execgate" else None for s in schemes}
    for s in schemes:
        _start_wait(cfgs[s.name] if s.daemon else None, args.start_wait)
    first: dict[str, str] = {}  # run key -> the first scheme with it; the others share its run
    same = {s.name: first.setdefault(sim_schemes.run_key(s, cfgs[s.name]), s.name)
            for s in schemes}
    jobs = [(s, cfgs[s.name]) for s in schemes if same[s.name] == s.name]
    # Heaviest first, so the two workers finish together.
    jobs.sort(key=lambda j: not j[0].daemon)
    fork = "fork" in multiprocessing.get_all_start_methods()
    if not fork:  # spawned workers import this module afresh: the shared load goes with them
        _SHARED = ()
        jobs = [(*j, tasks, arrivals, budget, settings) for j in jobs]
    ctx = multiprocessing.get_context("fork" if fork else None)
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as pool:
        results = dict(zip([j[0].name for j in jobs], pool.map(_one, jobs), strict=True))
    for s in schemes:
        r, wall = results[same[s.name]]
        m = r["metrics"]
        out.append({"scheme": s.name, "wall_s": wall, "metrics": m, "daemon": r.get("daemon"),
                    **({"same_as": same[s.name]} if same[s.name] != s.name else {})})
        shown = f"{wall:.1f}" if same[s.name] == s.name else f"= {same[s.name]}"
        lines.append(f"| {s.name} | {m['tasks_completed']}/{m['tasks_total']} | {m['oom_kills']}"
                     f" | {m['init_oom_kills']} | {m['attempts']} | {m['makespan_s']:.0f} | "
                     f"{m['latency_arrival_p50_s']:.0f} | {m['latency_arrival_p95_s']:.0f} | "
                     f"{m['mem_peak_util']:.0%} | {shown} |")
        print(lines[-1] if len(out) > 1 else "\n".join(lines), flush=True)
    total = time.perf_counter() - t_start
    lines += ["", f"wall time: {total:.1f} s for {len(schemes)} schemes ({len(jobs)} distinct "
              "runs: a scheme whose fields and config equal an earlier one's shares its run)"]
    print(lines[-1])
    _write(args.out, f"sweep-{n}.md", "\n".join(lines) + "\n")
    if args.out:
        _write(args.out, f"sweep-{n}.json", json.dumps(
            {"args": {k: v for k, v in vars(args).items() if k != "func"}, "wall_s": total,
             "runs": out}, indent=1, default=str) + "\n")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from bench import replay
    from bench.sweep import build_points
    from bench.sweep import workload_of as replay_workload
    if args.replay_args[:1] == ["--"]:
        args.replay_args = args.replay_args[1:]
    rp = replay._parser()
    rargs = rp.parse_args(["sweep", *args.replay_args])
    replay._apply_workload(rp, rargs, ["sweep", *args.replay_args])
    rargs.seed = int(rargs.seed) if str(rargs.seed).lstrip("-").isdigit() else rargs.seed
    w = replay_workload(rargs)
    points = build_points(rargs)
    n = max(len(p.tasks) for p in points)
    schemes = sim_schemes.parse(rargs.schemes, [int(k) for k in rargs.static_k.split(",")], n)
    cost, by_rt = _cost(args.cost)
    probe = MemoryConfig(swap_bandwidth_bps=args.swap_bandwidth_mib * MiB,
                         swap_in_bandwidth_bps=_swap_in(args))
    lines = [f"bench.replay sweep {' '.join(args.replay_args)}", f"cost {cost.source}; swap-out "
             f"{args.swap_bandwidth_mib:g} MiB/s, swap-in {probe.swap_in_bps / MiB:g} MiB/s, "
             f"ratio {rargs.fill_ratio:g}; {'hot' if w.hot_calls else 'cold'} calls; tick "
             f"{args.tick:g} s; {_policy_line()}"
             + ("" if args.start_wait is None else f"; max start wait {args.start_wait:g} s"), "",
             "| point | scheme | done | OOM kills | init kills | makespan s | P50 s | "
             "refaults MiB | stall s | daemon |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    print("\n".join(lines), flush=True)
    out: list[dict[str, Any]] = []
    for p in points:
        mem = MemoryConfig(swap=p.swap, swap_ratio=max(rargs.fill_ratio, 1.0),
                           swap_bandwidth_bps=args.swap_bandwidth_mib * MiB,
                           swap_in_bandwidth_bps=_swap_in(args),
                           hot_protection=args.hot_protection,
                           swap_max_bytes=parse_size(rargs.zram_size) if p.swap else None,
                           zram=True)  # the bench's swap is a zram device
        settings = SimSettings(cost=cost, cost_by_runtime=by_rt, memory=mem, tick_s=args.tick,
                               retry_limit=RETRY_LIMIT, immediate_steps=True,
                               sandbox_period_s=args.sandbox_period, hot_calls=w.hot_calls)
        arrivals = p.describe(w.speed)["arrivals_wall_s"]
        for s in schemes:
            if s.swap_at(p.swap) is None:
                continue
            cfg = bench_config({}, s, domain="/sim", mem_scale=w.mem_scale,
                               admission_wait_s=rargs.admission_wait,
                               scale_daemon=not rargs.no_scale_daemon, swap=p.swap) \
                if s.daemon or s.runtime == "execgate" else None
            _start_wait(cfg if s.daemon else None, args.start_wait)
            r = simulate(s, list(p.tasks), arrivals, p.budget, settings, cfg)
            m, d = r["metrics"], r.get("daemon") or {}
            brief = (f"admitted {d['admitted']} forced {d['forced']}, reclaims {d['reclaims']} "
                     f"({d['reclaims_at_call_end']} at call end, {d['reclaims_on_room']} on room)"
                     f", idle-room admissions {d.get('idle_room', {}).get('admissions_on_idle', 0)}"
                     f", sandbox fail-open {d.get('sandbox_fail_open', '-')}, red "
                     f"{d['states']['red']:.0f} s" if d else "")
            lines.append(f"| {p.label} | {s.name} | {m['tasks_completed']}/{m['tasks_total']} | "
                         f"{m['oom_kills']} | {m['init_oom_kills']} | {m['makespan_s']:.0f} | "
                         f"{m['latency_arrival_p50_s']:.0f} | {m['refault_bytes'] / MiB:.0f} | "
                         f"{m['stall_s']:.0f} | {brief} |")
            print(lines[-1], flush=True)
            out.append({"point": p.label, "scheme": s.name, "metrics": m, "daemon": d or None})
    if args.against:
        from bench.repeats import load
        from bench.sim.against import table as against_table

        lines += ["", f"against the VM ({args.against}): median (range) / sim (error)", "",
                  *against_table(out, [load(f) for f in args.against.split(",")])]
        print("\n".join(lines[-len(out) - 4:]), flush=True)
    if args.out:
        _write(args.out, f"{args.name}.md", "\n".join(lines) + "\n")
        _write(args.out, f"{args.name}.json", json.dumps(
            {"replay_args": args.replay_args, "cost": args.cost,
             "swap_bandwidth_mib": args.swap_bandwidth_mib, "runs": out},
            indent=1, default=str) + "\n")
    return 0


def _start_wait(cfg: dict[str, Any] | None, wait: float | None) -> None:
    """The bound on a create's wait set in a daemon scheme's config, when asked: the bench's
    creates are Docker's, so the bound for callers without a deadline where the policy run has
    one (before 5 Dec, max_start_wait_s bounded every create)."""
    if cfg is not None and wait is not None:
        from bench.sim.hands import DOCKER  # the revision's requests say caller_deadline

        key = "max_start_wait_s_no_deadline" if DOCKER else "max_start_wait_s"
        cfg.setdefault("sandbox_admission", {})[key] = wait


START_WAIT_HELP = ("[sandbox_admission] max_start_wait_s_no_deadline, the bound on a Docker "
                   "create's wait (default: the policy's; inf: as long as it takes, as Docker "
                   "lets them)")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m bench.sim",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="a VM results file's points, VM vs sim")
    v.add_argument("results")
    v.add_argument("--out", help="write validate.md and validate.json here")
    v.add_argument("--tick", type=float, default=0.1, help="control period (s)")
    v.add_argument("--extra", help="schemes the VM did not run, simulated on every point too "
                   "(e.g. execgate-sandboxadmit)")
    v.add_argument("--per-part", action="store_true",
                   help="one cost model per VM boot (`part` of a merged results file)")
    v.add_argument("--swap-bandwidth-mib", type=float, default=VM_SWAP_OUT_BPS / MiB,
                   help="swap-out speed where the VM had swap (default: the VM's zram, TCG)")
    v.add_argument("--swap-in-bandwidth-mib", type=float, default=VM_SWAP_IN_BPS / MiB)
    v.add_argument("--policy-rev", help="run execgate's policy as it was at this git revision "
                   "(the one the VM ran: fff81fa for docs/replay/sweep)")
    v.add_argument("--draws", type=int, default=0,
                   help="that many more runs per row with operation costs drawn around their "
                   "fit: the range a VM run falls in where outcomes turn on seconds")
    v.set_defaults(func=cmd_validate)
    f = sub.add_parser("fit", help="the control-plane cost model fitted to a results file")
    f.add_argument("results")
    f.set_defaults(func=cmd_fit)
    s = sub.add_parser("sweep", help="every scheme on the generator's calibrated tasks")
    s.add_argument("--sandboxes", type=int, default=1000, help="tasks (one sandbox each)")
    s.add_argument("--budget", default="64g")
    s.add_argument("--seed", default="1")
    s.add_argument("--arrival", default="poisson", choices=("poisson", "staggered", "burst"))
    s.add_argument("--mean-gap", type=float, default=2.0, help="seconds between arrivals")
    s.add_argument("--schemes", default="eager,static,reserve,agentcgroup,execgate,"
                                        "execgate-noadmit,execgate-nogrowth,execgate-noresidency,"
                                        "execgate-sandboxadmit")
    s.add_argument("--static-k", default="50,100,200")
    s.add_argument("--cost", default="hw", help="hw | none | fixed:RUN,EXEC,RM | RESULTS file")
    s.add_argument("--admission-wait", type=float, default=None)
    s.add_argument("--start-wait", type=float, default=None, help=START_WAIT_HELP)
    s.add_argument("--swap", action="store_true", help="compressed swap (default off)")
    s.add_argument("--swap-ratio", type=float, default=3.0)
    s.add_argument("--zram", action="store_true", help="swap's compressed copies not charged to "
                   "the domain (zram's pool); default: charged at 1/ratio (zswap)")
    s.add_argument("--swap-bandwidth-mib", type=float, default=256.0)
    s.add_argument("--swap-in-bandwidth-mib", type=float, default=None,
                   help="swap-in speed (default: 5.4x swap-out, the VM's ratio)")
    s.add_argument("--hot-calls", action="store_true",
                   help="calls read every page they hold each tick (bench --hot-calls)")
    s.add_argument("--hot-protection", type=float, default=1.0,
                   help="share of a hot call's proportional part of reclaim the LRU spares "
                        "while cold pages are left (default 1: hot pages go last)")
    s.add_argument("--tick", type=float, default=0.25,
                   help="control period, s (the daemon's is 0.1; 0.25 keeps 1,000 sandboxes "
                        "under a minute)")
    s.add_argument("--sandbox-period", type=float, default=1.0,
                   help="sandbox admission stepped at most this often, s (it scans every live "
                        "sandbox)")
    s.add_argument("--immediate", action="store_true",
                   help="step admission on every submit/release as the daemon does (slower; "
                        "default: once per period)")
    s.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="schemes simulated in parallel (default: one per CPU)")
    s.add_argument("--out")
    s.set_defaults(func=cmd_sweep)
    r = sub.add_parser("replay", help="the points a bench.replay sweep would run, simulated")
    r.add_argument("--cost", default="hw", help="as sweep's (a results file: the VM's fit)")
    r.add_argument("--swap-bandwidth-mib", type=float, default=256.0)
    r.add_argument("--swap-in-bandwidth-mib", type=float, default=None,
                   help="swap-in speed (default: 5.4x swap-out, the VM's ratio); hot calls "
                        "come from the bench's own --hot-calls")
    r.add_argument("--hot-protection", type=float, default=1.0,
                   help="share of a hot call's proportional part of reclaim the LRU spares "
                        "while cold pages are left (default 1: hot pages go last)")
    r.add_argument("--tick", type=float, default=0.1)
    r.add_argument("--sandbox-period", type=float, default=0.1)
    r.add_argument("--start-wait", type=float, default=None, help=START_WAIT_HELP)
    r.add_argument("--out")
    r.add_argument("--name", default="replay", help="NAME.md and NAME.json in --out")
    r.add_argument("--policy-rev", help="run execgate's policy as it was at this git revision "
                   "(the one a VM run ran)")
    r.add_argument("--against", help="VM results files of the same command (repeats), "
                   "comma-separated: their median and range beside the simulator's, with the error")
    r.add_argument("replay_args", nargs=argparse.REMAINDER,
                   help="after --: bench.replay sweep's arguments")
    r.set_defaults(func=cmd_replay)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if getattr(args, "policy_rev", None) and not policy_rev.active():
        return policy_rev.rerun(args.policy_rev, list(sys.argv[1:] if argv is None else argv))
    policy_rev.check()
    if getattr(args, "seed", None) is not None and str(args.seed).lstrip("-").isdigit():
        args.seed = int(args.seed)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
