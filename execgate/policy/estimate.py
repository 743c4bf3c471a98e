"""Predicted memory demand of a tool call before it runs (ToolSched §3.2–3.3).

Admission charges each call by a prediction of its average and peak memory. `Estimator` is the
pluggable interface; `HistoryEstimator` is the default, using in order:

(a) the caller's declared hint D, corrected by the geometric mean of observed-peak / declared
    ratios over the last k calls of the same sandbox that declared: D' = D · GM(P_j / D_j)
    (ToolSched §3.2). The GM is the right mean for ratios (a 2× over- and a 2× under-declaration
    cancel out), and each ratio is clamped to [1/16, 16] so one absurd hint cannot poison the
    window. Per sandbox, because how well an agent declares is the agent's own: one that
    over-declares must not discount a truthful neighbour's 2 GB into a co-admission that
    OOM-kills. No history in the sandbox: factor 1. The clamp also bounds an under-declaration's
    correction, so D' is never below the sandbox's own history of that command class (b): the
    peak is max(D', history) (issue 21: 1 B declared, 2 GiB used, must not stay "light").
(m) otherwise, with a learned model (`DemandModel`, issue 22: daemon/predictor.py loads the
    trees `execgatectl model train` fits), its high-quantile peak over the call's causal
    features (`predictor_features`: command words, class, the sandbox's and the host's earlier
    calls), raised by the GM of observed / predicted over the sandbox's last modelled calls of
    the class when that exceeds 1 (the online history corrects it; never lowered). A model
    that cannot answer (none, or it failed) falls through to (b);
(b) otherwise the history of the same (sandbox, command class), then of the command class across
    sandboxes (ToolSched §3.3). We use the *recent max* of observed peaks over a short window
    (default 8 calls) rather than an EWMA: an under-estimate costs an OOM kill while an
    over-estimate only costs a short wait, and the max forgets a one-off spike after 8 calls.
    The average is the mean of the same window's observed averages.
(c) otherwise a per-class default peak; with no observation of the average, avg = peak / 4
    (`avg_fraction`): tool calls are bursty (a test run peaks briefly during collection or
    linking), so the mean sits well below the peak.

A call killed by the OOM killer only shows how far it got, not what it needed: its observed peak
is scaled by `oom_peak_factor` before it enters any history.

Command classes come from the argv (`common.commands.classify_command`, the one classifier the
agent feedback uses too), seeing through shell wrappers, `timeout`, `env`, `sudo`, env
assignments and `cd x && …` chains; a chain is classified by its heaviest command.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from execgate.common.commands import (
    BUILD_INSTALL,
    GIT,
    LIGHT,
    OTHER,
    TEST,
    classify_command,
)
from execgate.common.units import GiB, MiB

from .predictor_features import CallHistory

PRIORITIES = ("high", "normal", "low")
# Predictions remembered for calls not yet observed, and (sandbox, class) windows of the
# model's online correction.
MAX_PREDICTED = 4096
# Modelled calls of a (sandbox, class) before their observed / predicted ratio corrects the
# model: one call above a high quantile is the quantile working, three in a row are not.
MODEL_CORRECTION_CALLS = 3


@dataclass(frozen=True)
class CallInfo:
    """One tool call (one `docker exec`) as the daemon sees it at submission."""

    call_id: str
    sandbox: str
    argv: Sequence[str]
    declared_bytes: int | None = None
    priority: str = "normal"  # 'low' | 'normal' | 'high'
    # Arrival time on the admission clock; None lets Admission.submit stamp it.
    arrival: float | None = None
    # Its class when the argv cannot tell (a redacted journal line: the program alone).
    command_class: str | None = None

    def __post_init__(self) -> None:
        if self.priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {PRIORITIES}, not {self.priority!r}")
        object.__setattr__(self, "argv", tuple(self.argv))


@dataclass(frozen=True)
class Demand:
    """Predicted average and peak bytes; `source` says which rule produced them."""

    avg_bytes: int
    peak_bytes: int
    source: str


@dataclass(frozen=True)
class Outcome:
    """What a finished call actually used (from its cgroup's memory.peak and sampling)."""

    peak_bytes: int
    avg_bytes: int
    duration_s: float
    oom_killed: bool = False


@dataclass(frozen=True)
class Prediction:
    """A learned model's answer for one call: its likely peak, a high quantile of it (what
    admission charges: an under-estimate costs an OOM kill), and its average if predicted."""

    peak_bytes: int
    high_bytes: int
    avg_bytes: int | None = None


class DemandModel(Protocol):
    """A learned predictor over `predictor_features` vectors (daemon/predictor.py loads one);
    None when it cannot answer (the history rules then)."""

    def predict(self, features: Sequence[float]) -> Prediction | None: ...


@runtime_checkable
class Estimator(Protocol):
    """Predicts a call's demand and learns from its outcome (ToolSched §3.2–3.3)."""

    def estimate(self, call: CallInfo) -> Demand: ...

    def observe(self, call: CallInfo, outcome: Outcome) -> None: ...


@dataclass(frozen=True)
class EstimateConfig:
    """Tunables of HistoryEstimator (config.toml fills them)."""

    # k: declared calls in the GM correction window (ToolSched §3.2).
    declared_window: int = 256
    # Each observed/declared ratio is clamped to [1/ratio_clamp, ratio_clamp].
    ratio_clamp: float = 16.0
    # Observations per (sandbox, class) and per class kept for the recent-max rule.
    history_window: int = 8
    # Observations needed before a history is trusted over the next rule.
    min_history: int = 1
    # Observed peak of an OOM-killed call is multiplied by this (it was cut short).
    oom_peak_factor: float = 2.0
    # avg = peak · avg_fraction when no average has been observed.
    avg_fraction: float = 0.25
    # Class default peaks.
    light_peak_bytes: int = 16 * MiB
    git_peak_bytes: int = 64 * MiB
    other_peak_bytes: int = 256 * MiB
    build_install_peak_bytes: int = 1 * GiB
    test_peak_bytes: int = 1 * GiB

    def __post_init__(self) -> None:
        if self.declared_window < 1 or self.history_window < 1 or self.min_history < 1:
            raise ValueError("windows and min_history must be >= 1")
        if self.ratio_clamp < 1:
            raise ValueError("ratio_clamp must be >= 1")
        if not 0 < self.avg_fraction <= 1:
            raise ValueError("avg_fraction must be in (0, 1]")

    def default_peak(self, command_class: str) -> int:
        return {
            LIGHT: self.light_peak_bytes,
            GIT: self.git_peak_bytes,
            OTHER: self.other_peak_bytes,
            BUILD_INSTALL: self.build_install_peak_bytes,
            TEST: self.test_peak_bytes,
        }[command_class]


# ---------------------------------------------------------------------------------------------
# The default estimator


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


@dataclass
class _Window:
    """The last n (peak, avg) pairs of one key, newest last: bytes for a command history,
    log(observed / declared) for a sandbox's declared calls."""

    peaks: deque[float]
    avgs: deque[float]

    @staticmethod
    def add(store: dict[Any, _Window], key: object, n: int, peak: float, avg: float) -> None:
        window = store.get(key)
        if window is None:
            window = store[key] = _Window(deque(maxlen=n), deque(maxlen=n))
        window.peaks.append(peak)
        window.avgs.append(avg)


@dataclass
class HistoryEstimator:
    """Declared-hint GM correction (per sandbox), then the learned model if any (corrected
    online), then (sandbox, class) / class history, then class defaults."""

    config: EstimateConfig = field(default_factory=EstimateConfig)
    # The learned predictor for undeclared calls (issue 22); None: history rules only.
    model: DemandModel | None = None

    def __post_init__(self) -> None:
        # The causal features of the next call (kept with or without a model: one loaded later
        # finds the history it needs).
        self.calls = CallHistory()
        # Per sandbox: log(observed / declared) of its last k declared calls, peak and average.
        self._declared: dict[str, _Window] = {}
        self._by_sandbox: dict[tuple[str, str], _Window] = {}
        self._by_class: dict[str, _Window] = {}
        # Per (sandbox, class): log(observed / predicted) of its last modelled calls, and the
        # prediction of each call still running (bounded: a call never observed is dropped).
        self._model_logs: dict[tuple[str, str], _Window] = {}
        self._predicted: OrderedDict[str, int] = OrderedDict()

    # -- correction factors ------------------------------------------------------------------

    def peak_correction(self, sandbox: str) -> float:
        """GM(P_j / D_j) over the sandbox's window; 1 with no history (ToolSched §3.2)."""
        logs = self._declared.get(sandbox)
        if logs is None or not logs.peaks:
            return 1.0
        return math.exp(math.fsum(logs.peaks) / len(logs.peaks))

    def avg_correction(self, sandbox: str) -> float:
        """GM(avg_j / D_j); avg_fraction with no history (a declared hint is a peak)."""
        logs = self._declared.get(sandbox)
        if logs is None or not logs.avgs:
            return self.config.avg_fraction
        return math.exp(math.fsum(logs.avgs) / len(logs.avgs))

    def declared_window_len(self, sandbox: str) -> int:
        logs = self._declared.get(sandbox)
        return 0 if logs is None else len(logs.peaks)

    # -- Estimator ---------------------------------------------------------------------------

    def estimate(self, call: CallInfo) -> Demand:
        cfg = self.config
        cls = classify_command(call.argv)
        own = self._history(self._by_sandbox.get((call.sandbox, cls)), f"sandbox-history:{cls}")
        declared = call.declared_bytes
        if declared is not None and declared > 0:
            peak = round(declared * self.peak_correction(call.sandbox))
            avg = min(round(declared * self.avg_correction(call.sandbox)), peak)
            if own is not None and own.peak_bytes > peak:
                # The ratio clamp bounds the correction at 16x: a sandbox that declares 1 B
                # and peaks at 2 GiB must not make its calls "light". What it used wins.
                return Demand(max(own.avg_bytes, avg), own.peak_bytes, own.source)
            return Demand(avg, peak, "declared")
        if self.model is not None:
            modelled = self._modelled(call, cls)
            if modelled is not None:
                return modelled
        if own is not None:
            return own
        shared = self._history(self._by_class.get(cls), f"class-history:{cls}")
        if shared is not None:
            return shared
        peak = cfg.default_peak(cls)
        return Demand(math.ceil(peak * cfg.avg_fraction), peak, f"class-default:{cls}")

    def _modelled(self, call: CallInfo, cls: str) -> Demand | None:
        """The model's high-quantile peak for an undeclared call, corrected by the online
        history: when the sandbox's modelled calls of this class used more than predicted
        (GM of observed / predicted over the window, > 1), the prediction is raised by as much
        (at most ratio_clamp). Upward only: the quantile already sits above most calls, and a
        sandbox the model under-predicts (a workload unlike its training data) costs OOM
        kills. `own` (the class history) is no floor: its recent max would undo the model."""
        assert self.model is not None
        pred = self.model.predict(self.calls.features(call.sandbox, call.argv, cls=cls))
        if pred is None:
            return None
        peak = max(pred.high_bytes, pred.peak_bytes, 1)
        self._predicted[call.call_id] = peak
        self._predicted.move_to_end(call.call_id)
        while len(self._predicted) > MAX_PREDICTED:
            self._predicted.popitem(last=False)
        logs = self._model_logs.get((call.sandbox, cls))
        if logs is not None and len(logs.peaks) >= MODEL_CORRECTION_CALLS:
            factor = math.exp(math.fsum(logs.peaks) / len(logs.peaks))
            if factor > 1:
                peak = round(peak * min(factor, self.config.ratio_clamp))
        avg = pred.avg_bytes if pred.avg_bytes is not None else peak * self.config.avg_fraction
        return Demand(min(math.ceil(avg), peak), peak, f"model:{cls}")

    def _history(self, hist: _Window | None, source: str) -> Demand | None:
        """The recent max peak and mean average of a window, once it holds min_history."""
        if hist is None or len(hist.peaks) < self.config.min_history:
            return None
        peak = int(max(hist.peaks))
        return Demand(min(math.ceil(sum(hist.avgs) / len(hist.avgs)), peak), peak, source)

    def observe(self, call: CallInfo, outcome: Outcome) -> None:
        cfg = self.config
        peak = max(outcome.peak_bytes, 0)
        if outcome.oom_killed:
            peak = math.ceil(peak * cfg.oom_peak_factor)
        avg = min(max(outcome.avg_bytes, 0), peak)
        declared = call.declared_bytes
        if declared is not None and declared > 0:
            lo, hi = 1.0 / cfg.ratio_clamp, cfg.ratio_clamp
            _Window.add(self._declared, call.sandbox, cfg.declared_window,
                        math.log(_clamp(peak / declared, lo, hi)),
                        math.log(_clamp(avg / declared, lo, hi)))
        cls = call.command_class or classify_command(call.argv)
        for store, key in ((self._by_sandbox, (call.sandbox, cls)), (self._by_class, cls)):
            _Window.add(store, key, cfg.history_window, peak, avg)
        self.calls.observe(call.sandbox, call.argv, peak, outcome.duration_s, cls)
        predicted = self._predicted.pop(call.call_id, None)
        if predicted:
            ratio = _clamp(max(peak, 1) / predicted, 1.0 / cfg.ratio_clamp, cfg.ratio_clamp)
            _Window.add(self._model_logs, (call.sandbox, cls), cfg.history_window,
                        math.log(ratio), 0.0)
            if len(self._model_logs) > MAX_PREDICTED:  # the oldest (sandbox, class) goes
                del self._model_logs[next(iter(self._model_logs))]

    def forget_sandbox(self, sandbox: str) -> None:
        """Drop a removed sandbox's history (keeps memory bounded by live sandboxes)."""
        self._declared.pop(sandbox, None)
        self.calls.forget_sandbox(sandbox)
        for key in [k for k in self._model_logs if k[0] == sandbox]:
            del self._model_logs[key]
        for key in [k for k in self._by_sandbox if k[0] == sandbox]:
            del self._by_sandbox[key]
