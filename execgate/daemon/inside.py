"""Agents that run inside their sandbox: every tool process they spawn is a gated tool call.

Many agents never `docker exec`: they run in the container and spawn `bash -c "pytest ..."`
themselves. For a container that opts in (OCI annotation `execgate.agent=inside`, or
`[inside] default = true`) the daemon follows the agent's commands — in the kernel
(bpf/inside.bpf.c, which tells only of commands that outlive their first slice) or through the
kernel's process events (proc_events.py, the flow below) — and turns each tool process into a
call exactly like a `docker exec` one — its own `tool-<hex>` cgroup, hint,
admission, growth gate, journal line and `[execgate]` feedback — with the image and the agent
unmodified:

    agent forks C ──fork event──▶ C is pending (a child of the agent that has not exec'd yet)
    C execs      ──exec event──▶ C is a call in its first slice (place_after_ms)
    C exits      ──exit event──▶ ... within the slice: nothing else happens (most commands)
    slice over   ──────────────▶ C (and what it forked meanwhile) moves into a prepared
                                 tool-<hex> (one write to cgroup.procs each); its hint
                                 (/proc/C/environ) and a handle on its stderr are taken;
                                 the engine admits it (C is frozen only while it waits)
    tool-<hex> empties ─────────▶ outcome, feedback on the kept stderr, journal, rmdir, done

Events are read in batches half a slice apart: following an agent that runs hundreds of short
commands a second then costs the daemon a few wake-ups per slice, not several per command. In
the kernel it costs nothing: the timer, the exit within the slice and the counting happen there,
and programs known (or learned) to grow fast are reported at their exec, without a slice.

Only the agent's own exec'd children match (rule "child"; "first-exec" also follows children
that only forked, e.g. subshells); descendants follow by cgroup inheritance. The agent itself is
never moved or stopped, and anything that goes wrong leaves the process running where it was.
The agent is the container's init, or the processes named by `execgate.agent.command=<comm>`
(e.g. a shell server started later), or the child of an init wrapper (tini, docker-init).
Containers without the opt-in cost nothing but the event filter (a hash lookup per exec and
exit in the kernel, a dict lookup per fork through the connector); with no opted-in container at
all, nothing is loaded and nothing listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import json
import logging
import os
import select
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from execgate.bpf import inside_probe as probe_mod
from execgate.calls import feedback, hint, outcome, tell
from execgate.calls.oom_score import raise_oom_score_adj
from execgate.calls.record import ToolCall
from execgate.cgroups import container, v2
from execgate.common import hints, records
from execgate.common.config import Config

from . import proc_events
from .engine import Engine, call_info
from .settings import InsideConfig, Settings

log = logging.getLogger("execgated.inside")

COMMAND_ANNOTATION = "execgate.agent.command"
XATTR = "trusted.execgate.inside"  # on a tool cgroup: "spare", or the call (for a restart)
INIT_WRAPPERS = frozenset({"docker-init", "tini", "dumb-init", "catatonit"})
# Programs that run others: a burst in their call is the other program's, so they are never
# learned as ones to place at exec (that would place every command an agent runs at once).
NEVER_LEARNED = INIT_WRAPPERS | {"sh", "bash", "dash", "ash", "zsh", "ksh", "fish", "busybox",
                                 "env", "timeout", "nice", "nohup", "xargs", "time", "sudo",
                                 "su", "setsid", "stdbuf", "script", "flock", "chroot", "strace"}
MAX_LEARNED = 256
MAX_XATTR_ARGV = 2048


# -- which exec is a tool call (pure bookkeeping, no I/O) ----------------------------------------

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


# -- /proc and cgroupfs helpers ------------------------------------------------------------------

def _stat_field(pid: int, index: int) -> int | None:
    """A numeric field of /proc/PID/stat, counted after the command name (0: state)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2:].split()[index])
    except (OSError, ValueError, IndexError):
        return None


def ppid(pid: int) -> int | None:
    return _stat_field(pid, 1)


def started_ns(pid: int) -> int:
    """When pid started, on CLOCK_MONOTONIC as near as /proc tells (0 if unknown)."""
    ticks = _stat_field(pid, 19)
    return 0 if ticks is None else ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def _proc_text(pid: int, name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/{name}") as f:
            return f.read().strip()
    except OSError:
        return None


def cgroup_path(pid: int) -> str | None:
    return _proc_text(pid, "cgroup")


def comm(pid: int) -> str | None:
    return _proc_text(pid, "comm")


def _nul_list(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    return [a.decode("utf-8", "surrogateescape") for a in data.split(b"\0")[:-1]]


def memory_status(pid: int) -> dict[str, int]:
    """VmRSS and RssAnon of a process, in bytes ({} when it is gone)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon"):
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def children(pid: int) -> list[int]:
    """Child processes of every thread of pid (needs CONFIG_PROC_CHILDREN)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def open_stderr(pid: int) -> int | None:
    """A new open file description of the process's stderr, for feedback once it ends.

    O_APPEND so a regular file is never overwritten from offset 0; O_NONBLOCK so a full pipe
    never blocks the daemon; O_NOCTTY so a terminal never becomes ours. Sockets cannot be
    opened this way: such a call gets no feedback.
    """
    try:
        return os.open(f"/proc/{pid}/fd/2", os.O_WRONLY | os.O_APPEND | os.O_NOCTTY
                       | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None


def _write_line(fd: int | None, tty: bool, text: str) -> None:
    if fd is not None:
        tell.say(fd, tty, [text])


def _set_xattr(cg: str, value: bytes) -> None:
    try:
        os.setxattr(cg, XATTR, value)
    except OSError:
        pass  # only restart adoption needs it


def _get_xattr(cg: str) -> bytes | None:
    try:
        return os.getxattr(cg, XATTR)
    except OSError:
        return None


class Inotify:
    """Just enough inotify (ctypes) to hear a container record appear or vanish at once."""

    IN_CLOSE_WRITE, IN_CREATE, IN_DELETE, IN_MOVED_TO, IN_MOVED_FROM = 0x8, 0x100, 0x200, 0x80, 0x40

    def __init__(self, path: str) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        mask = (self.IN_CLOSE_WRITE | self.IN_CREATE | self.IN_DELETE | self.IN_MOVED_TO
                | self.IN_MOVED_FROM)
        if libc.inotify_add_watch(self.fd, os.fsencode(path), mask) < 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(err, f"inotify_add_watch {path}")

    def drain(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self.fd, 65536):
                pass

    def close(self) -> None:
        os.close(self.fd)


class EndWatcher:
    """Tells when tool cgroups empty: one thread polls their cgroup.events for POLLPRI, which
    asyncio's readers cannot wait for. `on_empty(key)` runs in that thread."""

    def __init__(self, on_empty: Callable[[str], None]) -> None:
        self.on_empty = on_empty
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._lock = threading.Lock()
        self._new: list[tuple[str, int]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="inside-ends", daemon=True)
        self._thread.start()

    def watch(self, key: str, cg: str) -> bool:
        try:
            fd = os.open(os.path.join(cg, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        with self._lock:
            self._new.append((key, fd))
        os.write(self._wake_w, b"\0")
        return True

    def stop(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\0")
        self._thread.join(timeout=2)

    @staticmethod
    def _empty(fd: int) -> bool:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            return b"populated 0" in os.read(fd, 4096)
        except OSError:
            return True  # the cgroup is gone

    def _run(self) -> None:
        p = select.poll()
        p.register(self._wake_r, select.POLLIN)
        keys: dict[int, str] = {}
        while not self._stop:
            ready = [fd for fd, _ in p.poll(5000)]  # the timeout guards against a lost wakeup
            if self._wake_r in ready:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 4096)
                with self._lock:
                    new, self._new = self._new, []
                for key, fd in new:
                    keys[fd] = key
                    p.register(fd, select.POLLPRI | select.POLLERR)
                    ready.append(fd)
            if not ready:
                ready = list(keys)
            for fd in ready:
                if fd in keys and self._empty(fd):
                    p.unregister(fd)
                    os.close(fd)
                    key = keys.pop(fd)
                    try:
                        self.on_empty(key)
                    except Exception:  # noqa: BLE001 - the loop is closing
                        log.debug("end of %s not delivered", key)
        for fd in keys:
            os.close(fd)


# -- containers and calls ------------------------------------------------------------------------

@dataclass
class Box:
    """An opted-in container."""

    cid: str
    sandbox: str
    cgroup: str
    init_pid: int
    command: str | None
    number: int = 0  # the box's number in the BPF probe's agents map
    agents: set[int] = field(default_factory=set)
    spares: list[str] = field(default_factory=list)
    next_scan: float = 0.0


@dataclass
class Call:
    call: ToolCall  # as runtime/exec.py's, so the journal line reads the same
    pid: int
    box: Box
    stderr: int | None
    frozen: bool = False
    status: int | None = None
    last_comm: str = ""  # the program it ran last (the kernel's exit event), for learning
    exited: threading.Event = field(default_factory=threading.Event)
    wait: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.call.call

    @property
    def cgroup(self) -> str:
        return self.call.cgroup


class InsideAgents:
    """The event source, placement and end watching, on the daemon's asyncio loop."""

    def __init__(self, cfg: Config, settings: Settings, engine: Engine) -> None:
        self.cfg = cfg
        self.settings = settings
        self.conf: InsideConfig = settings.inside
        self.engine = engine
        self.tracker = Tracker(self.conf.rule)
        self.boxes: dict[str, Box] = {}
        self.calls: dict[str, Call] = {}
        self.by_pid: dict[int, Call] = {}
        self.conn: proc_events.ProcConnector | None = None
        self.probe: probe_mod.InsideProbe | None = None  # the kernel-side source (rule child)
        self._probe_off: str | None = None  # why the probe is not used (auto: once is enough)
        self._probe_short = 0  # short commands counted by probes closed since
        self._numbers: dict[int, str] = {}  # box number -> container id
        self.learned: set[str] = set()  # programs placed at exec because their calls grew
        self._next_number = 1
        self.ends: EndWatcher | None = None
        self.inotify: Inotify | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._dirty = True
        self._index = records.ContainerIndex(cfg.state_dir)
        self._overruns = 0
        self._starting = False
        self._retry_listen_at = 0.0
        self.stats = {"placed": 0, "short": 0, "missed": 0, "failed": 0, "events": 0}
        # Calls in their first slice (place_after_ms): tgid -> (timer, match).
        self._due: dict[int, tuple[asyncio.TimerHandle, Match]] = {}
        self._slice_ns = int(self.conf.place_after_ms * 1e6)
        self._batch_s = self.conf.place_after_ms / 2000

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.ends = EndWatcher(self._ended_threadsafe)
        cdir = os.path.join(self.cfg.state_dir, "containers")
        try:
            os.makedirs(cdir, mode=0o700, exist_ok=True)
            self.inotify = Inotify(cdir)
            self.loop.add_reader(self.inotify.fd, self._records_changed)
        except OSError as e:
            log.info("no inotify on %s (%s): records are re-read every %.1f s", cdir, e,
                     self.conf.scan_period_s)
        self._starting = True  # a previous daemon may have left calls frozen: thaw them all
        try:
            self._scan()
        finally:
            self._starting = False
        self._task = asyncio.ensure_future(self._periodic())

    def stop(self) -> None:
        """Shutting down: nothing of ours may stay frozen while the daemon is gone."""
        if self._task is not None:
            self._task.cancel()
        for handle, _m in self._due.values():
            handle.cancel()
        self._due.clear()
        for c in list(self.calls.values()):
            if c.frozen:
                self._thaw(c)
            if c.wait is not None:
                c.wait.cancel()
        self._listen(False)
        if self.inotify is not None and self.loop is not None:
            self.loop.remove_reader(self.inotify.fd)
            self.inotify.close()
        if self.ends is not None:
            self.ends.stop()

    def _listen(self, on: bool) -> None:
        """Listen to process events only while some container has opted in."""
        assert self.loop is not None
        if on and self.conn is None and self.probe is None:
            if time.monotonic() < self._retry_listen_at:
                return
            if self._open_probe():
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
        elif not on and self.probe is not None:
            self.loop.remove_reader(self.probe.fileno())
            with contextlib.suppress(OSError):
                self._probe_short += self.probe.stats()["short"]
            self.probe.close()
            self.probe = None
            log.info("inside agents: no opted-in container; probe detached")
        elif not on and self.conn is not None:
            self.loop.remove_reader(self.conn.fileno())
            self.conn.close()
            self.conn = None
            self.tracker.pending.clear()
            log.info("inside agents: no opted-in container; not listening")

    def _open_probe(self) -> bool:
        """Follow commands in the kernel (bpf/inside.bpf.c) where configured and possible."""
        source = self.conf.source
        if source == "connector" or (source == "auto" and self._probe_off is not None):
            return False
        if self.conf.rule != "child":
            self._probe_off = f"rule {self.conf.rule!r} is followed by the proc connector only"
            log.info("inside agents: %s", self._probe_off)
            return False
        try:
            obj = probe_mod.build()
            self.probe = probe_mod.load(obj, slice_ns=self._slice_ns)
        except Exception as e:  # noqa: BLE001 - any failure: the connector will do
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            self._probe_off = first
            if source == "bpf":
                self._retry_listen_at = time.monotonic() + 30.0
                log.error("inside agents: no BPF probe (%s); their tools run unmanaged "
                          "(retry in 30 s)", first)
                return True
            log.info("inside agents: no BPF probe (%s); using the proc connector", first)
            return False
        for name in (*self.conf.place_at_exec, *self.learned):
            self._eager(name)
        assert self.loop is not None
        self.loop.add_reader(self.probe.fileno(), self._on_probe_events)
        for table, wrapper in ((self.tracker.agents, False), (self.tracker.wrappers, True)):
            for pid, cid in table.items():
                if cid in self.boxes:
                    self._probe_agent(pid, self.boxes[cid], wrapper)
        log.info("inside agents: following commands in the kernel (%s, slice %.1f ms)", obj,
                 self._slice_ns / 1e6)
        return True

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
            name = comm(box.init_pid)
            if name is None:
                return
            if name in INIT_WRAPPERS:
                self._set_agent(box, box.init_pid, wrapper=True)
                found = {c for c in children(box.init_pid) if comm(c) not in INIT_WRAPPERS}
            else:
                found = {box.init_pid}
        else:
            ours = {c.cgroup for c in self.calls.values()}
            for dirpath, _dirs, _files in os.walk(box.cgroup):
                if dirpath in ours:
                    continue
                for pid in v2.procs(dirpath):
                    if comm(pid) == box.command[:15]:
                        found.add(pid)
            found = {p for p in found if ppid(p) not in found}  # not an agent's own child
        for pid in found - box.agents:
            self._set_agent(box, pid)
            self._pend_children(box, pid)

    def _pend_children(self, box: Box, agent: int) -> None:
        """Children an agent forked before we listened: those that have not exec'd yet (their
        command line is still the agent's) are pending; those that have, still beside the agent,
        are calls that started before we listened (an agent's first commands, or a burst of
        lost events) and are placed now, late rather than never."""
        mine = _nul_list(f"/proc/{agent}/cmdline")
        home = cgroup_path(agent)
        for child in children(agent):
            if child in self.by_pid:
                continue
            if _nul_list(f"/proc/{child}/cmdline") == mine:
                if self.probe is None:  # (the probe sees its exec without being told)
                    self.tracker.fork(agent, child, child, time.monotonic_ns())
            elif home is not None and cgroup_path(child) == home:
                try:
                    self._place(Match("call", child, agent, box.cid, started_ns(child)), box)
                    if self.probe is not None and child in self.by_pid:
                        self.probe.adopt_call(child, agent, box.number)  # to hear its exit
                except Exception:  # a bug here must not stop the scan
                    self.stats["failed"] += 1
                    log.exception("inside agents: placing %d late failed", child)

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
                if box is not None:
                    self._try_place(Match("call", ev.tgid, ev.parent, box.cid, ev.ns, ev.comm,
                                          bool(ev.status & probe_mod.AT_EXEC)), box)
            elif ev.kind == probe_mod.EV_EXIT:
                call = self.by_pid.pop(ev.tgid, None)
                if call is not None:
                    call.status = ev.status
                    call.last_comm = ev.comm
                    call.exited.set()
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

    def _try_place(self, m: Match, box: Box) -> None:
        try:
            self._place(m, box)
        except Exception:  # a bug here must not stop the event loop
            self.stats["failed"] += 1
            log.exception("inside agents: placing %d failed; it runs unmanaged", m.tgid)

    def _agent_execd(self, tgid: int) -> None:
        """A record names init before `runc start` execs it: if it became an init wrapper
        (docker run --init), the agent is the child the wrapper will exec instead."""
        cid = self.tracker.agents.get(tgid)
        box = self.boxes.get(cid) if cid else None
        if box is None or box.command is not None or tgid != box.init_pid:
            return
        if comm(tgid) in INIT_WRAPPERS:
            self._set_agent(box, tgid, wrapper=True)

    # -- placement -----------------------------------------------------------------------------

    def _new_tool(self, box: Box) -> str:
        tool = container.make_tool_cgroup(box.cgroup, container.new_tool_name())
        if self.conf.freeze == "always":
            v2.write(tool, "cgroup.freeze", "1")
        _set_xattr(tool, b"spare")
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
        if ppid(m.tgid) != m.parent:
            self.stats["short"] += 1  # gone (its exit is on its way), or its pid was reused
            return
        # Its name now: a short call may be gone (reaped) by the time its journal line is made.
        name_early = m.comm or comm(m.tgid)
        tool = box.spares.pop(0) if box.spares else self._new_tool(box)
        t0 = time.monotonic_ns()
        try:
            v2.move(m.tgid, tool)
        except OSError as e:
            if e.errno in (errno.ESRCH, errno.ENOENT, errno.EINVAL):
                self.stats["missed"] += 1  # it ended before we got to it: it ran unmanaged
                box.spares.insert(0, tool)
            else:
                v2.remove(tool, attempts=1)
                log.warning("inside agent in %s: cannot move %d: %s", box.cid[:12], m.tgid, e)
            return
        moved_ns = time.monotonic_ns()
        # What it forked before the move stays behind unless moved too (anything forked from
        # now on is born in the tool cgroup, so this walk misses nothing).
        todo = children(m.tgid)
        while todo:
            pid = todo.pop()
            with contextlib.suppress(OSError):
                v2.move(pid, tool)
            todo.extend(children(pid))
        raise_oom_score_adj(m.tgid, self.cfg.tool_oom_score_adj)
        mem = memory_status(m.tgid)
        self.stats["placed"] += 1
        stderr = open_stderr(m.tgid)
        tty = stderr is not None and os.isatty(stderr)
        argv = _nul_list(f"/proc/{m.tgid}/cmdline")
        if not argv:  # it ended already: no command line left, but a zombie keeps its name
            short = comm(m.tgid) or name_early
            argv = [short] if short else []
        name = os.path.basename(tool)
        call = ToolCall(name, box.cid, box.sandbox, tool, argv, tty=tty,
                        hint=self._hint(m.tgid, box, stderr, tty),
                        oom_score_adj=self.cfg.tool_oom_score_adj,
                        arrival=time.time() - (moved_ns - m.exec_ns) / 1e9)
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
        if self.cfg.memory_high_from_hint and call.hint and call.hint.get("memory_bytes"):
            with contextlib.suppress(OSError):
                v2.write(tool, "memory.high", str(call.hint["memory_bytes"]))
        assert self.ends is not None
        if not self.ends.watch(name, tool):
            self._ended(name)
            return
        self._admit(c)
        xcall = call.journal()
        if len(" ".join(argv)) > MAX_XATTR_ARGV:
            xcall["argv"] = argv[:1]
        _set_xattr(tool, json.dumps(xcall, separators=(",", ":")).encode())
        assert self.loop is not None
        self.loop.call_soon(self._replenish, box)

    def _hint(self, pid: int, box: Box, stderr: int | None, tty: bool) -> dict[str, Any] | None:
        """The call's parsed hint (from its exec'd environment), clamped to the container's
        limit; a malformed one is reported once per sandbox and value, as for docker exec."""
        raw = hints.pick(_nul_list(f"/proc/{pid}/environ"), [])
        return hint.resolve(raw, box.cgroup, box.sandbox, self.cfg.state_dir,
                            lambda why: log.warning("inside call in %s: %s", box.cid[:12], why),
                            lambda text: _write_line(stderr, tty, text))

    # -- admission -----------------------------------------------------------------------------

    def _admit(self, c: Call) -> None:
        msg = c.call.admit_request()
        try:
            _ticket, fut = self.engine.submit(msg)
        except Exception as e:  # noqa: BLE001 - fail open
            log.warning("inside call %s: not admitted (%s); running unmanaged", c.name, e)
            self._run(c, None)
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
        bound = (self.settings.admission.max_admission_wait_s
                 + self.settings.daemon.admission_slack_s)
        try:
            decision = await asyncio.wait_for(asyncio.shield(fut), bound)
        except TimeoutError:
            log.warning("inside call %s: no admission after %.0f s; running unmanaged",
                        c.name, bound)
            self.engine.cancel(c.name)
            self._run(c, None)
            return
        except asyncio.CancelledError:
            if c.frozen:
                self._thaw(c)  # shutting down, or the call ended: never leave it frozen
            raise
        self._run(c, decision)

    def _run(self, c: Call, decision: Any) -> None:
        """Admitted (decision) or failed open (None): let it go."""
        call = c.call
        if decision is None:
            call.admitted(False)
        else:
            call.admitted(True, round(float(decision.waited_s), 3), bool(decision.forced))
            if call.inside is not None:
                call.inside["frozen_s"] = call.waited_s if c.frozen else 0.0
            if feedback.should_report_delay(call.waited_s):
                _write_line(c.stderr, call.tty, feedback.admission_delayed(call.waited_s))
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

    # -- the end -------------------------------------------------------------------------------

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
            call.admitted(False)
            call.start = end
        gate = self.engine.done(name) if call.managed else None
        entry = outcome.conclude(call, end, gate)
        tell.tell_and_close(call, entry, c.stderr)  # the agent may be waiting for EOF
        assert self.loop is not None
        self.loop.run_in_executor(None, self._record, c, entry, end)

    def _record(self, c: Call, entry: dict[str, Any], end: float) -> None:
        """Off the loop: rmdir may have to retry, and the exit event may still be on its way."""
        if not v2.remove(c.cgroup):
            log.warning("inside call %s: cannot remove %s", c.name, c.cgroup)
        if not c.exited.wait(0.5) and self.loop is not None:
            self.loop.call_soon_threadsafe(self._forget_pid, c)
        elif c.last_comm and self.loop is not None:
            self.loop.call_soon_threadsafe(self._learn, c, entry.get("memory_peak"))
        outcome.record(entry, c.status, end, self.cfg.journal, log)

    def _forget_pid(self, c: Call) -> None:
        if self.by_pid.get(c.pid) is c:
            del self.by_pid[c.pid]

    # -- restart -------------------------------------------------------------------------------

    def _recover(self, box: Box) -> None:
        """What a previous daemon left in this container: spares, and calls that were placed
        (marked by an xattr; docker exec calls have their own watchers and are left alone)."""
        for tool in container.tool_cgroups(box.cgroup):
            mark = _get_xattr(tool)
            if mark is None and not self._starting:
                continue
            v2.thaw(tool)
            if mark is None:
                continue
            name = os.path.basename(tool)
            try:
                placed = json.loads(mark) if mark != b"spare" else None
            except ValueError:
                placed = None
            if not isinstance(placed, dict):
                if not v2.populated(tool):
                    v2.remove(tool, attempts=1)
                    continue
                call = ToolCall(name, box.cid, box.sandbox, tool, [], arrival=time.time())
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

    def snapshot(self) -> dict[str, Any]:
        stats = dict(self.stats)
        stats["short"] += self.tracker.gone_before_fork + self._probe_short
        if self.probe is not None:
            with contextlib.suppress(OSError):
                stats["kernel"] = self.probe.stats()  # the probe's own counters
                stats["short"] += stats["kernel"]["short"]
        source = "bpf" if self.probe is not None else "connector" if self.conn else None
        return {"containers": len(self.boxes), "listening": source is not None,
                "source": source, "calls": len(self.calls), "learned": sorted(self.learned),
                **stats}
