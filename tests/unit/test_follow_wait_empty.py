"""calls/follow.wait_empty on a temp dir laid out as a cgroup: it returns when the cgroup
empties, and when the cgroup is removed under it (runc's delete removes a container's cgroups,
ours included: an open kernfs file then reads as ENODEV; the follower raised and the call was
never journaled, seen in the VM's host-pid-namespace test)."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from execgate.calls import follow


def _cgroup(tmp: Path, populated: int) -> Path:
    (tmp / "cgroup.events").write_text(f"populated {populated}\nfrozen 0\n")
    (tmp / "memory.events").write_text("oom_kill 0\noom_group_kill 0\n")
    return tmp


def test_returns_once_the_cgroup_is_empty(tmp_path: Path) -> None:
    cg = _cgroup(tmp_path, 1)
    t = threading.Thread(target=follow.wait_empty, args=(str(cg),))
    t.start()
    time.sleep(0.1)
    assert t.is_alive()
    (cg / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    t.join(timeout=10)  # a regular file never notifies: the poll's own timeout rereads it
    assert not t.is_alive()


@pytest.mark.parametrize("watch_oom", [False, True])
def test_returns_when_the_cgroup_is_removed_under_it(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     watch_oom: bool) -> None:
    cg = _cgroup(tmp_path, 1)
    real_read = os.read
    gone = threading.Event()

    def read(fd: int, n: int) -> bytes:
        if gone.is_set():
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
        return real_read(fd, n)

    monkeypatch.setattr(follow.os, "read", read)
    monkeypatch.setattr(follow.select, "poll", _QuickPoll)
    raised: list[Exception] = []

    def wait() -> None:
        try:
            follow.wait_empty(str(cg), (lambda: None) if watch_oom else None)
        except Exception as e:  # noqa: BLE001 - the follower would die here, unjournaled
            raised.append(e)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.1)
    gone.set()
    t.join(timeout=5)
    assert not t.is_alive() and raised == []


class _QuickPoll:
    """select.poll whose waits are short (a regular file never notifies)."""

    def __init__(self) -> None:
        self.fds: list[int] = []

    def register(self, fd: int, _mask: int = 0) -> None:
        self.fds.append(fd)

    def unregister(self, fd: int) -> None:
        self.fds.remove(fd)

    def poll(self, _timeout: int | None = None) -> list[tuple[int, int]]:
        time.sleep(0.02)
        return []


def test_the_stream_is_let_go_when_the_calls_own_process_exits(tmp_path: Path) -> None:
    """Issue 21, item 7: a call that leaves a process in the background (`cmd &`) kept the
    exec's stderr until the whole cgroup emptied, and the agent (`docker exec`, an exec probe)
    waited as long. The stream ends when the exec's own process does; the cgroup's emptying
    still ends the call: its account and journal line."""
    import json
    import subprocess

    from execgate.calls.record import ToolCall
    from execgate.oci.runclog import RuncLog

    (tmp_path / "tool-1").mkdir()
    cg = _cgroup(tmp_path / "tool-1", 1)
    main = subprocess.Popen(["sleep", "0.1"])
    pidfd = os.pidfd_open(main.pid)
    main.wait()  # the exec's own process is gone; its background child runs on (populated 1)
    (tmp_path / "pid").write_text(str(main.pid))
    r, w = os.pipe()
    call = ToolCall("tool-1", "box", "box", str(cg), ["sh", "-c", "sleep 60 &"])
    call.admitted(True, 0.0)
    call.start = time.time()
    ended: dict[str, float] = {}
    t0 = time.monotonic()

    def done(_c: ToolCall) -> None:
        ended["done"] = time.monotonic() - t0

    def background_ends() -> None:
        time.sleep(3.0)
        (cg / "cgroup.events").write_text("populated 0\nfrozen 0\n")

    threading.Thread(target=background_ends, daemon=True).start()
    journal = tmp_path / "calls.jsonl"
    t = threading.Thread(target=follow.follow, args=(
        call, {main.pid: pidfd}, str(tmp_path / "pid"), str(journal), RuncLog(None, None), w,
        done))
    t.start()
    while os.read(r, 4096):
        pass
    eof = time.monotonic() - t0
    t.join(timeout=15)
    assert not t.is_alive()
    assert eof < 2.0, f"EOF after {eof:.2f} s: the stream waited for the background"
    assert ended["done"] >= 3.0  # the call ends (its charge) with its cgroup, not before
    (line,) = journal.read_text().splitlines()
    assert json.loads(line)["call"] == "tool-1"


def test_what_ends_just_after_the_calls_process_still_gets_its_note(tmp_path: Path) -> None:
    """A kill (cgroup.kill) or an OOM takes the call's processes down one after the other: the
    exec's own may go first. What ends within LINGER_S still ends with the call, so the agent
    is told (here: killed by execgate's last resort) before its stream closes."""
    import subprocess

    from execgate.calls.record import ToolCall
    from execgate.oci.runclog import RuncLog

    (tmp_path / "tool-1").mkdir()
    cg = _cgroup(tmp_path / "tool-1", 1)
    main = subprocess.Popen(["sleep", "0.05"])
    pidfd = os.pidfd_open(main.pid)
    main.wait()
    (tmp_path / "pid").write_text(str(main.pid))
    r, w = os.pipe()
    call = ToolCall("tool-1", "box", "box", str(cg), ["make", "-j8"])
    call.admitted(True, 0.0)
    call.start = time.time()

    def the_rest_dies() -> None:
        time.sleep(0.2)
        (cg / "cgroup.events").write_text("populated 0\nfrozen 0\n")

    threading.Thread(target=the_rest_dies, daemon=True).start()
    t = threading.Thread(target=follow.follow, args=(
        call, {main.pid: pidfd}, str(tmp_path / "pid"), str(tmp_path / "calls.jsonl"),
        RuncLog(None, None), w, lambda _c: {"held_s": 0.0, "killed_by_execgate": True}))
    t.start()
    said = b""
    while chunk := os.read(r, 4096):
        said += chunk
    t.join(timeout=15)
    assert b"[execgate]" in said, said  # the kill note, before EOF


def test_a_call_followed_without_a_stream_ends_with_its_cgroup(tmp_path: Path) -> None:
    """A call followed with no stream (one a restarted daemon picks up by its mark, a TTY
    call's) is journaled when its cgroup empties, not at once: the early release of a stream
    must not skip the wait (the e2e test of a daemon killed mid-call caught it)."""
    import json

    from execgate.calls.record import ToolCall
    from execgate.oci.runclog import RuncLog

    (tmp_path / "tool-1").mkdir()
    cg = _cgroup(tmp_path / "tool-1", 1)
    call = ToolCall("tool-1", "box", "box", str(cg), ["sleep", "60"])
    call.admitted(True, 0.0)
    call.start = time.time()
    journal = tmp_path / "calls.jsonl"
    t = threading.Thread(target=follow.follow, args=(
        call, {}, None, str(journal), RuncLog(None, None), None, lambda _c: None))
    t.start()
    time.sleep(0.5)
    assert t.is_alive() and not journal.exists()  # the call runs on
    (cg / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    t.join(timeout=10)
    assert not t.is_alive()
    assert json.loads(journal.read_text())["call"] == "tool-1"
