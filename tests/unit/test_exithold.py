"""The exit hold on the host's own kernel: ptrace needs no cgroup v2 and no container."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from execgate.runtime import exithold

# A parent (bash) that waits for its child and reports what it saw: the real parent's view.
_CHILD = ("import os, signal, sys, time\n"
          "signal.signal(signal.SIGUSR1, lambda *a: print('usr1', flush=True))\n"
          "print(os.getpid(), flush=True)\n"
          "time.sleep(0.4)\n"
          "os.kill(os.getpid(), signal.SIGUSR1)\n"
          "time.sleep(0.2)\n"
          "sys.exit(int(sys.argv[1]))\n")


def _family(code: int) -> tuple[subprocess.Popen[str], int]:
    parent = subprocess.Popen(
        ["bash", "-c", f'"$0" -c "$1" {code} & wait $!; echo "parent-saw $?"',
         sys.executable, _CHILD], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


def test_exit_is_held_until_the_note_is_written_and_signals_pass() -> None:
    parent, pid = _family(7)
    assert exithold.seize(pid)
    seen: list[object] = []

    def on_exit(sig: int | None) -> None:
        seen.append(sig)
        time.sleep(0.3)  # the parent must not see the exit meanwhile
        seen.append(parent.poll())

    t0 = time.monotonic()
    status = exithold.hold_exit(pid, on_exit)
    out, _ = parent.communicate(timeout=10)
    assert status is not None and os.waitstatus_to_exitcode(status) == 7
    assert seen == [None, None]  # not killed; the parent was still waiting during on_exit
    assert out.split() == ["usr1", "parent-saw", "7"]  # the signal reached its handler
    assert time.monotonic() - t0 >= 0.3


def test_a_killed_tracee_reports_its_signal() -> None:
    parent, pid = _family(0)
    assert exithold.seize(pid)
    seen: list[int | None] = []
    os.kill(pid, signal.SIGKILL)
    status = exithold.hold_exit(pid, seen.append)
    out, _ = parent.communicate(timeout=10)
    assert seen == [signal.SIGKILL]
    assert status is not None and os.WTERMSIG(status) == signal.SIGKILL
    assert out.split() == ["parent-saw", "137"]


def test_a_stopped_tracee_stays_stopped_until_continued() -> None:
    parent, pid = _family(3)
    assert exithold.seize(pid)
    os.kill(pid, signal.SIGSTOP)

    def cont_later() -> None:
        time.sleep(0.5)
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        os.kill(pid, signal.SIGCONT)
        assert state in ("t", "T"), state

    import threading

    t = threading.Thread(target=cont_later)
    t.start()
    status = exithold.hold_exit(pid, lambda sig: None)
    t.join()
    parent.communicate(timeout=10)
    assert status is not None and os.waitstatus_to_exitcode(status) == 3


def test_seize_refuses_a_missing_process() -> None:
    assert not exithold.seize(2**22 + 12345)


def test_running_passes_signals_on_and_keeps_a_death_held() -> None:
    """What the watcher does while runc is still about: poll, never block, never reap."""
    parent, pid = _family(5)
    assert exithold.seize(pid)
    deadline = time.monotonic() + 10
    while exithold.running(pid):  # the child's own SIGUSR1 stops it until running() resumes it
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.2)
    assert parent.poll() is None  # dead, but its exit is still ours to hand on
    seen: list[int | None] = []
    status = exithold.hold_exit(pid, seen.append)
    out, _ = parent.communicate(timeout=10)
    assert seen == [None] and status is not None and os.waitstatus_to_exitcode(status) == 5
    assert out.split() == ["usr1", "parent-saw", "5"]
