"""`exec`: every tool call runs in its own cgroup inside the container's, once admitted.

The handler reads the call's command and AGENT_RESOURCE_HINT from its process spec, asks the
daemon to admit it (fail open), creates `tool-<hex>` (calls/placement.py), leaves a watcher
behind to record the outcome and remove the cgroup, and execve()s `runc exec --cgroup
tool-<hex> …`: runc's exit status and output stay exactly what the engine expects. Where the
daemon runs, the compiled front hands it managed non-TTY calls instead (daemon/exec_op.py):
this handler is then the path for TTY calls and the fail-open one.
"""

from __future__ import annotations

import os
import time

from execgate.calls import placement
from execgate.cgroups import container
from execgate.common import records

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
    p = placement.plan(ctx.config, ctx.inv, ctx.log, _stderr, ctx.runc)
    if p is None:
        return ctx.inv.argv
    from . import admit, watcher

    call = p.call
    answer, why = admit.request(ctx.config.socket, ctx.config.daemon_timeout_ms / 1000,
                                call.admit_request(), ctx.log, None if call.tty else _waiting)
    if answer is None:  # the daemon thaws an idle sandbox when it admits; failing open, we do
        container.thaw_init(p.rec["cgroup"])
        call.admitted(False, unmanaged=why)
    else:
        call.daemon = {"socket": ctx.config.socket,
                       "timeout_s": ctx.config.daemon_timeout_ms / 1000}
        call.admitted(True, round(float(answer.get("waited_s", 0.0)), 3),
                      bool(answer.get("forced")))
    if answer and not call.tty and call.waited_s >= 2.0:
        from execgate.calls import feedback

        if feedback.should_report_delay(call.waited_s):
            _stderr(feedback.admission_delayed(call.waited_s))
    out = placement.place(ctx.config, p, ctx.log)
    proxy = None
    engine_socket = p.flags.get("console-socket")
    if call.tty and engine_socket:
        from execgate.calls import terminal

        try:
            proxy = terminal.Proxy(os.path.join(ctx.config.state_dir, "console",
                                                call.call + ".sock"), engine_socket)
            out = ctx.inv.replace_command_flag(out, "console-socket", proxy.path)
        except OSError as e:
            ctx.log.warning(f"exec in {call.container}: no terminal feedback ({e})")
            proxy = None
    call.start = time.time()
    watcher.spawn(call, p.flags.get("pid-file"), ctx.config.journal, ctx.log, proxy)
    return out
