"""What a restarted daemon finds: spare tool cgroups, and placed calls marked by an xattr on
their cgroup (the call's record in its journal form); docker exec calls have their own watchers
or, placed for the compiled front, their own mark (daemon/exec_op.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time

from execgate.calls import mark
from execgate.calls.record import ToolCall
from execgate.cgroups import container, v2

from ..engine import call_info
from . import procfs
from .state import AgentsState, Box, Call

log = logging.getLogger("execgated.inside")

def mark_call(call: ToolCall) -> None:
    """The call's record on its cgroup: what a restarted daemon reads back."""
    mark.put(call.cgroup, mark.INSIDE, mark.record(call))


def _first_task(tool: str) -> tuple[int, list[str]]:
    """The pid and command line of a cgroup's first task that has one; (0, []) if none."""
    for pid in v2.procs(tool):
        argv = procfs.nul_list(f"/proc/{pid}/cmdline")
        if argv:
            return pid, argv
    return 0, []


class Recovery(AgentsState):
    """Adopting what a previous daemon left in a container."""

    def _recover(self, box: Box) -> None:
        """What a previous daemon left in this container: spares, and calls that were placed
        (marked by an xattr; docker exec calls have their own watchers and are left alone)."""
        for tool in container.tool_cgroups(box.cgroup):
            found = mark.get(tool, mark.INSIDE)
            if found is None and not self._starting:
                continue
            v2.thaw(tool)
            if found is None:
                continue
            name = os.path.basename(tool)
            try:
                placed = json.loads(found) if found not in (mark.SPARE, mark.DONE) else None
            except ValueError:
                placed = None
            if not isinstance(placed, dict):
                if found == mark.DONE or (
                        not v2.populated(tool) and v2.never_ran(tool, unknown=True)):
                    v2.remove(tool, attempts=1)  # journaled, or a spare never used
                    continue
                # A call the previous daemon was placing when it died (moved, not yet
                # marked): its command is its first task's, unknown if it ended since.
                pid, argv = _first_task(tool)
                call = ToolCall(name, box.cid, box.sandbox, tool, argv, arrival=time.time())
                call.inside = {"pid": pid}  # an inside call (its exit heard, if it runs)
                call.redact = self.cfg.redact_commands
                mark_call(call)  # read back if this daemon dies too
            else:
                call = ToolCall.from_journal(placed)
            call.cgroup, call.call = tool, name
            call.managed, call.adopted = name in self.engine.calls, True
            live = self.engine.calls.get(name)
            if live is not None and call.hint:  # the engine adopted it without one
                with contextlib.suppress(KeyError, ValueError, TypeError):
                    live.info = call_info(call.admit_request())
            if call.waited_s is None:
                call.waited_s = 0.0
            if call.forced is None:
                call.forced = False
            if call.start is None:
                call.start = call.arrival or time.time()
            pid = int((call.inside or {}).get("pid") or 0)
            c = Call(call, pid, box, None)
            self.calls[name] = c
            if pid:
                self.by_pid[pid] = c
            assert self.ends is not None
            if not self.ends.watch(name, tool):
                self._ended(name)
            log.info("inside call %s in %s adopted after a restart", name, box.cid[:12])
