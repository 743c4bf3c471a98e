"""`exec`: every tool call runs in its own cgroup inside the container's, once admitted.

The handler reads the call's command and AGENT_RESOURCE_HINT from its process spec, asks the
daemon to admit it (fail open), creates `tool-<hex>`, leaves a watcher behind to record the
outcome and remove the cgroup, and execve()s `runc exec --cgroup tool-<hex> …`: runc's exit
status and output stay exactly what the engine expects.
"""

from __future__ import annotations

import os
import time

from execgate.calls import hint
from execgate.calls.record import ToolCall
from execgate.cgroups import container, v2
from execgate.common import records
from execgate.oci import process as process_mod

from .context import Context

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

# Hint parsing, message wording and the console relay (calls/) are imported only by the calls
# that need them, the daemon's protocol (msgpack, socket) and the watcher only by managed
# calls: this module runs on every `docker exec`.


def _stderr(text: str) -> None:
    """A line to the call's own stderr (our fd 2 is the exec's, before we become runc)."""
    try:
        os.write(2, text.encode())
    except OSError:
        pass


def _waiting(frame: dict[str, Any]) -> None:
    """The daemon's `waiting` frame, told on the call's stderr before it starts (not for a TTY
    call: its terminal is runc's to set up, after admission)."""
    from execgate.calls import feedback

    _stderr(feedback.admission_waiting(float(frame.get("waited_s") or 0.0),
                                       str(frame.get("reason") or "")))


def _hint(ctx: Context, spec: process_mod.ProcessSpec | None, rec: dict[str, Any], cg: str
          ) -> dict[str, Any] | None:
    """The call's hint (calls/hint.py), from its process spec (Docker merges the container's
    env into the exec's); a bad one is told on the call's stderr, not on a terminal."""
    raw = spec.command_getenv("AGENT_RESOURCE_HINT") if spec else None

    def ignored(why: str) -> None:
        ctx.log.warning(f"exec in {rec['id']}: {why}")

    return hint.resolve(raw, cg, str(rec.get("sandbox") or rec["id"]), ctx.config.state_dir,
                        ignored, _stderr if spec and not spec.terminal else None)


def recover(ctx: Context) -> None:
    """After a failed handler, before passing through: the exec must not land in an `init/`
    execgate froze (an idle sandbox), so thaw it. Never raises."""
    try:
        flags = ctx.inv.command_flags()
        rec = records.load_container(ctx.config.state_dir, flags.positionals[0])
        if rec and rec.get("managed") and isinstance(rec.get("cgroup"), str):
            container.thaw_init(rec["cgroup"])
    except Exception as e:  # noqa: BLE001 - the passthrough goes on regardless
        ctx.log.warning(f"exec: could not thaw the sandbox ({type(e).__name__}: {e})")


def handle(ctx: Context) -> list[str]:
    argv = ctx.inv.argv
    flags = ctx.inv.command_flags()
    if flags.get("cgroup") is not None or not flags.positionals:
        return argv  # the caller placed the process itself
    cid = flags.positionals[0]
    rec = records.load_container(ctx.config.state_dir, cid)
    if not rec or not rec.get("managed"):
        return argv
    cg = rec["cgroup"]
    if not container.is_prepared(cg):
        ctx.log.warning(f"exec in {cid}: {cg} lacks init/; running unmanaged")
        return argv
    spec = None
    if flags.get("process"):
        try:
            spec = process_mod.load(flags.get("process") or "")
        except (OSError, ValueError) as e:
            ctx.log.warning(f"exec in {cid}: unreadable process spec: {e}")
    from . import admit, watcher

    name = container.new_tool_name()
    call = ToolCall(name, cid, rec.get("sandbox", cid), os.path.join(cg, name),
                    spec.args if spec else flags.positionals[1:],
                    tty=bool(spec.terminal) if spec else flags.is_set("tty"),
                    detach=flags.is_set("detach"), hint=_hint(ctx, spec, rec, cg),
                    oom_score_adj=ctx.config.tool_oom_score_adj,
                    hold_exit=ctx.config.tty_exit_hold, arrival=time.time())
    answer = admit.request(ctx.config.socket, ctx.config.daemon_timeout_ms / 1000,
                           call.admit_request(), ctx.log, None if call.tty else _waiting)
    if answer is None:  # the daemon thaws an idle sandbox when it admits; failing open, we do
        container.thaw_init(cg)
        call.admitted(False)
    else:
        call.daemon = {"socket": ctx.config.socket,
                       "timeout_s": ctx.config.daemon_timeout_ms / 1000}
        call.admitted(True, round(float(answer.get("waited_s", 0.0)), 3),
                      bool(answer.get("forced")))
    if answer and not call.tty and call.waited_s >= 2.0:
        from execgate.calls import feedback

        if feedback.should_report_delay(call.waited_s):
            _stderr(feedback.admission_delayed(call.waited_s))
    tool = container.make_tool_cgroup(cg, name)
    # Its identity, for the watcher to check the exit status it reads is this call's: taken
    # now, as the cgroup may be gone (container deleted) before the watcher first runs.
    call.cgroup_id = os.stat(tool).st_ino
    cap = container.contain_group_oom(cg, tool)
    if cap is not None:
        ctx.log.debug(f"exec in {cid}: the container kills as a group; call capped at {cap}")
    if ctx.config.memory_high_from_hint and call.hint and call.hint.get("memory_bytes"):
        try:
            v2.write(tool, "memory.high", str(call.hint["memory_bytes"]))
        except OSError as e:
            ctx.log.warning(f"exec in {cid}: memory.high not set: {e}")
    out = ctx.inv.with_command_flags(["--cgroup", name])
    proxy = None
    engine_socket = flags.get("console-socket")
    if call.tty and engine_socket:
        from execgate.calls import terminal

        try:
            proxy = terminal.Proxy(os.path.join(ctx.config.state_dir, "console", name + ".sock"),
                                  engine_socket)
            out = ctx.inv.replace_command_flag(out, "console-socket", proxy.path)
        except OSError as e:
            ctx.log.warning(f"exec in {cid}: no terminal feedback ({e})")
            proxy = None
    call.start = time.time()
    watcher.spawn(call, flags.get("pid-file"), ctx.config.journal, ctx.log, proxy)
    return out
