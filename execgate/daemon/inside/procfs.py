"""What the daemon reads of a process in /proc: its parent, start, cgroup, name, memory, children,
command line, environment, and its very stderr. Each returns None (or empty) once the
process is gone: a short command may end at any point while it is being placed.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import stat
import time

from execgate.common.libc import libc


def _stat_fields(pid: int | str) -> list[bytes]:
    """The fields of /proc/PID/stat after the command name (0: state); [] once it is gone.
    pid may be "TGID/task/TID": a thread's own (/proc/TID/stat counts its whole process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2:].split()
    except (OSError, ValueError):
        return []


def _stat_field(pid: int, index: int) -> int | None:
    """A numeric field of /proc/PID/stat, counted after the command name (0: state)."""
    try:
        return int(_stat_fields(pid)[index])
    except (ValueError, IndexError):
        return None


def ppid(pid: int) -> int | None:
    return _stat_field(pid, 1)


def started_ns(pid: int) -> int:
    """When pid started, on CLOCK_MONOTONIC as near as /proc tells (0 if unknown)."""
    ticks = _stat_field(pid, 19)
    return 0 if ticks is None else ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int, thread_of: int | None = None) -> float | None:
    """User + system CPU seconds of a process, or of one of its threads by its id (thread_of:
    the process's pid; /proc/TID/stat alone counts the whole process)."""
    fields = _stat_fields(pid if thread_of is None else f"{thread_of}/task/{pid}")
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (ValueError, IndexError):
        return None


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


def state(pid: int) -> str | None:
    """Its state letter (R, S, D, Z...), None once it is gone."""
    fields = _stat_fields(pid)
    return fields[0].decode() if fields else None


def alive(pid: int) -> bool:
    """It exists and is not a zombie (a live process has a command line once its exec is done)."""
    return state(pid) not in (None, "Z", "X")


def exec_image(pid: int, within_s: float = 0.05) -> tuple[list[str], list[str]]:
    """Its command line and environment, read as one program's.

    A process caught inside execve has neither: the kernel switches it to the new program's
    memory before it writes the arguments there, and until then /proc reads both as empty (a
    call placed in that window lost its hint: `sh -c 'memhog ...'` execs memhog a few ms after
    its own exec, seen under TCG). A live process always has a command line once its exec is
    done (the kernel gives an empty argv one empty argument), so while it reads empty, or
    changes between two reads, wait a moment, at most `within_s`. A zombie's stays empty.
    """
    deadline = time.monotonic() + within_s
    while True:
        argv = nul_list(f"/proc/{pid}/cmdline")
        environ = nul_list(f"/proc/{pid}/environ")
        if argv and nul_list(f"/proc/{pid}/cmdline") == argv:
            return argv, environ
        if not alive(pid) or time.monotonic() >= deadline:
            return argv, environ
        time.sleep(0.0005)


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


def _pidfd_getfd(pid: int, target: int) -> int:
    """A duplicate of another process's descriptor (pidfd_getfd(2), close-on-exec): the very
    open file description it holds, with its access mode; OSError if it cannot be had."""
    pidfd = os.pidfd_open(pid)
    try:
        fd = libc().syscall(_SYS_PIDFD_GETFD, pidfd, target, 0)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return int(fd)
    finally:
        os.close(pidfd)


def take_stderr(pid: int) -> int | None:
    """The process's own stderr, for feedback once it ends; None if nothing may be written.

    Never reopened by path as root (that could append to a file the process only reads):
    pidfd_getfd takes the very descriptor, and one not open for writing gets no feedback. A
    pipe or terminal is then reopened through our copy, with the same write-only access but
    our own O_NONBLOCK (setting it on the shared description would change the process's
    stream), so a full pipe or a stopped terminal never blocks the daemon. A regular file is
    written through the shared description, at the process's own offset. A blocking socket
    cannot be reopened: such a call gets no feedback.
    """
    try:
        fd = _pidfd_getfd(pid, 2)
    except OSError:
        return None
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        if flags & os.O_ACCMODE == os.O_RDONLY:
            return _closed(fd)
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode) or flags & os.O_NONBLOCK:
            return fd
        if stat.S_ISSOCK(mode):
            return _closed(fd)
        own = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK
                      | os.O_CLOEXEC)
    except OSError:
        return _closed(fd)
    os.close(fd)
    return own


def _closed(fd: int) -> None:
    os.close(fd)


_SYS_PIDFD_GETFD = 438  # x86_64's and the generic table's (arm64, riscv) alike
