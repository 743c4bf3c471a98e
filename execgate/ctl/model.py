"""`execgatectl model train|show`: the learned demand model's files (issue 22).

    execgatectl model train [--from PATH...] [--out DIR] [--quantile Q] [--min-calls N]
    execgatectl model show [--json]

`train` reads finished calls (by default the daemon's history store, else its journal; or any
journals, stores, execgate-trace/1 files or directories of them given with --from; AgentCgroup
measurements become a trace file with `python3 -m bench.agentcgroup_import` from a checkout),
measures the model on a causal hold-out (trained on the earlier 80 % of the tasks, scored on
the later 20 %), fits it again on everything and writes the next version in `[predictor] dir`;
the daemon picks it up within `[predictor] reload_s`. `show` lists the versions and what the
newest one scored.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

TYPE_CHECKING = False
if TYPE_CHECKING:
    from execgate.common.config import Config

    from .model_data import CallRow

HOLDOUT_TRAIN = 0.8
HEAVY_BYTES = 256 << 20


def add_parser(sub: Any) -> None:
    p = sub.add_parser("model", help="the learned demand model: train it, show it")
    cmd = p.add_subparsers(dest="model_cmd", required=True)
    t = cmd.add_parser("train", help="fit a model on finished calls, write the next version")
    t.add_argument("--from", dest="sources", nargs="+", metavar="PATH",
                   help="journals (calls.jsonl), history stores (*.sqlite), trace files or "
                        "directories of them (default: the daemon's store, else its journal)")
    t.add_argument("--out", help="model directory (default: [predictor] dir)")
    t.add_argument("--quantile", type=float, help="peak quantile admission is charged (0.8)")
    t.add_argument("--min-calls", type=int, default=200,
                   help="refuse to train on fewer calls (default 200)")
    t.add_argument("--keep", type=int, default=5, help="versions kept (default 5)")
    s = cmd.add_parser("show", help="the model versions and the newest one's scores")
    s.add_argument("--json", action="store_true")


def _config(cfg: Config) -> Any:
    """[predictor] of the config file."""
    from execgate.daemon import settings as settings_mod

    return settings_mod.load(cfg)[0].predictor


def _sources(args: argparse.Namespace, cfg: Config) -> list[str]:
    from execgate.common import journal
    from execgate.daemon import settings as settings_mod

    from .model_data import find_sources

    if args.sources:
        return [p for src in args.sources for p in find_sources(src)]
    store = settings_mod.load(cfg)[0].daemon.store
    return [store] if os.path.isfile(store) else journal.files(cfg.journal) or [cfg.journal]


def holdout_scores(rows: Sequence[CallRow], x: Sequence[Sequence[float]], cfg: Any,
                   ) -> dict[str, Any] | None:
    """MAE and heavy-call recall of a model fitted on the earlier tasks, on the later ones'
    undeclared calls (None when there are too few tasks to split)."""
    from execgate.common.units import MiB
    from execgate.daemon import predictor

    from . import model_data, model_train

    train, test = model_data.causal_split(rows, HOLDOUT_TRAIN)
    tr = [i for i, r in enumerate(rows) if r.group in train]
    te = [i for i, r in enumerate(rows) if r.group in test and not r.declared_bytes]
    if len(tr) < 2 or not te:
        return None
    doc = model_train.fit([x[i] for i in tr], [rows[i].peak_bytes for i in tr],
                          [rows[i].avg_bytes for i in tr], cfg)
    model = predictor.parse(doc)
    preds = [model.predict(x[i]) for i in te]
    actual = [rows[i].peak_bytes for i in te]
    heavy = [i for i, a in enumerate(actual) if a >= HEAVY_BYTES]
    return {"test_calls": len(te), "test_tasks": len(test),
            "mae_mib": sum(abs(p.high_bytes - a) for p, a in zip(preds, actual, strict=True))
            / len(te) / MiB,
            "point_mae_mib": sum(abs(p.peak_bytes - a) for p, a in zip(preds, actual,
                                                                        strict=True))
            / len(te) / MiB,
            "heavy_calls": len(heavy),
            "heavy_recall_pct": 100 * sum(preds[i].high_bytes >= HEAVY_BYTES for i in heavy)
            / len(heavy) if heavy else None}


def train(args: argparse.Namespace, cfg: Config) -> int:
    from execgate.daemon import predictor

    from . import model_data, model_train

    if (why := model_train.sklearn_missing()) is not None:
        print(f"execgatectl: model train: {why}", file=sys.stderr)
        return 2
    sources = _sources(args, cfg)
    try:
        rows = model_data.rows_from(sources)
    except (OSError, ValueError) as e:
        print(f"execgatectl: model train: {e}", file=sys.stderr)
        return 1
    if len(rows) < max(args.min_calls, 2):
        print(f"execgatectl: model train: {len(rows)} finished call(s) in "
              f"{', '.join(sources) or 'nothing'}; need {args.min_calls} (--min-calls)",
              file=sys.stderr)
        return 1
    tcfg = model_train.TrainConfig() if args.quantile is None else \
        model_train.TrainConfig(quantile=args.quantile)
    ordered, x = model_data.features(rows)
    metrics = holdout_scores(ordered, x, tcfg)
    doc = model_train.fit(x, [r.peak_bytes for r in ordered], [r.avg_bytes for r in ordered],
                          tcfg, {"sources": sources, "metrics": metrics})
    path = predictor.save(doc, args.out or _config(cfg).dir, args.keep)
    print(f"execgatectl: model: {len(ordered)} calls -> {path}")
    if metrics:
        print(f"  hold-out ({metrics['test_calls']} calls of the last {metrics['test_tasks']} "
              f"tasks): MAE {metrics['mae_mib']:.1f} MiB (median {metrics['point_mae_mib']:.1f}"
              f"), heavy recall {_pct(metrics['heavy_recall_pct'])}")
    return 0


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} %"


def show(args: argparse.Namespace, cfg: Config) -> int:
    from execgate.daemon import predictor

    pcfg = _config(cfg)
    directory = pcfg.dir
    target = pcfg.model or predictor.latest(directory)
    out: dict[str, Any] = {"enabled": pcfg.enabled, "directory": directory,
                           "versions": [p for _v, p in predictor.versions(directory)],
                           "model": None, "error": None}
    if target:
        try:
            out["model"] = predictor.load(target).describe()
        except predictor.ModelError as e:
            out["error"] = str(e)
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0 if out["error"] is None else 1
    print(f"models in {directory}: {len(out['versions'])}; predictor "
          f"{'enabled' if pcfg.enabled else 'disabled'} ([predictor] enabled)")
    if out["error"]:
        print(f"  cannot use it: {out['error']}")
        return 1
    m = out["model"]
    if m is None:
        print("  no model: history estimates only (execgatectl model train)")
        return 0
    print(f"  in use: {m['path']} (version {m['version']}, created {m.get('created', '?')}, "
          f"{(m.get('trained_on') or {}).get('calls', '?')} calls, quantile "
          f"{m.get('quantile', '?')})")
    s = m.get("metrics")
    if s:
        print(f"  hold-out: MAE {s['mae_mib']:.1f} MiB on {s['test_calls']} calls, heavy "
              f"(>= 256 MiB) recall {_pct(s['heavy_recall_pct'])}")
    return 0


def status_line(p: dict[str, Any]) -> str:
    """`execgatectl status`'s line for the daemon's predictor (status.daemon.predictor)."""
    m = p.get("model")
    if not p.get("enabled"):
        state = "disabled ([predictor] enabled = false): history estimates only"
    elif m:
        state = (f"model version {m.get('version')} ({m.get('path')}, quantile "
                 f"{m.get('quantile', '?')})")
    else:
        state = "no model: history estimates only"
    extra = [f"last file refused: {p['error']}"] if p.get("error") else []
    if p.get("retraining"):
        extra.append("retraining now")
    return f"demand model: {state}" + "".join(f"; {e}" for e in extra)


def run(args: argparse.Namespace, cfg: Config) -> int:
    return train(args, cfg) if args.model_cmd == "train" else show(args, cfg)
