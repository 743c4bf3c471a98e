"""Synthetic agent-task traces calibrated to the published characterisation of coding agents.

Targets (AgentCgroup's SWE-bench measurements of Claude Code in Docker sandboxes):

* ~185 MB framework baseline per sandbox;
* tool-call bursts mostly 10-500 MB, with a rare tail to 2-4 GB that lasts 1-2 s;
* per-task peak/average memory up to ~15x (enforced as a cap: the tail is clipped if beyond);
* tests, installs and builds heavy; git/grep/ls/cat light;
* retry loops: the same test command 3+ times with edits in between, memory accumulating;
* tasks of 5-11 minutes, 26-44 % of it waiting on the LLM.

A task follows the usual agent arc: explore (light calls), maybe install, reproduce, then a
work loop of weighted random calls (with at most one retry loop), and a closing `git diff`.
Tool durations are drawn per category, then scaled so tool time is exactly the task's share;
LLM waits (one before each call, one at the end) split the rest. Task i draws from
random.Random(f"{seed}:{i}"), so output is deterministic and generate(n) is a prefix of
generate(n + k) for the same seed.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from bench.metrics import percentile
from bench.trace import (
    LlmWait,
    MemoryProfile,
    Step,
    Task,
    ToolCall,
    mean_and_peak,
    memory_curve,
    write_tasks,
)
from execgate.common.units import MiB

MB = 1_000_000  # the characterisation's "MB" (docker stats' decimal unit)
HEAVY = ("test", "install", "build")
LIGHT = ("light", "edit")


@dataclass(frozen=True)
class _Cat:
    """Per-category distributions: lognormal (median, sigma) clamped to [lo, hi]."""

    weight: float  # in the work loop
    dur: tuple[float, float, float, float]  # seconds
    peak: tuple[float, float, float, float]  # MB
    floor: tuple[float, float]  # call's own starting memory, fraction of its peak
    shapes: dict[str, float]
    cpu: tuple[float, float]
    retain: tuple[float, float, float] = (0.0, 0.0, 0.0)  # probability, MB range


_CATS: dict[str, _Cat] = {
    "light": _Cat(
        weight=0.50, dur=(0.4, 0.8, 0.05, 3), peak=(18, 0.6, 4, 80), floor=(0.3, 0.8),
        shapes={"plateau": 1}, cpu=(0.05, 0.3),
    ),
    "edit": _Cat(
        weight=0.10, dur=(0.3, 0.5, 0.05, 2), peak=(12, 0.5, 3, 40), floor=(0.3, 0.8),
        shapes={"plateau": 1}, cpu=(0.05, 0.2),
    ),
    "run": _Cat(
        weight=0.12, dur=(3, 0.8, 0.5, 30), peak=(80, 0.8, 15, 600), floor=(0.1, 0.4),
        shapes={"ramp": 0.5, "spike": 0.3, "plateau": 0.2}, cpu=(0.4, 1.0), retain=(0.05, 5, 20),
    ),
    "test": _Cat(
        weight=0.20, dur=(12, 0.8, 2, 120), peak=(180, 0.7, 30, 1200), floor=(0.1, 0.3),
        shapes={"ramp": 0.5, "sawtooth": 0.3, "spike": 0.2}, cpu=(0.6, 1.0), retain=(0.1, 5, 30),
    ),
    "build": _Cat(
        weight=0.04, dur=(20, 0.7, 3, 120), peak=(200, 0.6, 40, 1200), floor=(0.1, 0.3),
        shapes={"ramp": 0.6, "sawtooth": 0.4}, cpu=(0.7, 1.0), retain=(0.3, 10, 60),
    ),
    "install": _Cat(
        weight=0.04, dur=(30, 0.6, 5, 150), peak=(260, 0.5, 60, 1200), floor=(0.1, 0.3),
        shapes={"ramp": 0.6, "plateau": 0.4}, cpu=(0.3, 0.8), retain=(0.8, 20, 150),
    ),
}  # fmt: skip

_REPOS = ("astropy", "django", "sympy", "requests", "flask", "xarray", "pylint", "sphinx",
          "sklearn", "matplotlib", "seaborn", "pytest")  # fmt: skip
_MODS = ("core", "utils", "models", "parser", "io", "api", "config", "cli", "fields", "base")
_SYMS = ("parse_header", "to_dict", "_validate", "get_value", "resolve", "from_config",
         "_render", "normalize", "apply_filter", "decode")  # fmt: skip
_DEPS = ("numpy", "pytest-cov", "hypothesis", "pyyaml", "lxml", "pandas")


@dataclass(frozen=True)
class GenConfig:
    """Knobs of the generator; the defaults are the calibration targets above."""

    baseline_mb: float = 185.0
    baseline_sd_mb: float = 8.0
    duration_range_s: tuple[float, float] = (315.0, 645.0)  # inside 5-11 min
    llm_share_range: tuple[float, float] = (0.28, 0.42)  # inside 26-44 %
    retry_prob: float = 0.6  # tasks with a retry loop
    install_prob: float = 0.6  # tasks that install something before working
    tail_prob: float = 0.012  # per test/build/run call: a 2-4 GB spike
    tail_mb: tuple[float, float] = (2000.0, 4000.0)
    tail_hold_s: tuple[float, float] = (1.0, 2.0)
    max_peak_to_avg: float = 15.0
    hints: str = "none"  # none | class (memory:low|medium|high) | size (mem=<MiB>m)
    weights: dict[str, float] = field(
        default_factory=lambda: {k: c.weight for k, c in _CATS.items()}
    )


@dataclass
class _Draft:
    """A tool call before its duration is scaled to the task's tool-time budget."""

    category: str
    command: str
    dur: float
    peak: float  # MB
    floor: float  # MB
    shape: str
    peak_at: float
    cpu: float
    retained: float = 0.0  # MB
    hold: float = 0.0


def _lognormal(rng: random.Random, spec: tuple[float, float, float, float]) -> float:
    median, sigma, lo, hi = spec
    return min(hi, max(lo, rng.lognormvariate(math.log(median), sigma)))


class _Gen:
    def __init__(self, rng: random.Random, cfg: GenConfig) -> None:
        self.rng = rng
        self.cfg = cfg
        self.repo = rng.choice(_REPOS)
        self.mods = rng.sample(_MODS, 4)

    def _file(self) -> str:
        return f"{self.repo}/{self.rng.choice(self.mods)}.py"

    def _test_file(self) -> str:
        return f"{self.repo}/tests/test_{self.rng.choice(self.mods)}.py"

    def command(self, cat: str) -> str:
        r, f, sym = self.rng, self._file(), self.rng.choice(_SYMS)
        options = {
            "light": [
                "ls -la",
                f"ls {self.repo}/",
                f"cat {f}",
                f"head -80 {f}",
                f"wc -l {f}",
                f"sed -n '{(a := r.randint(1, 400))},{a + 60}p' {f}",
                f'grep -rn "{sym}" {self.repo}/',
                f'rg -n "{sym}" {self.repo}',
                "git status",
                "git diff",
                "git log --oneline -5",
                f"find . -name '*{r.choice(self.mods)}*.py'",
            ],
            "edit": [f"sed -i 's/{sym}(/{sym}_checked(/' {f}", "patch -p1 < /tmp/fix.diff"],
            "run": [
                "python reproduce.py",
                "python reproduce_issue.py",
                f'python -c "import {self.repo}; print({self.repo}.__version__)"',
            ],
            "test": [
                f"python -m pytest {self._test_file()} -x -q",
                f"pytest {self._test_file()}::test_{sym} -x",
                f"python -m pytest {self.repo}/tests -q -k {sym}",
                "tox -e py311",
            ],
            "build": ["python setup.py build_ext --inplace", "make -j4"],
            "install": [
                "pip install -e .",
                "pip install -r requirements-dev.txt",
                f"pip install {r.choice(_DEPS)}",
                "python setup.py develop",
            ],
        }
        return r.choice(options[cat])

    def draft(self, cat: str, command: str | None = None) -> _Draft:
        r, c = self.rng, _CATS[cat]
        shape = r.choices(list(c.shapes), weights=list(c.shapes.values()))[0]
        peak = _lognormal(r, c.peak)
        d = _Draft(
            category=cat,
            command=command or self.command(cat),
            dur=_lognormal(r, c.dur),
            peak=peak,
            floor=peak * r.uniform(*c.floor),
            shape=shape,
            peak_at=r.uniform(0.2, 0.5) if shape == "sawtooth" else r.uniform(0.3, 0.9),
            cpu=r.uniform(*c.cpu),
        )
        if c.retain[0] and r.random() < c.retain[0]:
            d.retained = min(d.peak, r.uniform(c.retain[1], c.retain[2]))
        if cat in ("test", "build", "run") and r.random() < self.cfg.tail_prob:
            d.peak = r.uniform(*self.cfg.tail_mb)
            d.floor = r.uniform(30, 150)
            d.shape, d.peak_at = "spike", r.uniform(0.3, 0.8)
            d.hold = r.uniform(*self.cfg.tail_hold_s)
            d.dur = max(d.dur, d.hold + 2.0)
        return d

    def retry_loop(self) -> list[_Draft]:
        """The same test command 3-5 times with edits between; each run needs and keeps more."""
        r = self.rng
        first = self.draft("test")
        first.hold, first.shape = 0.0, "ramp"
        first.peak = min(first.peak, 800.0)
        growth = r.uniform(0.08, 0.2)
        out: list[_Draft] = []
        for k in range(r.randint(3, 5)):
            d = self.draft("test", command=first.command)
            d.shape, d.hold, d.peak_at = "ramp", 0.0, first.peak_at
            d.peak = first.peak * (1 + growth * k)
            d.floor = min(d.floor, d.peak)
            d.retained = r.uniform(10, 60)
            out.append(d)
            for _ in range(r.randint(1, 3)):
                out.append(self.draft(r.choice(LIGHT)))
        return out


def _hint(cfg: GenConfig, peak_bytes: int) -> str | None:
    if cfg.hints == "none":
        return None
    if cfg.hints == "size":
        return f"mem={max(1, math.ceil(peak_bytes / MiB))}m"
    if cfg.hints == "class":
        level = "low" if peak_bytes <= 256 * MiB else "medium" if peak_bytes <= 1 << 30 else "high"
        return f"memory:{level}"
    raise ValueError(f"hints must be none, class or size (got {cfg.hints!r})")


def generate_task(seed: int | str, index: int, cfg: GenConfig | None = None) -> Task:
    """Task `index` of the series for `seed` (independent of how many others are generated)."""
    cfg = cfg or GenConfig()
    _hint(cfg, 0)  # reject a bad hints mode before drawing anything
    rng = random.Random(f"{seed}:{index}")
    g = _Gen(rng, cfg)
    total = rng.uniform(*cfg.duration_range_s)
    share = rng.uniform(*cfg.llm_share_range)
    budget = total * (1 - share)

    drafts = [g.draft("light") for _ in range(rng.randint(3, 8))]
    if rng.random() < cfg.install_prob:
        drafts += [g.draft("install") for _ in range(rng.randint(1, 2))]
    drafts.append(g.draft("run"))
    retry_pending = rng.random() < cfg.retry_prob
    retry_runs = 0
    cats, weights = list(cfg.weights), list(cfg.weights.values())
    closing = g.draft("light", command="git diff")
    used = sum(d.dur for d in drafts) + closing.dur
    while used < budget:
        if retry_pending and rng.random() < 0.25:
            new = g.retry_loop()
            retry_pending = False
            retry_runs = sum(d.category == "test" for d in new)
        else:
            new = [g.draft(rng.choices(cats, weights=weights)[0])]
        drafts += new
        used += sum(d.dur for d in new)
    if retry_pending:  # budget ran out first: the loop still happens, everything gets shorter
        new = g.retry_loop()
        retry_runs = sum(d.category == "test" for d in new)
        drafts += new
        used += sum(d.dur for d in new)
    drafts.append(closing)

    scale = budget / used
    waits = [rng.lognormvariate(0.0, 0.7) for _ in range(len(drafts) + 1)]
    wait_scale = (total - budget) / sum(waits)
    steps: list[Step] = []
    for d, w in zip(drafts, waits, strict=False):
        dur = round(d.dur * scale, 3)
        peak = round(d.peak * MB)
        mem = MemoryProfile(
            baseline_bytes=min(round(d.floor * MB), peak),
            peak_bytes=peak,
            shape=d.shape,
            peak_at=round(d.peak_at, 4),
            cpu_share=round(d.cpu, 3),
            retained_bytes=min(round(d.retained * MB), peak),
            hold_s=round(min(d.hold, 0.8 * dur), 3),
        )
        steps.append(LlmWait(round(w * wait_scale, 3)))
        steps.append(ToolCall(d.command, dur, mem, _hint(cfg, peak), "Bash", d.category))
    steps.append(LlmWait(round(waits[-1] * wait_scale, 3)))

    baseline = round(max(150.0, rng.gauss(cfg.baseline_mb, cfg.baseline_sd_mb)) * MB)
    meta = {
        "generator": "bench.generate",
        "seed": seed,
        "index": index,
        "target_duration_s": round(total, 3),
        "target_llm_share": round(share, 4),
        "retry_loop_runs": retry_runs,
    }
    task = Task(f"syn-{seed}-{index:04d}", steps, baseline, meta)
    _cap_peak_to_avg(task, cfg.max_peak_to_avg)
    return task


def _cap_peak_to_avg(task: Task, cap: float) -> None:
    """Clip the task's highest call until peak/average <= cap (the published maximum ~15x)."""
    for _ in range(20):
        mean, peak = mean_and_peak(memory_curve(task, dt=0.25))
        if peak <= cap * mean:
            return
        retained, best, best_i, before = 0, -1, -1, 0
        for i, s in enumerate(task.steps):
            if isinstance(s, ToolCall):
                if retained + s.memory.peak_bytes > best:
                    best, best_i, before = retained + s.memory.peak_bytes, i, retained
                retained += s.memory.retained_bytes
        call = task.steps[best_i]
        assert isinstance(call, ToolCall)
        m = call.memory
        target = int(0.98 * cap * mean) - task.baseline_bytes - before
        new_peak = max(m.baseline_bytes, m.retained_bytes, min(target, int(m.peak_bytes * 0.9)))
        if new_peak >= m.peak_bytes:
            return  # nothing left to clip
        task.steps[best_i] = ToolCall(
            call.command,
            call.duration_s,
            MemoryProfile(
                m.baseline_bytes,
                new_peak,
                m.shape,
                m.peak_at,
                m.cpu_share,
                m.retained_bytes,
                m.hold_s,
            ),
            call.hint,
            call.tool,
            call.category,
        )


def generate(n_tasks: int, seed: int | str, config: GenConfig | None = None) -> list[Task]:
    """`n_tasks` synthetic tasks; the same (n, seed, config) always yields the same traces."""
    if n_tasks < 0:
        raise ValueError("n_tasks must be >= 0")
    return [generate_task(seed, i, config) for i in range(n_tasks)]


def _dist(xs: Sequence[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "min": min(xs),
        "p50": percentile(xs, 50),
        "mean": sum(xs) / len(xs),
        "p95": percentile(xs, 95),
        "max": max(xs),
    }


def _longest_rise(xs: Sequence[int]) -> int:
    """Length of the longest run of non-decreasing consecutive values."""
    best = cur = 1 if xs else 0
    for a, b in pairwise(xs):
        cur = cur + 1 if b >= a else 1
        best = max(best, cur)
    return best


def calibration_stats(tasks: Sequence[Task]) -> dict[str, Any]:
    """The figures the generator is calibrated against, measured on any traces (also imported).

    A burst is a call's peak_bytes (what it adds over the sandbox's memory before it). A retry
    loop is one command run 3+ times in a row, with only light/edit calls between the runs; it
    accumulates when the sandbox memory at the runs' peaks rises (non-strictly) over 3+ runs.
    """
    bursts: list[float] = []
    by_cat: dict[str, list[float]] = {}
    tail_holds: list[float] = []
    ratios, durations, shares, baselines = [], [], [], []
    retry_tasks = accumulating = 0
    max_repeats = 0
    for t in tasks:
        baselines.append(t.baseline_bytes / MB)
        durations.append(t.duration_s / 60)
        shares.append(t.llm_wait_s / t.duration_s if t.duration_s else 0.0)
        mean, peak = mean_and_peak(memory_curve(t, dt=0.25))
        ratios.append(peak / mean if mean else 0.0)
        retained = 0
        loops: list[list[int]] = []
        current: tuple[str, list[int]] | None = None  # (command, sandbox memory at each peak)
        for c in t.tool_calls:
            mb = c.memory.peak_bytes / MB
            bursts.append(mb)
            by_cat.setdefault(c.category, []).append(mb)
            if mb >= 2000:
                tail_holds.append(c.memory.hold_s)
            if c.category not in LIGHT:  # light/edit calls between runs don't break a loop
                if current and current[0] == c.command:
                    current[1].append(retained + c.memory.peak_bytes)
                else:
                    if current and len(current[1]) >= 3:
                        loops.append(current[1])
                    current = (c.command, [retained + c.memory.peak_bytes])
            retained += c.memory.retained_bytes
        if current and len(current[1]) >= 3:
            loops.append(current[1])
        if loops:
            retry_tasks += 1
            max_repeats = max(max_repeats, *(len(v) for v in loops))
            if any(_longest_rise(v) >= 3 for v in loops):
                accumulating += 1
    n = len(tasks) or 1
    cat_mean = {k: sum(v) / len(v) for k, v in sorted(by_cat.items())}
    heavy = [x for k in HEAVY for x in by_cat.get(k, [])]
    light = [x for k in LIGHT for x in by_cat.get(k, [])]
    return {
        "n_tasks": len(tasks),
        "n_tool_calls": len(bursts),
        "baseline_mb": _dist(baselines),
        "burst_mb": _dist(bursts),
        "frac_bursts_10_500mb": sum(10 <= b <= 500 for b in bursts) / (len(bursts) or 1),
        "n_bursts_ge_2gb": len(tail_holds),
        "tail_hold_s": _dist(tail_holds),
        "peak_to_avg": _dist(ratios),
        "duration_min": _dist(durations),
        "llm_wait_share": _dist(shares),
        "frac_tasks_with_retry_loop": retry_tasks / n,
        "frac_tasks_with_accumulating_retry": accumulating / n,
        "max_retry_repeats": max_repeats,
        "category_calls": dict(
            sorted(Counter(c.category for t in tasks for c in t.tool_calls).items())
        ),
        "category_mean_burst_mb": cat_mean,
        "heavy_mean_burst_mb": sum(heavy) / len(heavy) if heavy else 0.0,
        "light_mean_burst_mb": sum(light) / len(light) if light else 0.0,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.generate",
        description="Generate calibrated synthetic agent traces (JSONL).",
    )
    ap.add_argument("-n", "--tasks", type=int, default=20, help="number of tasks (default 20)")
    ap.add_argument("--seed", default="1", help="seed (default 1); same seed, same traces")
    ap.add_argument("-o", "--output", default="-", help="output JSONL (default: stdout)")
    ap.add_argument(
        "--hints",
        choices=("none", "class", "size"),
        default="none",
        help="attach AGENT_RESOURCE_HINT to each tool call",
    )
    ap.add_argument("--retry-prob", type=float, default=GenConfig.retry_prob)
    ap.add_argument("--tail-prob", type=float, default=GenConfig.tail_prob)
    ap.add_argument("--stats", action="store_true", help="print calibration stats to stderr")
    args = ap.parse_args(argv)
    if args.tasks < 0:
        ap.error("-n must be >= 0")
    seed: int | str = int(args.seed) if args.seed.lstrip("-").isdigit() else args.seed
    cfg = GenConfig(hints=args.hints, retry_prob=args.retry_prob, tail_prob=args.tail_prob)
    tasks = generate(args.tasks, seed, cfg)
    if args.output == "-":
        write_tasks(tasks, sys.stdout)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            write_tasks(tasks, f)
    if args.stats:
        import json

        print(json.dumps(calibration_stats(tasks), indent=2), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
