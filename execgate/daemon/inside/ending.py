"""A placed call's end: its tool cgroup emptied (end_watcher.py). Outcome, feedback on the
kept stderr, the journal line, rmdir, and the engine told, as for a docker exec call.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from execgate.calls import mark, outcome, tell
from execgate.cgroups import v2

from .state import AgentsState, Call

log = logging.getLogger("execgated.inside")

FORGET_AFTER_S = 30.0  # how long an ended call waits for its exit event, at most


class Ending(AgentsState):
    """From an emptied tool cgroup to the journal line."""

    def _ended_threadsafe(self, name: str) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._ended, name)

    def _ended(self, name: str) -> None:
        c = self.calls.pop(name, None)
        if c is None:
            return
        end = time.time()  # (by_pid keeps it: the exit event comes after the cgroup empties)
        call = c.call
        if call.start is None:  # it ended before it was admitted (killed while waiting)
            if c.wait is not None:
                c.wait.cancel()
            self.engine.cancel(name)
            call.admitted(False, unmanaged="ended before it was admitted")
            call.start = end
        gate = self.engine.done(name) if call.managed else None
        entry = outcome.conclude(call, end, gate)
        tell.tell_and_close(call, entry, c.stderr)  # the agent may be waiting for EOF
        c.ended, c.peak = True, entry.get("memory_peak")
        if c.exited.is_set():
            self._learn(c, c.peak)  # else when its exit event comes (sources.py)
        assert self.loop is not None
        self.loop.run_in_executor(None, self._record, c, entry, end)

    def _record(self, c: Call, entry: dict[str, Any], end: float) -> None:
        """Off the loop: the exit event may still be on its way, and rmdir may have to retry.
        The line goes in before the cgroup goes: a daemon killed in between leaves a marked
        cgroup that its successor records, never a call gone without its line."""
        if not c.exited.wait(0.5) and self.loop is not None:
            self.loop.call_soon_threadsafe(self._forget_later, c)
        outcome.record(entry, c.status, end, self.cfg.journal, log)
        self.engine.journal_written()
        mark.done(c.cgroup, mark.INSIDE)  # if left behind: removed, not recorded
        if not v2.remove(c.cgroup):
            log.warning("inside call %s: cannot remove %s", c.name, c.cgroup)

    def _forget_later(self, c: Call) -> None:
        """Its exit event is late (a busy loop): it still carries the program to learn from,
        and pids are reused only after their exit events, which come in order."""
        assert self.loop is not None
        self.loop.call_later(FORGET_AFTER_S, self._forget_pid, c)

    def _forget_pid(self, c: Call) -> None:
        if self.by_pid.get(c.pid) is c:
            del self.by_pid[c.pid]
