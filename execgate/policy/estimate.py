"""Predicted memory demand of a tool call before it runs (ToolSched §3.2–3.3).

Admission charges each call by a prediction of its average and peak memory. `Estimator` is the
pluggable interface (a learned predictor will replace the default); `HistoryEstimator` is the
default, using in order:

(a) the caller's declared hint D, corrected by the geometric mean of observed-peak / declared
    ratios over the last k calls of the same sandbox that declared: D' = D · GM(P_j / D_j)
    (ToolSched §3.2). The GM is the right mean for ratios (a 2× over- and a 2× under-declaration
    cancel out), and each ratio is clamped to [1/16, 16] so one absurd hint cannot poison the
    window. Per sandbox, because how well an agent declares is the agent's own: one that
    over-declares must not discount a truthful neighbour's 2 GB into a co-admission that
    OOM-kills. No history in the sandbox: factor 1.
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

Command classes come from the argv (`classify_command`), seeing through shell wrappers
(`sh -c "…"`, `bash -lc "…"`), `timeout`, `env`, `nice`, env assignments and `cd x && …` chains;
a chain is classified by its heaviest command.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from execgate.common.commands import ASSIGNMENT, NODE_PMS, PYTHON, RUNNERS, SHELLS

MiB = 1 << 20
GiB = 1 << 30

PRIORITIES = ("high", "normal", "low")

# Command classes, lightest first: a chain is classified by the one ranked last.
LIGHT, GIT, OTHER, BUILD_INSTALL, TEST = "light", "git", "other", "build_install", "test"
CLASS_RANK = {LIGHT: 0, GIT: 1, OTHER: 2, BUILD_INSTALL: 3, TEST: 4}


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
# Command classes

# Reading, searching and small file operations; shell builtins (so `cd x && cmd` is `cmd`).
_LIGHT = frozenset[str]().union(
    {"grep", "egrep", "fgrep", "rg", "ag", "ls", "cat", "find", "fd", "head", "tail", "sed", "awk"},
    {"gawk", "mawk", "echo", "printf", "wc", "tree", "pwd", "cd", "pushd", "popd", "true", "false"},
    {":", "export", "unset", "set", "source", ".", "alias", "test", "[", "sleep", "mkdir", "rmdir"},
    {"touch", "rm", "cp", "mv", "ln", "stat", "which", "type", "whoami", "id", "date", "basename"},
    {"dirname", "readlink", "realpath", "diff", "cmp", "tr", "cut", "uniq", "tee", "chmod"},
    {"chown", "file", "du", "df", "nl", "rev", "less", "more"},
)
_TEST_TOOLS = frozenset(
    {"pytest", "py.test", "tox", "nox", "jest", "vitest", "mocha", "rspec", "phpunit", "ctest"}
)
_COMPILERS = re.compile(
    r"(gcc|g\+\+|cc|c\+\+|clang|clang\+\+|ld|ld\.lld|rustc|javac|tsc|cmake|meson|scons)(-[\d.]+)?"
)
_MAKE = frozenset({"make", "gmake", "bmake", "ninja"})
_BUILD_TOOLS = frozenset({"mvn", "gradle", "gradlew", "bazel", "bazelisk", "dotnet"})
_PIP = re.compile(r"pip(\d+(\.\d+)?)?")
_PKG_MANAGERS = frozenset(
    {"apt", "apt-get", "aptitude", "yum", "dnf", "apk", "zypper", "conda", "mamba", "gem", "brew"}
)
_INSTALL_VERBS = frozenset({"install", "add", "upgrade", "update", "build", "sync", "download"})
_NPX = frozenset({"npx", "pnpx", "bunx"})
_SEPARATOR_CHARS = frozenset(";&|()\n")
_MAX_DEPTH = 8


def _heaviest(classes: Sequence[str]) -> str:
    return max(classes, key=CLASS_RANK.__getitem__) if classes else LIGHT


def _first_operand(args: Sequence[str]) -> tuple[str, int]:
    """The first argument that is not an option, and its index ('' and len if none)."""
    for i, a in enumerate(args):
        if not a.startswith("-") and not a.startswith("+"):
            return a, i
    return "", len(args)


def _is_test_target(word: str) -> bool:
    return word.startswith("test") or word in ("check", "unittest")


def _skip_options(args: Sequence[str], with_value: frozenset[str]) -> int:
    """Index of the first operand, skipping options (and the values of those in with_value)."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        if args[i] == "--":
            return i + 1
        i += 2 if args[i] in with_value else 1
    return i


def _classify_string(command: str, depth: int) -> str:
    """Classify a shell command string: the heaviest simple command in it."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|()<>\n")
        lexer.whitespace_split = True
        lexer.whitespace = " \t\r"
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: fall back to a plain split
        tokens = command.split()
    classes: list[str] = []
    current: list[str] = []
    skip_next = False
    for tok in tokens:
        if skip_next:  # the target of a redirection
            skip_next = False
        elif tok and set(tok) <= _SEPARATOR_CHARS:
            if current:
                classes.append(_classify_simple(current, depth))
            current = []
        elif tok and tok[0] in "<>" and set(tok) <= set("<>&|"):
            skip_next = True
        else:
            current.append(tok)
    if current:
        classes.append(_classify_simple(current, depth))
    return _heaviest(classes) if classes else OTHER


def _classify_simple(argv: Sequence[str], depth: int) -> str:
    """Classify one simple command, unwrapping transparent prefixes first."""
    args = list(argv)
    while True:
        while args and ASSIGNMENT.fullmatch(args[0]):
            args.pop(0)
        if not args:
            return LIGHT  # only assignments
        head, rest = os.path.basename(args[0]), args[1:]
        if head == "env":
            i = _skip_options(rest, frozenset({"-u", "--unset", "-C", "--chdir", "-S"}))
            args = rest[i:]
        elif head == "timeout":
            i = _skip_options(rest, frozenset({"-s", "--signal", "-k", "--kill-after"}))
            args = rest[i + 1 :]  # drop the duration
        elif head == "nice":
            i = _skip_options(rest, frozenset({"-n", "--adjustment"}))
            args = rest[i:]
        elif head in ("nohup", "time", "exec", "command", "stdbuf", "ionice", "builtin"):
            valued = frozenset({"-c", "-n", "-p"} if head == "ionice" else {"-a"})
            args = rest[_skip_options(rest, valued) :]
        elif head in RUNNERS and rest[:1] == ["run"]:
            args = rest[1 + _skip_options(rest[1:], frozenset({"--with", "-p", "--python"})) :]
        elif head in SHELLS:
            return _classify_shell(rest, depth)
        else:
            return _classify_command(head, rest)
        if not args:
            return LIGHT


def _classify_shell(args: Sequence[str], depth: int) -> str:
    """`sh -c "…"`, `bash -lc "…"`, `bash -e -o pipefail -c "…"`: classify the string."""
    i = 0
    has_c = False
    while i < len(args) and args[i].startswith(("-", "+")) and args[i] not in ("-", "--"):
        opt = args[i]
        if opt in ("-o", "+o", "-O", "+O"):
            i += 1  # takes a value
        elif not opt.startswith("--") and "c" in opt[1:]:
            has_c = True
        i += 1
    if has_c and i < len(args) and depth < _MAX_DEPTH:
        return _classify_string(args[i], depth + 1)
    return OTHER  # a script or an interactive shell: nothing to see


def _classify_command(head: str, args: Sequence[str]) -> str:
    """Rules for one command name and its arguments."""
    if head in _LIGHT:
        return LIGHT
    if head == "git":
        return GIT
    if head in _TEST_TOOLS:
        return TEST
    verb, vi = _first_operand(args)
    if PYTHON.fullmatch(head):
        if "-m" in args:
            j = args.index("-m")
            module = args[j + 1] if j + 1 < len(args) else ""
            tail = args[j + 2 :]
            if module in ("pytest", "tox", "nox", "unittest"):
                return TEST
            if module == "pip":
                sub, _ = _first_operand(tail)
                return BUILD_INSTALL if sub in ("install", "download", "wheel") else OTHER
            if module == "build":
                return BUILD_INSTALL
            return OTHER
        if "-c" in args[: vi + 1]:
            return OTHER
        if os.path.basename(verb) == "setup.py":
            return BUILD_INSTALL
        return OTHER
    if _PIP.fullmatch(head):
        return BUILD_INSTALL if verb in ("install", "download", "wheel") else OTHER
    if head == "uv":
        if verb == "pip":
            sub, _ = _first_operand(args[vi + 1 :])
            return BUILD_INSTALL if sub in ("install", "sync", "compile") else OTHER
        return BUILD_INSTALL if verb in ("sync", "add", "build", "lock") else OTHER
    if head == "go":
        if verb == "test":
            return TEST
        return BUILD_INSTALL if verb in ("build", "install", "get", "mod", "run") else OTHER
    if head == "cargo":
        if verb in ("test", "t", "nextest", "bench"):
            return TEST
        build = ("build", "b", "install", "check", "c", "clippy", "doc", "run", "r", "fetch")
        return BUILD_INSTALL if verb in build else OTHER
    if head in NODE_PMS:
        if verb in ("test", "t", "tst"):
            return TEST
        if verb == "run":
            script, _ = _first_operand(args[vi + 1 :])
            if _is_test_target(script):
                return TEST
            return BUILD_INSTALL if script.startswith("build") else OTHER
        if verb in ("install", "i", "ci", "add", "update", "upgrade") or (
            head == "yarn" and not verb
        ):
            return BUILD_INSTALL
        return OTHER
    if head in _NPX:
        if verb in ("jest", "vitest", "mocha", "playwright"):
            return TEST
        return BUILD_INSTALL if verb in ("tsc", "webpack", "vite") else OTHER
    if head in _MAKE or head in _BUILD_TOOLS:  # `make check`, `mvn test`, `bazel test //…`
        wants_test = any(_is_test_target(a) for a in args if not a.startswith("-"))
        return TEST if wants_test else BUILD_INSTALL
    if _COMPILERS.fullmatch(head):
        return BUILD_INSTALL
    if head in _PKG_MANAGERS:
        return BUILD_INSTALL if verb in _INSTALL_VERBS else OTHER
    return OTHER


def classify_command(argv: Sequence[str]) -> str:
    """The command class of an argv: 'test', 'build_install', 'git', 'light' or 'other'."""
    if not argv:
        return OTHER
    return _classify_simple(list(argv), 0)


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
    """Declared-hint GM correction (per sandbox), then (sandbox, class) / class history, then
    class defaults."""

    config: EstimateConfig = field(default_factory=EstimateConfig)

    def __post_init__(self) -> None:
        # Per sandbox: log(observed / declared) of its last k declared calls, peak and average.
        self._declared: dict[str, _Window] = {}
        self._by_sandbox: dict[tuple[str, str], _Window] = {}
        self._by_class: dict[str, _Window] = {}

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
        declared = call.declared_bytes
        if declared is not None and declared > 0:
            peak = round(declared * self.peak_correction(call.sandbox))
            avg = min(round(declared * self.avg_correction(call.sandbox)), peak)
            return Demand(avg, peak, "declared")
        cls = classify_command(call.argv)
        for kind, hist in (
            ("sandbox-history", self._by_sandbox.get((call.sandbox, cls))),
            ("class-history", self._by_class.get(cls)),
        ):
            if hist is not None and len(hist.peaks) >= cfg.min_history:
                peak = int(max(hist.peaks))
                avg = min(math.ceil(sum(hist.avgs) / len(hist.avgs)), peak)
                return Demand(avg, peak, f"{kind}:{cls}")
        peak = cfg.default_peak(cls)
        return Demand(math.ceil(peak * cfg.avg_fraction), peak, f"class-default:{cls}")

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
        cls = classify_command(call.argv)
        for store, key in ((self._by_sandbox, (call.sandbox, cls)), (self._by_class, cls)):
            _Window.add(store, key, cfg.history_window, peak, avg)

    def forget_sandbox(self, sandbox: str) -> None:
        """Drop a removed sandbox's history (keeps memory bounded by live sandboxes)."""
        self._declared.pop(sandbox, None)
        for key in [k for k in self._by_sandbox if k[0] == sandbox]:
            del self._by_sandbox[key]
