"""What the daemon reads of a process in /proc: its parent, start, cgroup, name, memory, children,
command line, environment, and a handle on its stderr. Each returns None (or empty) once the
process is gone: a short command may end at any point while it is being placed.
"""

from __future__ import annotations

import os


def _stat_field(pid: int, index: int) -> int | None:
    """A numeric field of /proc/PID/stat, counted after the command name (0: state)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2:].split()[index])
    except (OSError, ValueError, IndexError):
        return None


def ppid(pid: int) -> int | None:
    return _stat_field(pid, 1)


def started_ns(pid: int) -> int:
    """When pid started, on CLOCK_MONOTONIC as near as /proc tells (0 if unknown)."""
    ticks = _stat_field(pid, 19)
    return 0 if ticks is None else ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def _proc_text(pid: int, name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/{name}") as f:
            return f.read().strip()
    except OSError:
        return None


def cgroup_path(pid: int) -> str | None:
    return _proc_text(pid, "cgroup")


def comm(pid: int) -> str | None:
    return _proc_text(pid, "comm")


def nul_list(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    return [a.decode("utf-8", "surrogateescape") for a in data.split(b"\0")[:-1]]


def memory_status(pid: int) -> dict[str, int]:
    """VmRSS and RssAnon of a process, in bytes ({} when it is gone)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon"):
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def children(pid: int) -> list[int]:
    """Child processes of every thread of pid (needs CONFIG_PROC_CHILDREN)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def open_stderr(pid: int) -> int | None:
    """A new open file description of the process's stderr, for feedback once it ends.

    O_APPEND so a regular file is never overwritten from offset 0; O_NONBLOCK so a full pipe
    never blocks the daemon; O_NOCTTY so a terminal never becomes ours. Sockets cannot be
    opened this way: such a call gets no feedback.
    """
    try:
        return os.open(f"/proc/{pid}/fd/2", os.O_WRONLY | os.O_APPEND | os.O_NOCTTY
                       | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
