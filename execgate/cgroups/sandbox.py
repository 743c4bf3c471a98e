"""A managed container's life in execgate's hands, around runc's own create, start, kill and
delete: its record (create), the init/ + tool-*/ layout made (start), what execgate froze
thawed (kill), what it left removed (delete). Shared by the runtime's handlers (runtime/
create.py, start.py, kill.py, delete.py) and the daemon's op for the compiled front
(daemon/lifecycle_op.py). A bundle here is oci/bundle.py's Bundle.

The engine's shim loads the container's cgroup from its init's /proc/PID/cgroup right after
create: init must still be in the container's own cgroup then, or `docker stats` would count
init/ alone and miss every tool call. So the layout waits for start.
"""

from __future__ import annotations

import os
import time

from execgate.common import records

from . import container, v2

TYPE_CHECKING = False  # typing's, without importing typing on the runtime path
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Protocol

    from execgate.common.config import Config

    class Log(Protocol):  # oci/runclog.py's RuncLog, or a logging.Logger
        def warning(self, msg: str) -> None: ...


# Where an engine names the image in the runtime spec, most specific first. The OCI spec has
# no image field: CRI (containerd, CRI-O) annotates it; Docker does not, unless asked
# (`docker run --annotation execgate.image=NAME`), so there the init's program stands in.
IMAGE_ANNOTATIONS = ("execgate.image", "io.kubernetes.cri.image-name",
                     "io.kubernetes.cri-o.ImageName", "org.opencontainers.image.ref.name",
                     "org.opencontainers.image.base.name")


def image_key(spec: Any) -> str:
    """The key sandbox baselines are learned under: the image where the spec names it, else
    `cmd:<init program>` (one image's sandboxes run one entrypoint), else "default"."""
    for key in IMAGE_ANNOTATIONS:
        if spec.annotations.get(key):
            return spec.annotations[key]
    if spec.args and spec.args[0]:
        return "cmd:" + os.path.basename(spec.args[0])
    return "default"


def admits_sandboxes(cfg: Config) -> bool:
    """Whether a create waits for sandbox admission: [sandbox_admission] not disabled, and a
    cgroup v2 host (the policy reads cgroup v2 files)."""
    table = cfg.tables.get("sandbox_admission") or {}
    return table.get("enabled") is not False and v2.is_unified()


def start_request(cid: str, spec: Any) -> dict[str, Any]:
    """A create's `start_sandbox` fields (docs/protocol.md), from its bundle."""
    return {"sandbox": cid, "image": image_key(spec), "pod": spec.sandbox_id(cid),
            "cgroups_path": spec.cgroups_path, "hostname": spec.hostname,
            "caller_deadline": spec.caller_deadline()}


def _init_pid(pid_file: str | None) -> int:
    if not pid_file:
        raise LookupError("no --pid-file given")
    with open(pid_file) as f:
        return int(f.read().strip())


def created(state_dir: str, cid: str, spec: Any, spec_error: Exception | None,
            pid_file: str | None, start: dict[str, Any] | None, log: Log) -> None:
    """After runc create: the container's record (managed, unless it cannot be: then why);
    start: how its sandbox admission went (None: not asked)."""
    record: dict[str, object] = {"id": cid, "created": time.time(), "managed": False}
    if start is not None:
        record["start"] = start
    try:
        if spec is None:
            raise spec_error or LookupError("no bundle")
        record.update(bundle=spec.path, hostname=spec.hostname, sandbox=spec.sandbox_id(cid),
                      annotations=spec.annotations, memory_limit=spec.memory_limit,
                      cgroups_path=spec.cgroups_path, image=image_key(spec))
        pid = _init_pid(pid_file)
        record["init_pid"] = pid
        if not v2.is_unified():
            raise OSError("host is not on a pure cgroup v2 hierarchy")
        record["cgroup"] = v2.path_of_pid(pid)
        record["managed"] = True
        record["prepared"] = False
    except Exception as e:  # noqa: BLE001 - the container runs as with plain runc
        record["reason"] = f"{type(e).__name__}: {e}"
        log.warning(f"container {cid}: no per-exec cgroups ({record['reason']})")
    try:
        records.save_container(state_dir, record)
    except (OSError, ValueError) as e:
        log.warning(f"container {cid}: cannot save record: {e}")


def prepare(cfg: Config, cid: str, log: Log,
            guard: Callable[[str], Callable[[], None]] | None = None) -> None:
    """After runc start: give a managed container its layout (cgroups/container.py, frozen
    meanwhile; guard(cg) returns what ends a guard that thaws it should we die first) and
    swap_max, and record it; a container that cannot have it runs as with plain runc."""
    rec = records.load_container(cfg.state_dir, cid)
    if not rec or not rec.get("managed") or rec.get("prepared"):
        return
    try:
        release = guard(rec["cgroup"]) if guard is not None else None
        try:
            rec["controllers"] = container.prepare(rec["cgroup"], cfg.controllers)
        finally:
            if release is not None:
                release()
        rec["prepared"] = True
        _swap_max(cfg, rec["cgroup"], log)
    except Exception as e:  # noqa: BLE001 - the container runs as with plain runc
        rec["managed"] = False
        rec["reason"] = f"{type(e).__name__}: {e}"
        log.warning(f"container {rec['id']}: no per-exec cgroups ({rec['reason']})")
    records.save_container(cfg.state_dir, rec)


def _swap_max(cfg: Config, cg: str, log: Log) -> None:
    """[residency] swap_max on init/ (cgroups/container.py says why there); a bad value or a
    kernel without swap accounting is logged, never a reason to give the container up."""
    table = cfg.tables.get("residency")
    raw = table.get("swap_max", "max") if isinstance(table, dict) else "max"
    value = None
    try:
        value = container.swap_max_value(raw)
        if value is not None:
            container.set_swap_max(cg, value)
    except FileNotFoundError as e:  # no swap accounting: "max" is what it has anyway
        if value != "max":
            log.warning(f"{cg}: [residency] swap_max {raw!r} not applied: {e}")
    except (OSError, ValueError) as e:
        log.warning(f"{cg}: [residency] swap_max {raw!r} not applied: {e}")


# The signals an engine stops a container with (runc kill's default is SIGTERM).
STOPPING = ("TERM", "INT", "QUIT", "KILL", "15", "2", "3", "9")


def stops(signal: list[str]) -> bool:
    """Whether `runc kill ID [SIGNAL]` (signal: its [SIGNAL]) stops the container: its calls
    are then released by the growth gate, not held (protocol op `release`)."""
    return (signal[0] if signal else "TERM").upper().removeprefix("SIG") in STOPPING


def thaw_ours(rec: dict[str, Any]) -> None:
    """Thaw what execgate froze in a managed container (init/, tool calls); the engine's own
    pause (the container's cgroup) is left alone."""
    if rec.get("managed") and rec.get("cgroup"):
        container.thaw_init(rec["cgroup"])
        for tool in container.tool_cgroups(rec["cgroup"]):
            v2.thaw(tool)


def clean_up(state_dir: str, rec: dict[str, Any]) -> None:
    """After runc delete: what execgate left (tool cgroups, init/, the record)."""
    cg = rec.get("cgroup")
    # runc (or systemd) removes the container cgroup recursively; this catches what is left
    # when that removal raced a follower or the container's cgroup survived the delete.
    if cg and os.path.isdir(cg) and not v2.procs(cg):
        container.remove_idle_tool_cgroups(cg)
        init = os.path.join(cg, container.INIT)
        if os.path.isdir(init) and not v2.populated(init):
            v2.remove(init, attempts=3)
    from execgate.common import hints

    records.remove_container(state_dir, rec["id"])
    hints.forget_warnings(state_dir, str(rec.get("sandbox") or rec["id"]))
