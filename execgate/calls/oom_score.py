"""A tool call is the kernel's preferred OOM victim, never the agent or the sandbox's init.

Both front doors raise it as soon as the call's process is seen: the runtime's watcher (runc
1.1 ignores an exec spec's oomScoreAdj) and the daemon when it places an inside call.
"""

from __future__ import annotations


def raise_oom_score_adj(pid: int, value: int) -> None:
    """Make the call the kernel's preferred OOM victim (its children inherit the value)."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "r+") as f:
            if int(f.read()) < value:
                f.seek(0)
                f.write(str(value))
    except (OSError, ValueError):
        pass
