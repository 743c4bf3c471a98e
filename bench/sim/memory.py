"""The domain's memory as the kernel would account it: one memcg (the slice) with memory.max.

What is modelled, and why each piece is there:

* a sandbox's **baseline** (the agent framework, memload's init in the bench): anonymous memory
  held from its start until it dies; its **retained** bytes (files a call left in /dev/shm):
  shmem charged to the sandbox until it is removed;
* a running call's bytes from its trace curve (`bench.trace.memory_at`, the curve memload draws);
  a call the growth gate holds keeps what it has (memload is clock-paced: once let go it jumps to
  where its clock says, the catch-up burst);
* optional **page cache** left by calls (`cache_fraction` of their peak), dropped first at the
  limit, as the kernel's reclaim would;
* optional **compressed swap** (zswap-like: the compressed copy is charged to the domain at
  1/ratio, pages move out at `swap_bandwidth_bps`): kernel reclaim at the limit pushes out
  anonymous memory coldest first, as the LRU would take it: idle sandboxes' (longest idle
  first), then busy sandboxes' baselines (memload's init writes its baseline once), then the
  pages of running calls that do not read them again (memload without `--hot` writes a page
  once: the kernel swaps a cold call out under itself for free), and last, in proportion to
  what each holds, the pages of hot calls (`--hot`: every page read each tick); `memory.reclaim`
  (residency) pushes out one chosen sandbox; off by default, as in the VM sweep
  (`memory.swap.max = 0`);
* **swap-in** (`swap_in_bps`): a hot call must have every page it holds back before its pass
  over them ends, so each period it first brings back what it has in swap, at the swap-in
  bandwidth (shared by the calls that wait, into free memory; into a full domain each byte
  also waits for one to be reclaimed, so at 1/(1/in + 1/out)), and its trace time advances only
  for the rest of the period; a call that cannot have them all back in one period does not
  advance (memload counts its ticks: it never skips one). Bytes brought back are the domain's
  anonymous refaults (`refault_bytes`, memory.stat `workingset_refault_anon`); what the swap-ins
  push out takes the LRU's order, hot pages included (thrash). Cold calls and baselines never
  refault (memload's init and a cold call never read their pages again);
* **direct reclaim** (with swap): what the period's swap-out cannot cover is taken back from the
  calls that grew in it (their allocations wait on reclaim; memload catches up later) and from
  the sandboxes whose init is writing its baseline (it writes as fast as reclaim gives it
  pages: a burst of sandboxes fills swap at its bandwidth, not at once) while anonymous memory
  is left to swap and swap has room, rather than killed; what remains is swapped out of the
  coldest memory beyond the bandwidth, its wait not timed. `stall_s` adds up the time at least one
  task waited on reclaim or swap-in (PSI `some`), `psi_some_avg10` its 10-s average in percent;
* **OOM at the limit**: when the charge would exceed memory.max and reclaim cannot cover it, the
  kernel kills the process of highest badness = resident + swapped bytes + oom_score_adj/1000 of
  the limit, and with memory.oom.group a tool call's cgroup dies whole. A sandbox's init is a
  candidate like any call: killed, the sandbox dies with everything in it (the VM sweep's
  `sandbox-oom`). One victim at a time: what it had in swap is room again, and the charges
  still over the limit go back to waiting on reclaim before anyone else is killed.

Stdlib only; the simulator (bench/sim/run.py) owns time and calls `tick`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from bench.trace import Curve, MemoryProfile
from execgate.common.units import MiB

SLACK = 1.0  # bytes: curves are floats, a kill is never for rounding
# Swap-in against swap-out bandwidth when only swap-out is given: the VM under TCG measured
# ~27 MB/s in and ~5 MB/s out (zram: decompressing is cheaper than compressing).
SWAP_IN_OVER_OUT = 5.4
PSI_WINDOW_S = 10.0  # avg10


@dataclass(frozen=True)
class MemoryConfig:
    """Parameters of the memory model (defaults: the VM sweep's host: no swap, no cache)."""

    sandbox_overhead_bytes: int = 0  # per live sandbox beyond its baseline (runtime, shm, slab)
    call_overhead_bytes: int = 0  # per running call beyond its curve (the process itself)
    cache_fraction: float = 0.0  # page cache a call leaves, as a fraction of its peak
    swap: bool = False
    swap_ratio: float = 3.0  # compression ratio of swapped anonymous memory
    swap_bandwidth_bps: float = 256 * MiB  # swap-out (and memory.reclaim) speed
    swap_in_bandwidth_bps: float | None = None  # None: SWAP_IN_OVER_OUT x swap_bandwidth_bps
    swap_max_bytes: int | None = None  # memory.swap.max; None = unlimited
    # zram: the compressed copies live in the device's pool, the host's memory, not charged to
    # the domain (zswap, the default here, charges them at 1/swap_ratio).
    zram: bool = False
    # With swap: a charge over the limit that the period's swap-out cannot cover stalls the
    # growing calls (direct reclaim: the allocator waits for its pages to leave) while swappable
    # memory is left, instead of OOM-killing; False: the kill, as before.
    direct_reclaim: bool = True
    # The share of a hot call's proportional part of reclaim that the LRU spares while cold
    # pages are left (1: all of it, a strict LRU; 0: none, as if its pages were cold).
    hot_protection: float = 1.0

    def __post_init__(self) -> None:
        if self.swap_ratio < 1 or self.swap_bandwidth_bps <= 0:
            raise ValueError("swap_ratio must be >= 1 and swap_bandwidth_bps > 0")
        if self.swap_in_bandwidth_bps is not None and self.swap_in_bandwidth_bps <= 0:
            raise ValueError("swap_in_bandwidth_bps must be > 0")
        if not 0 <= self.cache_fraction <= 1:
            raise ValueError("cache_fraction must be in [0, 1]")
        if not 0 <= self.hot_protection <= 1:
            raise ValueError("hot_protection must be in [0, 1]")

    @property
    def swap_in_bps(self) -> float:
        return self.swap_in_bandwidth_bps or SWAP_IN_OVER_OUT * self.swap_bandwidth_bps


@dataclass(eq=False)
class SimCall:
    """One tool call's process (a memload) from its exec to its exit."""

    id: str
    box: SimBox
    profile: MemoryProfile
    duration_s: float
    oom_score_adj: int
    started: float  # when the process started (after exec's setup and any admission wait)
    held: bool = False
    hot: bool = False  # reads every page it holds each tick (memload --hot)
    level: float = 0.0  # bytes now (resident + swapped: what the process allocated)
    peak: float = 0.0
    before: float = 0.0  # bytes before the last advance (what a stall gives back to)
    peak_before: float = 0.0
    area: float = 0.0  # byte-seconds, for the average the estimator learns
    last: float = 0.0
    swapped: float = 0.0  # of level, out in swap
    owed: float = 0.0  # swapped bytes its current pass still has to bring back (hot)
    lag: float = 0.0  # seconds lost waiting on swap-in: its trace time is now - started - lag
    touched: float = 0.0  # when it last read its pages (the LRU's age); a cold call: its start
    charge: float = 0.0  # what its cgroup's memory.current shows (resident + zswap's copies)
    shown_peak: float = 0.0  # the largest charge (memory.peak)

    def __post_init__(self) -> None:
        self.touched = self.started
        self._curve = Curve(self.profile, self.duration_s)  # evaluated every period
        self._curve_of = self.profile

    @property
    def resident(self) -> float:
        return self.level - self.swapped

    def end_at(self) -> float:
        """When the process exits, as of now (swap-in waits push it later)."""
        return self.started + self.duration_s + self.lag

    def curve(self, now: float) -> float:
        t = now - self.started - self.lag
        if self._curve_of is not self.profile:  # a profile swapped in (the tests do)
            self._curve, self._curve_of = Curve(self.profile, self.duration_s), self.profile
        return self._curve(min(max(t, 0.0), self.duration_s))

    def advance(self, now: float) -> None:
        self.before, self.peak_before = self.level, self.peak
        if not self.held:
            self.level = self.curve(now)
            # memload gives back the pages it wrote last (the resident ones) when it shrinks
            self.swapped = min(self.swapped, self.level)
            self.owed = min(self.owed, self.swapped)
        self.area += self.level * max(now - self.last, 0.0)
        self.last = now
        self.peak = max(self.peak, self.level)


@dataclass(eq=False)
class SimBox:
    """One sandbox's memory: the init's baseline and what calls left behind."""

    id: str
    baseline: int
    alive: bool = True
    retained: int = 0  # shmem
    cache: int = 0  # page cache (reclaimable at once)
    swapped: int = 0  # anonymous/shmem bytes out in compressed swap
    last_active: float = 0.0
    call: SimCall | None = None
    reclaim_left: int = 0  # memory.reclaim still in flight
    seq: int = 0  # its place in the domain (boxes in the order they came)
    # Of its baseline, what its init has yet to write: direct reclaim holds the init back as it
    # holds a call (memload's init writes its baseline as fast as its pages are given).
    pending: float = 0.0

    @property
    def anon(self) -> int:
        """Bytes that swap could push out (baseline + shmem), resident now."""
        return self.baseline - self.pending + self.retained - self.swapped


@dataclass(frozen=True)
class Kill:
    """One OOM kill: the victim (a call, or a sandbox's init) and its badness."""

    at: float
    box: str
    call: str | None  # None: the init was the victim (the sandbox dies)
    badness: float
    usage: float


@dataclass
class Domain:
    """The slice: live sandboxes and calls, memory.max, and what the kernel does at the limit."""

    budget: int
    config: MemoryConfig = field(default_factory=MemoryConfig)
    boxes: dict[str, SimBox] = field(default_factory=dict)
    kills: list[Kill] = field(default_factory=list)
    swap_out_bytes: int = 0
    running: dict[str, SimCall] = field(default_factory=dict)
    reclaiming: set[str] = field(default_factory=set)  # boxes with a memory.reclaim in flight
    static: float = 0.0  # sum of _box_static over live boxes, kept incrementally
    levels: float = 0.0  # sum of the running calls' bytes (+ their overhead), kept likewise
    # Sets that collect the ids of boxes that came, went, or whose bytes or call changed: what
    # the daemon's hands re-read (its views of 1,000 sandboxes, rebuilt only where they moved).
    watchers: list[set[str]] = field(default_factory=list)
    call_cgroups: bool = False  # calls in their own memcg (execgate's tool-<hex>), not the box's
    added: int = 0
    stalled_bytes: float = 0.0  # growth held back by direct reclaim (MemoryConfig.direct_reclaim)
    refault_bytes: float = 0.0  # anonymous refaults, cumulative (workingset_refault_anon)
    stall_s: float = 0.0  # time some task waited on reclaim or swap-in (PSI some), cumulative
    psi_some_avg10: float = 0.0  # its 10-s average, percent (memory.pressure's some avg10)
    _tick_stall: float = 0.0  # this period's share of stall_s so far
    box_swapped: float = 0.0  # bytes in swap: the live sandboxes', and
    call_swapped: float = 0.0  # the running calls' (kept as running totals)
    _reclaim_in: float = 0.0  # bytes this period's swap-ins must reclaim (paid in their wait)
    # inits writing their baseline this period, and how much: new sandboxes, waiting ones
    _filling: list[tuple[SimBox, float]] = field(default_factory=list)
    _arrived: list[SimBox] = field(default_factory=list)  # sandboxes added since the last period

    def _touch(self, box_id: str) -> None:
        for w in self.watchers:
            w.add(box_id)

    def _box_static(self, b: SimBox) -> float:
        return self.charged(b) + self.config.sandbox_overhead_bytes

    def charged(self, b: SimBox) -> float:
        """What the sandbox's cgroup is charged outside calls, as its memory.current says:
        resident bytes, and under zswap the compressed copies of what it swapped out."""
        swapped = 0.0 if self.config.zram else b.swapped / self.config.swap_ratio
        return b.anon + b.cache + swapped

    # -- the population ------------------------------------------------------------------------

    def add_box(self, box: SimBox) -> None:
        self.added += 1
        box.seq = self.added
        self.boxes[box.id] = box
        self.static += self._box_static(box)
        self._touch(box.id)
        self._arrived.append(box)

    def remove_box(self, box_id: str) -> None:
        box = self.boxes.pop(box_id, None)
        if box is not None:
            self._touch(box_id)
            box.alive = False
            self.static -= self._box_static(box)
            self.box_swapped -= box.swapped
            if box.call is not None and self.running.pop(box.call.id, None) is not None:
                self.levels -= box.call.charge + self.config.call_overhead_bytes
                self.call_swapped -= box.call.swapped
            if not self.boxes:
                self.static = 0.0  # no float drift across an empty domain
                self.box_swapped = 0.0
            if not self.running:
                self.levels = 0.0
                self.call_swapped = 0.0

    def start_call(self, call: SimCall) -> None:
        call.box.call = call
        self._touch(call.box.id)
        self.running[call.id] = call
        call.charge = call.level - call.swapped * self._freed_per_byte()
        self.levels += call.charge + self.config.call_overhead_bytes

    def advance(self, now: float, dt: float = 0.0) -> None:
        """Every running call to its bytes at `now` (held calls keep theirs), after the hot
        calls have brought back what they had in swap (the period's swap-in, `dt` long)."""
        self._tick_stall = 0.0
        self._reclaim_in = 0.0
        # Only an init that was writing last period can have been held back: those try again.
        waiting = [b for b, _ in self._filling if b.alive and b.pending > 0]
        self._filling, self._arrived = [(b, float(b.baseline)) for b in self._arrived], []
        for b in waiting:
            self._filling.append((b, b.pending))
            self.static += b.pending
            b.pending = 0.0
        wait = self._swap_in(dt) if self.config.swap and dt > 0 else 0.0
        fpb = self._freed_per_byte()
        total = swapped = 0.0
        for c in self.running.values():
            c.advance(now)
            if c.hot and not c.held and c.owed <= 0:  # its pass over its pages ended
                c.touched = now
            c.charge = c.level - c.swapped * fpb
            c.shown_peak = max(c.shown_peak, c.charge)
            total += c.charge
            swapped += c.swapped
        self.levels = total + len(self.running) * self.config.call_overhead_bytes
        self.call_swapped = swapped
        self._stalled(wait, dt)

    def _swap_in(self, dt: float) -> float:
        """The hot calls' passes bring back what they owe from swap, oldest call first, at the
        swap-in bandwidth into free memory and at 1/(1/in + 1/out) beyond it (each page in
        waits for one out). A call whose pages are all back loses the time it waited; one that
        is not, the whole period. Served in turn, not shared: shared, when the calls' working
        sets outgrew memory every pass was pushed out again before it ended and no call ever
        finished (the model's livelock; the kernel lets a task whose faults are served run).
        Returns the wait (the longest)."""
        waiting = [c for c in self.running.values() if c.hot and not c.held and c.swapped > 0]
        if not waiting:
            return 0.0
        cfg = self.config
        free = free0 = max(self.budget - self.usage(), 0.0) / self._freed_per_byte()
        fast = cfg.swap_in_bps
        slow = 1.0 / (1.0 / fast + 1.0 / cfg.swap_bandwidth_bps)
        t = got_all = 0.0  # t: when the call being served is done (the wait so far)
        for c in sorted(waiting, key=lambda c: c.started):
            if c.owed <= 0:  # a new pass over its pages: all of what is out must come back
                c.owed = c.swapped
            quick = min(c.owed, free)
            t_need = quick / fast + (c.owed - quick) / slow
            if t + t_need <= dt:
                back, t = c.owed, t + t_need
                free -= quick
                c.lag += t
            else:  # what the rest of the period buys: the free part first, then the slow part
                left = max(dt - t, 0.0)
                back = min(left * fast, free)
                back = min(back + (left - back / fast) * slow, c.owed)
                free = max(free - back, 0.0)
                t = dt
                c.lag += dt
            c.owed -= back
            c.swapped -= back
            self.call_swapped -= back
            got_all += back
            if c.owed <= SLACK:
                c.owed = 0.0
        self.refault_bytes += got_all
        self._reclaim_in = max(got_all - free0, 0.0)
        return t

    def _stalled(self, wait: float, dt: float) -> None:
        """Some task waited `wait` of this period (PSI some counts it once, whoever waits)."""
        if wait > self._tick_stall:
            self.stall_s += wait - self._tick_stall
            self._tick_stall = wait

    def end_period(self, dt: float) -> None:
        """The period is over: PSI's avg10 takes its share of stalled time."""
        if dt > 0:
            frac = min(self._tick_stall / dt, 1.0)
            self.psi_some_avg10 += (100 * frac - self.psi_some_avg10) * (
                1 - math.exp(-dt / PSI_WINDOW_S))

    def calls(self) -> Iterator[SimCall]:
        return iter(self.running.values())

    def end_call(self, call: SimCall, leaves: bool = True) -> None:
        """The process exited (leaves: normally, so its retained bytes and cache stay)."""
        box = call.box
        self._touch(box.id)
        if box.call is call:
            box.call = None
        if self.running.pop(call.id, None) is not None:
            self.levels -= call.charge + self.config.call_overhead_bytes
            self.call_swapped -= call.swapped
            if not self.running:
                self.levels = 0.0
                self.call_swapped = 0.0
        if leaves and box.alive:
            before = self._box_static(box)
            box.retained += call.profile.retained_bytes
            box.cache += int(call.profile.peak_bytes * self.config.cache_fraction)
            self.static += self._box_static(box) - before

    # -- accounting ----------------------------------------------------------------------------

    def usage(self) -> float:
        """memory.current of the slice (resident + the compressed copies of swapped pages)."""
        return self.static + self.levels

    def swap_used(self) -> float:
        """Bytes in swap: the sandboxes' and the running calls' (kept as a running total)."""
        return self.box_swapped + self.call_swapped

    # -- the kernel at the limit ---------------------------------------------------------------

    def _room(self) -> float:
        cfg = self.config
        return math.inf if cfg.swap_max_bytes is None else cfg.swap_max_bytes - self.swap_used()

    def _swap_out(self, b: SimBox, want: float) -> float:
        """Move up to `want` resident bytes of b to compressed swap; returns the bytes freed."""
        n = int(max(0.0, min(want, b.anon, self._room())))
        if n <= 0:
            return 0.0
        before = self._box_static(b)
        self._touch(b.id)
        b.swapped += n
        self.static += self._box_static(b) - before
        self.swap_out_bytes += n
        self.box_swapped += n
        return n * self._freed_per_byte()

    def _swap_out_call(self, c: SimCall, want: float) -> float:
        """Move up to `want` resident bytes of a running call to swap; returns the bytes freed."""
        n = max(0.0, min(want, c.resident, self._room()))
        if n <= 0:
            return 0.0
        self._touch(c.box.id)
        c.swapped += n
        freed = n * self._freed_per_byte()
        c.charge -= freed
        self.levels -= freed
        self.swap_out_bytes += int(n)
        self.call_swapped += n
        return freed

    def _units(self, hot: bool) -> list[tuple[float, list[SimBox | SimCall]]]:
        """The memcgs reclaim walks, each with its pages of one age class, coldest first: if
        not `hot`, a sandbox's baseline and retained shmem (written once) and its running
        call's pages if the call does not read them (cold, or held); if `hot`, the pages of
        the hot calls that run (read every tick: the youngest). Under runc a call runs in its
        sandbox's cgroup; execgate's runtime gives it its own (`call_cgroups`: tool-<hex>)."""
        units: list[tuple[float, list[SimBox | SimCall]]] = []
        for b in self.boxes.values():
            c = b.call
            c_hot = c is not None and c.hot and not c.held
            if hot:
                if c is not None and c_hot and c.resident > 0:
                    units.append((c.resident, [c]))
                continue
            take = c is not None and not c_hot and c.resident > 0
            if self.call_cgroups or not take:
                if b.anon > 0:
                    units.append((float(b.anon), [b]))
                if take and c is not None:
                    units.append((c.resident, [c]))
            elif c is not None:
                units.append((b.anon + c.resident, [b, c]))
        return units

    def _push(self, over: float, cap: float, hot: bool = True) -> tuple[float, float]:
        """Swap out up to `cap` bytes until `over` domain bytes are freed, as reclaim at the
        domain's memory.max does: it walks every memcg under the limit (mm/vmscan.c
        shrink_node_memcgs) and each gives in proportion to its size, its oldest pages first;
        the multi-gen LRU skips a memcg low on cold pages while others have them, so pages
        read every tick (hot calls) go only once nothing cold is left (`hot`), or, with
        `hot_protection` below 1, also take that much less than their proportional share
        while cold pages are left. Returns (freed, moved)."""
        fpb = self._freed_per_byte()
        want = min(cap, over / fpb, self._room())
        if want <= SLACK:
            return 0.0, 0.0
        cold = self._units(False)
        warm = self._units(True) if hot else []
        c_size = sum(size for size, _ in cold)
        h_size = sum(size for size, _ in warm) * (1.0 - self.config.hot_protection)
        h_want = want * h_size / (c_size + h_size) if h_size > 0 else 0.0
        freed = self._take(cold, c_size, want - h_want)
        # Hot calls by when they last read all their pages: one stuck waiting for swap-in has
        # not (its pages age, it loses them first), so thrash piles on the calls already
        # behind and the others go on, rather than every call stalling at once.
        by_age: dict[float, list[tuple[float, list[SimBox | SimCall]]]] = {}
        for unit in warm:
            by_age.setdefault(unit[1][0].touched, []).append(unit)  # type: ignore[union-attr]
        for _, units in sorted(by_age.items()):
            left = want - freed / fpb
            if left <= SLACK:
                break
            freed += self._take(units, sum(size for size, _ in units), left)
        return freed, freed / fpb

    def _take(self, units: list[tuple[float, list[SimBox | SimCall]]], total: float,
              want: float) -> float:
        """`want` bytes from the units in proportion to their sizes; returns the bytes freed."""
        if want <= SLACK or total <= 0:
            return 0.0
        fpb = self._freed_per_byte()
        share = min(want / total, 1.0)
        freed = 0.0
        for size, sources in units:
            left = size * share
            for src in sources:
                if left <= 0:
                    break
                got = (self._swap_out(src, math.ceil(left)) if isinstance(src, SimBox)
                       else self._swap_out_call(src, left))
                left -= got / fpb
                freed += got
        return freed

    def step_reclaim(self, dt: float) -> None:
        """memory.reclaim requests in flight progress at the swap bandwidth (page cache first)."""
        for bid in list(self.reclaiming):
            b = self.boxes.get(bid)
            if b is None or b.reclaim_left <= 0:
                self.reclaiming.discard(bid)
                continue
            got = min(b.cache, b.reclaim_left)
            if got:
                self._touch(bid)
            b.cache -= got
            self.static -= got
            b.reclaim_left -= got
            if self.config.swap and b.reclaim_left > 0:
                moved = min(self.config.swap_bandwidth_bps * dt, b.reclaim_left, b.anon)
                self._swap_out(b, moved)
                b.reclaim_left -= int(moved)
            if not self.config.swap or b.anon <= 0:
                b.reclaim_left = 0

    def reclaim(self, box_id: str, amount: int) -> None:
        """memory.reclaim of `amount` bytes from one sandbox (runs over the next periods)."""
        b = self.boxes.get(box_id)
        if b is not None and amount > 0:
            b.reclaim_left = amount
            self.reclaiming.add(box_id)

    def enforce(self, now: float, dt: float) -> list[Kill]:
        """Bring usage under memory.max: drop cache, make room for what the hot calls brought
        back from swap (their wait paid for it), swap out coldest first within the bandwidth
        of one period, stall the calls that grew and the inits writing their baselines (direct
        reclaim), swap out the rest beyond the bandwidth, then OOM-kill by badness until it
        fits."""
        over = self.usage() - self.budget
        if over <= SLACK:
            return []
        for b in sorted((b for b in self.boxes.values() if b.cache), key=lambda b: -b.cache):
            if over <= 0:
                break
            got = int(min(b.cache, over))
            self._touch(b.id)
            b.cache -= got
            self.static -= got
            over -= got
        if over > 0 and self.config.swap:
            if self._reclaim_in > 0:
                over -= self._push(min(over, self._reclaim_in * self._freed_per_byte()),
                                   self._reclaim_in)[0]
                self._reclaim_in = 0.0
            over -= self._push(over, self.config.swap_bandwidth_bps * dt)[0]
            over = self._reclaim_directly(over, dt)
        kills = []
        while over > SLACK:
            victim = self._victim()
            if victim is None:
                break
            kills.append(victim_kill := Kill(now, victim[1].id, victim[2], victim[0],
                                             self.usage()))
            self.kills.append(victim_kill)
            if victim[2] is None:  # the init: the whole sandbox goes
                self.remove_box(victim[1].id)
            else:
                call = victim[1].call
                assert call is not None
                self.end_call(call, leaves=False)
            over = self.usage() - self.budget
            # The kernel kills for one charge at a time: the victim's swap slots are free
            # again, so the other charges go back to waiting on reclaim. Killing on until
            # the whole period's growth fit killed 14 calls in one period where the VM lost
            # a few (the 15x burst, eager+swap: 139 kills against 69).
            over = self._reclaim_directly(over, dt)
        return kills

    def _reclaim_directly(self, over: float, dt: float) -> float:
        """What the period's swap-out left over the limit, after direct reclaim: the calls
        that grew and the inits writing their baselines wait (`_stall`), and the rest waits
        while the coldest pages leave, beyond the period's bandwidth (untimed)."""
        cfg = self.config
        if over <= SLACK or not (cfg.swap and cfg.direct_reclaim) or not self._swappable():
            return over
        cut = self._stall(over)
        over -= cut
        if cut > 0:
            self._stalled(dt, dt)
        if over > SLACK:
            freed, moved = self._push(over, math.inf, hot=False)
            over -= freed
            self._stalled(min(dt, moved / self.config.swap_bandwidth_bps), dt)
        return over

    def _freed_per_byte(self) -> float:
        """Domain bytes one swapped-out byte frees: all of it with zram, 1 - 1/ratio else."""
        return 1.0 if self.config.zram else 1 - 1 / self.config.swap_ratio

    def _swappable(self) -> bool:
        if self._room() <= SLACK:  # full, to within the floats' residue: that is no room
            return False
        return any(b.anon > 0 for b in self.boxes.values()) or any(
            c.resident > 0 for c in self.running.values())

    def _stall(self, over: float) -> float:
        """Direct reclaim: the calls that grew in this period, and the inits that wrote their
        baselines, give that back, up to `over` (each in proportion), as if their allocations
        waited for swap-out; memload is clock-paced, so a stalled call catches up once there is
        room, and an init writes what it has left the next period (`SimBox.pending`). Returns
        the bytes."""
        growth = [(c, c.level - c.before) for c in self.running.values()
                  if not c.held and c.level > c.before]
        # an init gives back at most what of it is still resident (some may be out already)
        inits = [(b, m) for b, g in self._filling if b.alive and (m := min(g, b.anon)) > 0]
        total = sum(g for _, g in growth) + sum(g for _, g in inits)
        if total <= 0:
            return 0.0
        cut = min(over, total)
        for b, g in inits:
            share = cut * g / total
            b.pending += share
            self.static -= share
            self._touch(b.id)
        for c, g in growth:
            c.level -= cut * g / total
            c.charge -= cut * g / total
            c.peak = max(c.peak_before, c.level)
            if c.swapped > c.level:
                self.call_swapped -= c.swapped - c.level
                c.swapped = c.level
            self.levels -= cut * g / total
        self.stalled_bytes += cut
        return cut

    def _victim(self) -> tuple[float, SimBox, str | None] | None:
        """The kernel's choice (oom_badness): resident + swapped, plus oom_score_adj per mille of
        the limit (memory.max + swap.max); the init's badness is what it has written of its
        baseline (shmem is not a process's), a call's its curve. Ties: the first found, as the
        kernel's scan."""
        total = self.budget + (self.config.swap_max_bytes or 0 if self.config.swap else 0)
        best: tuple[float, SimBox, str | None] | None = None
        for b in self.boxes.values():
            mine = b.baseline - b.pending  # resident + swapped: what its init has written
            if best is None or mine > best[0]:
                best = (float(mine), b, None)
            c = b.call
            if c is not None:
                bad = c.level + c.oom_score_adj * total / 1000
                if bad > best[0]:
                    best = (bad, b, c.id)
        return best
