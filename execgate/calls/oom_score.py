"""A tool call is the kernel's preferred OOM victim, never the agent or the sandbox's init —
unless the growth gate holds it.

Both front doors raise it as soon as the call's process is seen: the runtime's watcher (runc
1.1 ignores an exec spec's oomScoreAdj) and the daemon when it places an inside call. A call
the gate holds keeps what it allocated and cannot grow; at the tool value it would be the
kernel's first choice (issue 15: every call held in the 4x and 8.6x sweeps ended OOM-killed).
So while held its tasks get a lower value (`lower`), and get theirs back when released
(`restore`): the kernel then picks a running grower, not the call we stopped.
"""

from __future__ import annotations

import os

PROC = "/proc"


def raise_oom_score_adj(pid: int, value: int) -> None:
    """Make the call the kernel's preferred OOM victim (its children inherit the value)."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "r+") as f:
            if int(f.read()) < value:
                f.seek(0)
                f.write(str(value))
    except (OSError, ValueError):
        pass


def held_value(current: int, held: int) -> int | None:
    """What a held call's task gets: the held value if it is lower, else nothing to write."""
    return held if current > held else None


def restored_value(pid: int, current: int, saved: dict[int, int], held: int,
                   tool: int) -> int | None:
    """What a released task gets back: the value it had before the hold; a task born while
    held (it inherited the held value) gets the tool value; one changed since by someone else
    is left alone (None)."""
    if pid in saved:
        return saved[pid] if current == min(saved[pid], held) else None
    return tool if current == held and tool > held else None


def _procs(cgroup: str) -> list[int]:
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as f:
            return [int(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def _read(pid: int, proc: str) -> int | None:
    try:
        with open(f"{proc}/{pid}/oom_score_adj") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _write(pid: int, value: int, proc: str) -> bool:
    try:
        with open(f"{proc}/{pid}/oom_score_adj", "w") as f:
            f.write(str(value))
        return True
    except OSError:
        return False


def lower(cgroup: str, held: int, saved: dict[int, int], proc: str = PROC) -> int:
    """Give every task of a held call's cgroup above the held value that value; record in
    saved (pid -> old value) the tasks lowered for the first time. Called again while held,
    it catches tasks the call forked or another writer raised since. Returns how many were
    lowered now."""
    n = 0
    for pid in _procs(cgroup):
        current = _read(pid, proc)
        if current is None:
            continue
        value = held_value(current, held)
        if value is None:
            continue  # at or below the held value already (or born while held: inherited)
        saved.setdefault(pid, current)
        if _write(pid, value, proc):
            n += 1
    return n


def restore(cgroup: str, held: int, tool: int, saved: dict[int, int], proc: str = PROC) -> int:
    """Give a released call's tasks their value back (see restored_value). Returns how many."""
    n = 0
    for pid in _procs(cgroup):
        current = _read(pid, proc)
        if current is None:
            continue
        value = restored_value(pid, current, saved, held, tool)
        if value is not None and value != current and _write(pid, value, proc):
            n += 1
    saved.clear()
    return n
