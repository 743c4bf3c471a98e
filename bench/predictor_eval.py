"""How well the learned demand model predicts an undeclared call's peak, against the rules it
replaces (issue 22).

    python3 -m bench.predictor_eval DIR [--train-fraction 0.7] [--heavy-mib 1024] [--json OUT]

DIR holds AgentCgroup attempt directories (resources.json + tool_calls.json, imported with
bench.agentcgroup_import), execgate-trace/1 files (*.jsonl with tasks) and/or journals
(calls.jsonl) or history stores (*.sqlite), at any depth. Causal split: tasks (a sandbox's
calls) in the order they started; the model is trained on the first `--train-fraction` and
tested on the later ones. Every estimator replays all calls in time order (estimate at arrival,
learn at the end), so history-only has the same past the model had; metrics count the test
tasks' undeclared calls only:

* class-default: `EstimateConfig`'s default peak of the call's class, nothing learned;
* history-only: `HistoryEstimator` as the daemon runs it without a model;
* model: the same estimator with the model (what admission is charged: the high quantile);
* model-point: the model's median peak alone (the lowest MAE it can show, not what admission
  uses).

The average (what admission charges a running call) is scored too, where the source has it
(traces; a store's sampled averages; not a bare journal).

Reported: MAE (MiB), heavy-call precision and recall (actual >= 256 MiB and >= --heavy-mib;
predicted the same), under-estimates (predicted < actual: OOM risk), inference time.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.agentcgroup_import import find_attempts, import_attempt, task_ids
from bench.metrics import percentile
from bench.trace import write_tasks
from execgate.common.commands import classify_command
from execgate.common.units import MiB
from execgate.ctl import model_data, model_train
from execgate.daemon import predictor
from execgate.policy.estimate import (
    CallInfo,
    Demand,
    EstimateConfig,
    HistoryEstimator,
    Outcome,
)

HEAVY_MIB = 256


def load_rows(root: str, bash_only: bool = False) -> list[model_data.CallRow]:
    """Every call below DIR: AgentCgroup attempts (imported), traces, journals, stores."""
    rows: list[model_data.CallRow] = []
    attempts = [] if Path(root).is_file() else find_attempts(root)
    if attempts:
        tasks = [import_attempt(d, bash_only=bash_only, task_id=t)
                 for d, t in zip(attempts, task_ids(attempts), strict=True)]
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", encoding="utf-8") as f:
            write_tasks(tasks, f)
            f.flush()
            rows += model_data.trace_rows(f.name)
    rows += model_data.rows_from(model_data.find_sources(root))
    return rows


def replay(rows: Sequence[model_data.CallRow], est: HistoryEstimator) -> dict[int, Demand]:
    """The demand of every row (by index), estimated at its arrival, learnt at its end."""
    events = sorted([(r.arrive, 1, i) for i, r in enumerate(rows)]
                    + [(r.end, 0, i) for i, r in enumerate(rows)])
    out: dict[int, Demand] = {}
    for _t, kind, i in events:
        r = rows[i]
        info = CallInfo(f"c{i}", r.sandbox, r.argv, r.declared_bytes)
        if kind == 1:
            out[i] = est.estimate(info)
        else:
            est.observe(info, Outcome(r.peak_bytes, r.avg_bytes or r.peak_bytes // 2,
                                      r.duration_s, r.oom_killed))
    return out


def scores(pred: Sequence[Demand], rows: Sequence[model_data.CallRow],
           heavy_mib: Sequence[int]) -> dict[str, Any]:
    """MAE of the peak (and of the average, over the calls whose average is known), heavy-call
    precision and recall, under-estimates."""
    n = len(rows)
    out: dict[str, Any] = {"calls": n}
    if not n:
        return out
    actual = [r.peak_bytes for r in rows]
    avgs = [(d.avg_bytes, r.avg_bytes) for d, r in zip(pred, rows, strict=True)
            if r.avg_bytes is not None]
    out["avg_mae_mib"] = sum(abs(p - a) for p, a in avgs) / len(avgs) / MiB if avgs else None
    peaks = [d.peak_bytes for d in pred]
    out["mae_mib"] = sum(abs(p - a) for p, a in zip(peaks, actual, strict=True)) / n / MiB
    out["under_pct"] = 100 * sum(p < a for p, a in zip(peaks, actual, strict=True)) / n
    for h in heavy_mib:
        lim = h * MiB
        tp = sum(p >= lim and a >= lim for p, a in zip(peaks, actual, strict=True))
        pp = sum(p >= lim for p in peaks)
        ap = sum(a >= lim for a in actual)
        out[f"heavy{h}"] = {"actual": ap, "predicted": pp,
                            "precision_pct": 100 * tp / pp if pp else None,
                            "recall_pct": 100 * tp / ap if ap else None}
    return out


def evaluate(rows: list[model_data.CallRow], train_fraction: float = 0.7,
             heavy_mib: int = 1024, cfg: model_train.TrainConfig | None = None,
             ) -> dict[str, Any]:
    cfg = cfg or model_train.TrainConfig()
    ordered, x = model_data.features(rows)
    train, test = model_data.causal_split(ordered, train_fraction)
    tr = [i for i, r in enumerate(ordered) if r.group in train]
    te = [i for i, r in enumerate(ordered) if r.group in test and not r.declared_bytes]
    result: dict[str, Any] = {"calls": len(ordered), "tasks": len(train) + len(test),
                              "train_tasks": len(train), "test_tasks": len(test),
                              "train_calls": len(tr), "test_calls": len(te)}
    if not te or len(tr) < 2:
        result["note"] = "too few tasks for a causal split (need >= 2 train calls, 1 test task)"
        return result
    doc = model_train.fit([x[i] for i in tr], [ordered[i].peak_bytes for i in tr],
                          [ordered[i].avg_bytes for i in tr], cfg)
    model = predictor.parse(json.loads(json.dumps(doc)))
    econf = EstimateConfig()
    preds: dict[str, dict[int, Demand]] = {"class-default": {}}
    for i, r in enumerate(ordered):
        peak = econf.default_peak(classify_command(r.argv))
        preds["class-default"][i] = Demand(math.ceil(peak * econf.avg_fraction), peak, "")
    preds["history-only"] = replay(ordered, HistoryEstimator(econf))
    preds["model"] = replay(ordered, HistoryEstimator(econf, model=model))
    point: dict[int, Demand] = {}
    times = []
    for i in te:
        t0 = time.perf_counter()
        p = model.predict(x[i])
        times.append(time.perf_counter() - t0)
        point[i] = Demand(p.avg_bytes or 0, p.peak_bytes, "")
    preds["model-point"] = point
    result["estimators"] = {
        name: scores([p[i] for i in te], [ordered[i] for i in te], (HEAVY_MIB, heavy_mib))
        for name, p in preds.items()}
    result["inference_ms"] = {"p50": 1e3 * percentile(times, 50),
                              "p99": 1e3 * percentile(times, 99)}
    result["quantile"] = cfg.quantile
    return result


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def markdown(result: dict[str, Any], heavy_mib: int) -> str:
    lines = [f"{result['calls']} calls in {result['tasks']} tasks; trained on the first "
             f"{result['train_tasks']} tasks ({result['train_calls']} calls), tested on the "
             f"{result['test_calls']} undeclared calls of the last {result['test_tasks']}."]
    if "estimators" not in result:
        return "\n".join([*lines, result.get("note", "")])
    lines += ["", f"| estimator | MAE (MiB) | under-estimates | >= {HEAVY_MIB} MiB precision / "
              f"recall | >= {heavy_mib} MiB precision / recall | average's MAE (MiB) |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, s in result["estimators"].items():
        a, b = s[f"heavy{HEAVY_MIB}"], s[f"heavy{heavy_mib}"]
        avg = "–" if s["avg_mae_mib"] is None else f"{s['avg_mae_mib']:.1f}"
        lines.append(f"| {name} | {s['mae_mib']:.1f} | {s['under_pct']:.1f} % | "
                     f"{_pct(a['precision_pct'])} / {_pct(a['recall_pct'])} % | "
                     f"{_pct(b['precision_pct'])} / {_pct(b['recall_pct'])} % | {avg} |")
    h = result["estimators"]["model"][f"heavy{HEAVY_MIB}"]
    t = result["inference_ms"]
    lines += ["", f"Heavy (>= {HEAVY_MIB} MiB) test calls: {h['actual']}. Model inference: "
              f"p50 {t['p50']:.3f} ms, p99 {t['p99']:.3f} ms a call (features not included)."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.predictor_eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", metavar="DIR")
    ap.add_argument("--train-fraction", type=float, default=0.7)
    ap.add_argument("--heavy-mib", type=int, default=1024, help="second heavy-call threshold")
    ap.add_argument("--quantile", type=float, default=model_train.TrainConfig.quantile)
    ap.add_argument("--bash-only", action="store_true",
                    help="AgentCgroup attempts: only Bash calls (the ones a docker exec runs)")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args(argv)
    if (why := model_train.sklearn_missing()) is not None:
        print(f"predictor_eval: {why}", file=sys.stderr)
        return 2
    try:
        rows = load_rows(args.dir, args.bash_only)
    except (OSError, ValueError) as e:
        print(f"predictor_eval: {e}", file=sys.stderr)
        return 1
    if not rows:
        print(f"predictor_eval: {args.dir}: no calls found", file=sys.stderr)
        return 1
    result = evaluate(rows, args.train_fraction, args.heavy_mib,
                      model_train.TrainConfig(quantile=args.quantile))
    print(markdown(result, args.heavy_mib))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
