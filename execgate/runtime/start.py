"""`start`: run runc start, then give the container the init/ + tool-*/ cgroup layout.

Done here, not at create, because the engine's shim has loaded the container's cgroup by now
(see create.py); the container is frozen for the moment it takes (cgroups/container.py). A
`start` killed meanwhile (the shim's timeout sends SIGKILL) cannot thaw it itself, so a guard
process does: the container never stays frozen by a start that died.
"""

from __future__ import annotations

import os

from execgate.cgroups import container, v2
from execgate.common import records
from execgate.oci import runc

from .context import Context

TYPE_CHECKING = False  # typing's, without importing typing on the runtime path
if TYPE_CHECKING:
    from collections.abc import Callable


def handle(ctx: Context) -> int:
    flags = ctx.inv.command_flags()
    rc = runc.run(ctx.runc, ctx.inv.argv)
    if rc != 0 or not flags.positionals:
        return rc
    try:  # runc has run: from here on nothing may make main() run it again
        _prepare(ctx, flags.positionals[0])
    except Exception as e:  # noqa: BLE001
        ctx.log.warning(f"start {flags.positionals[0]}: {type(e).__name__}: {e}")
    return rc


def _prepare(ctx: Context, cid: str) -> None:
    rec = records.load_container(ctx.config.state_dir, cid)
    if not rec or not rec.get("managed") or rec.get("prepared"):
        return
    try:
        release = _thaw_guard(rec["cgroup"])
        try:
            rec["controllers"] = container.prepare(rec["cgroup"], ctx.config.controllers)
        finally:
            release()
        rec["prepared"] = True
        _swap_max(ctx, rec["cgroup"])
    except Exception as e:  # noqa: BLE001 - the container runs as with plain runc
        rec["managed"] = False
        rec["reason"] = f"{type(e).__name__}: {e}"
        ctx.log.warning(f"container {rec['id']}: no per-exec cgroups ({rec['reason']})")
    records.save_container(ctx.config.state_dir, rec)


def _thaw_guard(cg: str) -> Callable[[], None]:
    """Fork a guard that thaws cg should this process die before calling what is returned
    (the pipe it reads ends without a word); nothing for a container frozen already (paused:
    prepare leaves it so). The guard is in a session of its own, on /dev/null, holding no fd
    of ours but the pipe, so neither a kill of our group nor the engine's pipes wait on it."""
    if v2.read_int(cg, "cgroup.freeze") == 1:
        return lambda: None
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:  # EAGAIN: prepare as before, unguarded
        os.close(r)
        os.close(w)
        return lambda: None
    if pid == 0:  # the guard
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, r)
            os.closerange(r + 1, 1 << 20)
            if os.read(r, 1) == b"":  # our parent died mid-prepare
                v2.write(cg, "cgroup.freeze", "0")
        finally:
            os._exit(0)
    os.close(r)

    def release() -> None:
        os.write(w, b"k")
        os.close(w)
        os.waitpid(pid, 0)

    return release


def _swap_max(ctx: Context, cg: str) -> None:
    """[residency] swap_max on init/ (cgroups/container.py says why there); a bad value or a
    kernel without swap accounting is logged, never a reason to give the container up."""
    table = ctx.config.tables.get("residency")
    raw = table.get("swap_max", "max") if isinstance(table, dict) else "max"
    value = None
    try:
        value = container.swap_max_value(raw)
        if value is not None:
            container.set_swap_max(cg, value)
    except FileNotFoundError as e:  # no swap accounting: "max" is what it has anyway
        if value != "max":
            ctx.log.warning(f"{cg}: [residency] swap_max {raw!r} not applied: {e}")
    except (OSError, ValueError) as e:
        ctx.log.warning(f"{cg}: [residency] swap_max {raw!r} not applied: {e}")
