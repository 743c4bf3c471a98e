"""The learned demand model, as the daemon holds it: a versioned JSON file, trees walked in
plain Python.

`execgatectl model train` fits scikit-learn's gradient boosting and exports its trees into
`[predictor] dir` (/var/lib/execgate/models/demand-<N>.json, this module's format); the daemon
loads the newest one (or the file `[predictor] model` names) and never imports scikit-learn,
numpy or pickle: a pickled model breaks with every scikit-learn release and runs code at load,
a tree is five lists. Walking the ~300 shallow trees costs ~0.05 ms a call (1 ms is the
budget).

A missing, corrupt or mismatched model (another `FEATURE_VERSION`) leaves the estimator on the
version before it, else on its history rules; the reason is logged once per file. `Predictor`
is what the estimator holds: it answers None while it has no model, looks for a newer version
every `reload_s`, and, with `retrain_every_h`, runs `execgatectl model train` (niced, in the
background) on the host's own history when the newest model is older than that.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from execgate.common.units import MiB
from execgate.policy.estimate import Prediction
from execgate.policy.predictor_features import FEATURE_VERSION, N_FEATURES

log = logging.getLogger("execgated")

FORMAT = "execgate-demand-model/1"
HEADS = ("peak", "peak_q", "avg")  # point peak, admission's high quantile, average (MiB)
_NAME = re.compile(r"demand-(\d+)\.json")

# One tree: feature index, threshold, left child, right child, leaf value, per node (-1: leaf).
Tree = tuple[list[int], list[float], list[int], list[int], list[float]]


class ModelError(ValueError):
    """A model file that cannot be used (the message says why)."""


@dataclass(frozen=True)
class Head:
    """One boosted ensemble: base + scale * sum(tree leaves)."""

    base: float
    scale: float
    trees: tuple[Tree, ...]

    def predict(self, x: Sequence[float]) -> float:
        total = 0.0
        for feat, thr, left, right, val in self.trees:
            i = 0
            while left[i] >= 0:
                i = left[i] if x[feat[i]] <= thr[i] else right[i]
            total += val[i]
        return self.base + self.scale * total


def parse_head(raw: Any, name: str = "head") -> Head:
    """One head from its JSON object; ModelError says what is wrong with it."""
    try:
        trees = []
        for t in raw["trees"]:
            feat, thr, left, right, val = (list(t[k]) for k in ("feature", "threshold", "left",
                                                                "right", "value"))
            n = len(left)
            if not n or any(len(a) != n for a in (feat, thr, right, val)):
                raise ModelError(f"{name}: a tree's node lists differ in length")
            for i in range(n):
                if left[i] >= 0 and not (i < left[i] < n and i < right[i] < n
                                         and 0 <= feat[i] < N_FEATURES):
                    raise ModelError(f"{name}: node {i} points outside its tree")
            trees.append((feat, [float(v) for v in thr], left, right, [float(v) for v in val]))
        return Head(float(raw["base"]), float(raw["scale"]), tuple(trees))
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, ModelError):
            raise
        raise ModelError(f"{name}: malformed head ({e!r})") from None


@dataclass(frozen=True)
class DemandModel:
    """A loaded model: predicts a call's peak, high-quantile peak and average from its
    features (`policy.predictor_features`)."""

    path: str
    version: int
    heads: dict[str, Head]
    meta: dict[str, Any]

    def predict(self, features: Sequence[float]) -> Prediction:
        def mib(head: str) -> float:
            return max(self.heads[head].predict(features), 0.0) * MiB

        peak = mib("peak")
        high = max(mib("peak_q"), peak) if "peak_q" in self.heads else peak
        avg = min(mib("avg"), high) if "avg" in self.heads else None
        return Prediction(peak_bytes=round(peak), high_bytes=round(high),
                          avg_bytes=None if avg is None else round(avg))

    def describe(self) -> dict[str, Any]:
        """What `status` and `execgatectl model show` print of it."""
        return {"path": self.path, "version": self.version,
                "trees": {k: len(h.trees) for k, h in self.heads.items()},
                **{k: self.meta[k] for k in ("created", "trained_on", "quantile", "metrics")
                   if k in self.meta}}


def parse(doc: Any, path: str = "<model>") -> DemandModel:
    """A model from its JSON document; ModelError says what is wrong with it."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ModelError(f"{path}: not an {FORMAT} file")
    if doc.get("feature_version") != FEATURE_VERSION or doc.get("n_features") != N_FEATURES:
        raise ModelError(f"{path}: trained on feature version {doc.get('feature_version')} "
                         f"({doc.get('n_features')} features), this execgate computes "
                         f"{FEATURE_VERSION} ({N_FEATURES}): retrain it")
    raw = doc.get("heads")
    if not isinstance(raw, dict) or "peak" not in raw:
        raise ModelError(f"{path}: no peak head")
    heads = {k: parse_head(v, f"{path}: {k}") for k, v in raw.items() if k in HEADS}
    version = doc.get("version")
    return DemandModel(path, version if isinstance(version, int) else 0, heads,
                       {k: v for k, v in doc.items() if k != "heads"})


def load(path: str) -> DemandModel:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise ModelError(f"{path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ModelError(f"{path}: not JSON ({e})") from None
    return parse(doc, path)


def versions(directory: str) -> list[tuple[int, str]]:
    """(version, path) of the model files in a directory, oldest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = [(int(m.group(1)), os.path.join(directory, n))
             for n in names if (m := _NAME.fullmatch(n))]
    return sorted(found)


def latest(directory: str) -> str | None:
    found = versions(directory)
    return found[-1][1] if found else None


def save(doc: dict[str, Any], directory: str, keep: int = 5) -> str:
    """Write a model as the next version (atomically: a reader never sees half a file) and
    prune all but the newest `keep`."""
    os.makedirs(directory, exist_ok=True)
    found = versions(directory)
    version = found[-1][0] + 1 if found else 1
    path = os.path.join(directory, f"demand-{version}.json")
    doc = {**doc, "version": version}
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, path)
    for _v, old in found[: max(0, len(found) + 1 - keep)]:
        try:
            os.unlink(old)
        except OSError:
            pass
    return path


@dataclass(frozen=True)
class PredictorConfig:
    """[predictor]: the learned demand model for undeclared calls."""

    # Use a model when there is one (false: the history rules alone).
    enabled: bool = True
    # Where `execgatectl model train` writes the versions and the daemon finds the newest.
    dir: str = "/var/lib/execgate/models"
    # A model file to use instead of the newest version ("" = the newest).
    model: str = ""
    # How often the daemon looks for a newer version (or a changed file).
    reload_s: float = 60.0
    # Retrain from the host's own history when the newest model is older than this (hours;
    # 0 = never: run `execgatectl model train` by hand or from a timer).
    retrain_every_h: float = 0.0

    def __post_init__(self) -> None:
        if self.reload_s <= 0 or self.retrain_every_h < 0:
            raise ValueError("reload_s must be > 0 and retrain_every_h >= 0")


class Predictor:
    """The estimator's model slot in the daemon (policy.estimate.DemandModel)."""

    def __init__(self, cfg: PredictorConfig, config_path: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.clock = clock
        self.model: DemandModel | None = None
        self.error: str | None = None
        self.failures = 0  # predictions that raised (the model is dropped at the first)
        self._loaded: tuple[str, int] | None = None  # (path, mtime_ns) of the model in use
        self._refused: dict[tuple[str, int], str] = {}  # files that failed (logged once): why
        self._said_none = False
        self._checked = float("-inf")
        self._training: subprocess.Popen[bytes] | None = None
        self._trained_at = float("-inf")

    def predict(self, features: Sequence[float]) -> Prediction | None:
        model = self.model
        if model is None:
            return None
        try:
            return model.predict(features)
        except Exception as e:  # noqa: BLE001 - a broken model must not break admission
            self.failures += 1
            self.model, self.error = None, f"{model.path}: prediction failed ({e!r})"
            log.warning("predictor: %s; history estimates only", self.error)
            return None

    def step(self) -> None:
        """Every control period: reload and retrain when due (a stat at most every reload_s)."""
        now = self.clock()
        if not self.cfg.enabled or now - self._checked < self.cfg.reload_s:
            return
        self._checked = now
        self.reload()
        self._retrain(now)

    def reload(self) -> None:
        """Use the newest version that loads (or `[predictor] model`): a file that fails is
        logged once and passed over until it changes, so a torn or foreign newest version
        leaves the one before it in use, or the history rules when there is none."""
        paths = [self.cfg.model] if self.cfg.model else \
            [p for _v, p in reversed(versions(self.cfg.dir))]
        if not paths:
            if not self._said_none:
                log.info("predictor: no model in %s; %s", self.cfg.dir,
                         "the model in use stays" if self.model else "history estimates only")
                self._said_none = True
            return
        self._said_none = False
        self.error = None  # the newest file refused in this pass, if any
        for path in paths:
            try:
                key = (path, os.stat(path).st_mtime_ns)
            except OSError as e:
                self._refuse((path, -1), f"{path}: {e.strerror or e}")
                continue
            if key == self._loaded:
                return  # the newest usable one is in use already
            if key in self._refused:
                self.error = self.error or self._refused[key]
                continue
            try:
                model = load(path)
                if not all(math.isfinite(h.base) for h in model.heads.values()):
                    raise ModelError(f"{path}: a non-finite base")
            except ModelError as e:
                self._refuse(key, str(e))
                continue
            self.model, self._loaded = model, key
            log.info("predictor: model %s (version %d) loaded", path, model.version)
            return

    def _refuse(self, key: tuple[str, int], why: str) -> None:
        self.error = self.error or why
        if key not in self._refused:
            self._refused[key] = why
            log.warning("predictor: %s; %s", why, "the model in use stays" if self.model
                        else "history estimates only")

    def _retrain(self, now: float) -> None:
        if self._training is not None:
            if self._training.poll() is None:
                return
            rc, self._training = self._training.returncode, None
            (log.info if rc == 0 else log.warning)("predictor: retraining exited %d", rc)
        hours = self.cfg.retrain_every_h
        if not hours or now - self._trained_at < hours * 3600:
            return
        target = latest(self.cfg.dir)
        try:
            age = time.time() - os.stat(target).st_mtime if target else float("inf")
        except OSError:
            age = float("inf")
        if age < hours * 3600:
            return
        self._trained_at = now
        argv = ["nice", "-n", "19"] if shutil.which("nice") else []
        argv += [sys.executable, "-m", "execgate.ctl.main"]
        if self.config_path:
            argv += ["--config", self.config_path]
        argv += ["model", "train", "--out", self.cfg.dir]
        try:
            self._training = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL)
            log.info("predictor: retraining (%s)", " ".join(argv))
        except OSError as e:
            log.warning("predictor: cannot retrain: %s", e)

    def snapshot(self) -> dict[str, Any]:
        """What status shows of it."""
        return {"enabled": self.cfg.enabled, "error": self.error, "failures": self.failures,
                "model": self.model.describe() if self.model else None,
                "retraining": self._training is not None}
