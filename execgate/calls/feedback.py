"""Every word execgate writes to a tool call's stderr, and nothing else does.

The reader is an AI agent that sees the call's output mixed with ours, so each line carries one
tag, `[execgate]`. AgentCgroup, the prior art for this feedback loop, prefixes its OOM advice
with a bracketed word on its first lines (`[Resource] Command killed (OOM, ...)`); we keep that
shape but put the tag on *every* line and name ourselves instead: `[Resource]` could as well be
printed by the program under test, while `[execgate]` tells the agent (and a human grepping a
transcript) exactly who is speaking and where to look for documentation.

Messages are short (at most 5 lines of at most 160 ASCII characters), say what happened in the
agent's terms, and end with something it can do differently on its next call.
"""

from __future__ import annotations

import math

from execgate.common import commands
from execgate.common.commands import NODE_PMS
from execgate.common.hints import ENV_NAME, escape, quote
from execgate.common.units import GiB, MiB

TAG = "[execgate]"
MAX_LINE = 160
MAX_LINES = 5

_SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_TEST_EXAMPLES = {
    "pytest": "pytest path/to/test_one.py",
    "py.test": "pytest path/to/test_one.py",
    "unittest": "python -m unittest tests.test_one",
    "go": "go test ./path/to/pkg",
    "cargo": "cargo test one_test_name",
}


def _line(text: str) -> str:
    """One tagged line, made ASCII and printable, cut to MAX_LINE."""
    line = f"{TAG} {escape(text)}"
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."


def _message(*lines: str) -> str:
    return "".join(_line(t) + "\n" for t in lines[:MAX_LINES])


def fmt_size(n: int | float) -> str:
    """Binary units with one decimal below 10 (`2.1 GiB`, `312 MiB`), as `free -h` users read."""
    value = max(float(n), 0.0) if math.isfinite(n) else 0.0
    unit = 0
    while unit < len(_SIZE_UNITS) - 1 and round(value, 1 if value < 10 else 0) >= 1024:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{round(value)} B"
    text = f"{value:.1f}" if round(value, 1) < 10 else f"{value:.0f}"
    return f"{text.removesuffix('.0')} {_SIZE_UNITS[unit]}"


def fmt_duration(seconds: float) -> str:
    """`4.2 s` under ten seconds, whole seconds up to a minute, then `1 min 5 s` / `1 h 2 min`."""
    s = max(seconds, 0.0) if math.isfinite(seconds) else 0.0
    if round(s, 1) < 10:
        return f"{s:.1f} s"
    whole = round(s)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        minutes, secs = divmod(whole, 60)
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(round(s / 60), 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def suggested_hint_bytes(peak_bytes: int) -> int:
    """The next clean size strictly above a peak: 256 MiB steps up to 1 GiB, then whole GiB.

    Strictly above, because a call killed at its peak needed more than that peak; clean, so the
    agent can repeat the value in a hint without doing arithmetic.
    """
    step = 256 * MiB if peak_bytes < GiB else GiB
    return (max(peak_bytes, 0) // step + 1) * step


def _hint_size(n: int) -> str:
    return f"{n // GiB}g" if n % GiB == 0 else f"{n // MiB}m"


def classify(argv: list[str]) -> tuple[str, str]:
    """('test' | 'install' | 'other', tool): the advice's view of the one command class
    (common/commands.py, the estimator's too): a test run, a package install (a build is
    `build_install` too, but "install fewer packages" is no advice for it), or anything else."""
    command = commands.classify(argv)
    if command.cls == commands.TEST:
        return "test", command.tool
    if command.install:
        return "install", command.tool
    return "other", ""


def _narrowing_advice(argv: list[str]) -> str:
    kind, tool = classify(argv)
    if kind == "test":
        example = _TEST_EXAMPLES.get(tool, "")
        if tool in NODE_PMS:
            example = f"{tool} test -- path/to/one.test.js"
        tail = f" (e.g. `{example}`)" if example else ""
        return f"Fix: run one test file or package instead of the whole suite{tail}."
    if kind == "install":
        return f"Fix: install fewer packages at once, e.g. one or two per `{tool} install`."
    return "Fix: do less per call, e.g. process less data at once or split it into smaller steps."


def oom_killed(
    peak_bytes: int | None,
    available_bytes: int | None,
    limit_bytes: int | None,
    argv: list[str],
    by: str = "kernel",
) -> str:
    """The call died of memory: say so, give the numbers, and offer two ways forward.

    When the call reached its container's limit, a hint cannot help (execgate never raises a
    limit), so the message says that instead of suggesting one.
    """
    if by == "execgate":
        what = "Out of memory: execgate killed this call as a last resort, host memory ran out."
    else:
        what = "Out of memory: the kernel OOM-killed this call."
    facts = [
        f"Peak memory {fmt_size(peak_bytes) if peak_bytes is not None else 'unknown'}",
        f"available {fmt_size(available_bytes) if available_bytes is not None else 'unknown'}",
    ]
    if limit_bytes is not None:
        facts.append(f"container limit {fmt_size(limit_bytes)}")
    lines = [what, "; ".join(facts) + ".", _narrowing_advice(argv)]

    if peak_bytes is None:
        lines.append(
            f"Or declare {ENV_NAME}=memory:<size> (e.g. memory:2g) so the call starts"
            " only when that much memory is free."
        )
        return _message(*lines)
    want = suggested_hint_bytes(peak_bytes)
    # Killed within 5% of the container's limit: the limit, not the host, was what ran out.
    if limit_bytes is not None and (want > limit_bytes or peak_bytes >= 0.95 * limit_bytes):
        lines.append(
            f"A hint cannot help: the call needs more than the container's"
            f" {fmt_size(limit_bytes)} limit, which execgate never raises."
        )
    else:
        lines.append(
            f"Or declare {ENV_NAME}=memory:{_hint_size(want)} so the call starts"
            " only when that much memory is free."
        )
    return _message(*lines)


def admission_delayed(waited_s: float, reason: str = "host memory pressure") -> str:
    """Explain a slow start before the agent concludes the command hung."""
    return _message(
        f"This call waited {fmt_duration(waited_s)} before starting ({reason});"
        " it was delayed, not hung."
    )


def admission_waiting(waited_s: float, reason: str) -> str:
    """While a call waits to start (every 10 s): how long so far and why, so the agent neither
    takes the silence for a hang nor retries (a retry queues behind this very call)."""
    why = f" ({reason})" if reason else ""
    return _message(f"Waiting for memory for {fmt_duration(waited_s)}{why};"
                    " it starts on its own, do not retry.")


def gate_held(held_s: float, run_s: float) -> str:
    """Explain a slow run: time spent paused while host memory was short is not the command's."""
    share = 100 if run_s <= 0 else min(100, round(100 * max(held_s, 0.0) / run_s))
    return _message(
        f"This call was paused by the memory growth gate for {fmt_duration(held_s)} of its"
        f" {fmt_duration(run_s)} run ({share}%) while host memory was short; it was not hung."
    )


def hint_ignored(value: str, reason: str) -> str:
    """Tell the agent its hint did nothing, and why, so it can fix the next one."""
    head = f"Ignored {ENV_NAME}={quote(value)}: "
    tail = "; the call ran without a hint."
    room = MAX_LINE - len(TAG) - 1 - len(head) - len(tail)
    why = escape(reason).removeprefix(quote(value) + ": ")  # the parser names the item too
    if len(why) > room:
        why = why[: max(room - 3, 0)] + "..."
    return _message(head + why + tail)


def should_report_delay(waited_s: float, threshold_s: float = 2.0) -> bool:
    """Short waits are noise to an agent; only waits it might mistake for a hang are reported."""
    return math.isfinite(waited_s) and waited_s >= threshold_s


def should_report_hold(held_s: float, run_s: float, share: float = 0.2) -> bool:
    """Report a hold only when it was a noticeable part of the call's wall time."""
    if not (math.isfinite(held_s) and math.isfinite(run_s)) or held_s <= 0 or run_s <= 0:
        return False
    return held_s >= share * run_s


def compose(*messages: str) -> bytes:
    """Messages joined for a single write(2), so they are not interleaved with the call's output."""
    text = "".join(m if m.endswith("\n") else m + "\n" for m in messages if m)
    return text.encode("ascii", "backslashreplace")
