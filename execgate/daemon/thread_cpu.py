"""Where the daemon's CPU goes, by thread.

engine.LoopStats times the control loop's stages; the rest of the process's CPU is requests
handled on the loop's thread, the executor's threads (cgroup set-up, bundles, status), the
reclaim worker and one follower per tool call. Under an emulator every CPU-second the daemon
spends is taken from the sandboxes, so this split says what to make cheaper. Live threads are
read from /proc; a thread that ends first adds its own CPU (`counted`).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from .inside import procfs

_ID = re.compile(r"[-_](tool-\w+|\d.*)$")  # follow-tool-1a2b3c, asyncio_0, Thread-3 (run)
_ended: dict[str, float] = {}
_lock = threading.Lock()


def group(name: str) -> str:
    """The thread's kind: its name without a per-call or per-worker suffix."""
    return _ID.sub("", name) or name


def counted(target: Callable[..., None]) -> Callable[..., None]:
    """A short-lived thread's target that adds its CPU to the split on its way out (its
    /proc/self/task entry goes with it)."""
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            target(*args, **kwargs)
        finally:
            cpu = time.thread_time()
            name = group(threading.current_thread().name)
            with _lock:
                _ended[name] = _ended.get(name, 0.0) + cpu

    return run


def snapshot() -> dict[str, float]:
    """CPU seconds by thread kind since the daemon started, ended threads included."""
    with _lock:
        out = dict(_ended)
    me = os.getpid()
    for t in threading.enumerate():
        cpu = procfs.cpu_s(t.native_id, me) if t.native_id is not None else None
        if cpu is not None:
            name = group(t.name)
            out[name] = out.get(name, 0.0) + cpu
    return {k: round(v, 3) for k, v in sorted(out.items())}
