"""Placing a tool call: from a `runc exec` argv to the call's own cgroup in its container's.

Shared by the runtime's exec handler (runtime/exec.py) and the daemon's exec op
(daemon/exec_op.py), which does the same for the compiled front with no Python started per
call. Two steps around admission: plan() reads what the call is (the container's record, its
process spec, its hint) into a ToolCall; place() makes its cgroup and returns the argv runc runs
it with. Neither tells the agent anything itself: `say` gets what is for the call's stderr.
"""

from __future__ import annotations

import os
import time

from execgate.calls import hint
from execgate.calls.record import ToolCall
from execgate.cgroups import container, v2
from execgate.common import records
from execgate.oci import process as process_mod

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from execgate.common.config import Config
    from execgate.oci.cli import Flags, Invocation
    from execgate.oci.runclog import RuncLog


class Plan:
    """A managed call, read but not yet placed."""

    def __init__(self, inv: Invocation, flags: Flags, rec: dict[str, Any],
                 spec: process_mod.ProcessSpec | None, call: ToolCall) -> None:
        self.inv = inv
        self.flags = flags
        self.rec = rec
        self.spec = spec
        self.call = call


def _hint(cfg: Config, spec: process_mod.ProcessSpec | None, rec: dict[str, Any], cg: str,
          log: RuncLog, say: Callable[[str], None]) -> dict[str, Any] | None:
    """The call's hint (calls/hint.py), from its process spec (Docker merges the container's
    env into the exec's); a bad one is told on the call's stderr, not on a terminal."""
    raw = spec.command_getenv("AGENT_RESOURCE_HINT") if spec else None

    def ignored(why: str) -> None:
        log.warning(f"exec in {rec['id']}: {why}")

    return hint.resolve(raw, cg, str(rec.get("sandbox") or rec["id"]), cfg.state_dir,
                        ignored, say if spec and not spec.terminal else None)


def plan(cfg: Config, inv: Invocation, log: RuncLog, say: Callable[[str], None],
         runtime: str | None = None) -> Plan | None:
    """The call this exec is, or None when it is not execgate's to place (the caller chose a
    cgroup, the container is not managed or not prepared, the real runtime (runtime: its path,
    else found from the config) has no `exec --cgroup`): then it passes through as it is."""
    flags = inv.command_flags()
    if flags.get("cgroup") is not None or not flags.positionals:
        return None  # the caller placed the process itself
    cid = flags.positionals[0]
    rec = records.load_container(cfg.state_dir, cid)
    if not rec or not rec.get("managed"):
        return None
    cg = rec["cgroup"]
    if not container.is_prepared(cg):
        log.warning(f"exec in {cid}: {cg} lacks init/; running unmanaged")
        records.note_fail_open(cfg.state_dir, "not-prepared", cid, f"{cg} lacks init/")
        return None
    from execgate.oci import exec_cgroup

    real = runtime or _found_runtime(cfg.runtime)
    if real is not None and not exec_cgroup.supported(real, cfg.state_dir):
        log.warning(f"exec in {cid}: the runtime {real} has no `exec --cgroup`: running "
                    "unmanaged (runc >= 1.1 has it)")
        records.note_fail_open(cfg.state_dir, "no-exec-cgroup", cid,
                               f"{real} has no `exec --cgroup`")
        return None
    spec = None
    if flags.get("process"):
        try:
            spec = process_mod.load(flags.get("process") or "")
        except (OSError, ValueError) as e:
            log.warning(f"exec in {cid}: unreadable process spec: {e}")
    name = container.new_tool_name()
    call = ToolCall(name, cid, rec.get("sandbox", cid), os.path.join(cg, name),
                    spec.args if spec else flags.positionals[1:],
                    tty=bool(spec.terminal) if spec else flags.is_set("tty"),
                    detach=flags.is_set("detach"), hint=_hint(cfg, spec, rec, cg, log, say),
                    oom_score_adj=cfg.tool_oom_score_adj,
                    hold_exit=cfg.tty_exit_hold, arrival=time.time())
    call.redact = cfg.redact_commands
    return Plan(inv, flags, rec, spec, call)


_found: dict[tuple[str, ...], str | None] = {}  # configured candidates -> the real runtime


def _found_runtime(candidates: tuple[str, ...]) -> str | None:
    """The real runtime for a caller that has not resolved it (the daemon's exec op, on every
    call: found once per configured list); None when none is found: the caller's own runtime
    decides then."""
    if candidates not in _found:
        from execgate.oci import runc

        try:
            _found[candidates] = runc.find(candidates)
        except runc.RuntimeNotFound:
            return None
    return _found[candidates]


def place(cfg: Config, p: Plan, log: RuncLog) -> list[str]:
    """Make the admitted call's cgroup (capped where the container kills as a group, with
    memory.high from its hint where configured); the argv that runs the call in it."""
    call, cg = p.call, p.rec["cgroup"]
    tool = container.make_tool_cgroup(cg, call.call)
    # Its identity, for the follower to check the exit status it reads is this call's: taken
    # now, as the cgroup may be gone (container deleted) before the follower first runs.
    call.cgroup_id = os.stat(tool).st_ino
    cap = container.contain_group_oom(cg, tool)
    if cap is not None:
        log.debug(f"exec in {call.container}: the container kills as a group; "
                  f"call capped at {cap}")
    if cfg.memory_high_from_hint and call.hint and call.hint.get("memory_bytes"):
        try:
            v2.write(tool, "memory.high", str(call.hint["memory_bytes"]))
        except OSError as e:
            log.warning(f"exec in {call.container}: memory.high not set: {e}")
    return p.inv.with_command_flags(["--cgroup", call.call])
