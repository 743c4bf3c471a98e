"""Fit the demand model with scikit-learn and export it as daemon/predictor.py's JSON trees.

Three gradient-boosted ensembles over `predictor_features` vectors, targets in MiB: the peak
(absolute error: its median, what MAE rewards), a high quantile of the peak (`quantile`, what
admission charges: an under-estimate is an OOM kill, an over-estimate a short wait) and the
average (squared error; only on rows whose average is known). Shallow trees and ~100 of them
keep inference, walked in plain Python by the daemon, well under a millisecond.

scikit-learn is imported here only (the `model` extra: pip install 'execgate[model]'); the
export is checked against scikit-learn's own predictions before it is written.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from execgate.common.units import MiB
from execgate.daemon import predictor
from execgate.policy.predictor_features import FEATURE_VERSION, N_FEATURES


@dataclass(frozen=True)
class TrainConfig:
    # The peak quantile admission is charged. On the generator's traces (bench/predictor_eval.py,
    # two seeds; README, Benchmarks) 0.85 clears 90 % heavy-call recall on both at an MAE of
    # ~73 MiB; 0.82 stays just under 90 % on one; each +0.02 costs ~4 MiB of MAE.
    quantile: float = 0.85
    n_estimators: int = 100
    max_depth: int = 3
    learning_rate: float = 0.1
    min_samples_leaf: int = 5
    subsample: float = 0.8
    seed: int = 0


def sklearn_missing() -> str | None:
    """Why training cannot run here, or None."""
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return "scikit-learn is not installed (pip install 'execgate[model]')"
    return None


def _export(model: Any, x: Any) -> dict[str, Any]:
    """One fitted GradientBoostingRegressor as a predictor head (public tree_ arrays only;
    leaves pre-multiplied by the learning rate, so heads can be added by joining their trees)."""
    trees = []
    leaves_first = 0.0
    lr = float(model.learning_rate)
    for est in model.estimators_[:, 0]:
        t = est.tree_
        trees.append({"feature": [int(v) if v >= 0 else 0 for v in t.feature],
                      "threshold": [float(v) for v in t.threshold],
                      "left": [int(v) for v in t.children_left],
                      "right": [int(v) for v in t.children_right],
                      "value": [lr * float(v) for v in t.value[:, 0, 0]]})
        leaves_first += float(est.predict(x[:1])[0])
    base = float(model.predict(x[:1])[0]) - lr * leaves_first
    return {"base": base, "scale": 1.0, "trees": trees}


def _check(head: dict[str, Any], want: Any, x: Any) -> None:
    exported = predictor.parse_head(head)
    for row, w in zip(x[:2000], want[:2000], strict=False):
        got = exported.predict([float(v) for v in row])
        if abs(got - w) > 1e-3 * max(1.0, abs(w)):
            raise RuntimeError(f"exported trees disagree with scikit-learn ({got} != {w})")


def fit(x_rows: Sequence[Sequence[float]], peaks: Sequence[int],
        avgs: Sequence[int | None], cfg: TrainConfig | None = None,
        meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """A model document (daemon/predictor.py's format) fitted on these rows.

    The quantile head is the median's plus trees fitted to the quantile of what the median
    misses: fitted to the peaks themselves, quantile boosting's sign gradients cannot tell a
    5 MiB `ls` from a 320 MiB test run in one leaf and leave both near the overall quantile."""
    cfg = cfg or TrainConfig()
    import numpy as np
    from sklearn.ensemble import GradientBoostingRegressor

    if len(x_rows) < 2:
        raise ValueError(f"{len(x_rows)} call(s): too few to train on")
    x = np.asarray(x_rows, dtype=np.float32)
    y = np.asarray(peaks, dtype=np.float64) / MiB

    def gbr(loss: str, **kw: Any) -> Any:
        return GradientBoostingRegressor(
            loss=loss, n_estimators=cfg.n_estimators, max_depth=cfg.max_depth,
            learning_rate=cfg.learning_rate, min_samples_leaf=cfg.min_samples_leaf,
            subsample=cfg.subsample, random_state=cfg.seed, **kw)

    heads: dict[str, Any] = {}
    point = gbr("absolute_error").fit(x, y)
    heads["peak"] = _export(point, x)
    median = point.predict(x)
    _check(heads["peak"], median, x)
    spread = gbr("quantile", alpha=cfg.quantile).fit(x, y - median)
    extra = _export(spread, x)
    heads["peak_q"] = {"base": heads["peak"]["base"] + extra["base"], "scale": 1.0,
                       "trees": heads["peak"]["trees"] + extra["trees"]}
    _check(heads["peak_q"], median + spread.predict(x), x)
    known = [i for i, a in enumerate(avgs) if a is not None]
    if len(known) >= 2:
        xa = x[known]
        avg = gbr("squared_error").fit(
            xa, np.asarray([avgs[i] for i in known], dtype=np.float64) / MiB)
        heads["avg"] = _export(avg, xa)
        _check(heads["avg"], avg.predict(xa), xa)
    return {"format": predictor.FORMAT, "feature_version": FEATURE_VERSION,
            "n_features": N_FEATURES, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                               time.gmtime()),
            "quantile": cfg.quantile, "trained_on": {"calls": len(x_rows),
                                                     "with_avg": len(known)},
            "config": cfg.__dict__, **(meta or {}), "heads": heads}
