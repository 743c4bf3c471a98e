"""`delete`: run runc delete, then remove what execgate left: tool cgroups, init/, the record.
`delete --force` thaws what execgate froze first, as `kill` does: runc kills the container."""

from __future__ import annotations

from execgate.cgroups import sandbox
from execgate.common import records
from execgate.oci import runc

from .context import Context


def handle(ctx: Context) -> int:
    flags = ctx.inv.command_flags()
    cid = flags.positionals[0] if flags.positionals else None
    rec = records.load_container(ctx.config.state_dir, cid) if cid else None
    if rec and flags.is_set("force"):  # runc kills it first: nothing of ours may delay that
        sandbox.thaw_ours(rec)
    rc = runc.run(ctx.runc, ctx.inv.argv)
    if rc != 0 or not rec:
        return rc
    try:  # runc has run: from here on nothing may make main() run it again
        sandbox.clean_up(ctx.config.state_dir, rec)
    except Exception as e:  # noqa: BLE001
        ctx.log.warning(f"delete {rec['id']}: clean-up failed: {type(e).__name__}: {e}")
    return rc

