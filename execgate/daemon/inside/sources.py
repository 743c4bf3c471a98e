"""Where the agents' commands are heard: the BPF probe (bpf/inside.bpf.c), else the kernel's
process events (proc_events.py), read in batches half a slice apart; and the programs learned
to be placed at their exec.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from execgate.bpf import inside_probe as probe_mod

from . import proc_events
from .discovery import INIT_WRAPPERS
from .state import AgentsState, Box, Call
from .tracker import Match

log = logging.getLogger("execgated.inside")

# Programs that run others: a burst in their call is the other program's, so they are never
# learned as ones to place at exec (that would place every command an agent runs at once).
NEVER_LEARNED = INIT_WRAPPERS | {"sh", "bash", "dash", "ash", "zsh", "ksh", "fish", "busybox",
                                 "env", "timeout", "nice", "nohup", "xargs", "time", "sudo",
                                 "su", "setsid", "stdbuf", "script", "flock", "chroot", "strace"}
MAX_LEARNED = 256
PROBE_LINGER_S = 300.0
MAX_EARLY_EXITS = 1024


def _load_probe(slice_ns: int) -> tuple[probe_mod.InsideProbe, str, float]:
    """Build (cached) and load the probe: on a worker thread, never the daemon's loop."""
    t0 = time.monotonic()
    obj = probe_mod.build()
    return probe_mod.load(obj, slice_ns=slice_ns), str(obj), time.monotonic() - t0


class EventSources(AgentsState):
    """Listening (probe or connector), the events read, and learning."""

    def _listen(self, on: bool, *, linger: bool = True) -> None:
        """Listen to process events only while some container has opted in. The probe stays
        attached PROBE_LINGER_S after the last one left (unless the daemon stops: linger False):
        loading it takes seconds, and containers come and go."""
        assert self.loop is not None
        if on:
            self._quiet_since = None
            if self.conn is not None or self.probe is not None or self._loading is not None:
                return
            if time.monotonic() < self._retry_listen_at:
                return
            if self._start_probe():
                return
            try:
                conn = proc_events.ProcConnector(self.conf.rcvbuf_bytes)
                conn.subscribe()
            except OSError as e:
                self._retry_listen_at = time.monotonic() + 30.0
                log.error("inside agents: no process events (%s); their tools run unmanaged "
                          "(retry in 30 s)", e)
                return
            self.conn = conn
            self.loop.add_reader(conn.fileno(), self._readable)
            log.info("inside agents: listening to process events (kernel filter: %s)",
                     conn.filtered)
        elif self.probe is not None or self._loading is not None:
            now = time.monotonic()
            if linger:
                if self._quiet_since is None:
                    self._quiet_since = now
                if now - self._quiet_since < PROBE_LINGER_S:
                    return
            self._loading = None  # a load still running is closed when it ends (_probe_ready)
            if self.probe is not None:
                self.loop.remove_reader(self.probe.fileno())
                with contextlib.suppress(OSError):
                    self._probe_short += self.probe.stats()["short"]
                self.probe.close()
                self.probe = None
                log.info("inside agents: probe detached (%s)",
                         "no opted-in container" if linger else "the daemon stops")
        elif self.conn is not None:
            self.loop.remove_reader(self.conn.fileno())
            self.conn.close()
            self.conn = None
            self.tracker.pending.clear()
            log.info("inside agents: no opted-in container; not listening")

    def _start_probe(self) -> bool:
        """Follow commands in the kernel (bpf/inside.bpf.c) where configured and possible: the
        probe is built and loaded on a worker thread (bpftool takes seconds, 10+ under TCG: the
        daemon's loop, every sandbox's admission, must not wait for it). True: it is loading."""
        source = self.conf.source
        if source == "connector" or (source == "auto" and self._probe_off is not None):
            return False
        if self.conf.rule != "child":
            self._probe_off = f"rule {self.conf.rule!r} is followed by the proc connector only"
            log.info("inside agents: %s", self._probe_off)
            return False
        assert self.loop is not None
        slice_ns = self._slice_ns
        loading = self.loop.run_in_executor(None, _load_probe, slice_ns)
        self._loading = loading
        loading.add_done_callback(self._probe_ready)
        return True

    def _probe_ready(self, loading: asyncio.Future[tuple[probe_mod.InsideProbe, str, float]]
                     ) -> None:
        """The load ended: attach the probe, or fall back (auto) / retry later (bpf)."""
        if loading is not self._loading:  # given up meanwhile: the daemon stopped
            if not loading.cancelled() and loading.exception() is None:
                loading.result()[0].close()
            return
        self._loading = None
        try:
            probe, obj, took = loading.result()
        except Exception as e:  # noqa: BLE001 - any failure: the connector will do
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            self._probe_off = first
            if self.conf.source == "bpf":
                self._retry_listen_at = time.monotonic() + 30.0
                log.error("inside agents: no BPF probe (%s); their tools run unmanaged "
                          "(retry in 30 s)", first)
                return
            log.info("inside agents: no BPF probe (%s); using the proc connector", first)
            self._listen(bool(self.boxes))
            return
        assert self.loop is not None
        self.probe = probe
        for name in (*self.conf.place_at_exec, *self.learned):
            self._eager(name)
        self.loop.add_reader(probe.fileno(), self._on_probe_events)
        for table, wrapper in ((self.tracker.agents, False), (self.tracker.wrappers, True)):
            for pid, cid in table.items():
                if cid in self.boxes:
                    self._probe_agent(pid, self.boxes[cid], wrapper)
        for box in self.boxes.values():  # what the agents started while it loaded: late
            for agent in list(box.agents):
                self._pend_children(box, agent)
        log.info("inside agents: following commands in the kernel (%s, slice %.1f ms; loaded "
                 "in %.1f s)", obj, self._slice_ns / 1e6, took)

    def _eager(self, name: str) -> None:
        if self.probe is None:
            return
        try:
            self.probe.add_eager(name)
        except (OSError, ValueError) as e:
            log.warning("inside agents: %r not placed at exec: %s", name, e)

    def _learn(self, c: Call, peak: int | None) -> None:
        """A call grew past learn_at_exec_bytes: its program is placed at exec from now on."""
        name = c.last_comm
        limit = self.conf.learn_at_exec_bytes
        if (not limit or peak is None or peak < limit or not name or name in self.learned
                or name in NEVER_LEARNED or name[:15] in {n[:15] for n in self.conf.place_at_exec}
                or len(self.learned) >= MAX_LEARNED):
            return
        self.learned.add(name)
        self._eager(name)
        log.info("inside agents: %r grew to %d MiB in %s: placed at its exec from now on", name,
                 peak >> 20, c.name)

    def _probe_agent(self, pid: int, box: Box, wrapper: bool = False) -> None:
        if self.probe is None:
            return
        try:
            self.probe.add_agent(pid, box.number, wrapper=wrapper)
        except OSError as e:
            log.warning("inside agent %d in %s: not followed in the kernel: %s", pid,
                        box.cid[:12], e)

    # -- events --------------------------------------------------------------------------------

    def _readable(self) -> None:
        """Events are waiting: read them a moment later, in one batch. A command is not placed
        before its first slice anyway, and waking once per few commands instead of once per
        event is most of what following a busy agent costs."""
        if self.conn is None or self._batch_s <= 0:
            self._on_events()
            return
        assert self.loop is not None
        self.loop.remove_reader(self.conn.fileno())
        self.loop.call_later(self._batch_s, self._on_events)

    def _on_events(self) -> None:
        if self.conn is None:
            return
        if self._batch_s > 0:
            assert self.loop is not None
            self.loop.add_reader(self.conn.fileno(), self._readable)
        try:
            events = self.conn.read()
        except OSError as e:
            log.warning("inside agents: reading process events: %s", e)
            return
        self.stats["events"] += len(events)
        tracker = self.tracker
        # Where each process's exit is in this batch: a call whose exit is already here ended
        # before we could place it, and costs no syscall (most short commands, under load).
        last_exit = {ev.tgid: i for i, ev in enumerate(events)
                     if ev.what == proc_events.PROC_EVENT_EXIT and ev.pid == ev.tgid}
        for i, ev in enumerate(events):
            m = None
            if ev.what == proc_events.PROC_EVENT_FORK:
                m = tracker.fork(ev.parent_tgid, ev.pid, ev.tgid, ev.timestamp_ns)
            elif ev.what == proc_events.PROC_EVENT_EXEC:
                m = tracker.exec(ev.tgid, ev.timestamp_ns)
                if m is None and ev.tgid in tracker.agents:
                    self._agent_execd(ev.tgid)
            elif ev.what == proc_events.PROC_EVENT_EXIT:
                call = self.by_pid.pop(ev.tgid, None) if ev.pid == ev.tgid else None
                if call is not None:
                    call.status = ev.exit_code
                    call.exited.set()
                elif ev.pid == ev.tgid and (due := self._due.pop(ev.tgid, None)) is not None:
                    due[0].cancel()
                    self.stats["short"] += 1  # ended within its first slice: nothing to do
                cid = tracker.exit(ev.pid, ev.tgid, ev.timestamp_ns)
                if cid is not None and cid in self.boxes:
                    self.boxes[cid].agents.discard(ev.tgid)
            if m is None:
                continue
            box = self.boxes.get(m.cid)
            if box is None:
                continue
            if m.kind == "agent":
                box.agents.add(m.tgid)
                continue
            if last_exit.get(m.tgid, -1) > i:
                self.stats["short"] += 1  # it ended before we could look: nothing to do
                continue
            left = m.exec_ns + self._slice_ns - time.monotonic_ns()
            if left > 0:
                assert self.loop is not None
                self._due[m.tgid] = (self.loop.call_later(left / 1e9, self._place_due, m.tgid),
                                     m)
                continue
            self._try_place(m, box)

    def _on_probe_events(self) -> None:
        """The kernel's side (bpf/inside.bpf.c) has kept every command that ended within its
        slice: what arrives here is a call to place, a placed call's end, or news of agents."""
        if self.probe is None:
            return
        events = self.probe.read()
        self.stats["events"] += len(events)
        for ev in events:
            cid = self._numbers.get(ev.box)
            box = self.boxes.get(cid) if cid is not None else None
            if ev.kind == probe_mod.EV_CALL:
                early = self._early_exits.pop(ev.tgid, None)
                if early is not None and early >= ev.ns:
                    self.stats["short"] += 1  # its end came first: gone, nothing to place
                elif box is not None:
                    self._try_place(Match("call", ev.tgid, ev.parent, box.cid, ev.ns, ev.comm,
                                          bool(ev.status & probe_mod.AT_EXEC)), box)
            elif ev.kind == probe_mod.EV_EXIT:
                call = self.by_pid.pop(ev.tgid, None)
                if call is not None:
                    call.status = ev.status
                    call.last_comm = ev.comm
                    call.exited.set()
                    if call.ended:  # its cgroup emptied first (ending.py)
                        self._learn(call, call.peak)
                else:  # its EV_CALL may be behind it (inside.bpf.c: timer and exit race)
                    self._early_exits[ev.tgid] = ev.ns
                    if len(self._early_exits) > MAX_EARLY_EXITS:
                        del self._early_exits[next(iter(self._early_exits))]
            elif ev.kind == probe_mod.EV_AGENT:  # a wrapper's child: the new agent
                if box is not None:
                    self._set_agent(box, ev.tgid)
            elif ev.kind == probe_mod.EV_AGENT_EXEC:
                self._agent_execd(ev.tgid)
            elif ev.kind == probe_mod.EV_AGENT_EXIT:
                self.tracker.exit(ev.tgid, ev.tgid, ev.ns)
                if box is not None:
                    box.agents.discard(ev.tgid)

    def _place_due(self, tgid: int) -> None:
        """A call's first slice is over and it still runs: now it is worth a cgroup."""
        _handle, m = self._due.pop(tgid, (None, None))
        box = self.boxes.get(m.cid) if m is not None else None
        if m is not None and box is not None:
            self._try_place(m, box)
