"""Ask execgated to admit a tool call before it runs; fail open on any trouble.

The daemon answers `queued` at once, then — because we ask for them (`progress_s`) — a
`waiting` frame every protocol.PROGRESS_S seconds while the call waits (the agent is told why on its
stderr), and `admitted` when the call may start. The first frame is held to the short budget
(daemon_timeout_ms): a daemon that is down, wedged or slow costs a call at most that, and the
call then runs unmanaged. After it, a daemon that keeps us informed is waited for: a call
whose bounded wait has ended is first in line, not forced into a full host (docs/protocol.md),
so it may wait longer than max_wait_s. Two bounds keep that wait finite: silence for
MISSED_FRAMES * PROGRESS_S + SLACK_S (a wedged daemon, not a late one), and the daemon's own
fail-open cap, max_queued_s +
SLACK_S in all (the daemon starts the call by then itself). A daemon that dies while we wait
closes the socket, which ends the wait at once. A daemon that sends no `progress_s` back (an
older one) is waited for max_wait_s + SLACK_S, as it forces the call by then.
"""

from __future__ import annotations

import os
import time

from execgate.common import frontconf, protocol

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from collections.abc import Callable
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


def _number(value: Any, default: float | None) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return default
    return float(value)


def wait_bound(first: dict[str, Any]) -> tuple[float, float]:
    """(total seconds to wait for `admitted`, seconds of silence after which the daemon
    counts as wedged), from its `queued` frame."""
    progress = _number(first.get("progress_s"), None)
    max_wait = _number(first.get("max_wait_s"), 30.0) or 0.0
    if not progress:  # an older daemon: it forces the call after max_wait_s
        return max_wait + SLACK_S, max_wait + SLACK_S
    cap = _number(first.get("max_queued_s"), max_wait) or 0.0
    return max(cap, max_wait) + SLACK_S, progress * protocol.MISSED_FRAMES + SLACK_S


def request(path: str, budget_s: float, msg: dict[str, Any], log: RuncLog,
            on_wait: Callable[[dict[str, Any]], None] | None = None
            ) -> tuple[dict[str, Any] | None, str]:
    """The daemon's `admitted` answer (with waited_s, forced, ...) and "", or None and why the
    call runs unmanaged (the journal keeps it). on_wait gets every `waiting` frame (waited_s,
    reason) while the call waits."""
    call = msg.get("call")

    def unmanaged(why: str, debug: bool = False) -> tuple[None, str]:
        (log.debug if debug else log.warning)(f"call {call}: {why}; running unmanaged")
        return None, why

    if os.environ.get(frontconf.DAEMON_LOST):
        return unmanaged("the daemon went away or fell silent while the call waited")
    if not os.path.exists(path):
        return unmanaged(f"no daemon socket at {path}", debug=True)
    t0 = time.monotonic()
    try:
        with protocol.Client(path, budget_s) as daemon:
            daemon.send(protocol.request("admit", progress_s=protocol.PROGRESS_S, **msg))
            first = daemon.recv(deadline=t0 + budget_s)  # connect to `queued`: one budget
            if not first.get("ok") or not first.get("queued"):
                return unmanaged(f"daemon refused: {first.get('error')}")
            total, silence = wait_bound(first)
            deadline = time.monotonic() + total
            while True:
                now = time.monotonic()
                if now >= deadline:
                    raise TimeoutError(f"no admission within {total:g} s")
                final = daemon.recv(deadline=min(now + silence, deadline))  # each frame whole
                if not final.get("waiting"):
                    break
                if on_wait is not None:
                    on_wait(final)
    except (OSError, protocol.ProtocolError) as e:
        waited = time.monotonic() - t0
        return unmanaged(f"daemon unavailable after {waited:.2f}s ({type(e).__name__}: {e})")
    if not final.get("ok") or not final.get("admitted"):
        return unmanaged(f"no admission ({final.get('error')})")
    return final, ""
