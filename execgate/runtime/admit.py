"""Ask execgated to admit a tool call before it runs; fail open on any trouble.

The daemon answers in two frames: `queued` at once, `admitted` when the call may start. Only
the first is held to the short budget (daemon_timeout_ms): a daemon that is down, wedged or
slow costs a call at most that, and the call then runs unmanaged. Waiting for `admitted` is
bounded by the daemon's own max wait (it admits anyway then) plus slack, and a daemon that
dies while we wait closes the socket, which ends the wait at once.
"""

from __future__ import annotations

import os
import time

from execgate.common import protocol

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

    from execgate.oci.runclog import RuncLog

SLACK_S = 5.0


def done(path: str, budget_s: float, call_id: str) -> dict[str, Any] | None:
    """Tell the daemon a call ended; it answers what the growth gate did to it (or None)."""
    try:
        answer = protocol.call(path, protocol.request("done", call=call_id), timeout=budget_s)
    except (OSError, protocol.ProtocolError):
        return None
    return answer if answer.get("ok") else None


def request(path: str, budget_s: float, msg: dict[str, Any], log: RuncLog) -> dict[str, Any] | None:
    """The daemon's `admitted` answer (with waited_s, forced, ...), or None to run unmanaged."""
    if not os.path.exists(path):
        log.debug(f"call {msg.get('call')}: no daemon socket at {path}; running unmanaged")
        return None
    t0 = time.monotonic()
    try:
        with protocol.Client(path, budget_s) as daemon:
            daemon.send(protocol.request("admit", **msg))
            first = daemon.recv()
            if not first.get("ok") or not first.get("queued"):
                log.warning(f"call {msg.get('call')}: daemon refused: {first.get('error')}; "
                            "running unmanaged")
                return None
            daemon.settimeout(float(first.get("max_wait_s", 30.0)) + SLACK_S)
            final = daemon.recv()
    except (OSError, protocol.ProtocolError) as e:
        waited = time.monotonic() - t0
        log.warning(f"call {msg.get('call')}: daemon unavailable after {waited:.2f}s "
                    f"({type(e).__name__}: {e}); running unmanaged")
        return None
    if not final.get("ok") or not final.get("admitted"):
        log.warning(f"call {msg.get('call')}: no admission ({final.get('error')}); "
                    "running unmanaged")
        return None
    return final
