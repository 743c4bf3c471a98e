"""Which containers opted in and which of their processes are agents.

Container records are heard through inotify (re-read every scan period without it); an
agent is the container's init, its child under an init wrapper, or the processes named by
`execgate.agent.command`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import time
from typing import Any

from execgate.cgroups import container, v2
from execgate.common import records
from execgate.common.libc import libc

from . import procfs
from .state import AgentsState, Box
from .tracker import Match

log = logging.getLogger("execgated.inside")

COMMAND_ANNOTATION = "execgate.agent.command"
INIT_WRAPPERS = frozenset({"docker-init", "tini", "dumb-init", "catatonit"})


class Inotify:
    """Just enough inotify (ctypes) to hear a container record appear or vanish at once."""

    IN_CLOSE_WRITE, IN_CREATE, IN_DELETE, IN_MOVED_TO, IN_MOVED_FROM = 0x8, 0x100, 0x200, 0x80, 0x40

    def __init__(self, path: str) -> None:
        lib = libc()
        self.fd = lib.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        mask = (self.IN_CLOSE_WRITE | self.IN_CREATE | self.IN_DELETE | self.IN_MOVED_TO
                | self.IN_MOVED_FROM)
        if lib.inotify_add_watch(self.fd, os.fsencode(path), mask) < 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(err, f"inotify_add_watch {path}")

    def drain(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self.fd, 65536):
                pass

    def close(self) -> None:
        os.close(self.fd)


class Discovery(AgentsState):
    """Opted-in containers found and dropped; their agents found."""

    async def _periodic(self) -> None:
        while True:
            await asyncio.sleep(self.conf.scan_period_s)
            try:
                self._scan()
            except Exception:
                log.exception("inside agents: scan failed")

    def _records_changed(self) -> None:
        assert self.inotify is not None
        self.inotify.drain()
        self._dirty = True
        try:
            self._scan()
        except Exception:
            log.exception("inside agents: scan failed")

    # -- containers ----------------------------------------------------------------------------

    def _scan(self) -> None:
        """Pick up opted-in containers (and drop gone ones); find agents that are missing."""
        if self._dirty or self.inotify is None:
            self._dirty = False
            seen: set[str] = set()
            for rec in self._index.records():
                cg = rec.get("cgroup")
                # The init/ + tool-*/ layout is made at `start` (runtime/start.py): until then
                # a tool cgroup would lack its controllers.
                if not (rec.get("managed") and cg and rec.get("init_pid")
                        and rec.get("prepared", True)
                        and records.agent_inside(rec, self.conf.default)
                        and container.is_prepared(cg)):
                    continue
                seen.add(rec["id"])
                box = self.boxes.get(rec["id"])
                if box is not None and (box.init_pid, box.cgroup) != (rec["init_pid"], cg):
                    self._drop_box(box.cid)  # the same container, started again
                    box = None
                if box is None and os.path.isdir(cg):
                    self._add_box(rec)
            for cid in set(self.boxes) - seen:
                self._drop_box(cid)
        now = time.monotonic()
        for box in list(self.boxes.values()):
            if not os.path.isdir(box.cgroup):
                self._drop_box(box.cid)
            elif not box.agents and now >= box.next_scan:
                box.next_scan = now + 1.0
                self._find_agents(box)
        self._listen(bool(self.boxes))
        if self.conn is not None and self.conn.overruns != self._overruns:
            self._overruns = self.conn.overruns
            log.warning("inside agents: process events were lost; resynchronising")
            self.tracker.pending.clear()
            for box in self.boxes.values():
                for agent in box.agents:
                    self._pend_children(box, agent)

    def _add_box(self, rec: dict[str, Any]) -> None:
        command = (rec.get("annotations") or {}).get(COMMAND_ANNOTATION) or None
        box = Box(rec["id"], str(rec.get("sandbox") or rec["id"]), rec["cgroup"],
                  int(rec["init_pid"]), command, self._next_number)
        self._next_number += 1
        self.boxes[box.cid] = box
        self._numbers[box.number] = box.cid
        self._listen(True)
        self._recover(box)
        self._find_agents(box)
        self._replenish(box)
        log.info("inside agent in %s: agents %s%s", box.cid[:12], sorted(box.agents) or "-",
                 f" (command {command!r})" if command else "")

    def _drop_box(self, cid: str) -> None:
        box = self.boxes.pop(cid, None)
        if box is None:
            return
        self._numbers.pop(box.number, None)
        if self.probe is not None:
            for table in (self.tracker.agents, self.tracker.wrappers):
                for pid in [p for p, c in table.items() if c == cid]:
                    with contextlib.suppress(OSError):
                        self.probe.remove_agent(pid)
        self.tracker.forget_container(cid)
        for spare in box.spares:
            v2.remove(spare, attempts=1)
        box.spares.clear()

    def _find_agents(self, box: Box) -> None:
        """The agent processes of a box: init, init's exec'd child under a wrapper, or the
        processes named by the command annotation (never one of our own calls)."""
        found: set[int] = set()
        if box.command is None:
            name = procfs.comm(box.init_pid)
            if name is None:
                return
            if name in INIT_WRAPPERS:
                self._set_agent(box, box.init_pid, wrapper=True)
                found = {c for c in procfs.children(box.init_pid)
                         if procfs.comm(c) not in INIT_WRAPPERS}
            else:
                found = {box.init_pid}
        else:
            ours = {c.cgroup for c in self.calls.values()}
            for dirpath, _dirs, _files in os.walk(box.cgroup):
                if dirpath in ours:
                    continue
                for pid in v2.procs(dirpath):
                    if procfs.comm(pid) == box.command[:15]:
                        found.add(pid)
            found = {p for p in found if procfs.ppid(p) not in found}  # not an agent's own child
        for pid in found - box.agents:
            self._set_agent(box, pid)
            self._pend_children(box, pid)

    def _pend_children(self, box: Box, agent: int) -> None:
        """Children an agent forked before we listened: those that have not exec'd yet (their
        command line is still the agent's) are pending; those that have, still beside the agent,
        are calls that started before we listened (an agent's first commands, or a burst of
        lost events) and are placed now, late rather than never."""
        mine = procfs.nul_list(f"/proc/{agent}/cmdline")
        home = procfs.cgroup_path(agent)
        for child in procfs.children(agent):
            if child in self.by_pid:
                continue
            if procfs.nul_list(f"/proc/{child}/cmdline") == mine:
                if self.probe is None:  # (the probe sees its exec without being told)
                    self.tracker.fork(agent, child, child, time.monotonic_ns())
            elif home is not None and procfs.cgroup_path(child) == home:
                try:
                    self._place(Match("call", child, agent, box.cid, procfs.started_ns(child)), box)
                    if self.probe is not None and child in self.by_pid:
                        self.probe.adopt_call(child, agent, box.number)  # to hear its exit
                except Exception:  # a bug here must not stop the scan
                    self.stats["failed"] += 1
                    log.exception("inside agents: placing %d late failed", child)

    def _agent_execd(self, tgid: int) -> None:
        """A record names init before `runc start` execs it: if it became an init wrapper
        (docker run --init), the agent is the child the wrapper will exec instead."""
        cid = self.tracker.agents.get(tgid)
        box = self.boxes.get(cid) if cid else None
        if box is None or box.command is not None or tgid != box.init_pid:
            return
        if procfs.comm(tgid) in INIT_WRAPPERS:
            self._set_agent(box, tgid, wrapper=True)

    def _set_agent(self, box: Box, pid: int, *, wrapper: bool = False) -> None:
        """pid is an agent of box (or its init wrapper): for the tracker and for the probe."""
        if wrapper:
            self.tracker.agents.pop(pid, None)
            box.agents.discard(pid)
            self.tracker.wrappers[pid] = box.cid
        else:
            self.tracker.agents[pid] = box.cid
            box.agents.add(pid)
        self._probe_agent(pid, box, wrapper)
