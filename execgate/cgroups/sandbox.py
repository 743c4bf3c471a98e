"""A managed container's life in execgate's hands, around runc's own start, kill and delete: the
init/ + tool-*/ layout made (start), what execgate froze thawed (kill), what it left removed
(delete). Shared by the runtime's handlers (runtime/start.py, kill.py, delete.py) and the
daemon's ops for the compiled front (daemon/lifecycle_op.py).
"""

from __future__ import annotations

import os

from execgate.common import records

from . import container, v2

TYPE_CHECKING = False  # typing's, without importing typing on the runtime path
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Protocol

    from execgate.common.config import Config

    class Log(Protocol):  # oci/runclog.py's RuncLog, or a logging.Logger
        def warning(self, msg: str) -> None: ...


def prepare(cfg: Config, cid: str, log: Log,
            guard: Callable[[str], Callable[[], None]] | None = None) -> None:
    """After runc start: give a managed container its layout (cgroups/container.py, frozen
    meanwhile; guard(cg) returns what ends a guard that thaws it should we die first) and
    swap_max, and record it; a container that cannot have it runs as with plain runc."""
    rec = records.load_container(cfg.state_dir, cid)
    if not rec or not rec.get("managed") or rec.get("prepared"):
        return
    try:
        release = guard(rec["cgroup"]) if guard is not None else None
        try:
            rec["controllers"] = container.prepare(rec["cgroup"], cfg.controllers)
        finally:
            if release is not None:
                release()
        rec["prepared"] = True
        _swap_max(cfg, rec["cgroup"], log)
    except Exception as e:  # noqa: BLE001 - the container runs as with plain runc
        rec["managed"] = False
        rec["reason"] = f"{type(e).__name__}: {e}"
        log.warning(f"container {rec['id']}: no per-exec cgroups ({rec['reason']})")
    records.save_container(cfg.state_dir, rec)


def _swap_max(cfg: Config, cg: str, log: Log) -> None:
    """[residency] swap_max on init/ (cgroups/container.py says why there); a bad value or a
    kernel without swap accounting is logged, never a reason to give the container up."""
    table = cfg.tables.get("residency")
    raw = table.get("swap_max", "max") if isinstance(table, dict) else "max"
    value = None
    try:
        value = container.swap_max_value(raw)
        if value is not None:
            container.set_swap_max(cg, value)
    except FileNotFoundError as e:  # no swap accounting: "max" is what it has anyway
        if value != "max":
            log.warning(f"{cg}: [residency] swap_max {raw!r} not applied: {e}")
    except (OSError, ValueError) as e:
        log.warning(f"{cg}: [residency] swap_max {raw!r} not applied: {e}")


# The signals an engine stops a container with (runc kill's default is SIGTERM).
STOPPING = ("TERM", "INT", "QUIT", "KILL", "15", "2", "3", "9")


def stops(signal: list[str]) -> bool:
    """Whether `runc kill ID [SIGNAL]` (signal: its [SIGNAL]) stops the container: its calls
    are then released by the growth gate, not held (protocol op `release`)."""
    return (signal[0] if signal else "TERM").upper().removeprefix("SIG") in STOPPING


def thaw_ours(rec: dict[str, Any]) -> None:
    """Thaw what execgate froze in a managed container (init/, tool calls); the engine's own
    pause (the container's cgroup) is left alone."""
    if rec.get("managed") and rec.get("cgroup"):
        container.thaw_init(rec["cgroup"])
        for tool in container.tool_cgroups(rec["cgroup"]):
            v2.thaw(tool)


def clean_up(state_dir: str, rec: dict[str, Any]) -> None:
    """After runc delete: what execgate left (tool cgroups, init/, the record)."""
    cg = rec.get("cgroup")
    # runc (or systemd) removes the container cgroup recursively; this catches what is left
    # when that removal raced a follower or the container's cgroup survived the delete.
    if cg and os.path.isdir(cg) and not v2.procs(cg):
        container.remove_idle_tool_cgroups(cg)
        init = os.path.join(cg, container.INIT)
        if os.path.isdir(init) and not v2.populated(init):
            v2.remove(init, attempts=3)
    from execgate.common import hints

    records.remove_container(state_dir, rec["id"])
    hints.forget_warnings(state_dir, str(rec.get("sandbox") or rec["id"]))
