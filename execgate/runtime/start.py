"""`start`: run runc start, then give the container the init/ + tool-*/ cgroup layout.

Done here, not at create, because the engine's shim has loaded the container's cgroup by now
(see create.py); the container is frozen for the moment it takes (cgroups/container.py). A
`start` killed meanwhile (the shim's timeout sends SIGKILL) cannot thaw it itself, so a guard
process does: the container never stays frozen by a start that died.
"""

from __future__ import annotations

import os

from execgate.cgroups import sandbox, v2
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
        sandbox.prepare(ctx.config, flags.positionals[0], ctx.log, _thaw_guard)
    except Exception as e:  # noqa: BLE001
        ctx.log.warning(f"start {flags.positionals[0]}: {type(e).__name__}: {e}")
    return rc


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

