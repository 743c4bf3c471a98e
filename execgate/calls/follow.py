"""Following a placed tool call to its end: the outcome, the agent told, the journal line.

Shared by the runtime's per-call watcher (runtime/watcher.py, a detached process) and the
daemon, which follows the calls the compiled front hands it (daemon/exec_op.py) in a thread
each, with no process per call. The end signal is the tool cgroup emptying (`cgroup.events`
populated 0, POLLPRI): race-free, unlike waiting on a pid the shim may already have reaped. The
exit status is read, where the kernel offers it, from a pidfd (PIDFD_GET_INFO), checked against
the tool cgroup's id so a reused pid is never mistaken.
"""

from __future__ import annotations

import fcntl
import os
import select
import struct
import time
from collections.abc import Callable

from execgate.calls import mark, outcome, tell
from execgate.calls.oom_score import raise_oom_score_adj
from execgate.cgroups import v2

TYPE_CHECKING = False  # typing's, without importing typing on the exec path
if TYPE_CHECKING:
    from typing import Any, Protocol

    from execgate.calls.record import ToolCall
    from execgate.oci.runclog import RuncLog

    class Tracer(Protocol):
        """What holds a TTY call's exit (runtime/exithold.py)."""

        def seize(self, pid: int) -> bool: ...

        def running(self, pid: int) -> bool: ...

    Done = Callable[[ToolCall], dict[str, Any] | None]

# struct pidfd_info, first version (64 bytes): mask, cgroupid, eleven ids, exit_code.
_PIDFD_INFO = struct.Struct("=QQ11Ii")
_PIDFD_INFO_CGROUPID = 1 << 2
_PIDFD_INFO_EXIT = 1 << 3
_PIDFD_GET_INFO = (3 << 30) | (64 << 16) | (0xFF << 8) | 11  # _IOWR(0xFF, 11, 64 bytes)

def wait_readable(fd: int, timeout: float | None = None) -> bool:
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(None if timeout is None else int(timeout * 1000)))


def wait_empty(cg: str, on_oom: Callable[[], None] | None = None,
               main: int | None = None) -> bool:
    """Block until the cgroup has no tasks (or is gone: runc's delete removes a container's
    cgroups, ours included, and an open cgroup file then reads as ENODEV): True.

    With on_oom, memory.events is watched too and on_oom runs as soon as the kernel OOM-kills
    in the call: the note then reaches the stream before the engine sees the call exit (a TTY
    exec's terminal is torn down right after, so a note written later would be lost).
    With main (a pidfd), it also returns, False, once that process has exited while others
    still run in the cgroup.
    """
    try:
        fd = os.open(os.path.join(cg, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
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
        if main is not None:
            p.register(main, select.POLLIN)
        while True:
            try:
                if mem is not None and on_oom is not None:
                    os.lseek(mem, 0, os.SEEK_SET)
                    events = dict(line.split()
                                  for line in os.read(mem, 4096).decode().splitlines())
                    if int(events.get("oom_kill", 0)) or int(events.get("oom_group_kill", 0)):
                        on_oom()
                        p.unregister(mem)
                        os.close(mem)
                        mem = None
                os.lseek(fd, 0, os.SEEK_SET)
                data = os.read(fd, 4096).decode()
            except OSError:  # removed under us: nothing is left in it
                return True
            if "populated 0" in data:
                return True
            if main is not None and wait_readable(main, 0):
                return False
            p.poll(5000)  # kernfs notifies; the timeout only guards against a lost wakeup
    finally:
        os.close(fd)
        if mem is not None:
            os.close(mem)


def wait_runtime(runtime_pidfd: int, cg: str, oom_score_adj: int = 0,
                 tracer: Tracer | None = None) -> tuple[dict[int, int], int | None]:
    """Wait for runc to exit; meanwhile take a pidfd on every task that enters the cgroup.

    The call's process joins the tool cgroup (populated 1) before it execs the command, under
    the pid it keeps; a pidfd taken then outlives the shim's reaping, so even a command that
    ends in microseconds leaves us its exit status. (runc 1.1 ignores an exec spec's
    oomScoreAdj, so the call's oom_score_adj is raised here too, before the command runs.)

    With a tracer, the first task seen (runc places only the exec's own process; what it forks
    comes later) is traced at once (runtime/exithold.py), not once runc has gone: runc can take
    longer to exit than a call takes to be OOM-killed. Returns (pidfds, traced pid or None);
    if the traced process dies first it returns at once, as runc may be waiting for it.
    """
    pidfds: dict[int, int] = {}
    traced = None
    try:
        events = os.open(os.path.join(cg, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        wait_readable(runtime_pidfd)
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
                        if tracer is not None and traced is None and len(pidfds) == 1 \
                                and tracer.seize(pid):
                            traced = pid
            if traced is not None and tracer is not None and not tracer.running(traced):
                return pidfds, traced
            # A traced call's stops (a signal sent to it) wait for us: look often meanwhile.
            if any(fd == runtime_pidfd for fd, _ in p.poll(5000 if traced is None else 10)):
                if oom_score_adj:  # whatever the call forked meanwhile
                    for pid in v2.procs(cg):
                        raise_oom_score_adj(pid, oom_score_adj)
                return pidfds, traced
    finally:
        os.close(events)


def exec_pidfd(pid_file: str | None, pidfds: dict[int, int], traced: int | None = None,
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


def exit_status(pidfd: int | None, cgroup_id: int | None) -> int | None:
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



def finish(call: ToolCall, entry: dict[str, Any], status: int | None, end: float,
            journal: str, log: RuncLog) -> None:
    """The journal line, then the cgroup marked done and removed: a follower killed in between
    leaves a cgroup its daemon's successor removes (calls/mark.py), never a call without its
    line."""
    outcome.record(entry, status, end, journal, log)
    mark.done(call.cgroup)
    if not v2.remove(call.cgroup):
        log.warning(f"call {call.call}: cannot remove {call.cgroup}")


# How long the rest of a call may outlive its own process and still count as ending with it
# (a pipeline's last stages, the group a kill or OOM takes down): then the notes go out as
# usual; what lives longer runs in the background and the stream is let go without them.
LINGER_S = 0.5


def _empties_soon(cg: str) -> bool:
    try:
        return v2.wait_event(cg, "populated", 0, LINGER_S)
    except OSError:  # removed: nothing left in it
        return True


def follow(call: ToolCall, pidfds: dict[int, int], pid_file: str | None, journal: str,
           log: RuncLog, stderr: int | None, done: Done) -> None:
    """The rest of a call whose exit is not held, once runc has gone (wait_runtime): the OOM
    note as soon as the kernel kills, the end, the daemon's account (done), the note, the
    journal line and the cgroup removed. stderr (the call's, or None) is closed.

    The stream is let go when the exec's own process exits: what it left running in the
    background (`cmd &`) holds the cgroup, and with it the call's charge and journal line, but
    never the agent, which waits for the stream's EOF (`docker exec`, `kubectl exec`, an exec
    probe). A hold note is then not told: the gate's account comes when the cgroup empties.
    What ends within LINGER_S of the exec's process (a kill, an OOM) still ends with it."""
    cg = call.cgroup
    _pid, exec_pid = exec_pidfd(pid_file, pidfds)
    told = []

    def tell_oom_now() -> None:
        early = {"memory_peak": v2.read_int(cg, "memory.peak"), "killed_by_execgate": False}
        err = tell.say(stderr, call.tty, [tell.oom_message(call, early)])  # type: ignore[arg-type]
        log.debug(f"call {call.call}: OOM note {'lost: ' + err if err else 'written'}")
        told.append(True)

    kept = stderr
    try:
        if stderr is None:
            wait_empty(cg)
        elif not wait_empty(cg, tell_oom_now, exec_pid) and not _empties_soon(cg):
            kept = None
            os.close(stderr)
            log.debug(f"call {call.call}: its process exited, the background runs on: "
                      "stream released")
            wait_empty(cg)
        end = time.time()
        gate = done(call)
        entry = outcome.conclude(call, end, gate)
        if kept is not None:
            kept = None
            tell.tell_and_close(call, entry, stderr, told_oom=bool(told))
    finally:
        if kept is not None:  # failed before the note: the stream must still end
            os.close(kept)
    status = exit_status(exec_pid, call.cgroup_id)
    if exec_pid is not None:
        os.close(exec_pid)
    finish(call, entry, status, end, journal, log)
