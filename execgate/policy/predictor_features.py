"""Causal features of a tool call, for the learned demand predictor (issue 22).

One vector per call, from what is known before it runs: its command line (hashed word uni- and
bigrams: a vocabulary would have to be shipped with the model and misses every new file name,
a hash bucket does not), its command class, its declared hint, and what earlier calls did — in
its sandbox (their peaks, how often this very command ran, whether its peak grew from one run
to the next: retry loops accumulate) and on the whole host (the same command in other
sandboxes, e.g. `pip install -e .` of the same project). Strictly causal: `features` reads only
calls already `observe`d, never the call itself, so the trainer (replaying a journal or a trace
in order) and the daemon (live) compute the same vector from the same past.

Pure and stdlib only (crc32 for a hash that is the same in every process, unlike str hash), so
the estimator can hold one in `policy/` and the trainer and the evaluation reuse it.
"""

from __future__ import annotations

import math
import re
import zlib
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from execgate.common.commands import CLASS_RANK, SHELLS, classify_command
from execgate.common.units import MiB

# Bumped whenever the vector's layout or meaning changes: a model trained on another version is
# refused at load (its columns would mean something else).
FEATURE_VERSION = 1
WORD_BUCKETS = 128
CLASSES = tuple(sorted(CLASS_RANK, key=CLASS_RANK.__getitem__))
# Peaks kept per sandbox and per class for the window statistics.
WINDOW = 8
# Commands remembered host-wide and per sandbox, and sandboxes remembered (least recently seen
# forgotten first: the daemon never hears that a sandbox is gone for good).
MAX_COMMANDS = 4096
MAX_SANDBOXES = 4096
# Characters of a command line its words are hashed from, and that name "the same command": an
# agent's 64 KiB argv must not cost the daemon milliseconds per estimate.
MAX_KEY_CHARS = 4096

_TOKEN = re.compile(r"[a-z_][a-z0-9_]*|\d+")

NUMERIC = (
    "declared_mib", "has_declared", "argv_chars", "argv_words",
    "sb_calls", "sb_max", "sb_mean", "sb_last", "sb_last_duration",
    "sbc_calls", "sbc_max", "sbc_last", "sbc_mean",
    "sbcmd_calls", "sbcmd_last", "sbcmd_max", "sbcmd_growth",
    "cmd_calls", "cmd_last", "cmd_max",
    "cls_calls", "cls_max", "cls_mean",
)
NAMES = (*(f"class:{c}" for c in CLASSES), *NUMERIC,
         *(f"word:{i}" for i in range(WORD_BUCKETS)))
N_FEATURES = len(NAMES)


def command_key(argv: Sequence[str]) -> str:
    """The command line with its whitespace normalised, seen through `sh -c` (an agent's shell
    tool wraps every command in one, a trace records the command alone): what "the same
    command" means, and what its words are hashed from."""
    if len(argv) >= 3 and argv[0].rsplit("/", 1)[-1] in SHELLS and argv[1].startswith("-") \
            and argv[1].endswith("c"):
        argv = argv[2:]
    return " ".join(" ".join(argv).split())[:MAX_KEY_CHARS]


def tokens(text: str) -> list[str]:
    """Lower-case words of a command line, numbers folded to one token (line ranges, ports)."""
    return ["0" if t[0].isdigit() else t for t in _TOKEN.findall(text.lower())]


def word_buckets(text: str) -> dict[int, float]:
    """Hashed counts of word unigrams and bigrams (bucket -> count)."""
    words = tokens(text)
    grams = words + [f"{a} {b}" for a, b in pairwise(words)]
    out: dict[int, float] = {}
    for g in grams:
        b = zlib.crc32(g.encode()) % WORD_BUCKETS
        out[b] = out.get(b, 0.0) + 1.0
    return out


def _mib(n: float) -> float:
    return n / MiB


@dataclass
class _Peaks:
    """Count, last, and a window of the recent peaks (MiB) of one key."""

    calls: int = 0
    last: float = 0.0
    prev: float = 0.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def add(self, peak: float) -> None:
        self.calls += 1
        self.prev, self.last = self.last, peak
        self.recent.append(peak)

    def stats(self) -> tuple[float, float, float, float]:
        """calls, last, max, mean of the window; zeros when never seen (-1 would do as well
        for trees, zeros keep the vector readable)."""
        if not self.calls:
            return 0.0, 0.0, 0.0, 0.0
        return (float(self.calls), self.last, max(self.recent),
                math.fsum(self.recent) / len(self.recent))


@dataclass
class _Sandbox:
    all: _Peaks = field(default_factory=_Peaks)
    last_duration: float = 0.0
    by_class: dict[str, _Peaks] = field(default_factory=dict)
    by_command: dict[str, _Peaks] = field(default_factory=dict)


class CallHistory:
    """What earlier calls did, per sandbox and host-wide; the features of the next call."""

    def __init__(self) -> None:
        self._sandboxes: OrderedDict[str, _Sandbox] = OrderedDict()
        self._commands: OrderedDict[str, _Peaks] = OrderedDict()
        self._classes: dict[str, _Peaks] = {}

    def features(self, sandbox: str, argv: Sequence[str], declared_bytes: int | None = None,
                 cls: str | None = None) -> list[float]:
        """The call's vector (NAMES), from the history before it; `cls`: its command class when
        the caller has it already (classifying a long command line is not free)."""
        cls = cls or classify_command(argv)
        key = command_key(argv)
        sb = self._sandboxes.get(sandbox) or _Sandbox()
        empty = _Peaks()
        n, last, mx, mean = sb.all.stats()
        c_n, c_last, c_max, c_mean = sb.by_class.get(cls, empty).stats()
        cmd = sb.by_command.get(key, empty)
        k_n, k_last, k_max, _ = cmd.stats()
        growth = cmd.last - cmd.prev if cmd.calls >= 2 else 0.0
        g = self._commands.get(key, empty)
        g_n, g_last, g_max, _ = g.stats()
        h_n, _, h_max, h_mean = self._classes.get(cls, empty).stats()
        declared = _mib(declared_bytes) if declared_bytes and declared_bytes > 0 else 0.0
        vec = [1.0 if cls == c else 0.0 for c in CLASSES]
        vec += [declared, 1.0 if declared else 0.0, float(len(key)), float(len(key.split())),
                n, mx, mean, last, sb.last_duration,
                c_n, c_max, c_last, c_mean,
                k_n, k_last, k_max, growth,
                g_n, g_last, g_max,
                h_n, h_max, h_mean]
        words = [0.0] * WORD_BUCKETS
        for b, count in word_buckets(key).items():
            words[b] = count
        vec += words
        return vec

    def observe(self, sandbox: str, argv: Sequence[str], peak_bytes: int,
                duration_s: float = 0.0, cls: str | None = None) -> None:
        """Record a finished call (its observed peak) for the calls after it."""
        cls = cls or classify_command(argv)
        key = command_key(argv)
        peak = _mib(max(peak_bytes, 0))
        sb = self._sandboxes.pop(sandbox, None) or _Sandbox()
        self._sandboxes[sandbox] = sb
        while len(self._sandboxes) > MAX_SANDBOXES:
            self._sandboxes.popitem(last=False)
        sb.all.add(peak)
        sb.last_duration = max(duration_s, 0.0)
        sb.by_class.setdefault(cls, _Peaks()).add(peak)
        sb.by_command.setdefault(key, _Peaks()).add(peak)
        if len(sb.by_command) > MAX_COMMANDS:  # a sandbox that never repeats a command
            del sb.by_command[next(iter(sb.by_command))]
        g = self._commands.pop(key, None) or _Peaks()
        g.add(peak)
        self._commands[key] = g
        while len(self._commands) > MAX_COMMANDS:
            self._commands.popitem(last=False)
        self._classes.setdefault(cls, _Peaks()).add(peak)

    def forget_sandbox(self, sandbox: str) -> None:
        """Drop a removed sandbox (its host-wide traces stay)."""
        self._sandboxes.pop(sandbox, None)
