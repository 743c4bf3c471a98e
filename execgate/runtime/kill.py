"""`kill`: thaw the container's tool calls and init first, so every signal is delivered at once.

A tool call frozen by the growth gate, or an idle sandbox's init frozen under pressure, would
sit on a SIGTERM until thawed; the engine expects the container to react to it. (docker pause
freezes the container's cgroup, not the tool cgroups' or init's own cgroup.freeze, so paused
containers stay paused.)
"""

from __future__ import annotations

from execgate.cgroups import container, v2
from execgate.common import records

from .context import Context

TYPE_CHECKING = False  # typing's, without importing typing on the runtime path
if TYPE_CHECKING:
    from typing import Any


def handle(ctx: Context) -> list[str]:
    flags = ctx.inv.command_flags()
    rec = records.load_container(ctx.config.state_dir, flags.positionals[0]) \
        if flags.positionals else None
    if rec:
        thaw_ours(rec)
    return ctx.inv.argv


def thaw_ours(rec: dict[str, Any]) -> None:
    """Thaw what execgate froze in a managed container (init/, tool calls); the engine's own
    pause (the container's cgroup) is left alone."""
    if rec.get("managed") and rec.get("cgroup"):
        container.thaw_init(rec["cgroup"])
        for tool in container.tool_cgroups(rec["cgroup"]):
            v2.thaw(tool)
