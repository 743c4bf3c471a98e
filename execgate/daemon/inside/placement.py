"""Placing a tool process: moved into a prepared tool-<hex> cgroup (one write to cgroup.procs)
with what it forked meanwhile, its hint and a handle on its stderr taken, and handed to
admission. The time-critical part: spares are made beforehand.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from typing import Any

from execgate.calls import hint, mark, tell
from execgate.calls.oom_score import raise_oom_score_adj
from execgate.calls.record import ToolCall
from execgate.cgroups import container, v2
from execgate.common import hints

from . import procfs
from .recovery import mark_call
from .state import AgentsState, Box, Call
from .tracker import Match

log = logging.getLogger("execgated.inside")

# A call caught inside an exec is read again this often, for at most this long.
EXEC_POLL_S = 0.01
EXEC_WAIT_S = 2.0


def write_line(fd: int | None, tty: bool, text: str) -> None:
    """A feedback line on an inside call's stderr (or terminal), if we hold a handle on it."""
    if fd is not None:
        tell.say(fd, tty, [text])


class Placement(AgentsState):
    """Spare tool cgroups and the placement of a call into one."""

    def _try_place(self, m: Match, box: Box) -> None:
        try:
            self._place(m, box)
        except Exception:  # a bug here must not stop the event loop
            self.stats["failed"] += 1
            log.exception("inside agents: placing %d failed; it runs unmanaged", m.tgid)


    def _new_tool(self, box: Box) -> str:
        tool = container.make_tool_cgroup(box.cgroup, container.new_tool_name())
        if self.conf.freeze == "always":
            v2.write(tool, "cgroup.freeze", "1")
        mark.put(tool, mark.INSIDE, mark.SPARE)
        return tool

    def _replenish(self, box: Box) -> None:
        while box.cid in self.boxes and len(box.spares) < self.conf.spares:
            try:
                box.spares.append(self._new_tool(box))
            except OSError as e:
                log.warning("inside agent in %s: no spare cgroup: %s", box.cid[:12], e)
                return

    def _place(self, m: Match, box: Box) -> None:
        """Move a just-exec'd tool process into its own cgroup: the time-critical part."""
        if m.tgid in self.by_pid:
            return  # placed already (late, by a scan, before its exec event was read)
        if procfs.ppid(m.tgid) != m.parent:
            self.stats["short"] += 1  # gone (its exit is on its way), or its pid was reused
            return
        # Its name now: a short call may be gone (reaped) by the time its journal line is made.
        name_early = m.comm or procfs.comm(m.tgid)
        tool = box.spares.pop(0) if box.spares else self._new_tool(box)
        t0 = time.monotonic_ns()
        try:
            v2.move(m.tgid, tool)
        except OSError as e:
            if e.errno in (errno.ESRCH, errno.ENOENT, errno.EINVAL):
                self.stats["missed"] += 1  # it ended before we got to it: it ran unmanaged
                log.debug("inside agent in %s: %d (%s) ended before it was placed",
                          box.cid[:12], m.tgid, name_early)
                box.spares.insert(0, tool)
            else:
                v2.remove(tool, attempts=1)
                log.warning("inside agent in %s: cannot move %d: %s", box.cid[:12], m.tgid, e)
            return
        moved_ns = time.monotonic_ns()
        # What it forked before the move stays behind unless moved too (anything forked from
        # now on is born in the tool cgroup, so this walk misses nothing).
        todo = procfs.children(m.tgid)
        while todo:
            pid = todo.pop()
            with contextlib.suppress(OSError):
                v2.move(pid, tool)
            todo.extend(procfs.children(pid))
        with contextlib.suppress(OSError):  # a group-killing container: the call's OOM its own
            container.contain_group_oom(box.cgroup, tool)
        raise_oom_score_adj(m.tgid, self.cfg.tool_oom_score_adj)
        mem = procfs.memory_status(m.tgid)
        self.stats["placed"] += 1
        stderr = procfs.take_stderr(m.tgid)
        tty = stderr is not None and os.isatty(stderr)
        argv, environ = procfs.exec_image(m.tgid)
        # Still inside an exec (`sh -c 'tool ...'` execs the tool as we read): its command line
        # and environment, the hint with them, are read when it is done (see _describe_later).
        in_exec = not argv and procfs.alive(m.tgid)
        if not argv:  # it ended already: no command line left, but a zombie keeps its name
            short = procfs.comm(m.tgid) or name_early
            argv = [short] if short else []
        name = os.path.basename(tool)
        call = ToolCall(name, box.cid, box.sandbox, tool, argv, tty=tty,
                        hint=None if in_exec else self._hint(environ, box, stderr, tty),
                        oom_score_adj=self.cfg.tool_oom_score_adj,
                        arrival=time.time() - (moved_ns - m.exec_ns) / 1e9)
        call.redact = self.cfg.redact_commands
        call.inside = {
                "pid": m.tgid, "agent_pid": m.parent,
                "placement_us": round((moved_ns - m.exec_ns) / 1000, 1), "at_exec": m.at_exec,
                "move_us": round((moved_ns - t0) / 1000, 1),
                "rss_before_bytes": mem.get("VmRSS"), "anon_before_bytes": mem.get("RssAnon"),
                "memory_after_move": v2.read_int(tool, "memory.current"),
        }
        c = Call(call, m.tgid, box, stderr, frozen=self.conf.freeze == "always")
        self.calls[name] = c
        self.by_pid[m.tgid] = c
        assert self.ends is not None and self.loop is not None
        self.loop.call_soon(self._replenish, box)
        if not self.ends.watch(name, tool):
            self._ended(name)
            return
        if in_exec:
            self.stats["in_exec"] += 1
            # Described up to EXEC_WAIT_S from now: marked meanwhile, so a daemon killed then
            # leaves a call its successor records with its name (otherwise the spare's mark
            # and its CPU used are all it leaves: recovery.py).
            mark_call(call)
            self._describe_later(c, time.monotonic() + EXEC_WAIT_S)
            return
        self._admit_described(c)

    def _describe_later(self, c: Call, deadline: float) -> None:
        """A call placed inside an exec: its image read again every EXEC_POLL_S, off the
        loop's critical path (an exec slowed by reclaim takes far longer than exec_image's
        in-line wait: one under TCG at a full memory domain lost its hint in CI), then
        admitted as any other. Past `deadline` it is admitted with what can be read."""
        if self.calls.get(c.name) is not c:
            return  # it ended meanwhile; its journal line says what was known
        try:
            argv, environ = procfs.exec_image(c.pid, within_s=0.0)
            if not argv and procfs.alive(c.pid) and time.monotonic() < deadline:
                assert self.loop is not None
                self.loop.call_later(EXEC_POLL_S, self._describe_later, c, deadline)
                return
            if argv:
                c.call.argv = argv
            c.call.hint = self._hint(environ, c.box, c.stderr, c.call.tty)
            self._admit_described(c)
        except Exception:  # a bug here must not stop the event loop
            self.stats["failed"] += 1
            log.exception("inside agents: describing %d failed; it runs unmanaged", c.pid)
            self._run(c, None)

    def _admit_described(self, c: Call) -> None:
        """Its command and hint known: its limit from the hint, admission, and its mark (what
        a restarted daemon reads back)."""
        call = c.call
        if self.cfg.memory_high_from_hint and call.hint and call.hint.get("memory_bytes"):
            with contextlib.suppress(OSError):
                v2.write(call.cgroup, "memory.high", str(call.hint["memory_bytes"]))
        self._admit(c)
        mark_call(call)  # now with its hint and admission

    def _hint(self, environ: list[str], box: Box, stderr: int | None, tty: bool
              ) -> dict[str, Any] | None:
        """The call's parsed hint (from its exec'd environment), clamped to the container's
        limit; a malformed one is reported once per sandbox and value, as for docker exec."""
        raw = hints.pick(environ, [])
        return hint.resolve(raw, box.cgroup, box.sandbox, self.cfg.state_dir,
                            lambda why: log.warning("inside call in %s: %s", box.cid[:12], why),
                            lambda text: write_line(stderr, tty, text))
