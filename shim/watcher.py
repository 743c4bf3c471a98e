"""The per-call watcher: waits for a tool call to end, records its outcome, removes its cgroup.

With `runc exec --detach` (what containerd uses) the call outlives runc, and its exit status
goes to containerd's shim, the parent. The watcher is a detached grandchild that never touches
the call's stdio, so it can never delay the exec's exit being reported. The end signal is the
tool cgroup emptying (`cgroup.events` populated 0, POLLPRI): race-free, unlike waiting on a pid
the shim may already have reaped. The exit status is read, where the kernel offers it, from a
pidfd (PIDFD_GET_INFO), checked against the tool cgroup's id so a reused pid is never mistaken.
"""

from __future__ import annotations

import fcntl
import os
import select
import struct
import time
from typing import Any

from execgate.cgroups import v2
from execgate.common import records
from execgate.oci.runclog import RuncLog

# struct pidfd_info, first version (64 bytes): mask, cgroupid, eleven ids, exit_code.
_PIDFD_INFO = struct.Struct("=QQ11Ii")
_PIDFD_INFO_CGROUPID = 1 << 2
_PIDFD_INFO_EXIT = 1 << 3
_PIDFD_GET_INFO = (3 << 30) | (64 << 16) | (0xFF << 8) | 11  # _IOWR(0xFF, 11, 64 bytes)


def spawn(call: dict[str, Any], pid_file: str | None, journal: str, log: RuncLog) -> None:
    """Fork the watcher off (double fork) and return at once in the caller."""
    try:
        runtime_pidfd = os.pidfd_open(os.getpid())  # this process, soon to be runc
    except OSError as e:
        log.warning(f"call {call['call']}: no pidfd ({e}); its cgroup is cleaned up later")
        return
    pid = os.fork()
    if pid:
        os.close(runtime_pidfd)
        os.waitpid(pid, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        _detach(keep=runtime_pidfd)
        watch(call, runtime_pidfd, pid_file, journal, log)
    except BaseException as e:  # noqa: BLE001 - a watcher must never raise into anything
        log.warning(f"call {call.get('call')}: watcher failed: {type(e).__name__}: {e}")
    finally:
        os._exit(0)


def _detach(keep: int) -> None:
    """Drop the caller's stdio and every inherited fd: the call's streams must close on time."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    os.closerange(3, keep)
    os.closerange(keep + 1, 65536)


def _wait_readable(fd: int, timeout: float | None = None) -> bool:
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(None if timeout is None else int(timeout * 1000)))


def _wait_empty(cg: str) -> None:
    """Block until the cgroup has no tasks (or is gone)."""
    try:
        fd = os.open(os.path.join(cg, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        p = select.poll()
        p.register(fd, select.POLLPRI | select.POLLERR)
        while True:
            os.lseek(fd, 0, os.SEEK_SET)
            data = os.read(fd, 4096).decode()
            if "populated 0" in data:
                return
            p.poll(5000)  # kernfs notifies; the timeout only guards against a lost wakeup
    finally:
        os.close(fd)


def _open_exec_pidfd(pid_file: str | None) -> int | None:
    if not pid_file:
        return None
    try:
        with open(pid_file) as f:
            return os.pidfd_open(int(f.read().strip()))
    except (OSError, ValueError):
        return None  # already reaped: the status is lost, the memory figures are not


def _exit_status(pidfd: int | None, cgroup_id: int) -> int | None:
    """The exec's wait status as the kernel kept it (Linux >= 6.15), if it is our call's."""
    if pidfd is None:
        return None
    deadline = time.monotonic() + 3.0
    delay = 0.002
    while True:  # the kernel keeps the exit info once the parent (containerd's shim) reaps
        buf = bytearray(_PIDFD_INFO.pack(_PIDFD_INFO_EXIT | _PIDFD_INFO_CGROUPID, 0,
                                         *([0] * 11), 0))
        try:
            fcntl.ioctl(pidfd, _PIDFD_GET_INFO, buf)
        except OSError:
            return None
        mask, cgid, *_ids, code = _PIDFD_INFO.unpack(buf)
        if mask & _PIDFD_INFO_EXIT:
            if mask & _PIDFD_INFO_CGROUPID and cgid != cgroup_id:
                return None
            return code
        if time.monotonic() > deadline:
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def decode_status(status: int | None) -> dict[str, int | None]:
    """A wait status as exit code and signal (exit_code 128+sig for a killed call, as sh does)."""
    if status is None:
        return {"exit_code": None, "signal": None}
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return {"exit_code": 128 + sig, "signal": sig}
    return {"exit_code": os.WEXITSTATUS(status), "signal": None}


def outcome(cg: str) -> dict[str, Any]:
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


def watch(call: dict[str, Any], runtime_pidfd: int, pid_file: str | None, journal: str,
          log: RuncLog) -> None:
    cg = call["cgroup"]
    cgroup_id = os.stat(cg).st_ino
    _wait_readable(runtime_pidfd)  # runc has exited: the call is placed, or never will be
    os.close(runtime_pidfd)
    exec_pidfd = _open_exec_pidfd(pid_file)
    _wait_empty(cg)
    end = time.time()
    entry = dict(call)
    entry.update(outcome(cg))
    if not v2.remove(cg):
        log.warning(f"call {call['call']}: cannot remove {cg}")
    entry.update(decode_status(_exit_status(exec_pidfd, cgroup_id)))
    if entry["exit_code"] is None and entry["oom_kill"]:
        entry.update(exit_code=137, signal=9)
    entry["end"] = end
    entry["duration"] = round(end - call["start"], 6)
    entry["oom_killed"] = bool(entry["oom_kill"] or entry["oom_group_kill"])
    try:
        records.append_journal(journal, entry)
    except OSError as e:
        log.warning(f"call {call['call']}: cannot write journal {journal}: {e}")
