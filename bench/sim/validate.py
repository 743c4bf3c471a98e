"""The simulator against the VM: the same points, schemes and settings a results file recorded.

Everything is taken from the results file, nothing tuned per point: the tasks (the generator's,
from the recorded seed, count and workload transforms, or the recorded trace), each point's
budget and arrival times, each run's scheme and the config the bench wrote for it (execgate's
`config`), and the control-plane cost model fitted to the same file's runc runs (bench/sim/
cost.py). Per scheme and point it prints VM vs sim: tasks done, OOM kills (attempts that died of
one: metrics.summarize's oom_kills), makespan and P50 latency from arrival, with the errors.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.generate import generate
from bench.schemes import bench_config
from bench.sim import schemes as sim_schemes
from bench.sim.cost import CostModel, fit_results, load_results, residual_table
from bench.sim.memory import MemoryConfig
from bench.sim.run import SimSettings, simulate
from bench.trace import Task, load_tasks
from bench.workload import Workload, prepare
from execgate.common.units import MiB

METRICS = (("tasks_completed", "done"), ("oom_kills", "OOM"), ("makespan_s", "makespan"),
           ("latency_arrival_p50_s", "P50"))


def tasks_of(results: Mapping[str, Any]) -> list[Task]:
    """The tasks exactly as the results' runs replayed them."""
    params = results["params"]
    n = max(p["n_tasks"] for p in results["points"])
    src = load_tasks(params["trace"])[:n] if params.get("trace") else generate(n, params["seed"])
    w = params["workload"]
    return prepare(src, Workload(**{k: v for k, v in w.items() if k in Workload.__annotations__}))


def scheme_config(run: Mapping[str, Any], w: Mapping[str, Any],
                  settings: Mapping[str, Any]) -> dict[str, Any] | None:
    """The config execgate ran with: recorded by the run, else what bench_config would write."""
    if run.get("config"):
        return dict(run["config"])
    scheme = sim_schemes.parse(run["scheme"])[0]
    if not (scheme.daemon or scheme.runtime == "execgate"):
        return None
    return bench_config({}, scheme, domain="/sim", mem_scale=float(w.get("mem_scale", 1.0)),
                        admission_wait_s=settings.get("admission_wait_s"),
                        scale_daemon=bool(settings.get("scale_daemon", True)))


def extra_config(runs: Sequence[Mapping[str, Any]], name: str, w: Mapping[str, Any],
                 settings: Mapping[str, Any]) -> dict[str, Any] | None:
    """The config a scheme the VM did not run is simulated with: a recorded run's at its
    point (one whose scheme runs the daemon and edits none first), less that run's own
    ablation edits, plus the scheme's. (Beside a run of execgate-nolaunchbound, an extra
    `execgate` kept its max_launching = 0 and was simulated as the ablation.)"""
    scheme = sim_schemes.parse(name)[0]
    def edits(run: Mapping[str, Any]) -> tuple[bool, bool]:  # (edits tables, no daemon)
        s = sim_schemes.parse(run["scheme"])[0]
        return bool(s.daemon_tables), not s.daemon

    recorded = sorted((r for r in runs if r.get("config")), key=edits)
    if not recorded:
        return scheme_config({"scheme": name}, w, settings)
    cfg: dict[str, Any] = json.loads(json.dumps(recorded[0]["config"]))
    for table, values in sim_schemes.parse(recorded[0]["scheme"])[0].daemon_tables.items():
        for key in values:  # back to the defaults the run's scheme changed
            cfg.get(table, {}).pop(key, None)
    for table, values in scheme.daemon_tables.items():  # the scheme's own edits
        cfg.setdefault(table, {}).update(values)
    return cfg


# The VM's zram under single-threaded TCG (README, "Where real tests run"): compression is
# emulated, ~5 MB/s out and ~27 MB/s back in.
VM_SWAP_OUT_BPS = 5 * MiB
VM_SWAP_IN_BPS = 27 * MiB


def memory_of(results: Mapping[str, Any], run: Mapping[str, Any], point: Mapping[str, Any],
              swap_out_bps: float = VM_SWAP_OUT_BPS,
              swap_in_bps: float = VM_SWAP_IN_BPS) -> MemoryConfig:
    """The memory model of the host a run had: its swap as the bench set it up (a zram device
    of the recorded size, where the point had swap and the scheme uses it), at the ratio the
    run's zram measured (else the workload's fill ratio). Without it the simulator OOM-killed
    96 attempts of a burst point where the VM, swapping, had 2."""
    params = results["params"]
    point_swap = point.get("swap") in ("on", True)
    scheme = sim_schemes.parse(run["scheme"])[0]
    if not (point_swap and scheme.swap_at(point_swap)):
        return MemoryConfig()
    peak = (run.get("swap") or {}).get("zram_peak") or {}
    ratio = float(params.get("workload", {}).get("fill_ratio") or 3.0)
    if peak.get("compr_bytes") and peak.get("orig_bytes", 0) > 16 * MiB:
        ratio = peak["orig_bytes"] / peak["compr_bytes"]
    return MemoryConfig(swap=True, swap_ratio=max(ratio, 1.0), swap_bandwidth_bps=swap_out_bps,
                        swap_in_bandwidth_bps=swap_in_bps,
                        swap_max_bytes=params.get("zram_size_bytes"), zram=True)


def _err(vm: float, sim: float) -> str:
    if not (isinstance(vm, int | float) and isinstance(sim, int | float)) or math.isnan(vm) \
            or math.isnan(sim):
        return "-"
    if vm == 0:
        return "0 %" if sim == 0 else "inf"
    return f"{100 * (sim - vm) / vm:+.0f} %"


def validate(path: str | Path, tick_s: float = 0.1, extra: Sequence[str] = (),
             per_part: bool = False, swap_out_bps: float = VM_SWAP_OUT_BPS,
             swap_in_bps: float = VM_SWAP_IN_BPS, draws: int = 0) -> dict[str, Any]:
    """Rerun every (point, scheme) of the results in the simulator; rows of VM vs sim. `extra`:
    schemes the VM did not run, simulated on every point too (rows without a VM side), with
    the config of the point's execgate run. `per_part`: one cost model per VM boot of a merged
    results file (`part`), fitted to that boot's runs only: the boots ran at different speeds
    (two at once on one host), which a pooled fit averages away. `draws`: that many more runs
    per row with seeded operation costs (`SimSettings.cost_seed`), the spread a VM run falls in
    (`sim_draws`: each metric's values, sorted)."""
    results = load_results(path)
    tasks = tasks_of(results)
    by_id = {t.id: t for t in tasks}
    costs = fit_results(results, by_id)
    part_costs: dict[Any, dict[str, CostModel]] = {}
    if per_part:
        for part in {r.get("part") for r in results["runs"]}:
            sub = dict(results, runs=[r for r in results["runs"] if r.get("part") == part])
            part_costs[part] = fit_results(sub, by_id)
    params = results["params"]

    def settings(c: Mapping[str, CostModel], mem: MemoryConfig,
                 seed: int | None = None) -> SimSettings:
        """One run's: its cost model and host memory, the file's tick, retries and calls, and
        the seed of its drawn costs (None: every operation at its fit)."""
        return SimSettings(cost=c["runc"], cost_by_runtime=dict(c), memory=mem, tick_s=tick_s,
                           retry_limit=int(params.get("retry_limit", 5)),
                           hot_calls=bool(params["workload"].get("hot_calls")), cost_seed=seed)

    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for run in sorted(results["runs"], key=lambda r: (r["point"], r["scheme"])):
        point = results["points"][run["point"]]
        n = point["n_tasks"]
        scheme = sim_schemes.parse(run["scheme"])[0]
        cfg = scheme_config(run, params["workload"], params.get("settings") or {})
        c = part_costs.get(run.get("part"), costs)
        mem = memory_of(results, run, point, swap_out_bps, swap_in_bps)
        sim = simulate(scheme, tasks[:n], point["arrivals_wall_s"], point["budget_bytes"],
                       settings(c, mem), cfg)
        vm_m, sim_m = run["metrics"], sim["metrics"]
        row: dict[str, Any] = {"point": run["point"], "label": point["label"],
                               "oversubscription": point["oversubscription"],
                               "scheme": run["scheme"], "part": run.get("part")}
        for key, _ in METRICS:
            row[f"vm_{key}"] = vm_m.get(key)
            row[f"sim_{key}"] = sim_m.get(key)
        row["vm_kernel_oom_kills"] = vm_m.get("kernel_oom_kills")
        row["sim_kernel_oom_kills"] = sim_m.get("kernel_oom_kills")
        row["sim_init_oom_kills"] = sim_m.get("init_oom_kills")
        row["vm_reasons"] = _reasons(run.get("attempts", []))
        row["sim_reasons"] = _reasons(sim["attempts"])
        if "daemon" in sim:
            row["sim_daemon"] = sim["daemon"]
        if draws > 0:
            runs = [simulate(scheme, tasks[:n], point["arrivals_wall_s"], point["budget_bytes"],
                             settings(c, mem, seed), cfg)["metrics"]
                    for seed in range(draws)]
            row["sim_draws"] = {key: sorted(m.get(key) for m in runs) for key, _ in METRICS}
        rows.append(row)
    for name in extra:
        scheme = sim_schemes.parse(name)[0]
        for i, point in enumerate(results["points"]):
            cfg = extra_config([r for r in results["runs"] if r["point"] == i], name,
                               params["workload"], params.get("settings") or {})
            n = point["n_tasks"]
            mem = memory_of(results, {"scheme": name}, point, swap_out_bps, swap_in_bps)
            sim = simulate(scheme, tasks[:n], point["arrivals_wall_s"], point["budget_bytes"],
                           settings(costs, mem), cfg)
            row = {"point": i, "label": point["label"],
                   "oversubscription": point["oversubscription"], "scheme": name, "part": None}
            for key, _ in METRICS:
                row[f"vm_{key}"] = None
                row[f"sim_{key}"] = sim["metrics"].get(key)
            row["sim_kernel_oom_kills"] = sim["metrics"].get("kernel_oom_kills")
            row["sim_init_oom_kills"] = sim["metrics"].get("init_oom_kills")
            row["sim_reasons"] = _reasons(sim["attempts"])
            row["sim_daemon"] = sim.get("daemon")
            rows.append(row)
    return {"source": str(path), "rows": rows, "costs": costs, "part_costs": part_costs,
            "tasks": by_id,
            "results": results, "wall_s": time.perf_counter() - t0}


def _reasons(attempts: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in attempts:
        if not a.get("ok"):
            r = str(a.get("reason") or "?")
            out[r] = out.get(r, 0) + 1
    return out


def table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown: one row per point and scheme, VM / sim / error per metric."""
    lines = ["| load | scheme | done VM/sim | OOM kills VM/sim | makespan s VM/sim (err) | "
             "P50 s VM/sim (err) |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if r["vm_tasks_completed"] is None:
            lines.append(
                f"| x{r['oversubscription']:.1f} | {r['scheme']} (sim only) | "
                f"-/{r['sim_tasks_completed']} | -/{r['sim_oom_kills']} | "
                f"-/{r['sim_makespan_s']:.0f} | -/{r['sim_latency_arrival_p50_s']:.0f} |")
            continue
        lines.append(
            f"| x{r['oversubscription']:.1f} | {r['scheme']} | "
            f"{r['vm_tasks_completed']}/{r['sim_tasks_completed']}"
            f"{'' if r['vm_tasks_completed'] == r['sim_tasks_completed'] else ' ✗'} | "
            f"{r['vm_oom_kills']}/{r['sim_oom_kills']} | "
            f"{r['vm_makespan_s']:.0f}/{r['sim_makespan_s']:.0f} "
            f"({_err(r['vm_makespan_s'], r['sim_makespan_s'])}) | "
            f"{r['vm_latency_arrival_p50_s']:.0f}/{r['sim_latency_arrival_p50_s']:.0f} "
            f"({_err(r['vm_latency_arrival_p50_s'], r['sim_latency_arrival_p50_s'])}) |"
            + (_band_cells(r) if "sim_draws" in r else ""))
    if any("sim_draws" in r for r in rows):
        lines[0] += " done, drawn costs | makespan s, drawn costs |"
        lines[1] += " ---: | ---: |"
    return lines


def _band_cells(r: Mapping[str, Any]) -> str:
    """The seeded runs' range (median) of tasks done and makespan; ✗ where the VM is outside."""
    done, span = r["sim_draws"]["tasks_completed"], r["sim_draws"]["makespan_s"]
    mark = "" if _in_band(r) else " ✗"
    return (f" {done[0]}–{done[-1]} ({done[len(done) // 2]}){mark} |"
            f" {span[0]:.0f}–{span[-1]:.0f} ({span[len(span) // 2]:.0f}) |")


def _in_band(r: Mapping[str, Any]) -> bool:
    """Whether the VM's tasks done lies within the seeded runs' range."""
    done = r["sim_draws"]["tasks_completed"]
    return done[0] <= r["vm_tasks_completed"] <= done[-1]


def summary(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """How many rows meet the issue's targets (makespan within 20 %, tasks done exact)."""
    rows = [r for r in rows if r["vm_tasks_completed"] is not None]
    n = len(rows)
    exact = sum(r["vm_tasks_completed"] == r["sim_tasks_completed"] for r in rows)
    within = [r for r in rows if r["vm_makespan_s"]
              and abs(r["sim_makespan_s"] - r["vm_makespan_s"]) <= 0.2 * r["vm_makespan_s"]]
    errs = sorted(abs(r["sim_makespan_s"] - r["vm_makespan_s"]) / r["vm_makespan_s"]
                  for r in rows if r["vm_makespan_s"])
    med = errs[len(errs) // 2] if errs else math.nan
    out = [f"tasks done exact: {exact}/{n}; makespan within 20 %: {len(within)}/{n}; "
           f"median |makespan error| {100 * med:.0f} %"]
    drawn = [r for r in rows if "sim_draws" in r]
    if drawn:
        k = len(drawn[0]["sim_draws"]["tasks_completed"])
        out.append(f"with {k} draws of operation costs (lognormal, sigma = each fit's RMSE over "
                   f"its mean): the VM's tasks done within the draws' range on "
                   f"{sum(_in_band(r) for r in drawn)}/{len(drawn)}")
    return out


def cost_lines(costs: Mapping[str, CostModel], results: Mapping[str, Any],
               tasks: Mapping[str, Task]) -> list[str]:
    out = []
    for rt, m in costs.items():
        out.append(f"{rt} ({m.source}):")
        for op in ("run", "exec", "rm"):
            out.append(f"  {op:<4} {getattr(m, op).describe()}")
        if m.exec_during:
            out.append(f"  of an exec's cost, {m.exec_during:.2f} is its process running slower "
                       "(holding its memory), the rest setup and teardown")
    out.append("")
    out += residual_table(results, tasks, costs["runc"])
    return out
