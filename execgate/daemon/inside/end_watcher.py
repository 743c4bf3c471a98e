"""When tool cgroups empty: the end of an inside call, heard on cgroup.events (POLLPRI)."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import Callable

log = logging.getLogger("execgated.inside")


class EndWatcher:
    """Tells when tool cgroups empty: one thread polls their cgroup.events for POLLPRI, which
    asyncio's readers cannot wait for. `on_empty(key)` runs in that thread."""

    def __init__(self, on_empty: Callable[[str], None]) -> None:
        self.on_empty = on_empty
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._lock = threading.Lock()
        self._new: list[tuple[str, int]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="inside-ends", daemon=True)
        self._thread.start()

    def watch(self, key: str, cg: str) -> bool:
        try:
            fd = os.open(os.path.join(cg, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        with self._lock:
            self._new.append((key, fd))
        os.write(self._wake_w, b"\0")
        return True

    def stop(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\0")
        self._thread.join(timeout=2)

    @staticmethod
    def _empty(fd: int) -> bool:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            return b"populated 0" in os.read(fd, 4096)
        except OSError:
            return True  # the cgroup is gone

    def _run(self) -> None:
        p = select.poll()
        p.register(self._wake_r, select.POLLIN)
        keys: dict[int, str] = {}
        while not self._stop:
            ready = [fd for fd, _ in p.poll(5000)]  # the timeout guards against a lost wakeup
            if self._wake_r in ready:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 4096)
                with self._lock:
                    new, self._new = self._new, []
                for key, fd in new:
                    keys[fd] = key
                    p.register(fd, select.POLLPRI | select.POLLERR)
                    ready.append(fd)
            if not ready:
                ready = list(keys)
            for fd in ready:
                if fd in keys and self._empty(fd):
                    p.unregister(fd)
                    os.close(fd)
                    key = keys.pop(fd)
                    try:
                        self.on_empty(key)
                    except Exception:  # noqa: BLE001 - the loop is closing
                        log.debug("end of %s not delivered", key)
        for fd in keys:
            os.close(fd)
