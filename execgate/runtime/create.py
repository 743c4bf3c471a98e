"""`create`: ask the daemon to admit the sandbox, run runc create and record the container (its
cgroup layout comes at `start`; cgroups/sandbox.py).

The daemon is asked *before* runc create, while nothing is in the container's cgroup yet: a
sandbox that would not fit waits here (`policy/sandbox_admission.py`), bounded by the daemon's
`max_start_wait_s`. A daemon that is down, silent or dies while we wait never holds a create:
it goes ahead at once (fail open), logged in runc's log and counted in the record (`start`).
"""

from __future__ import annotations

import os
import time

from execgate.cgroups import sandbox
from execgate.common import frontconf
from execgate.oci import bundle as bundle_mod
from execgate.oci import runc

from .context import Context

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any


def _admit_start(ctx: Context, cid: str, spec: bundle_mod.Bundle) -> dict[str, Any] | None:
    """Wait for the daemon's word that the sandbox may start; what happened, for the record
    (None: not asked, as sandbox admission is off or the host is not on cgroup v2)."""
    if not sandbox.admits_sandboxes(ctx.config):
        return None
    if os.environ.get(frontconf.DAEMON_LOST):  # the front waited, and the daemon went away
        ctx.log.warning(f"create {cid}: the daemon went away while the sandbox waited; "
                        "starting unadmitted (fail open)")
        return {"admitted": False, "verdict": "daemon-unavailable", "waited_s": 0.0,
                "why": "the daemon went away while the front waited"}
    if not os.path.exists(ctx.config.socket):  # no daemon here: nothing to wait for
        ctx.log.debug(f"create {cid}: no daemon socket at {ctx.config.socket}; unadmitted")
        return {"admitted": False, "verdict": "no-daemon", "waited_s": 0.0}
    from . import start_admit  # the protocol (msgpack, socket): only for a create that asks

    t0 = time.monotonic()
    msg = sandbox.start_request(cid, spec)
    answer, why = start_admit.ask(ctx.config.socket, ctx.config.daemon_timeout_ms / 1000, msg)
    waited = round(time.monotonic() - t0, 3)
    if answer is None:
        ctx.log.warning(f"create {cid}: {why} after {waited:.2f}s; starting unadmitted "
                        "(fail open)")
        return {"admitted": False, "verdict": "daemon-unavailable", "waited_s": waited,
                "why": why}
    verdict = str(answer.get("verdict") or "admitted")
    if verdict != "admitted":
        ctx.log.warning(f"create {cid}: {answer.get('reason')}")
    return {"admitted": True, "verdict": verdict, "waited_s": waited,
            "image": msg["image"]}


def handle(ctx: Context) -> int:
    flags = ctx.inv.command_flags()
    cid = flags.positionals[0] if flags.positionals else None
    spec: bundle_mod.Bundle | None = None
    spec_error: Exception | None = None
    try:
        spec = bundle_mod.load(flags.get("bundle") or os.getcwd())
    except Exception as e:  # noqa: BLE001 - runc reports a bad bundle its own way
        spec_error = e
    start = _admit_start(ctx, cid, spec) if cid and spec is not None else None
    rc = runc.run(ctx.runc, ctx.inv.argv)
    if rc != 0 or not cid:
        return rc
    try:  # runc has run: from here on nothing may make main() run it again
        sandbox.created(ctx.config.state_dir, cid, spec, spec_error, flags.get("pid-file"),
                        start, ctx.log)
    except Exception as e:  # noqa: BLE001
        ctx.log.warning(f"container {cid}: cannot record: {type(e).__name__}: {e}")
    return rc
