"""Hold a TTY call's exit until its note is on the terminal.

For a TTY exec the engine's shim shuts the terminal down as soon as it reaps the call's
process, so a note written when the kernel OOM-kills the call races the kill itself (and loses
under load). A process traced by us is different: its zombie is visible only to its tracer, and
its real parent (containerd's shim, the subreaper) is told of the exit only once the tracer has
waited for it. So the watcher PTRACE_SEIZEs the call's main process the moment runc places it
in its cgroup (waiting for runc to exit first lost the race to calls OOM-killed in under a
second under load) — no stop, no change to what it sees —, forwards every signal it is sent,
and, when the process has died, writes the note and only then lets the exit through. Should
the watcher die, the kernel detaches the tracee, which carries on (or is reaped) as if never
traced: the hold can delay an exit, never lose one.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

from execgate.common.libc import libc

_PTRACE_CONT = 7
_PTRACE_SEIZE = 0x4206
_PTRACE_LISTEN = 0x4208
_PTRACE_EVENT_STOP = 128
_WALL = 0x40000000
_JOB_STOPS = (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
_DEAD = (os.CLD_EXITED, os.CLD_KILLED, os.CLD_DUMPED)

_libc: ctypes.CDLL | None = None


def prepare() -> ctypes.CDLL:
    """Load libc's ptrace now, while runc is still starting the call: done at the seize, this
    (with importing ctypes) took long enough on a loaded host for a call OOM-killed in under a
    second to be gone before it was traced (its note then lost to the terminal's teardown)."""
    global _libc
    if _libc is None:
        lib = libc()
        lib.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        lib.ptrace.restype = ctypes.c_long
        _libc = lib
    return _libc


def _ptrace(request: int, pid: int, data: int = 0) -> None:
    if prepare().ptrace(request, pid, None, ctypes.c_void_p(data)) == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def seize(pid: int) -> bool:
    """Become pid's tracer without stopping it; False when the kernel says no (Yama, LSM, gone)."""
    try:
        _ptrace(_PTRACE_SEIZE, pid)
    except OSError:
        return False
    return True


def _resume(pid: int) -> bool:
    """Consume one pending trace stop (never the exit: WEXITED is not asked for) and undo it:
    a signal is re-injected, a job-control stop is kept as one (PTRACE_LISTEN), so the call and
    its terminal behave as untraced. False if nothing was pending."""
    try:
        info = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG | _WALL)
    except (ChildProcessError, InterruptedError):
        return False
    if info is None:
        return False
    sig, event = info.si_status & 0xFF, info.si_status >> 8
    try:
        if event != _PTRACE_EVENT_STOP:
            _ptrace(_PTRACE_CONT, pid, sig)  # deliver what was sent
        elif sig in _JOB_STOPS:
            _ptrace(_PTRACE_LISTEN, pid)  # a group stop: stay stopped until SIGCONT
        else:  # SIGCONT ended a group stop (or any other event stop): run on
            _ptrace(_PTRACE_CONT, pid)
    except OSError:
        pass  # killed meanwhile: its exit is the next thing waited for
    return True


def _dead(pid: int, block: bool) -> os.waitid_result | None:
    """The tracee's exit if it has died (left unreaped: still held), else None; with block,
    wait for its death, undoing trace stops on the way. Raises ChildProcessError if lost."""
    flags = os.WEXITED | os.WSTOPPED | os.WNOWAIT | _WALL | (0 if block else os.WNOHANG)
    while True:
        try:
            info = os.waitid(os.P_PID, pid, flags)
        except InterruptedError:
            continue
        if info is None:
            return None
        if info.si_code in _DEAD:
            return info
        if not _resume(pid) and not block:
            return None


def running(pid: int) -> bool:
    """Undo whatever trace stops are pending, without blocking; False once the tracee has died
    (its exit is held until hold_exit) or is no longer ours."""
    try:
        return _dead(pid, block=False) is None
    except ChildProcessError:
        return False


def hold_exit(pid: int, on_exit: Callable[[int | None], None]) -> int | None:
    """Run the traced pid to its end, then on_exit(signal that killed it, or None) while its
    exit is still held; return its wait status (None if the tracee was lost)."""
    try:
        info = _dead(pid, block=True)
    except ChildProcessError:
        return None
    assert info is not None
    try:
        on_exit(info.si_status if info.si_code != os.CLD_EXITED else None)
    finally:
        try:
            _, status = os.waitpid(pid, _WALL)  # hands the exit on to the real parent
        except ChildProcessError:
            status = None
    return status
