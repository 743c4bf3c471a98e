"""Which exec is a tool call: fork/exec/exit bookkeeping, pure (no I/O), fed by either source.

The proc connector (proc_events.py) feeds it every event; the BPF probe (bpf/inside.bpf.c) does
the same in the kernel and needs it only for agents it reports.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Match:
    kind: str  # "call": a tool call starts; "agent": a wrapper's child became the agent
    tgid: int
    parent: int
    cid: str
    exec_ns: int = 0  # when it exec'd (the event's CLOCK_MONOTONIC timestamp)
    comm: str = ""  # what it exec'd, where the event says (it may be gone before /proc does)
    at_exec: bool = False  # reported at its exec, without a slice (a program known to grow)


class Tracker:
    """Follows fork/exec/exit events to tell which exec starts a tool call.

    A process forked by an agent is *pending* until it execs (then it is a call) or exits.
    The kernel reports a fork from the parent after the child is already running, so on
    another CPU the child may exec (or even exit) before its fork is reported: execs and exits
    of processes not known yet are remembered for a moment (RACE_NS, by the events' own
    timestamps, so a reused pid is never confused with its predecessor) and a late fork
    matches them. Nothing here reads /proc: unrelated processes cost a few dict operations.
    """

    RACE_NS = 1_000_000_000

    def __init__(self, rule: str = "child", max_pending: int = 1 << 16,
                 max_recent: int = 4096) -> None:
        self.rule = rule
        self.max_pending = max_pending
        self.max_recent = max_recent
        self.agents: dict[int, str] = {}  # agent tgid -> container id
        self.wrappers: dict[int, str] = {}  # init wrapper tgid -> container id
        # tgid -> (parent tgid, container id, becomes the agent when it execs)
        self.pending: OrderedDict[int, tuple[int, str, bool]] = OrderedDict()
        self.recent_exec: OrderedDict[int, int] = OrderedDict()  # tgid -> timestamp
        self.recent_exit: OrderedDict[int, int] = OrderedDict()
        self.gone_before_fork = 0  # children of agents that ended before their fork was read

    @staticmethod
    def _put(table: OrderedDict[int, Any], key: int, value: Any, limit: int) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > limit:  # a fork bomb: forget the oldest
            table.popitem(last=False)

    def fork(self, parent_tgid: int, pid: int, tgid: int, ts: int = 0) -> Match | None:
        """A new process; a Match when it has exec'd already (its exec was reported first)."""
        if pid != tgid:
            return None  # a new thread, not a process
        if parent_tgid in self.agents:
            entry = (parent_tgid, self.agents[parent_tgid], False)
        elif parent_tgid in self.wrappers:
            entry = (parent_tgid, self.wrappers[parent_tgid], True)
        elif self.rule == "first-exec" and parent_tgid in self.pending:
            _, cid, becomes_agent = self.pending[parent_tgid]
            if becomes_agent:
                return None
            entry = (parent_tgid, cid, False)
        else:
            return None
        gone = self.recent_exit.pop(tgid, None)
        execd = self.recent_exec.pop(tgid, None)
        if gone is not None and ts - gone < self.RACE_NS:
            self.gone_before_fork += 1
            return None  # it came and went before its fork was reported
        self._put(self.pending, tgid, entry, self.max_pending)
        if execd is not None and ts - execd < self.RACE_NS:
            return self.exec(tgid, execd)
        return None

    def exec(self, tgid: int, ts: int = 0) -> Match | None:
        found = self.pending.pop(tgid, None)
        if found is None:
            self._put(self.recent_exec, tgid, ts, self.max_recent)
            return None
        parent, cid, becomes_agent = found
        if becomes_agent:
            self.agents[tgid] = cid
            return Match("agent", tgid, parent, cid, ts)
        return Match("call", tgid, parent, cid, ts)

    def exit(self, pid: int, tgid: int, ts: int = 0) -> str | None:
        """Forget an exited process; returns the container id if it was an agent."""
        if pid != tgid:
            return None
        self.recent_exec.pop(tgid, None)
        if self.pending.pop(tgid, None) is None:
            self._put(self.recent_exit, tgid, ts, self.max_recent)
        cid = self.agents.pop(tgid, None)
        if cid is None:
            cid = self.wrappers.pop(tgid, None)
        return cid

    def forget_container(self, cid: str) -> None:
        for table in (self.agents, self.wrappers):
            for tgid in [t for t, c in table.items() if c == cid]:
                del table[tgid]
        for tgid in [t for t, p in self.pending.items() if p[1] == cid]:
            del self.pending[tgid]
