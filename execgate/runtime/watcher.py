"""The per-call watcher: waits for a tool call to end, records its outcome, removes its cgroup.

With `runc exec --detach` (what containerd uses) the call outlives runc, and its exit status
goes to containerd's shim, the parent. The watcher is a detached grandchild that never touches
the call's stdio, so it can never delay the exec's exit being reported. How a call is followed
to its end is calls/follow.py's, shared with the daemon (which follows the calls the compiled
front hands it, with no watcher); here are the process mechanics and the TTY exit hold.

Only the process mechanics are here: the journal line (calls/outcome.py) and what the agent is
told (calls/tell.py) are shared with the daemon's inside agents.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from execgate.calls import follow, outcome, tell
from execgate.cgroups import v2
from execgate.oci.runclog import RuncLog

from . import admit

TYPE_CHECKING = False  # typing's, without importing typing on the exec path
if TYPE_CHECKING:
    from typing import Any

    from execgate.calls import terminal
    from execgate.calls.record import ToolCall

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


def watch(call: ToolCall, runtime_pidfd: int, pid_file: str | None, journal: str,
          log: RuncLog, stderr: int | None = None) -> None:
    hold = _holds(call, stderr)
    tracer = None
    if hold:
        from . import exithold as tracer
    # Once runc has exited the call is placed, or never will be.
    pidfds, traced = follow.wait_runtime(runtime_pidfd, call.cgroup,
                                         int(call.oom_score_adj or 0), tracer)
    _hurry(False)  # caught (or missed): from here on the watcher is nobody's hurry
    os.close(runtime_pidfd)
    if traced is not None:
        pid, exec_pidfd = follow.exec_pidfd(pid_file, pidfds, traced)
        if pid != traced:  # not runc's doing; the hold still ends when that process does
            log.warning(f"call {call.call}: traced pid {traced}, runc named {pid}")
        _watch_held(call, traced, exec_pidfd, pid == traced, journal, log,
                    stderr)  # type: ignore[arg-type]
        return
    if hold:
        log.debug(f"call {call.call}: exit not held: ended or untraceable before it was "
                  "seen; its note may race the exit")
    follow.follow(call, pidfds, pid_file, journal, log, stderr, _done)


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
    follow.wait_empty(call.cgroup)  # what it left running in the background
    if not is_main or status is None:
        status = follow.exit_status(pidfd, call.cgroup_id)
    if pidfd is not None:
        os.close(pidfd)
    follow.finish(call, outcome.conclude(call, told["end"], told["gate"]), status, told["end"],
                  journal, log)


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
