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
from collections.abc import Callable

from execgate.cgroups import v2
from execgate.common import meminfo, records
from execgate.oci.runclog import RuncLog

from . import admit

TYPE_CHECKING = False  # typing's, without importing typing on the exec path
if TYPE_CHECKING:
    from typing import Any

    from . import console

# struct pidfd_info, first version (64 bytes): mask, cgroupid, eleven ids, exit_code.
_PIDFD_INFO = struct.Struct("=QQ11Ii")
_PIDFD_INFO_CGROUPID = 1 << 2
_PIDFD_INFO_EXIT = 1 << 3
_PIDFD_GET_INFO = (3 << 30) | (64 << 16) | (0xFF << 8) | 11  # _IOWR(0xFF, 11, 64 bytes)


def spawn(call: dict[str, Any], pid_file: str | None, journal: str, log: RuncLog,
          proxy: console.Proxy | None = None) -> None:
    """Fork the watcher off (double fork) and return at once in the caller.

    For a non-TTY call the watcher keeps a duplicate of the call's stderr (our fd 2), so it
    can tell the agent what happened after the call ends; it closes it as soon as it has. For a
    TTY call it relays the console socket (runtime/console.py) and keeps the terminal instead.
    """
    try:
        runtime_pidfd = os.pidfd_open(os.getpid())  # this process, soon to be runc
    except OSError as e:
        log.warning(f"call {call['call']}: no pidfd ({e}); its cgroup is cleaned up later")
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
        stderr = None if call.get("tty") else os.dup(2)
        keep = {runtime_pidfd} | ({stderr} if stderr is not None else set())
        if proxy is not None:
            keep.add(proxy.fileno())
        _detach(keep=keep)
        if proxy is not None:
            stderr = proxy.relay(runtime_pidfd)
            log.debug(f"call {call['call']}: terminal relayed, "
                      f"{'keeping its peer' if stderr is not None else 'no peer (no feedback)'}")
            if stderr is not None and (call.get("waited_s") or 0.0) >= 2.0:
                from . import feedback

                if feedback.should_report_delay(call["waited_s"]):
                    say(call, stderr, [feedback.admission_delayed(call["waited_s"])])
        watch(call, runtime_pidfd, pid_file, journal, log, stderr)
    except BaseException as e:  # noqa: BLE001 - a watcher must never raise into anything
        log.warning(f"call {call.get('call')}: watcher failed: {type(e).__name__}: {e}")
    finally:
        os._exit(0)


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


def _raise_oom_score_adj(pid: int, value: int) -> None:
    """Make the call the kernel's preferred OOM victim (its children inherit the value)."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "r+") as f:
            if int(f.read()) < value:
                f.seek(0)
                f.write(str(value))
    except (OSError, ValueError):
        pass


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
                            _raise_oom_score_adj(pid, oom_score_adj)
                        if trace and traced is None and len(pidfds) == 1 \
                                and exithold.seize(pid):
                            traced = pid
            if traced is not None and not exithold.running(traced):
                return pidfds, traced
            # A traced call's stops (a signal sent to it) wait for us: look often meanwhile.
            if any(fd == runtime_pidfd for fd, _ in p.poll(5000 if traced is None else 10)):
                if oom_score_adj:  # whatever the call forked meanwhile
                    for pid in v2.procs(cg):
                        _raise_oom_score_adj(pid, oom_score_adj)
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


def _tell_agent(call: dict[str, Any], entry: dict[str, Any], stderr: int,
                told_oom: bool = False) -> str | None:
    """Feedback on the call's own stderr (or terminal), written before the stream closes.

    Nothing is written for a call that simply succeeded. An admission delay was told before the
    call started, a kernel OOM kill the moment it happened (told_oom); the rest is told here.
    """
    from . import feedback  # only now: the call is over, nobody waits on us

    messages = []
    held, run = entry.get("held_s") or 0.0, entry.get("duration") or 0.0
    if feedback.should_report_hold(held, run):
        messages.append(feedback.gate_held(held, run))
    if entry["oom_killed"] and not told_oom:
        messages.append(_oom_message(call, entry))
    return say(call, stderr, messages) if messages else None


def say(call: dict[str, Any], stream: int, messages: list[str]) -> str | None:
    """Write feedback messages to a call's stderr, or its terminal for a TTY call; the error
    if the stream would not take them (the reader is gone: nothing else to do)."""
    from . import console, feedback

    try:
        if call.get("tty"):
            console.write_to_terminal(stream, "".join(messages))
        else:
            os.write(stream, feedback.compose(*messages))
    except OSError as e:
        return str(e)
    return None


def _oom_message(call: dict[str, Any], entry: dict[str, Any]) -> str:
    from . import feedback

    parent = os.path.dirname(call["cgroup"])
    limit = v2.read_int(parent, "memory.max")
    used = v2.read_int(parent, "memory.current")
    if limit is not None and used is not None:
        available = max(limit - used, 0)
    else:
        available = meminfo.available()
    by = "execgate" if entry.get("killed_by_execgate") else "kernel"
    return feedback.oom_killed(entry.get("memory_peak"), available, limit,
                               call.get("argv") or [], by=by)


def conclude(call: dict[str, Any], end: float, gate: dict[str, Any] | None) -> dict[str, Any]:
    """A finished call's journal entry, all but its exit status: what the kernel kept in its
    (empty) cgroup and what the growth gate did (the daemon's `done` answer, None if unmanaged).

    Shared with the daemon's inside-agent calls (daemon/inside.py), so both journal alike."""
    entry = dict(call)
    entry.pop("daemon", None)
    entry.update(outcome(call["cgroup"]))
    entry["duration"] = round(end - call["start"], 6)
    entry["held_s"] = float(gate.get("held_s") or 0.0) if gate else 0.0
    entry["killed_by_execgate"] = bool(gate and gate.get("killed_by_execgate"))
    entry["oom_killed"] = bool(entry["oom_kill"] or entry["oom_group_kill"]
                               or entry["killed_by_execgate"])
    return entry


def tell_and_close(call: dict[str, Any], entry: dict[str, Any], stderr: int | None,
                   told_oom: bool = False) -> str | None:
    """Feedback (if any) on the call's kept stderr, then let go of it: the agent may be
    waiting for that stream's EOF. The write's error, if any."""
    if stderr is None:
        return None
    try:
        return _tell_agent(call, entry, stderr, told_oom)
    finally:
        os.close(stderr)


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


def watch(call: dict[str, Any], runtime_pidfd: int, pid_file: str | None, journal: str,
          log: RuncLog, stderr: int | None = None) -> None:
    cg = call["cgroup"]
    hold = bool(call.get("tty") and call.get("hold_exit", True) and stderr is not None)
    # Once runc has exited the call is placed, or never will be.
    pidfds, traced = _wait_runtime(runtime_pidfd, cg, int(call.get("oom_score_adj") or 0), hold)
    os.close(runtime_pidfd)
    pid, exec_pidfd = _exec_pidfd(pid_file, pidfds, traced)
    if traced is not None:
        if pid != traced:  # not runc's doing; the hold still ends when that process does
            log.warning(f"call {call['call']}: traced pid {traced}, runc named {pid}")
        _watch_held(call, traced, exec_pidfd, pid == traced, journal, log,
                    stderr)  # type: ignore[arg-type]
        return
    if hold:
        log.debug(f"call {call['call']}: exit not held (pid {pid}): ended or untraceable "
                  "before it was seen; its note may race the exit")
    told = []

    def tell_oom_now() -> None:
        early = {"memory_peak": v2.read_int(cg, "memory.peak"), "killed_by_execgate": False}
        err = say(call, stderr, [_oom_message(call, early)])  # type: ignore[arg-type]
        log.debug(f"call {call['call']}: OOM note {'lost: ' + err if err else 'written'}")
        told.append(True)

    _wait_empty(cg, tell_oom_now if stderr is not None else None)
    end = time.time()
    gate = _done(call)
    entry = conclude(call, end, gate)
    tell_and_close(call, entry, stderr, told_oom=bool(told))
    _finish(call, entry, _exit_status(exec_pidfd, call.get("cgroup_id")), end, journal, log)


def _watch_held(call: dict[str, Any], pid: int, pidfd: int | None, is_main: bool,
                journal: str, log: RuncLog, terminal: int) -> None:
    """A TTY call whose exit we hold (runtime/exithold.py): the note goes out before the engine
    learns of the exit and tears the terminal down; the record waits for the cgroup to empty.
    The exit status is the held one's, unless runc named another process (is_main false)."""
    from . import exithold

    told: dict[str, Any] = {}

    def on_exit(signal: int | None) -> None:
        told["end"] = time.time()
        if signal == 9:  # the OOM killer counts its kill a moment after sending it
            _wait_for(lambda: _oom_counted(call["cgroup"]), 0.2)
        told["gate"] = _done(call)
        entry = conclude(call, told["end"], told["gate"])
        err = tell_and_close(call, entry, terminal)
        log.debug(f"call {call['call']}: exit held (signal {signal}, oom_killed "
                  f"{entry['oom_killed']}, note {'lost: ' + err if err else 'ok'}); releasing it")

    status = exithold.hold_exit(pid, on_exit)
    if "end" not in told:  # lost the trace: tell what we can, now
        on_exit(None)
    _wait_empty(call["cgroup"])  # what it left running in the background
    if not is_main or status is None:
        status = _exit_status(pidfd, call.get("cgroup_id"))
    if pidfd is not None:
        os.close(pidfd)
    _finish(call, conclude(call, told["end"], told["gate"]), status, told["end"], journal, log)


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


def _done(call: dict[str, Any]) -> dict[str, Any] | None:
    """The daemon's account of the ended call (what the growth gate did), None if unmanaged."""
    if not call.get("daemon"):
        return None
    return admit.done(call["daemon"]["socket"], call["daemon"]["timeout_s"], call["call"])


def _finish(call: dict[str, Any], entry: dict[str, Any], status: int | None, end: float,
            journal: str, log: RuncLog) -> None:
    if not v2.remove(call["cgroup"]):
        log.warning(f"call {call['call']}: cannot remove {call['cgroup']}")
    record(entry, status, end, journal, log)
