"""Ask execgated whether a sandbox may start (`start_sandbox`, before runc create).

Apart from `admit.py` (a tool call's conversation) because a create's differs: nothing to tell
an agent while it waits, and the wait is the sandbox policy's `max_start_wait_s`, which the
daemon's first frame announces. Fail open on any trouble: None, and the caller starts the
sandbox unadmitted. A daemon that dies while we wait closes the socket: the wait ends at once.
"""

from __future__ import annotations

import time

from execgate.common import protocol

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time
if TYPE_CHECKING:
    from typing import Any

SLACK_S = 5.0  # beyond max_start_wait_s: the daemon answers fail-open by then itself


def ask(path: str, budget_s: float, msg: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """(the daemon's `admitted` frame, "") or (None, why it was not had)."""
    t0 = time.monotonic()
    try:
        with protocol.Client(path, budget_s) as daemon:
            daemon.send(protocol.request("start_sandbox", **msg))
            queued = daemon.recv(deadline=t0 + budget_s)  # connect to `queued`: one budget
            if not (queued.get("ok") and queued.get("queued")):
                return None, f"daemon refused: {queued.get('error')}"
            wait = queued.get("max_wait_s")
            if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait >= 0:
                wait = 0.0
            answer = daemon.recv(deadline=time.monotonic() + min(wait, 1e6) + SLACK_S)
    except (OSError, protocol.ProtocolError) as e:
        return None, f"daemon unavailable ({type(e).__name__}: {e})"
    if answer.get("ok") and answer.get("admitted"):
        return answer, ""
    return None, f"no admission ({answer.get('error')})"
