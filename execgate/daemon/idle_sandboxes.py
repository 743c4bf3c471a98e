"""Residency of idle sandboxes: the daemon's hands for policy/residency.py.

Freezing acts on a sandbox's ``init/`` leaf, never on the container's own cgroup: that one is
the engine's (`docker pause` writes its cgroup.freeze) and its tool calls live beside init.
Nothing else freezes ``init/``, so a daemon that starts and finds one frozen thaws it: a crash
never leaves a sandbox frozen for longer than a restart. memory.reclaim can take a while, so
it runs in a worker thread, one sandbox at a time; the control loop never waits for it.

The action boundary (a call has ended: the agent waits on its model) is seen here, not told: a
sandbox touched by a call's start or end that no longer has a call running or waiting has just
ended one. Admission that needs room (a new sandbox, a call that does not fit) asks through
`make_room`, which acts at the next control period (`pushable` says what idle sandboxes could
give).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from execgate.cgroups import container, v2
from execgate.common import meminfo, records
from execgate.policy.headroom import freed_bytes, swap_kept_share
from execgate.policy.pressure import PressureConfig, PressureReading, region_limits
from execgate.policy.pressure_state import Pressure
from execgate.policy.residency import Action, ResidencyConfig, SandboxView, idle_enough, plan

from . import thread_cpu
from .cgfiles import KeptFiles
from .events import EventBus
from .looks import LOOK_S, Looks

log = logging.getLogger("execgated")

RESCAN_S = 2.0  # container records are re-read at most this often
MAX_ACTIVITY = 4096  # containers whose last tool call is remembered
ROOM_TTL_S = 5.0  # a make_room ask not renewed for this long lapses
RATE_MIN_BYTES = 4 << 20  # reclaims of at least this much teach the swap-out bandwidth
ZSWAP_ENABLED = "/sys/module/zswap/parameters/enabled"


@dataclass
class Box:
    cid: str
    cgroup: str
    freezable: bool
    last_active: float
    frozen: bool = False
    reclaimed: bool = False
    reclaimed_bytes: int = 0  # over its lifetime, as measured around each reclaim
    cpu: tuple[float, int] | None = None  # (when, cpu.stat usage_usec): the busy check's base
    busy: bool | None = None  # used more than busy_cpu over the last second; None: not known
    active: bool = False  # a call started, ran or ended in it since the last period
    ended: bool = False  # idle since a call ended in it: the action boundary
    # (when, init/'s cpu.stat usage_usec, whether init/ was quiet since the one before):
    # an active sandbox's agent side, apart from its calls
    init_cpu: tuple[float, int, bool | None] | None = None

    def mark_active(self, now: float) -> None:
        """A tool call starts, runs or ends in it: idle time and the busy check start over."""
        self.last_active, self.reclaimed, self.cpu, self.busy = now, False, None, None
        self.active, self.ended = True, False


CPU_WINDOW_S = 1.0


def cpu_since(files: KeptFiles, cg: str, last: tuple[float, int] | None, now: float
              ) -> tuple[int, float | None] | None:
    """cg's cpu.stat usage_usec now, and its CPU share since `last` (when, usage_usec); None
    when the file says nothing."""
    usec = files.read_key(cg, "cpu.stat", "usage_usec")
    if usec is None:
        return None
    rate = None if last is None else (usec - last[1]) / 1e6 / max(now - last[0], 1e-9)
    return usec, rate


class Residency:
    def __init__(self, cfg: ResidencyConfig, pressure: PressureConfig, state_dir: str,
                 inside_default: bool, events: EventBus,
                 clock: Callable[[], float] = time.monotonic,
                 files: KeptFiles | None = None) -> None:
        self.cfg = cfg
        # the sandboxes' cgroup files, read every second or period: descriptors kept open
        # (cgfiles.py); the engine's, so that one bound covers every descriptor the daemon keeps
        self.files = KeptFiles() if files is None else files
        self.pressure = pressure
        self.index = records.ContainerIndex(state_dir)
        self.inside_default = inside_default
        self.events = events
        self.clock = clock
        self.boxes: dict[str, Box] = {}
        # containers with a call running or waiting (the engine's, given to step)
        self.busy: Callable[[], Iterable[str]] = lambda: ()
        self.activity: dict[str, float] = {}  # last tool call start or end, by container
        self.started = clock()
        self.scanned_at = -RESCAN_S
        self.green_since = clock()
        self.worker: threading.Thread | None = None
        self.stats = {"frozen": 0, "thawed": 0, "reclaims": 0, "reclaimed_bytes": 0}
        self.last_reclaim: dict[str, Any] | None = None
        self.room = 0  # bytes admission asked for (make_room) ...
        self.room_at = float("-inf")  # ... when
        self.swap_out_rate: float | None = None  # bytes/s reclaims achieved (moving average)
        self.looks = Looks(clock, files=self.files)  # memory files, read at most once a second
        self._meminfo_at: tuple[float, dict[str, int]] = (-math.inf, {})  # when, what it said
        self._kept = (-math.inf, 0.0)  # swap_kept: when, what

    # -- admission's hook ----------------------------------------------------------------------

    def make_room(self, nbytes: int) -> None:
        """Admission needs ``nbytes`` more (a sandbox or call waiting for room): idle sandboxes
        give memory back from the next control period on, the longest idle first and each once
        per idle period, whatever the pressure (`pushable` says what they could give). An ask
        lapses unless renewed within ROOM_TTL_S; 0 withdraws it. Cheap enough to call every
        period while something waits: it measures nothing, and rescans the records at most
        every RESCAN_S."""
        self.room, self.room_at = max(int(nbytes), 0), self.clock()
        self._rescan()

    def pushable(self, cold: bool = False) -> int:
        """What idle sandboxes could give back now (each `reclaimable_bytes`), without asking;
        cold: and what the kernel can swap out of active ones (`cold_bytes`)."""
        self._rescan()
        busy, free, kept = set(self.busy()), self.swap_free(), self.swap_kept()
        total = 0
        for cid in self.boxes:  # the free swap is shared: what one takes, the next cannot
            if cid in busy and not cold:
                continue
            got, swapped = (self.cold_parts(cid, free, kept) if cid in busy
                            else self.reclaimable_parts(cid, busy, free, kept=kept))
            total += got
            free = max(free - swapped, 0)
        return total

    def swap_free(self) -> int:
        """The host's free swap (0 when unknown), as /proc/meminfo said within LOOK_S."""
        return self._meminfo().get("SwapFree", 0)

    def swap_kept(self) -> float:
        """The share of a swapped-out byte still charged to its cgroup (`swap_kept_share`:
        zswap's compressed copy; 0 for zram and disk swap), as seen within LOOK_S."""
        now = self.clock()
        if now - self._kept[0] < LOOK_S:
            return self._kept[1]
        try:
            with open(ZSWAP_ENABLED) as f:
                zswap = f.read().strip() in ("Y", "1")
        except OSError:
            zswap = False
        info = self._meminfo() if zswap else {}
        kept = swap_kept_share(True, info.get("Zswap"), info.get("Zswapped")) if zswap else 0.0
        self._kept = (now, kept)
        return kept

    def _meminfo(self) -> dict[str, int]:
        now = self.clock()
        if now - self._meminfo_at[0] >= LOOK_S:
            try:
                self._meminfo_at = (now, meminfo.read())
            except (OSError, ValueError):
                self._meminfo_at = (now, {})
        return self._meminfo_at[1]

    def cold_bytes(self, cid: str, host_free: int | None = None, kept: float = 0.0) -> int:
        """An active sandbox's cold pages, what the kernel swaps out first when a call beside
        them needs room: all of its init leaf's memory while init/ used at most busy_cpu since
        the last look (a process that does not run touches no page; with MGLRU an untouched
        page stays on the "active" lists until reclaim ages it, so the lists alone miss it),
        else its inactive LRU lists; anonymous pages as far as swap has room. Its running calls
        live in their own cgroups, so they are not counted. kept: as `swap_kept` (the bytes
        then are what the push frees, not what it moves)."""
        return self.cold_parts(cid, host_free, kept)[0]

    def cold_parts(self, cid: str, host_free: int | None = None, kept: float = 0.0
                   ) -> tuple[int, int]:
        """cold_bytes, and the anonymous part of them (what goes to swap)."""
        box = self.boxes.get(cid)
        if box is None:
            return 0, 0
        init = container.init_leaf(box.cgroup)
        stat = self.looks.keyed(init, "memory.stat")
        if not stat:
            return 0, 0
        quiet = self._init_quiet(box, init)
        file, anon = (("file", "anon") if quiet else ("inactive_file", "inactive_anon"))
        swapped = min(stat.get(anon, 0), self._swap_room(box, host_free))
        return freed_bytes(stat.get(file, 0), swapped, kept), swapped

    def _init_quiet(self, box: Box, init: str) -> bool:
        """Whether init/ used at most busy_cpu since the last look (at least CPU_WINDOW_S
        ago); False until two looks were made."""
        now = self.clock()
        last = box.init_cpu
        if last is not None and now - last[0] < CPU_WINDOW_S:
            return last[2] is True
        seen = cpu_since(self.files, init, None if last is None else last[:2], now)
        if seen is None:
            return False
        usec, rate = seen
        quiet = None if rate is None else rate <= self.cfg.busy_cpu
        box.init_cpu = (now, usec, quiet)
        return quiet is True

    def swap_out_bytes_per_s(self, configured: float) -> float:
        """The configured swap-out bandwidth, or what reclaims here achieved if slower (an
        emulated or loaded host compresses far below a hardware figure)."""
        rate = self.swap_out_rate
        return configured if rate is None else min(configured, rate)

    def room_wanted(self) -> int:
        if self.room and self.clock() - self.room_at > ROOM_TTL_S:
            self.room = 0
        return self.room

    def reclaimable_bytes(self, cid: str, busy: set[str] | None = None,
                          host_free: int | None = None, current: int | None = None,
                          kept: float = 0.0) -> int:
        """What memory.reclaim could take from an idle sandbox now: its page cache, and its
        anonymous memory as far as swap has room (the host's free swap, init/'s swap.max), down
        to keep_bytes; 0 while a call runs or waits in it (``busy``: the engine's set, asked
        for when not given) or once reclaimed in this idle period. host_free (`swap_free`) and
        current (its memory.current) are read here when the caller has not read them. kept:
        as `swap_kept`, for what the reclaim frees (admission's room) rather than what it
        moves (residency's ask)."""
        return self.reclaimable_parts(cid, busy, host_free, current, kept)[0]

    def reclaimable_parts(self, cid: str, busy: set[str] | None = None,
                          host_free: int | None = None, current: int | None = None,
                          kept: float = 0.0) -> tuple[int, int]:
        """reclaimable_bytes, and the anonymous part of what it moves (what goes to swap)."""
        box = self.boxes.get(cid)
        if box is None or box.reclaimed or cid in (set(self.busy()) if busy is None else busy):
            return 0, 0
        stat = self.looks.keyed(box.cgroup, "memory.stat")
        if not stat:
            return 0, 0
        anon = min(stat.get("anon", 0), self._swap_room(box, host_free))
        if current is None:
            current = self.looks.int(box.cgroup, "memory.current") or 0
        moved = max(min(stat.get("file", 0) + anon, current - self.cfg.keep_bytes), 0)
        file = min(stat.get("file", 0), moved)
        return (freed_bytes(file, moved - file, kept) if kept else moved), moved - file

    def _swap_room(self, box: Box, host_free: int | None = None) -> int:
        free = self.swap_free() if host_free is None else host_free
        init = container.init_leaf(box.cgroup)
        for cg in (box.cgroup, init):
            limit = (self.looks.text(cg, "memory.swap.max") or "").strip()
            if limit.isdigit():  # else none set, or no swap accounting: the host's free swap
                used = self.looks.int(cg, "memory.swap.current") or 0
                free = min(free, max(int(limit) - used, 0))
        return free

    # -- events from the engine ----------------------------------------------------------------

    def touch(self, cid: str | None) -> None:
        """A tool call starts or ends in this sandbox: it is active again (and thawed now)."""
        if not cid:
            return
        now = self.activity[cid] = self.clock()
        if len(self.activity) > MAX_ACTIVITY:  # containers come and go while all is green
            for old in sorted(self.activity, key=self.activity.__getitem__)[:MAX_ACTIVITY // 2]:
                del self.activity[old]
        box = self.boxes.get(cid)
        if box is None:
            return
        box.mark_active(now)
        self.looks.forget(box.cgroup, container.init_leaf(box.cgroup))  # its memory moves now
        if box.frozen:
            self._thaw(box, "a tool call")

    # -- start and stop ------------------------------------------------------------------------

    def recover(self) -> int:
        """Thaw what a previous daemon froze (nothing else freezes init/)."""
        self._rescan(force=True)
        thawed = 0
        for box in self.boxes.values():
            if container.thaw_init(box.cgroup):
                thawed += 1
                log.info("residency: thawed %s, frozen by a previous daemon", box.cid[:12])
        return thawed

    def stop(self) -> None:
        for box in self.boxes.values():
            if box.frozen:
                self._thaw(box, "the daemon stopping")
        if self.worker is not None:
            self.worker.join(timeout=5.0)

    # -- every control period ------------------------------------------------------------------

    def step(self, reading: PressureReading, busy: Callable[[], Iterable[str]],
             queued_bytes: Callable[[], int]) -> None:
        """Cheap while green with nothing frozen: one comparison (``busy``, the containers with
        a call running or waiting, and ``queued_bytes``, the waiting calls' demand, are asked
        for only when there is more to do)."""
        now = self.clock()
        self.busy = busy
        done = self.last_reclaim
        if done is not None and not done["published"] and not self.worker_alive():
            done["published"] = True
            box = self.boxes.get(done["container"])
            if box is not None:  # what it holds and has in swap has just changed
                self.looks.forget(box.cgroup, container.init_leaf(box.cgroup))
            self.events.publish("residency", action="reclaimed", container=done["container"],
                                asked=done["asked"], reclaimed=done["reclaimed"],
                                seconds=done["seconds"], error=done["error"])
        room = self.room_wanted()
        if reading.state == Pressure.GREEN and not room:
            if not any(b.frozen for b in self.boxes.values()):
                self.green_since = min(self.green_since, now)
                return
        elif reading.state != Pressure.GREEN:
            self.green_since = now
        self._rescan()
        active = set(busy())
        host_free: int | None = None  # read at the first candidate, once for all
        views = []
        for box in self.boxes.values():
            if box.cid in active:
                box.mark_active(now)
            elif box.active:  # its call has ended since the last period: the action boundary
                box.active, box.ended = False, True
            if box.frozen:  # the runtime thaws by itself when failing open, or on kill
                box.frozen = self.files.read_int(container.init_leaf(box.cgroup),
                                                 "cgroup.freeze") == 1
            idle = None if box.cid in active else now - box.last_active
            eligible = idle_enough(self.cfg, idle, box.ended, room > 0)
            if eligible and not self._quiet(box, now):
                idle, eligible = None, False  # at work without a tool call (or not known yet)
            # memory.current only where a reclaim could follow: a few reads, not one per box
            candidate = eligible and (reading.state != Pressure.GREEN or room) \
                and not box.reclaimed
            memory = can = 0
            if candidate:
                memory = self.looks.int(box.cgroup, "memory.current") or 0
                host_free = self.swap_free() if host_free is None else host_free
                can = self.reclaimable_bytes(box.cid, active, host_free, memory)
            views.append(SandboxView(box.cid, idle, memory, box.freezable, box.frozen,
                                     box.reclaimed, box.ended, can))
        reclaiming = self.worker_alive()
        for action in plan(self.cfg, reading.state, now - self.green_since,
                           self._need(reading) + queued_bytes(), views, reclaiming, room):
            self._apply(action, reading)

    def _quiet(self, box: Box, now: float) -> bool:
        """Whether the sandbox used at most busy_cpu over the last second (cpu.stat); a busy
        one counts as active from now on."""
        if box.frozen:
            return True
        if box.cpu is None or now - box.cpu[0] >= CPU_WINDOW_S:
            seen = cpu_since(self.files, box.cgroup, box.cpu, now)
            if seen is None:
                return True  # nothing to tell by: idle by calls alone
            usec, rate = seen
            if rate is not None:
                box.busy = rate > self.cfg.busy_cpu
                if box.busy:
                    box.last_active = now
            box.cpu = (now, usec)
        return box.busy is False

    def worker_alive(self) -> bool:
        return self.worker is not None and self.worker.is_alive()

    def _need(self, reading: PressureReading) -> int:
        yellow = region_limits(self.pressure, reading.budget)[1]
        return max(yellow - reading.effective_headroom, 0) if reading.state else 0

    def _apply(self, action: Action, reading: PressureReading) -> None:
        box = self.boxes.get(action.cid)
        if box is None:
            return
        if action.kind == "thaw":
            self._thaw(box, "the domain being green")
        elif action.kind == "freeze":
            try:
                v2.write(container.init_leaf(box.cgroup), "cgroup.freeze", "1")
            except OSError as e:
                if e.errno == errno.ENOENT:  # removed before its record: nothing to freeze,
                    del self.boxes[box.cid]  # and no warning every period until the rescan
                    return
                log.warning("residency: cannot freeze %s: %s", box.cid[:12], e)
                return
            box.frozen = True
            self.stats["frozen"] += 1
            self.events.publish("residency", action="frozen", container=box.cid,
                                state=str(reading.state))
        elif action.kind == "reclaim":
            box.reclaimed = True
            # (the kernel's reclaim runs on this thread's CPU: counted when it ends)
            self.worker = threading.Thread(target=thread_cpu.counted(self._reclaim),
                                           args=(box, action.amount),
                                           name="reclaim", daemon=True)
            self.worker.start()

    def _thaw(self, box: Box, why: str) -> None:
        box.frozen = False
        try:
            v2.write(container.init_leaf(box.cgroup), "cgroup.freeze", "0")
        except OSError as e:
            if e.errno != errno.ENOENT:  # a removed container has nothing left to thaw
                log.warning("residency: cannot thaw %s: %s", box.cid[:12], e)
            return
        self.stats["thawed"] += 1
        self.events.publish("residency", action="thawed", container=box.cid, why=why)

    def _reclaim(self, box: Box, amount: int) -> None:
        """memory.reclaim fails (EAGAIN) when it could not take all it was asked for: what it
        did take is still gone, and measured here."""
        before = v2.read_int(box.cgroup, "memory.current") or 0
        t0 = time.monotonic()
        error = None
        try:
            v2.write(box.cgroup, "memory.reclaim", str(amount))
        except OSError as e:
            error = os.strerror(e.errno) if e.errno else str(e)
        after = v2.read_int(box.cgroup, "memory.current") or 0
        got = max(before - after, 0)
        took = time.monotonic() - t0
        if got >= RATE_MIN_BYTES and took > 0:  # small reclaims say little about bandwidth
            rate = got / took
            old = self.swap_out_rate
            self.swap_out_rate = rate if old is None else 0.7 * old + 0.3 * rate
        box.reclaimed_bytes += got
        self.stats["reclaims"] += 1
        self.stats["reclaimed_bytes"] += got
        # Published by the loop's next step: the event bus's queues belong to its thread.
        self.last_reclaim = {"container": box.cid, "asked": amount, "reclaimed": got,
                             "seconds": round(took, 3), "error": error,
                             "published": False}

    # -- sandboxes -----------------------------------------------------------------------------

    def _rescan(self, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self.scanned_at < RESCAN_S:
            return
        self.scanned_at = now
        seen = set()
        for rec in self.index.records():
            cg = rec.get("cgroup")
            if not rec.get("managed") or not cg or not container.is_prepared(cg):
                continue
            cid = rec["id"]
            seen.add(cid)
            old = self.boxes.get(cid)
            if old is not None and old.cgroup != cg:  # restarted in a new cgroup: a new life
                self._drop(cid)
            if cid not in self.boxes:  # idle since its last call, its start, or ours
                created = now - max(time.time() - float(rec.get("created") or 0), 0.0)
                self.boxes[cid] = Box(cid, cg, not records.agent_inside(rec, self.inside_default),
                                      self.activity.get(cid, max(self.started, created)),
                                      active=cid in self.activity)
        for cid in set(self.boxes) - seen:
            self._drop(cid)
        self.looks.keep_only({cg for b in self.boxes.values()
                              for cg in (b.cgroup, container.init_leaf(b.cgroup))})
        for cid in set(self.activity) - seen:
            del self.activity[cid]

    def _drop(self, cid: str) -> None:
        """Forget a sandbox, and close its kept descriptors."""
        cg = self.boxes.pop(cid).cgroup
        self.files.forget(cg, container.init_leaf(cg))

    def snapshot(self) -> dict[str, Any]:
        now = self.clock()
        return {
            "enabled": self.cfg.enabled, "idle_after_s": self.cfg.idle_after_s,
            **self.stats, "last_reclaim": self.last_reclaim and {
                k: v for k, v in self.last_reclaim.items() if k != "published"},
            "room": self.room_wanted(),
            "swap_out_bytes_per_s": self.swap_out_rate and round(self.swap_out_rate),
            "sandboxes": {b.cid: {"idle_s": round(now - b.last_active, 1), "frozen": b.frozen,
                                  "reclaimed_bytes": b.reclaimed_bytes, "ended": b.ended,
                                  "reclaimed": b.reclaimed}
                          for b in self.boxes.values()},
        }
