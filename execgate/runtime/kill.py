"""`kill`: thaw the container's tool calls and init first, so every signal is delivered at once.

A tool call frozen by the growth gate, or an idle sandbox's init frozen under pressure, would
sit on a SIGTERM until thawed; the engine expects the container to react to it. (docker pause
freezes the container's cgroup, not the tool cgroups' or init's own cgroup.freeze, so paused
containers stay paused.) A signal that stops the container also has the daemon release the
calls its growth gate holds: a held task runs only once the hold cap lets it.
"""

from __future__ import annotations

import os

from execgate.cgroups import sandbox
from execgate.common import records

from .context import Context


def handle(ctx: Context) -> list[str]:
    flags = ctx.inv.command_flags()
    rec = records.load_container(ctx.config.state_dir, flags.positionals[0]) \
        if flags.positionals else None
    if rec:
        sandbox.thaw_ours(rec)
        if rec.get("managed") and sandbox.stops(flags.positionals[1:2]):
            _release(ctx, flags.positionals[0])
    return ctx.inv.argv


def _release(ctx: Context, cid: str) -> None:
    """Ask the daemon to release the container's held calls and hold them no more: a task the
    growth gate parks gets no CPU to handle the signal until the hold cap (20 s). Within the
    daemon budget, and fail open: a dead daemon's gate is unloaded, holding nothing."""
    if not os.path.exists(ctx.config.socket):
        return
    from execgate.common import protocol

    try:
        protocol.call(ctx.config.socket, protocol.request("release", container=cid),
                      timeout=ctx.config.daemon_timeout_ms / 1000)
    except (OSError, protocol.ProtocolError) as e:
        ctx.log.warning(f"kill {cid}: the daemon did not release its calls: {e}")

