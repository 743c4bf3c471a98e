"""A placed call asks the engine to be admitted; frozen only while it waits (freeze "queued"),
thawed once admitted (or failing open), unless the growth gate holds it by then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from execgate.calls import feedback
from execgate.cgroups import v2

from .placement import write_line
from .state import AgentsState, Call

log = logging.getLogger("execgated.inside")


class CallAdmission(AgentsState):
    """Admission of placed calls, and holding them while they wait."""

    def _admit(self, c: Call) -> None:
        msg = c.call.admit_request()
        try:
            _ticket, fut = self.engine.submit(msg)
        except Exception as e:  # noqa: BLE001 - fail open
            log.warning("inside call %s: not admitted (%s); running unmanaged", c.name, e)
            self._run(c, None, f"not admitted ({type(e).__name__}: {e})")
            return
        if fut.done():
            self._run(c, fut.result())
            return
        if not c.frozen:
            try:
                v2.write(c.cgroup, "cgroup.freeze", "1")
                c.frozen = True
            except OSError as e:
                log.warning("inside call %s: cannot hold it (%s)", c.name, e)
        c.wait = asyncio.ensure_future(self._wait(c, fut))

    async def _wait(self, c: Call, fut: asyncio.Future[Any]) -> None:
        bound = self.engine.wait_bound_s()  # past max_wait_s a call is first in line, not forced
        try:
            decision = await asyncio.wait_for(asyncio.shield(fut), bound)
        except TimeoutError:
            log.warning("inside call %s: no admission after %.0f s; running unmanaged",
                        c.name, bound)
            self.engine.cancel(c.name)
            self._run(c, None, f"no admission after {bound:.0f} s")
            return
        except asyncio.CancelledError:
            if c.frozen:
                self._thaw(c)  # shutting down, or the call ended: never leave it frozen
            raise
        self._run(c, decision)

    def _run(self, c: Call, decision: Any, why: str = "") -> None:
        """Admitted (decision) or failed open (None, and why): let it go."""
        call = c.call
        if decision is None:
            call.admitted(False, unmanaged=why or "not admitted")
        else:
            call.admitted(True, round(float(decision.waited_s), 3), bool(decision.forced))
            if call.inside is not None:
                call.inside["frozen_s"] = call.waited_s if c.frozen else 0.0
            if feedback.should_report_delay(call.waited_s):
                write_line(c.stderr, call.tty, feedback.admission_delayed(call.waited_s))
        if c.frozen:
            self._thaw(c)
        call.start = time.time()

    def _thaw(self, c: Call) -> None:
        held = self.engine.growth.tracked.get(c.name)
        if held is not None and not held.allowed:
            return  # the growth gate holds it now; the gate releases it
        try:
            v2.write(c.cgroup, "cgroup.freeze", "0")
        except OSError:
            pass
        c.frozen = False
