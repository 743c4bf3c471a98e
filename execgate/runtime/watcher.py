"""The per-call watcher: waits for a tool call to end, records its outcome, removes its cgroup.

With `runc exec --detach` (what containerd uses) the call outlives runc, and its exit status
goes to containerd's shim, the parent. The watcher is a detached grandchild that never touches
the call's stdio, so it can never delay the exec's exit being reported. The end signal is the
tool cgroup emptying (`cgroup.events` populated 0, POLLPRI): race-free, unlike waiting on a pid
the shim may already have reaped. The exit status is read, where the kernel offers it, from a
pidfd (PIDFD_GET_INFO), checked against the tool cgroup's id so a reused pid is never mistaken.

Only the process mechanics are here: the journal line (calls/outcome.py) and what the agent is
told (calls/tell.py) are shared with the daemon's inside agents.
"""

from __future__ import annotations

import fcntl
import os
import select
import struct
import time
from collections.abc import Callable

from execgate.calls import outcome, tell
from execgate.calls.oom_score import raise_oom_score_adj
from execgate.cgroups import v2
from execgate.oci.runclog import RuncLog

from . import admit

TYPE_CHECKING = False  # typing's, without importing typing on the exec path
if TYPE_CHECKING:
    from typing import Any

    from execgate.calls import terminal
    from execgate.calls.record import ToolCall

# struct pidfd_info, first version (64 bytes): mask, cgroupid, eleven ids, exit_code.
_PIDFD_INFO = struct.Struct("=QQ11Ii")
_PIDFD_INFO_CGROUPID = 1 << 2
_PIDFD_INFO_EXIT = 1 << 3
_PIDFD_GET_INFO = (3 << 30) | (64 << 16) | (0xFF << 8) | 11  # _IOWR(0xFF, 11, 64 bytes)
# Until it has traced a held call, the watcher runs ahead of the host's other work: a call
# OOM-killed within a second must not end while the watcher waits for a CPU.
HOLD_NICE = -10


def spawn(call: ToolCall, pid_file: str | None, journal: str, log: RuncLog,
          proxy: terminal.Proxy | None = None) -> None:
    """Fork the watcher off (double fork) and return at once in the caller.

    For a non-TTY call the watcher keeps a duplicate of the call's stderr (our fd 2), so it
    can tell the agent what happened after the call ends; it closes it as soon as it has. For a
    TTY call it relays the console socket (calls/terminal.py) and keeps the terminal instead.
    """
    try:
        runtime_pidfd = os.pidfd_open(os.getpid())  # this process, soon to be runc
    except OSError as e:
        log.warning(f"call {call.call}: no pidfd ({e}); its cgroup is cleaned up later")
        return
    pid = os.fork()
    if pid:
        os.close(runtime_pidfd)
        if proxy is not None:
            proxy.sock.close()  # the watcher owns it now (the path stays for runc)
        os.waitpid(pid, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        stderr = None if call.tty else os.dup(2)
        keep = {runtime_pidfd} | ({stderr} if stderr is not None else set())
        if proxy is not None:
            keep.add(proxy.fileno())
        _detach(keep=keep)
        if proxy is not None:
            if _holds(call, proxy):  # ready to trace before the call can start, and quick
                from . import exithold

                exithold.prepare()
                _hurry(True)
            stderr = proxy.relay(runtime_pidfd)
            log.debug(f"call {call.call}: terminal relayed, "
                      f"{'keeping its peer' if stderr is not None else 'no peer (no feedback)'}")
            waited = call.waited_s or 0.0
            if stderr is not None and waited >= 2.0:
                from execgate.calls import feedback

                if feedback.should_report_delay(waited):
                    tell.say(stderr, call.tty, [feedback.admission_delayed(waited)])
        watch(call, runtime_pidfd, pid_file, journal, log, stderr)
    except BaseException as e:  # noqa: BLE001 - a watcher must never raise into anything
        log.warning(f"call {call.call}: watcher failed: {type(e).__name__}: {e}")
    finally:
        os._exit(0)


def _holds(call: ToolCall, stderr: object) -> bool:
    """Whether this TTY call's exit is held until its note is written (runtime/exithold.py)."""
    return bool(call.tty and call.hold_exit is not False and stderr is not None)


_inherited_nice: int | None = None  # set while the watcher runs at HOLD_NICE


def _hurry(on: bool) -> None:
    """HOLD_NICE until the held call is caught, then back to the priority it inherited."""
    global _inherited_nice
    try:
        if on:
            before = os.getpriority(os.PRIO_PROCESS, 0)
            os.setpriority(os.PRIO_PROCESS, 0, HOLD_NICE)
            _inherited_nice = before
        elif _inherited_nice is not None:
            os.setpriority(os.PRIO_PROCESS, 0, _inherited_nice)
            _inherited_nice = None
    except OSError:
        pass  # unprivileged (rootless): the inherited priority serves


def _detach(keep: set[int]) -> None:
    """Drop the caller's stdio and every other inherited fd: the call's streams must close on
    time, and nothing of containerd's may outlive its exec in us."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def _wait_readable(fd: int, timeout: float | None = None) -> bool:
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(None if timeout is None else int(timeout * 1000)))


def _wait_empty(cg: str, on_oom: Callable[[], None] | None = None) -> None:
    """Block until the cgroup has no tasks (or is gone).

    With on_oom, memory.events is watched too and on_oom runs as soon as the kernel OOM-kills
    in the call: the note then reaches the stream before the engine sees the call exit (a TTY
    exec's terminal is torn down right after, so a note written later would be lost).
    """
    try:
        fd = os.open(os.path.join(cg, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    mem = None
    if on_oom is not None:
        try:
            mem = os.open(os.path.join(cg, "memory.events"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            mem = None
    try:
        p = select.poll()
        p.register(fd, select.POLLPRI | select.POLLERR)
        if mem is not None:
            p.register(mem, select.POLLPRI | select.POLLERR)
        while True:
            if mem is not None and on_oom is not None:
                os.lseek(mem, 0, os.SEEK_SET)
                events = dict(line.split() for line in os.read(mem, 4096).decode().splitlines())
                if int(events.get("oom_kill", 0)) or int(events.get("oom_group_kill", 0)):
                    on_oom()
                    p.unregister(mem)
                    os.close(mem)
                    mem = None
            os.lseek(fd, 0, os.SEEK_SET)
            data = os.read(fd, 4096).decode()
            if "populated 0" in data:
                return
            p.poll(5000)  # kernfs notifies; the timeout only guards against a lost wakeup
    finally:
        os.close(fd)
        if mem is not None:
            os.close(mem)


def _wait_runtime(runtime_pidfd: int, cg: str, oom_score_adj: int = 0, trace: bool = False,
                  ) -> tuple[dict[int, int], int | None]:
    """Wait for runc to exit; meanwhile take a pidfd on every task that enters the cgroup.

    The call's process joins the tool cgroup (populated 1) before it execs the command, under
    the pid it keeps; a pidfd taken then outlives the shim's reaping, so even a command that
    ends in microseconds leaves us its exit status. (runc 1.1 ignores an exec spec's
    oomScoreAdj, so the call's oom_score_adj is raised here too, before the command runs.)

    With trace, the first task seen (runc places only the exec's own process; what it forks
    comes later) is traced at once (runtime/exithold.py), not once runc has gone: runc can take
    longer to exit than a call takes to be OOM-killed. Returns (pidfds, traced pid or None);
    if the traced process dies first it returns at once, as runc may be waiting for it.
    """
    if trace:
        from . import exithold
    pidfds: dict[int, int] = {}
    traced = None
    try:
        events = os.open(os.path.join(cg, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        _wait_readable(runtime_pidfd)
        return pidfds, traced
    try:
        p = select.poll()
        p.register(runtime_pidfd, select.POLLIN)
        p.register(events, select.POLLPRI | select.POLLERR)
        while True:
            os.lseek(events, 0, os.SEEK_SET)
            if "populated 1" in os.read(events, 4096).decode():
                for pid in v2.procs(cg):
                    if pid not in pidfds:
                        try:
                            pidfds[pid] = os.pidfd_open(pid)
                        except OSError:
                            continue
                        if oom_score_adj:
                            raise_oom_score_adj(pid, oom_score_adj)
                        if trace and traced is None and len(pidfds) == 1 \
                                and exithold.seize(pid):
                            traced = pid
            if traced is not None and not exithold.running(traced):
                return pidfds, traced
            # A traced call's stops (a signal sent to it) wait for us: look often meanwhile.
            if any(fd == runtime_pidfd for fd, _ in p.poll(5000 if traced is None else 10)):
                if oom_score_adj:  # whatever the call forked meanwhile
                    for pid in v2.procs(cg):
                        raise_oom_score_adj(pid, oom_score_adj)
                return pidfds, traced
    finally:
        os.close(events)


def _exec_pidfd(pid_file: str | None, pidfds: dict[int, int], traced: int | None = None,
                ) -> tuple[int | None, int | None]:
    """The pid and pidfd of the exec's own process (named by runc's pid file, else the one we
    trace), others closed."""
    pid = None
    if pid_file:
        try:
            with open(pid_file) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            pid = None
    if pid is None:  # runc has not written it (a call that died before runc went)
        pid = traced
    chosen = pidfds.pop(pid, None) if pid is not None else None
    for fd in pidfds.values():
        os.close(fd)
    if chosen is None and pid is not None:
        try:
            chosen = os.pidfd_open(pid)
        except OSError:
            return None, None  # already reaped: the status is lost, the memory figures are not
    return pid, chosen


def _exit_status(pidfd: int | None, cgroup_id: int | None) -> int | None:
    """The exec's wait status as the kernel kept it (Linux >= 6.15), if it is our call's."""
    if pidfd is None:
        return None
    # The kernel keeps the exit info once the parent (containerd's shim) reaps, which a loaded
    # host can put off for seconds (50 concurrent execs under TCG: > 3 s). Only this watcher
    # waits: the call's exit went to the engine long ago.
    deadline = time.monotonic() + 20.0
    delay = 0.002
    while True:
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


def watch(call: ToolCall, runtime_pidfd: int, pid_file: str | None, journal: str,
          log: RuncLog, stderr: int | None = None) -> None:
    cg = call.cgroup
    hold = _holds(call, stderr)
    # Once runc has exited the call is placed, or never will be.
    pidfds, traced = _wait_runtime(runtime_pidfd, cg, int(call.oom_score_adj or 0), hold)
    _hurry(False)  # caught (or missed): from here on the watcher is nobody's hurry
    os.close(runtime_pidfd)
    pid, exec_pidfd = _exec_pidfd(pid_file, pidfds, traced)
    if traced is not None:
        if pid != traced:  # not runc's doing; the hold still ends when that process does
            log.warning(f"call {call.call}: traced pid {traced}, runc named {pid}")
        _watch_held(call, traced, exec_pidfd, pid == traced, journal, log,
                    stderr)  # type: ignore[arg-type]
        return
    if hold:
        log.debug(f"call {call.call}: exit not held (pid {pid}): ended or untraceable "
                  "before it was seen; its note may race the exit")
    told = []

    def tell_oom_now() -> None:
        early = {"memory_peak": v2.read_int(cg, "memory.peak"), "killed_by_execgate": False}
        err = tell.say(stderr, call.tty, [tell.oom_message(call, early)])  # type: ignore[arg-type]
        log.debug(f"call {call.call}: OOM note {'lost: ' + err if err else 'written'}")
        told.append(True)

    _wait_empty(cg, tell_oom_now if stderr is not None else None)
    end = time.time()
    gate = _done(call)
    entry = outcome.conclude(call, end, gate)
    tell.tell_and_close(call, entry, stderr, told_oom=bool(told))
    _finish(call, entry, _exit_status(exec_pidfd, call.cgroup_id), end, journal, log)


def _watch_held(call: ToolCall, pid: int, pidfd: int | None, is_main: bool,
                journal: str, log: RuncLog, terminal: int) -> None:
    """A TTY call whose exit we hold (runtime/exithold.py): the note goes out before the engine
    learns of the exit and tears the terminal down; the record waits for the cgroup to empty.
    The exit status is the held one's, unless runc named another process (is_main false)."""
    from . import exithold

    told: dict[str, Any] = {}

    def on_exit(signal: int | None) -> None:
        told["end"] = time.time()
        if signal == 9:  # the OOM killer counts its kill a moment after sending it
            _wait_for(lambda: _oom_counted(call.cgroup), 0.2)
        told["gate"] = _done(call)
        entry = outcome.conclude(call, told["end"], told["gate"])
        err = tell.tell_and_close(call, entry, terminal)
        log.debug(f"call {call.call}: exit held (signal {signal}, oom_killed "
                  f"{entry['oom_killed']}, note {'lost: ' + err if err else 'ok'}); releasing it")

    status = exithold.hold_exit(pid, on_exit)
    if "end" not in told:  # lost the trace: tell what we can, now
        on_exit(None)
    _wait_empty(call.cgroup)  # what it left running in the background
    if not is_main or status is None:
        status = _exit_status(pidfd, call.cgroup_id)
    if pidfd is not None:
        os.close(pidfd)
    _finish(call, outcome.conclude(call, told["end"], told["gate"]), status, told["end"], journal,
            log)


def _oom_counted(cg: str) -> bool:
    events = v2.read_keyed(cg, "memory.events")
    return bool(events.get("oom_kill") or events.get("oom_group_kill"))


def _wait_for(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _done(call: ToolCall) -> dict[str, Any] | None:
    """The daemon's account of the ended call (what the growth gate did), None if unmanaged."""
    if not call.daemon:
        return None
    return admit.done(call.daemon["socket"], call.daemon["timeout_s"], call.call)


def _finish(call: ToolCall, entry: dict[str, Any], status: int | None, end: float,
            journal: str, log: RuncLog) -> None:
    if not v2.remove(call.cgroup):
        log.warning(f"call {call.call}: cannot remove {call.cgroup}")
    outcome.record(entry, status, end, journal, log)
