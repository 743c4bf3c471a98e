"""`start`: run runc start, then give the container the init/ + tool-*/ cgroup layout.

Done here, not at create, because the engine's shim has loaded the container's cgroup by now
(see create.py); the container is frozen for the moment it takes (cgroups/container.py).
"""

from __future__ import annotations

from execgate.cgroups import container
from execgate.common import records
from execgate.oci import runc

from .context import Context


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
        rec["controllers"] = container.prepare(rec["cgroup"], ctx.config.controllers)
        rec["prepared"] = True
        _swap_max(ctx, rec["cgroup"])
    except Exception as e:  # noqa: BLE001 - the container runs as with plain runc
        rec["managed"] = False
        rec["reason"] = f"{type(e).__name__}: {e}"
        ctx.log.warning(f"container {rec['id']}: no per-exec cgroups ({rec['reason']})")
    records.save_container(ctx.config.state_dir, rec)


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
