"""sched_ext's state as sysfs shows it: whether a scheduler runs, and which one.

The gate reads it before loading (another scheduler, or one going away) and to tell an ejected
scheduler (watchdog, BPF error) from a running one; the daemon's actuator choice reads it too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

SCX_SYSFS = "/sys/kernel/sched_ext"


def state(sysfs: str = SCX_SYSFS) -> str:
    """sched_ext's state: ``enabled``, ``disabled``, ``enabling``, ``disabling``, or
    ``unsupported`` when the kernel has no sched_ext. A scheduler the kernel ejected (watchdog,
    error) shows as ``disabled``."""
    try:
        with open(os.path.join(sysfs, "state")) as f:
            return f.read().strip() or "unknown"
    except FileNotFoundError:
        return "unsupported"


def scheduler_name(sysfs: str = SCX_SYSFS) -> str | None:
    """The loaded scheduler's name (``/sys/kernel/sched_ext/root/ops``), None if none."""
    try:
        with open(os.path.join(sysfs, "root", "ops")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def wait_state(want: Iterable[str], timeout: float = 10.0, sysfs: str = SCX_SYSFS) -> str:
    """Polls :func:`state` until it is one of ``want`` or ``timeout`` passes; returns it."""
    want = set(want)
    deadline = time.monotonic() + timeout
    while True:
        st = state(sysfs)
        if st in want or time.monotonic() >= deadline:
            return st
        time.sleep(0.05)
