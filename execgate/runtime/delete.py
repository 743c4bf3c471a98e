"""`delete`: run runc delete, then remove what execgate left: tool cgroups, init/, the record.
`delete --force` thaws what execgate froze first, as `kill` does: runc kills the container."""

from __future__ import annotations

import os
from typing import Any

from execgate.cgroups import container, v2
from execgate.common import hints, records
from execgate.oci import runc

from .context import Context
from .kill import thaw_ours


def handle(ctx: Context) -> int:
    flags = ctx.inv.command_flags()
    cid = flags.positionals[0] if flags.positionals else None
    rec = records.load_container(ctx.config.state_dir, cid) if cid else None
    if rec and flags.is_set("force"):  # runc kills it first: nothing of ours may delay that
        thaw_ours(rec)
    rc = runc.run(ctx.runc, ctx.inv.argv)
    if rc != 0 or not rec:
        return rc
    try:  # runc has run: from here on nothing may make main() run it again
        _clean_up(ctx, rec)
    except Exception as e:  # noqa: BLE001
        ctx.log.warning(f"delete {rec['id']}: clean-up failed: {type(e).__name__}: {e}")
    return rc


def _clean_up(ctx: Context, rec: dict[str, Any]) -> None:
    cg = rec.get("cgroup")
    # runc (or systemd) removes the container cgroup recursively; this catches what is left
    # when that removal raced a watcher or the container's cgroup survived the delete.
    if cg and os.path.isdir(cg) and not v2.procs(cg):
        container.remove_idle_tool_cgroups(cg)
        init = os.path.join(cg, container.INIT)
        if os.path.isdir(init) and not v2.populated(init):
            v2.remove(init, attempts=3)
    records.remove_container(ctx.config.state_dir, rec["id"])
    hints.forget_warnings(ctx.config.state_dir, str(rec.get("sandbox") or rec["id"]))
