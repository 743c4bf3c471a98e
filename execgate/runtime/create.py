"""`create`: ask the daemon to admit the sandbox, run runc create and record the container (its
cgroup layout comes at `start`).

The daemon is asked *before* runc create, while nothing is in the container's cgroup yet: a
sandbox that would not fit waits here (`policy/sandbox_admission.py`), bounded by the daemon's
`max_start_wait_s`. A daemon that is down, silent or dies while we wait never holds a create:
it goes ahead at once (fail open), logged in runc's log and counted in the record (`start`).

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

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

# Where an engine names the image in the runtime spec, most specific first. The OCI spec has
# no image field: CRI (containerd, CRI-O) annotates it; Docker does not, unless asked
# (`docker run --annotation execgate.image=NAME`), so there the init's program stands in.
IMAGE_ANNOTATIONS = ("execgate.image", "io.kubernetes.cri.image-name",
                     "io.kubernetes.cri-o.ImageName", "org.opencontainers.image.ref.name",
                     "org.opencontainers.image.base.name")


def image_key(spec: bundle_mod.Bundle) -> str:
    """The key sandbox baselines are learned under: the image where the spec names it, else
    `cmd:<init program>` (one image's sandboxes run one entrypoint), else "default"."""
    for key in IMAGE_ANNOTATIONS:
        if spec.annotations.get(key):
            return spec.annotations[key]
    if spec.args and spec.args[0]:
        return "cmd:" + os.path.basename(spec.args[0])
    return "default"


def _init_pid(pid_file: str | None) -> int:
    if not pid_file:
        raise LookupError("no --pid-file given")
    with open(pid_file) as f:
        return int(f.read().strip())


def _admit_start(ctx: Context, cid: str, spec: bundle_mod.Bundle) -> dict[str, Any] | None:
    """Wait for the daemon's word that the sandbox may start; what happened, for the record
    (None: not asked, as sandbox admission is off or the host is not on cgroup v2)."""
    table = ctx.config.tables.get("sandbox_admission") or {}
    if table.get("enabled") is False or not v2.is_unified():
        return None
    if not os.path.exists(ctx.config.socket):  # no daemon here: nothing to wait for
        ctx.log.debug(f"create {cid}: no daemon socket at {ctx.config.socket}; unadmitted")
        return {"admitted": False, "verdict": "no-daemon", "waited_s": 0.0}
    from . import start_admit  # the protocol (msgpack, socket): only for a create that asks

    t0 = time.monotonic()
    msg = {"sandbox": cid, "image": image_key(spec), "pod": spec.sandbox_id(cid),
           "cgroups_path": spec.cgroups_path, "hostname": spec.hostname}
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
    record: dict[str, object] = {"id": cid, "created": time.time(), "managed": False}
    if start is not None:
        record["start"] = start
    try:
        if spec is None:
            raise spec_error or LookupError("no bundle")
        record.update(bundle=spec.path, hostname=spec.hostname, sandbox=spec.sandbox_id(cid),
                      annotations=spec.annotations, memory_limit=spec.memory_limit,
                      cgroups_path=spec.cgroups_path, image=image_key(spec))
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
