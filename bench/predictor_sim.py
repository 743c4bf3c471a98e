"""Admission with the learned demand model against without it, in the policy simulator.

    python3 -m bench.predictor_sim [--train-tasks 200] [--train-seed 1]
        [--sandboxes 40] [--seed 7] [--budget 12g] [--arrival poisson] [--mean-gap 2]

The model is trained on one generator series (`--train-seed`) and the simulator runs another
(`--seed`: other tasks, so nothing is tested on what it learnt from). The simulator hands the
estimator a call's memload command line (what the VM replay runs); here the estimator sees the
trace's own command instead, as the daemon sees an agent's, through `CommandEstimator`. The
runs, all with undeclared calls but the first:

* `hints = profiled peaks`: the execgate scheme as the benchmark runs it, every call declaring
  its trace's peak (what no predictor can beat);
* `history (memload argv)`: the simulator as it runs the execgate scheme today;
* `history`: the same rules on the agents' commands (classes and history per command class);
* `model`: the same estimator with the model (issue 22).

Reported per run: tasks done, OOM kills, attempts, makespan, P50, admission waits (mean, p95).
Nothing in bench/sim is changed: the estimator is swapped into the execgate hands after the
simulation is built.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from bench.generate import generate
from bench.metrics import percentile
from bench.schemes import bench_config
from bench.sim import schemes as sim_schemes
from bench.sim.memory import MemoryConfig
from bench.sim.run import SimSettings, Simulation
from bench.trace import ToolCall, memload_argv, write_tasks
from bench.workload import arrival_schedule, oversubscription
from execgate.common.hints import parse_size
from execgate.ctl import model_data, model_train
from execgate.daemon import predictor
from execgate.policy.estimate import (
    CallInfo,
    Demand,
    DemandModel,
    EstimateConfig,
    HistoryEstimator,
    Outcome,
)


class CommandEstimator:
    """A HistoryEstimator that sees a call's trace command where the simulator has memload's."""

    def __init__(self, commands: dict[tuple[str, ...], str], config: EstimateConfig,
                 model: DemandModel | None) -> None:
        self.commands = commands
        self.inner = HistoryEstimator(config, model=model)

    def _as_agent(self, call: CallInfo) -> CallInfo:
        cmd = self.commands.get(tuple(call.argv))
        return call if cmd is None else dataclasses.replace(call, argv=("sh", "-c", cmd))

    def estimate(self, call: CallInfo) -> Demand:
        return self.inner.estimate(self._as_agent(call))

    def observe(self, call: CallInfo, outcome: Outcome) -> None:
        self.inner.observe(self._as_agent(call), outcome)


def train(tasks: Sequence[Any]) -> predictor.DemandModel:
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", encoding="utf-8") as f:
        write_tasks(tasks, f)
        f.flush()
        rows = model_data.trace_rows(f.name)
    ordered, x = model_data.features(rows)
    doc = model_train.fit(x, [r.peak_bytes for r in ordered], [r.avg_bytes for r in ordered])
    return predictor.parse(doc)


def run(label: str, tasks: Sequence[Any], arrivals: Sequence[float], budget: int,
        estimator: CommandEstimator | None, hints: bool = False) -> dict[str, Any]:
    (scheme,) = sim_schemes.parse("execgate", (), len(tasks))
    if not hints:  # undeclared calls: what the model is for
        scheme = dataclasses.replace(scheme, name="execgate-nohints", hints=False)
    cfg = bench_config({}, scheme, domain="/sim")
    sim = Simulation(scheme, tasks, arrivals, budget, SimSettings(memory=MemoryConfig()), cfg)
    hands = sim.hands
    assert hands is not None
    if estimator is not None:
        estimator.inner.config = hands.estimator.config  # the scheme's own [estimate]
        hands.estimator = estimator  # type: ignore[assignment]
        hands.admission.estimator = estimator
    r = sim.run()
    m = r["metrics"]
    waits = hands.stats.waits or [0.0]
    return {"run": label, "done": f"{m['tasks_completed']}/{m['tasks_total']}",
            "oom_kills": m["oom_kills"], "attempts": m["attempts"],
            "makespan_s": m["makespan_s"], "p50_s": m["latency_arrival_p50_s"],
            "wait_mean_s": sum(waits) / len(waits), "wait_p95_s": percentile(waits, 95)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.predictor_sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-tasks", type=int, default=200)
    ap.add_argument("--train-seed", default="1")
    ap.add_argument("--sandboxes", type=int, default=40)
    ap.add_argument("--seed", default="7")
    ap.add_argument("--budget", default="12g")
    ap.add_argument("--arrival", default="poisson", choices=("poisson", "staggered", "burst"))
    ap.add_argument("--mean-gap", type=float, default=2.0)
    args = ap.parse_args(argv)
    if (why := model_train.sklearn_missing()) is not None:
        print(f"predictor_sim: {why}", file=sys.stderr)
        return 2
    model = train(generate(args.train_tasks, args.train_seed))
    tasks = generate(args.sandboxes, args.seed)
    arrivals = arrival_schedule(args.sandboxes, args.seed, args.arrival, args.mean_gap)
    budget = parse_size(args.budget)
    commands = {tuple(memload_argv(s)): s.command for t in tasks for s in t.steps
                if isinstance(s, ToolCall)}
    print(f"{args.sandboxes} sandboxes (seed {args.seed}), budget {args.budget} "
          f"({oversubscription(tasks, budget):.2f}x), {args.arrival} arrivals every "
          f"{args.mean_gap:g} s; model trained on {args.train_tasks} tasks of seed "
          f"{args.train_seed}\n")
    print("| run | done | OOM kills | attempts | makespan s | P50 s | wait mean / p95 s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    econf = EstimateConfig()
    for label, est, hints in (
            ("hints = profiled peaks (an oracle)", None, True),
            ("history (memload argv)", None, False),
            ("history", CommandEstimator(commands, econf, None), False),
            ("model", CommandEstimator(commands, econf, model), False)):
        r = run(label, tasks, arrivals, budget, est, hints)
        print(f"| {r['run']} | {r['done']} | {r['oom_kills']} | {r['attempts']} | "
              f"{r['makespan_s']:.0f} | {r['p50_s']:.0f} | {r['wait_mean_s']:.1f} / "
              f"{r['wait_p95_s']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
