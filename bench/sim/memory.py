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
  1/ratio, pages move at `bandwidth_bps`): kernel reclaim at the limit pushes out the anonymous
  memory of the longest-idle sandboxes, and `memory.reclaim` (residency) pushes out one chosen
  sandbox; off by default, as in the VM sweep (`memory.swap.max = 0`);
* **direct reclaim** (with swap): what the period's swap-out cannot cover is taken back from the
  calls that grew in it (their allocations wait on reclaim; memload catches up later) while the
  sandboxes have anonymous memory left to swap and swap has room, rather than killed; what
  remains (a baseline arriving) is swapped out of the coldest sandboxes beyond the bandwidth,
  its wait not timed (a real create would start that much later);
* **OOM at the limit**: when the charge would exceed memory.max and reclaim cannot cover it, the
  kernel kills the process of highest badness = resident + swapped bytes + oom_score_adj/1000 of
  the limit, and with memory.oom.group a tool call's cgroup dies whole. A sandbox's init is a
  candidate like any call: killed, the sandbox dies with everything in it (the VM sweep's
  `sandbox-oom`).

Stdlib only; the simulator (bench/sim/run.py) owns time and calls `tick`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from bench.trace import MemoryProfile, memory_at
from execgate.common.units import MiB

SLACK = 1.0  # bytes: curves are floats, a kill is never for rounding


@dataclass(frozen=True)
class MemoryConfig:
    """Parameters of the memory model (defaults: the VM sweep's host: no swap, no cache)."""

    sandbox_overhead_bytes: int = 0  # per live sandbox beyond its baseline (runtime, shm, slab)
    call_overhead_bytes: int = 0  # per running call beyond its curve (the process itself)
    cache_fraction: float = 0.0  # page cache a call leaves, as a fraction of its peak
    swap: bool = False
    swap_ratio: float = 3.0  # compression ratio of swapped anonymous memory
    swap_bandwidth_bps: float = 256 * MiB  # swap-out (and memory.reclaim) speed
    swap_max_bytes: int | None = None  # memory.swap.max; None = unlimited
    # zram: the compressed copies live in the device's pool, the host's memory, not charged to
    # the domain (zswap, the default here, charges them at 1/swap_ratio).
    zram: bool = False
    # With swap: a charge over the limit that the period's swap-out cannot cover stalls the
    # growing calls (direct reclaim: the allocator waits for its pages to leave) while swappable
    # memory is left, instead of OOM-killing; False: the kill, as before.
    direct_reclaim: bool = True

    def __post_init__(self) -> None:
        if self.swap_ratio < 1 or self.swap_bandwidth_bps <= 0:
            raise ValueError("swap_ratio must be >= 1 and swap_bandwidth_bps > 0")
        if not 0 <= self.cache_fraction <= 1:
            raise ValueError("cache_fraction must be in [0, 1]")


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
    level: float = 0.0  # bytes now
    peak: float = 0.0
    before: float = 0.0  # bytes before the last advance (what a stall gives back to)
    peak_before: float = 0.0
    area: float = 0.0  # byte-seconds, for the average the estimator learns
    last: float = 0.0

    def curve(self, now: float) -> float:
        return memory_at(self.profile, min(max(now - self.started, 0.0), self.duration_s),
                         self.duration_s)

    def advance(self, now: float) -> None:
        self.before, self.peak_before = self.level, self.peak
        if not self.held:
            self.level = self.curve(now)
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

    @property
    def anon(self) -> int:
        """Bytes that swap could push out (baseline + shmem), resident now."""
        return self.baseline + self.retained - self.swapped


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
    added: int = 0
    stalled_bytes: float = 0.0  # growth held back by direct reclaim (MemoryConfig.direct_reclaim)

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

    def remove_box(self, box_id: str) -> None:
        box = self.boxes.pop(box_id, None)
        if box is not None:
            self._touch(box_id)
            box.alive = False
            self.static -= self._box_static(box)
            if box.call is not None and self.running.pop(box.call.id, None) is not None:
                self.levels -= box.call.level + self.config.call_overhead_bytes
            if not self.boxes:
                self.static = 0.0  # no float drift across an empty domain
            if not self.running:
                self.levels = 0.0

    def start_call(self, call: SimCall) -> None:
        call.box.call = call
        self._touch(call.box.id)
        self.running[call.id] = call
        self.levels += call.level + self.config.call_overhead_bytes

    def advance(self, now: float) -> None:
        """Every running call to its bytes at `now` (held calls keep theirs)."""
        total = 0.0
        for c in self.running.values():
            c.advance(now)
            total += c.level
        self.levels = total + len(self.running) * self.config.call_overhead_bytes

    def calls(self) -> Iterator[SimCall]:
        return iter(self.running.values())

    def end_call(self, call: SimCall, leaves: bool = True) -> None:
        """The process exited (leaves: normally, so its retained bytes and cache stay)."""
        box = call.box
        self._touch(box.id)
        if box.call is call:
            box.call = None
        if self.running.pop(call.id, None) is not None:
            self.levels -= call.level + self.config.call_overhead_bytes
            if not self.running:
                self.levels = 0.0
        if leaves and box.alive:
            before = self._box_static(box)
            box.retained += call.profile.retained_bytes
            box.cache += int(call.profile.peak_bytes * self.config.cache_fraction)
            self.static += self._box_static(box) - before

    # -- accounting ----------------------------------------------------------------------------

    def usage(self) -> float:
        """memory.current of the slice (resident + the compressed copies of swapped pages)."""
        return self.static + self.levels

    def swap_used(self) -> int:
        return sum(b.swapped for b in self.boxes.values())

    # -- the kernel at the limit ---------------------------------------------------------------

    def _swap_out(self, b: SimBox, want: float) -> float:
        """Move up to `want` resident bytes of b to compressed swap; returns the bytes freed."""
        cfg = self.config
        room = math.inf if cfg.swap_max_bytes is None else cfg.swap_max_bytes - self.swap_used()
        n = int(max(0.0, min(want, b.anon, room)))
        if n <= 0:
            return 0.0
        before = self._box_static(b)
        self._touch(b.id)
        b.swapped += n
        self.static += self._box_static(b) - before
        self.swap_out_bytes += n
        return n * self._freed_per_byte()

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
        """Bring usage under memory.max: drop cache, swap out the coldest sandboxes (within the
        bandwidth of one period), then OOM-kill by badness until it fits."""
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
            budget = self.config.swap_bandwidth_bps * dt
            for b in sorted(self.boxes.values(),
                            key=lambda b: (b.call is not None, b.last_active)):
                if over <= 0 or budget <= 0:
                    break
                want = min(budget, math.ceil(over / self._freed_per_byte()))
                freed = self._swap_out(b, want)
                budget -= want
                over -= freed
            if over > SLACK and self.config.direct_reclaim and self._swappable():
                over -= self._stall(over)
                # The rest (a sandbox's baseline arriving, shmem): its allocator waits while
                # the coldest sandboxes' pages leave, beyond the period's bandwidth (untimed).
                for b in sorted(self.boxes.values(),
                                key=lambda b: (b.call is not None, b.last_active)):
                    if over <= SLACK:
                        break
                    over -= self._swap_out(b, math.ceil(over / self._freed_per_byte()))
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
        return kills

    def _freed_per_byte(self) -> float:
        """Domain bytes one swapped-out byte frees: all of it with zram, 1 - 1/ratio else."""
        return 1.0 if self.config.zram else 1 - 1 / self.config.swap_ratio

    def _swappable(self) -> bool:
        cfg = self.config
        if cfg.swap_max_bytes is not None and self.swap_used() >= cfg.swap_max_bytes:
            return False
        return any(b.anon > 0 for b in self.boxes.values())

    def _stall(self, over: float) -> float:
        """Direct reclaim: the calls that grew in this period give their growth back, up to
        `over` (each in proportion), as if their allocations waited for swap-out; memload is
        clock-paced, so a stalled call catches up once there is room. Returns the bytes."""
        growth = [(c, c.level - c.before) for c in self.running.values()
                  if not c.held and c.level > c.before]
        total = sum(g for _, g in growth)
        if total <= 0:
            return 0.0
        cut = min(over, total)
        for c, g in growth:
            c.level -= cut * g / total
            c.peak = max(c.peak_before, c.level)
        self.levels -= cut
        self.stalled_bytes += cut
        return cut

    def _victim(self) -> tuple[float, SimBox, str | None] | None:
        """The kernel's choice (oom_badness): resident + swapped, plus oom_score_adj per mille of
        the limit (memory.max + swap.max); the init's badness is its own baseline (shmem is not a
        process's), a call's its curve. Ties: the first found, as the kernel's scan."""
        total = self.budget + (self.config.swap_max_bytes or 0 if self.config.swap else 0)
        best: tuple[float, SimBox, str | None] | None = None
        for b in self.boxes.values():
            if best is None or b.baseline > best[0]:  # resident + swapped = the baseline
                best = (float(b.baseline), b, None)
            c = b.call
            if c is not None:
                bad = c.level + c.oom_score_adj * total / 1000
                if bad > best[0]:
                    best = (bad, b, c.id)
        return best
