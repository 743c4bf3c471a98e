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
