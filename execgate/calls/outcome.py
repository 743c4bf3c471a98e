"""A finished call's journal line: what the kernel kept in its cgroup, its exit, the gate's part.

The runtime's watcher and the daemon (inside agents) both write it, so a call journals alike
whichever door it came in by, and the daemon learns from both the same way.
"""

from __future__ import annotations

import os

from execgate.cgroups import v2
from execgate.common import records

from .record import ToolCall

TYPE_CHECKING = False  # typing's, without importing typing on the exec path
if TYPE_CHECKING:
    from typing import Any


def decode_status(status: int | None) -> dict[str, int | None]:
    """A wait status as exit code and signal (exit_code 128+sig for a killed call, as sh does)."""
    if status is None:
        return {"exit_code": None, "signal": None}
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return {"exit_code": 128 + sig, "signal": sig}
    return {"exit_code": os.WEXITSTATUS(status), "signal": None}


def kept(cg: str) -> dict[str, Any]:
    """What the kernel kept about a finished call's cgroup."""
    events = v2.read_keyed(cg, "memory.events")
    cpu = v2.read_keyed(cg, "cpu.stat")
    return {
        "memory_peak": v2.read_int(cg, "memory.peak"),
        "oom_kill": events.get("oom_kill", 0),
        "oom_group_kill": events.get("oom_group_kill", 0),
        "memory_max_events": events.get("max", 0),
        "cpu_usec": cpu.get("usage_usec"),
        "pids_peak": v2.read_int(cg, "pids.peak"),
    }


def conclude(call: ToolCall, end: float, gate: dict[str, Any] | None) -> dict[str, Any]:
    """A finished call's journal entry, all but its exit status: what the kernel kept in its
    (empty) cgroup and what the growth gate did (the daemon's `done` answer, None if unmanaged)."""
    entry = call.journal()
    entry.update(kept(call.cgroup))
    entry["duration"] = round(end - float(call.start), 6)  # type: ignore[arg-type]
    entry["held_s"] = float(gate.get("held_s") or 0.0) if gate else 0.0
    entry["killed_by_execgate"] = bool(gate and gate.get("killed_by_execgate"))
    entry["oom_killed"] = bool(entry["oom_kill"] or entry["oom_group_kill"]
                               or entry["killed_by_execgate"])
    return entry


def record(entry: dict[str, Any], status: int | None, end: float, journal: str, log: Any) -> None:
    """Complete the entry with the exit status (a wait status, None if unknown) and append it."""
    entry.update(decode_status(status))
    if entry["exit_code"] is None and entry["oom_kill"]:
        entry.update(exit_code=137, signal=9)
    if entry["exit_code"] is None and entry["killed_by_execgate"]:
        entry.update(exit_code=137, signal=9)
    entry["end"] = end
    try:
        records.append_journal(journal, entry)
    except OSError as e:
        log.warning(f"call {entry['call']}: cannot write journal {journal}: {e}")
