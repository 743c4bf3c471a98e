"""Sandbox admission's hands: the daemon's side of `policy/sandbox_admission.py`.

A managed container's `create` asks (`start_sandbox`) before runc create; it waits here, its
future unresolved, until the policy says it fits or its wait is over. Every control period
that a create waits, the domain is measured into a `DomainSnapshot`:

* budget and S from the period's `PressureReading` (`pressure.effective_margin`);
* one `LiveSandbox` per live managed sandbox in the domain (from the container records):
  resident = its cgroup's memory.current less its running calls' memory; reclaimable = what
  residency (`idle_sandboxes.py`, the hands that give it back) says memory.reclaim could take
  from it now — page cache, anonymous memory as far as swap has room — for a sandbox with no
  call running or waiting and not busy on its CPU; idle_s since its last call; next-call
  peak = the predicted peak of a call waiting in it, else the largest call peak seen in it,
  else the configured default;
* running calls' charges (at least their current memory); other = the domain's use outside
  live sandboxes (the host's daemons, for domain "host").

While nothing waits, the records are rescanned every RESCAN_S for the baselines: a sandbox's
baseline is what it held outside tool calls at its largest — its init leaf's memory.peak, and
whenever none of its calls is live its memory.current less page cache (what the kernel drops
before an OOM kill; tmpfs and shm stay): what its calls left behind counts, as the policy's
reserve_growth expects — learned for its image when its record goes (the runtime's `delete`
removes it), with its start (the same before its first call: what a new one arrives with).
Measured only before the first call, the leftovers went unlearned: simulated, 1,000 sandboxes
without swap took 42,635 s with 43 OOM kills instead of 5,309 s with none.
A create admitted on bytes idle sandboxes can give back asks residency for them
(`make_room`: reclaimed from the next period on, the longest idle first). A create whose cgroup
lies outside a cgroup domain is admitted at once: its memory is not the domain's to share.
The baselines learned are kept in the state directory (`baselines.json`, the last
history_window per image), so a restarted or upgraded daemon admits from what it has seen; an
unreadable file is logged and the defaults serve.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from execgate.cgroups import container, v2
from execgate.common import records
from execgate.policy.headroom import HeadroomConfig, LiveSandbox
from execgate.policy.pressure import PressureReading
from execgate.policy.sandbox_admission import (
    DomainSnapshot,
    SandboxAdmission,
    SandboxAdmissionConfig,
    SandboxDecision,
    SandboxRequest,
    Verdict,
)

from .cgfiles import KeptFiles
from .events import EventBus
from .idle_sandboxes import Residency

log = logging.getLogger("execgated")

RESCAN_S = 2.0  # records (and baselines) are re-read at most this often while nothing waits
# While creates wait, the domain is measured and decided at most this often, and at once when a
# create has come or a call has begun or ended since: every 0.1 s period it took 42 of the
# daemon's 141 CPU-seconds in a VM run of the 15x burst, its creates waiting minutes, and a
# start takes seconds, so half a second more in the queue costs it nothing.
WAITING_STEP_S = 0.5
BASELINES = "baselines.json"  # in the state directory: BaselineModel.export()


class WaitingStep:
    """When waiting creates are decided: every `period_s`, or at once when a create has come
    or the running calls changed since the last decision (the simulator's hands use it too)."""

    def __init__(self, period_s: float = WAITING_STEP_S) -> None:
        self.period_s = period_s
        self.asked = 0  # creates asked so far
        self.at = -math.inf  # the last decision
        self._on: tuple[int, set[str]] = (0, set())  # creates asked, calls running then

    def due(self, now: float, calls: Iterable[str]) -> bool:
        """Whether to decide now; if so, this is the decision's time."""
        ids = set(calls)
        if now - self.at < self.period_s and self._on == (self.asked, ids):
            return False
        self.at, self._on = now, (self.asked, ids)
        return True


def cgroup_dir(cgroups_path: str, root: str = v2.ROOT) -> str | None:
    """The cgroupfs directory a spec's linux.cgroupsPath names (runc's two grammars:
    "slice:prefix:name" for the systemd driver, a path for cgroupfs); None when not said."""
    if not cgroups_path:
        return None
    parts = cgroups_path.split(":")
    if len(parts) == 3 and not cgroups_path.startswith("/"):
        slice_, prefix, name = parts
        slice_ = slice_ or "system.slice"
        stem = slice_.removesuffix(".slice")
        dirs = ["-".join(stem.split("-")[:i + 1]) + ".slice" for i in range(len(stem.split("-")))]
        if slice_ == "-.slice":
            dirs = []
        unit = name if name.endswith(".slice") else (f"{prefix}-{name}.scope" if prefix
                                                     else f"{name}.scope")
        return os.path.join(root, *dirs, unit)
    return os.path.join(root, cgroups_path.lstrip("/"))


def within(path: str, domain: str) -> bool:
    path, domain = os.path.normpath(path), os.path.normpath(domain)
    return path == domain or path.startswith(domain + "/")


@dataclass
class Box:
    """A live managed sandbox, as sandbox admission follows it."""

    cid: str
    cgroup: str
    image: str
    created: float  # on the daemon's clock
    baseline: int = 0  # bytes outside calls at the most: init peak, resident between calls
    start: int = 0  # ... before its first call: what it arrived with
    called: bool = False  # a tool call has come: what it holds now includes calls' leftovers
    call_peak: int | None = None  # the largest tool-call peak seen in it
    call_area: float = 0.0  # its calls' peak x duration, summed: its call load over its life
    peak_at: float = -math.inf  # its init's memory.peak, last read
    measured_at: float = -math.inf  # its memory.current and memory.stat, last read


class Sandboxes:
    """Waiting creates, the live sandboxes of the domain, and the policy between them."""

    def __init__(self, cfg: SandboxAdmissionConfig, residency: Residency, state_dir: str,
                 domain: str | None, events: EventBus,
                 clock: Callable[[], float] = time.monotonic,
                 headroom: HeadroomConfig | None = None, files: KeptFiles | None = None) -> None:
        self.cfg = cfg
        # [headroom]: count_cold (an active sandbox's cold pages are pushable) and the
        # swap-out bandwidth assumed before reclaims here measured it
        self.headroom = HeadroomConfig() if headroom is None else headroom
        self.residency = residency  # what idle sandboxes can give back, and make_room
        self.domain = domain  # a cgroup directory, or None for the host
        self.events = events
        self.clock = clock
        self.policy = SandboxAdmission(cfg, clock)
        # each sandbox's memory.current, read every period while a create waits: a pread on a
        # kept descriptor, not an open, a read and a close each (cgfiles.py); the engine's,
        # so that one bound covers every descriptor the daemon keeps
        self.files = KeptFiles() if files is None else files
        self.index = records.ContainerIndex(state_dir)
        self.boxes: dict[str, Box] = {}
        self.waiting: dict[str, tuple[dict[str, Any], asyncio.Future[SandboxDecision]]] = {}
        self.scanned_at = -math.inf
        self.decide = WaitingStep()  # while creates wait: measured and decided when due
        # steps: waiting creates decided on a fresh measure, or on the last (launch bound)
        self.stats = {"outside_domain": 0, "cancelled": 0, "create_failed": 0,
                      "steps_measured": 0, "steps_unmeasured": 0}
        # Sandboxes whose first call came before a rescan found their record (an agent's exec
        # right after its create): their Box is born having been called.
        self._called_early: set[str] = set()
        self._born = time.time()  # sandboxes created before this daemon: their past is unknown
        self.last: DomainSnapshot | None = None
        self.learned_path = os.path.join(state_dir, BASELINES)
        self._load_learned()

    # -- baselines kept across restarts ---------------------------------------------------------

    def _load_learned(self) -> None:
        try:
            with open(self.learned_path) as f:
                self.policy.model.restore(json.load(f))
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            log.warning("sandbox baselines: %s unreadable (%s); the defaults serve",
                        self.learned_path, e)

    def _save_learned(self) -> None:
        tmp = f"{self.learned_path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(self.policy.model.export(), f)
            os.replace(tmp, self.learned_path)
        except OSError as e:
            log.warning("sandbox baselines: not saved to %s (%s)", self.learned_path, e)

    # -- requests ------------------------------------------------------------------------------

    def submit(self, msg: dict[str, Any]) -> tuple[dict[str, Any], asyncio.Future[SandboxDecision]]:
        """Queue a create (`start_sandbox`); ValueError when that sandbox already asked."""
        sid, image = msg["sandbox"], msg["image"]
        fut: asyncio.Future[SandboxDecision] = asyncio.get_running_loop().create_future()
        deadline = msg.get("caller_deadline") is not False  # an older runtime: kubelet's bound
        answer: dict[str, Any] = {"max_wait_s": self.cfg.max_wait_s(deadline)}
        target = cgroup_dir(str(msg.get("cgroups_path") or ""))
        if self.domain is not None and target is not None and not within(target, self.domain):
            self.stats["outside_domain"] += 1
            fut.set_result(SandboxDecision(sid, Verdict.ADMITTED, 0.0, 0, 0, 0, 0,
                                           f"admitted: {target} is outside the domain"))
            return answer, fut
        if sid not in self.waiting:  # the same container again (a restart): a new start
            self.policy.cancel(sid)
        ticket = self.policy.submit(SandboxRequest(sid, image, arrival=self.clock(),
                                                   caller_deadline=deadline))
        self.waiting[sid] = (msg, fut)
        self.decide.asked += 1
        pred = ticket.prediction
        self.events.publish("queued", of="sandbox", sandbox=sid, image=image,
                            baseline=pred.baseline_bytes, peak=pred.call_peak_bytes,
                            source=pred.source)
        return {**answer, "baseline": pred.baseline_bytes, "peak": pred.call_peak_bytes,
                "source": pred.source}, fut

    def cancel(self, sid: str) -> None:
        """The create hung up while it waited: it will not start now."""
        if self.waiting.pop(sid, None) is not None:
            self.policy.cancel(sid)
            self.stats["cancelled"] += 1
            self.events.publish("cancelled", of="sandbox", sandbox=sid)

    def create_failed(self, sid: str) -> None:
        """runc create of an admitted sandbox failed: nothing of it will start."""
        if self.policy.cancel(sid):
            self.stats["create_failed"] += 1
            self.events.publish("create-failed", of="sandbox", sandbox=sid)

    def call_arrived(self, cid: str | None) -> None:
        """A tool call came in this sandbox: it has reached its baseline (`settled`)."""
        if not cid:
            return
        self.policy.settled(cid)
        box = self.boxes.get(cid)
        if box is not None:
            box.called = True
        elif len(self._called_early) < 4096:  # bounded: a rescan clears what has no record
            self._called_early.add(cid)

    def call_ended(self, cid: str, peak: object, ran_s: float = 0.0) -> None:
        """A call of sandbox `cid` ended: its peak, and how long it ran since admitted."""
        if not isinstance(peak, int):
            return
        area = peak * max(ran_s, 0.0)
        self.policy.call_ran(cid, area)  # before its record is read, too
        box = self.boxes.get(cid)
        if box is not None:
            box.call_peak = max(box.call_peak or 0, peak)
            box.call_area += area

    # -- every control period ------------------------------------------------------------------

    def step(self, reading: PressureReading, used: int, calls: Mapping[str, Any],
             busy: Callable[[], Iterable[str]], activity: Mapping[str, float],
             queued_peaks: Callable[[], Mapping[str, int]]) -> None:
        """calls: the engine's LiveCalls by id (container, last_mem, extra["charge"]); busy:
        containers with a call running or waiting; activity: last call start or end by
        container (residency's); queued_peaks: predicted peak of calls waiting, by container.
        Cheap while no create waits: a rescan every RESCAN_S; while creates wait, a decision
        every WAITING_STEP_S, or at the next period after a create came or a call began or
        ended."""
        now = self.clock()
        if not self.waiting:
            if now - self.scanned_at >= RESCAN_S:
                self._rescan(now, calls)
                self.policy.expire(self.boxes.keys())
            return
        if not self.decide.due(now, calls):
            return
        self._rescan(now, calls)
        res = self.residency
        if res.cfg.enabled and res.cfg.reclaim:  # the room asked for the creates under way,
            res.make_room(res.room_wanted())  # renewed no more than asked (records rescanned)
        last = self.last
        if last is not None and self.policy.launches_full(now) and \
                {s.sandbox_id for s in last.sandboxes} == self.boxes.keys():
            # Nothing starts now but by its wait's bound: decided on the last measure, the
            # same sandboxes not measured again (at the 15x burst, creates waited on the bound
            # for minutes, and the measure was most of this stage's CPU). A sandbox come or
            # gone is measured: the policy forgets a start it does not see live.
            snap = last
            self.stats["steps_unmeasured"] += 1
        else:
            snap = self.last = self._snapshot(reading, used, calls, set(busy()), activity,
                                              queued_peaks())
            self.stats["steps_measured"] += 1
        pushable = sum(s.pushable_bytes for s in snap.sandboxes)
        for d in self.policy.step(snap, waiting=False, now=now):  # the starts: all it acts on
            if not d.start:
                continue
            # Admitted on what idle sandboxes can give back, or on what swap absorbs while the
            # baselines arrive or takes of the calls: have them give it.
            to_swap = d.absorbed_bytes + d.on_swap_bytes
            deficit = d.need_bytes + to_swap + pushable - d.room_bytes
            if d.verdict is Verdict.ADMITTED and (pushable or to_swap) and deficit > 0:
                self.residency.make_room(max(self.residency.room_wanted(), deficit))
            _msg, fut = self.waiting.pop(d.sandbox_id, (None, None))
            if fut is not None and not fut.done():
                fut.set_result(d)
            self.events.publish("admitted", of="sandbox", sandbox=d.sandbox_id,
                                verdict=str(d.verdict), waited_s=round(d.waited_s, 3),
                                need=d.need_bytes, room=d.room_bytes, reason=d.reason)
            if d.verdict is Verdict.FAIL_OPEN:
                log.warning("sandbox %s starts unadmitted: %s", d.sandbox_id[:12], d.reason)
            elif d.waited_s >= 0.5:
                log.info("sandbox %s waited %.1f s to start: %s", d.sandbox_id[:12],
                         d.waited_s, d.reason)

    def _snapshot(self, reading: PressureReading, used: int, calls: Mapping[str, Any],
                  busy: set[str], activity: Mapping[str, float],
                  queued: Mapping[str, int]) -> DomainSnapshot:
        now = self.clock()
        res = self.residency
        pushes = res.cfg.enabled and res.cfg.reclaim
        in_calls: dict[str, int] = {}
        for c in calls.values():
            in_calls[c.container] = in_calls.get(c.container, 0) + c.last_mem
        live, total = [], 0
        free, kept = res.swap_free(), res.swap_kept()  # once for every sandbox below
        for box in self.boxes.values():
            mem = self.files.read_int(box.cgroup, "memory.current")
            if mem is None:
                continue  # gone: its record goes at the next rescan
            total += mem
            resident = max(mem - in_calls.get(box.cid, 0), 0)
            idle: float | None = None
            reclaim = cold = swap = 0
            held = res.boxes.get(box.cid) if pushes and box.cid not in busy else None
            if held is not None and held.busy is not True:  # not at work without a call
                idle = max(now - max(activity.get(box.cid, box.created), box.created), 0.0)
                reclaim, swap = res.reclaimable_parts(box.cid, busy, free, kept=kept)
            elif self.headroom.count_cold:
                cold, swap = res.cold_parts(box.cid, free, kept)
            peak = queued.get(box.cid) or box.call_peak or self.cfg.default_call_peak_bytes
            live.append(LiveSandbox(box.cid, resident, reclaim, idle, peak, cold, swap))
        running = [max(int(c.extra.get("charge") or 0), c.last_mem) for c in calls.values()]
        # Room swap offers a baseline arriving: the host's free swap, within the swap.max
        # the runtime gives each sandbox ([residency] swap_max; "" writes none)
        limit = str(res.cfg.swap_max or "max")
        room = min(free, int(limit)) if limit.isdigit() else free
        # what swap-out frees per second (under zswap, less the compressed copies it keeps)
        rate = res.swap_out_bytes_per_s(self.headroom.swap_out_bytes_per_s) * (1.0 - kept)
        return DomainSnapshot(reading.budget, reading.safety_margin, live, running,
                              max(used - total, 0), room if pushes else 0, rate,
                              free if pushes else 0, reading.swap_credit)

    def _rescan(self, now: float, calls: Mapping[str, Any]) -> None:
        """Follow the records: new sandboxes join, removed ones teach their image's baseline."""
        self.scanned_at = now
        seen = set()
        in_call = {c.container for c in calls.values()}
        for rec in self.index.records():
            cg = rec.get("cgroup")
            if not rec.get("managed") or not cg or (self.domain and not within(cg, self.domain)):
                continue
            cid = rec["id"]
            seen.add(cid)
            box = self.boxes.get(cid)
            if box is None:
                born = float(rec.get("created") or 0)
                created = now - max(time.time() - born, 0.0)
                box = self.boxes[cid] = Box(cid, cg, str(rec.get("image") or "default"), created)
                # Called already, or created before this daemon (it may have been): what it
                # holds may be leftovers, not its start.
                box.called = cid in self._called_early or cid in in_call or born < self._born
                self._called_early.discard(cid)
                self.policy.live(cid, box.image)  # started before this daemon: its load counts
            if rec.get("prepared"):  # its runtime's start has run (max_launching)
                self.policy.launched(cid)
            if box.cgroup != cg:  # a restarted container may have a new one
                self._forget(box.cgroup)
                box.cgroup = cg
            self._measure(box, cid in in_call, now)
        self._called_early &= seen  # a create that never came to be
        for cid in set(self.boxes) - seen:
            box = self.boxes.pop(cid)
            self._forget(box.cgroup)
            life = now - box.created
            load = int(box.call_area / life) if box.call_peak is not None and life > 0 else None
            self.policy.finished(cid, box.image, box.baseline or None, box.call_peak, load,
                                 box.start or None)
            if box.baseline:
                self._save_learned()
            self.events.publish("finished", of="sandbox", sandbox=cid, image=box.image,
                                baseline=box.baseline, start=box.start, call_peak=box.call_peak,
                                call_load=load)

    def _measure(self, box: Box, in_call: bool, now: float) -> None:
        """Its baseline so far (module docstring). Between calls only — none the daemon knows
        of, none running unadmitted in a tool cgroup (a runtime that could not reach the
        daemon): a call's own bytes would count as the sandbox's. At most once per RESCAN_S
        per sandbox (rescans run every period while a create waits), and memory.stat only when
        memory.current could raise the baseline (at 1,000 sandboxes: nearly never)."""
        peak = 0
        if now - box.peak_at >= RESCAN_S:  # a high-water mark read later misses nothing
            box.peak_at = now
            peak = self.files.read_int(container.init_leaf(box.cgroup), "memory.peak") or 0
        unasked = False  # a call the daemon was not asked about runs in it
        if not in_call and now - box.measured_at >= RESCAN_S:
            box.measured_at = now
            mem = self.files.read_int(box.cgroup, "memory.current")
            if mem is not None and mem > max(box.baseline, peak):
                unasked = any(v2.populated(t) for t in container.tool_cgroups(box.cgroup))
                if not unasked:
                    stat = v2.read_keyed(box.cgroup, "memory.stat")
                    # less what the kernel takes back before an OOM kill: page cache (file
                    # less tmpfs and shm) and reclaimable slab (dentries and inodes of files)
                    cache = (stat.get("file", 0) - stat.get("shmem", 0)
                             + stat.get("slab_reclaimable", 0))
                    peak = max(peak, mem - max(cache, 0))
        if not box.called:
            box.start = max(box.start, peak)
        box.called = box.called or unasked
        box.baseline = max(box.baseline, peak)

    def _forget(self, cg: str) -> None:
        """Close the descriptors kept for a sandbox's cgroup and its init leaf."""
        self.files.forget(cg, container.init_leaf(cg))

    # -- views ---------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        snap = self.policy.snapshot()
        last = self.last
        return {**snap, "enabled": self.cfg.enabled, **self.stats,
                "live": len(self.boxes),
                "domain": None if last is None else {
                    "budget": last.budget_bytes, "margin": last.margin_bytes,
                    "running_call_bytes": sum(last.running_call_bytes),
                    "other_bytes": last.other_bytes,
                    "swap_free_bytes": last.swap_free_bytes,
                    "swap_out_bytes_per_s": round(last.swap_out_bytes_per_s),
                    "sandboxes": {s.sandbox_id: {"resident": s.resident_bytes,
                                                 "reclaimable": s.reclaimable_bytes,
                                                 "cold": s.cold_bytes, "idle_s": s.idle_s,
                                                 "next_call_peak": s.next_call_peak_bytes}
                                  for s in last.sandboxes}}}

