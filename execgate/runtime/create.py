"""`create`: run runc create and record the container (its cgroup layout comes at `start`).

The engine's shim loads the container's cgroup from its init's /proc/PID/cgroup right after
create: init must still be in the container's own cgroup then, or `docker stats` would count
init/ alone and miss every tool call.
"""

from __future__ import annotations

import os
import time

from execgate.cgroups import v2
from execgate.common import records
from execgate.oci import bundle as bundle_mod
from execgate.oci import runc

from .context import Context


def _init_pid(pid_file: str | None) -> int:
    if not pid_file:
        raise LookupError("no --pid-file given")
    with open(pid_file) as f:
        return int(f.read().strip())


def handle(ctx: Context) -> int:
    flags = ctx.inv.command_flags()
    rc = runc.run(ctx.runc, ctx.inv.argv)
    if rc != 0 or not flags.positionals:
        return rc
    cid = flags.positionals[0]
    record: dict[str, object] = {"id": cid, "created": time.time(), "managed": False}
    try:
        spec = bundle_mod.load(flags.get("bundle") or os.getcwd())
        record.update(bundle=spec.path, hostname=spec.hostname, sandbox=spec.sandbox_id(cid),
                      annotations=spec.annotations, memory_limit=spec.memory_limit,
                      cgroups_path=spec.cgroups_path)
        pid = _init_pid(flags.get("pid-file"))
        record["init_pid"] = pid
        if not v2.is_unified():
            raise OSError("host is not on a pure cgroup v2 hierarchy")
        record["cgroup"] = v2.path_of_pid(pid)
        record["managed"] = True
        record["prepared"] = False
    except Exception as e:  # noqa: BLE001 - the container runs as with plain runc
        record["reason"] = f"{type(e).__name__}: {e}"
        ctx.log.warning(f"container {cid}: no per-exec cgroups ({record['reason']})")
    try:
        records.save_container(ctx.config.state_dir, record)
    except (OSError, ValueError) as e:
        ctx.log.warning(f"container {cid}: cannot save record: {e}")
    return rc
