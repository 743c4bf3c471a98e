"""Telling the agent: feedback on a call's own stderr, or its terminal for a TTY call.

Nothing is written for a call that simply succeeded. The wording is feedback.py's; how it
reaches a raw or cooked terminal is terminal.py's. Both are imported only once there is
something to say: the runtime's watcher imports this module before the call runs.
"""

from __future__ import annotations

import os

from execgate.cgroups import v2
from execgate.common import meminfo

from .record import ToolCall

TYPE_CHECKING = False  # typing's, without importing typing on the exec path
if TYPE_CHECKING:
    from typing import Any


def say(stream: int, tty: bool, messages: list[str]) -> str | None:
    """Write feedback messages to a call's stderr, or its terminal for a TTY call; the error
    if the stream would not take them (the reader is gone: nothing else to do)."""
    from . import feedback, terminal

    try:
        if tty:
            terminal.write_to_terminal(stream, "".join(messages))
        else:
            os.write(stream, feedback.compose(*messages))
    except OSError as e:
        return str(e)
    return None


def oom_message(call: ToolCall, entry: dict[str, Any]) -> str:
    """The OOM note: the call's peak against what its container had left."""
    from . import feedback

    parent = os.path.dirname(call.cgroup)
    limit = v2.read_int(parent, "memory.max")
    used = v2.read_int(parent, "memory.current")
    if limit is not None and used is not None:
        available = max(limit - used, 0)
    else:
        available = meminfo.available()
    by = "execgate" if entry.get("killed_by_execgate") else "kernel"
    return feedback.oom_killed(entry.get("memory_peak"), available, limit, call.argv or [], by=by)


def _tell_agent(call: ToolCall, entry: dict[str, Any], stderr: int,
                told_oom: bool = False) -> str | None:
    """Feedback written before the stream closes. An admission delay was told before the call
    started, a kernel OOM kill the moment it happened (told_oom); the rest is told here."""
    from . import feedback  # only now: the call is over, nobody waits on us

    messages = []
    held, run = entry.get("held_s") or 0.0, entry.get("duration") or 0.0
    if feedback.should_report_hold(held, run):
        messages.append(feedback.gate_held(held, run))
    if entry["oom_killed"] and not told_oom:
        messages.append(oom_message(call, entry))
    return say(stderr, call.tty, messages) if messages else None


def tell_and_close(call: ToolCall, entry: dict[str, Any], stderr: int | None,
                   told_oom: bool = False) -> str | None:
    """Feedback (if any) on the call's kept stderr, then let go of it: the agent may be
    waiting for that stream's EOF. The write's error, if any."""
    if stderr is None:
        return None
    try:
        return _tell_agent(call, entry, stderr, told_oom)
    finally:
        os.close(stderr)
