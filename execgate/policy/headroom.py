"""Headroom that counts what idle sandboxes can give back, and the no-force rule (issue 15 §3).

An agent's sandbox sits idle while its agent waits on its model; the memory it holds then can be
pushed out (memory.reclaim into compressed swap) to make room for another sandbox's call. So
call admission should count it — but only the bytes that can leave before the new call reaches
its peak: swap-out runs at a finite bandwidth, and bytes still resident when the call peaks are
no room at all. And when the room is needed, it should come from the sandboxes idle the longest
(the least likely to wake first).

What the daemon passes in, what it gets back:

* `LiveSandbox`: one live sandbox as the policy sees it (resident bytes, reclaimable bytes,
  idle or not, predicted next-call peak). One snapshot per control period serves this module
  and sandbox admission (`sandbox_admission.py`).
* `headroom_with_idle(free_bytes, sandboxes, cfg, time_to_peak_s)` -> `Headroom`: free_bytes is
  the headroom already net of the safety margin S (and, for call admission, of the growth still
  predicted for running calls: `PressureReading.effective_headroom`); the result adds the
  reclaimable bytes that can leave in time and says why.
* `reclaim_plan(deficit_bytes, sandboxes)` -> `ReclaimPlan`: how much to reclaim from which
  idle sandboxes, longest idle first, stopping once the deficit is covered.
* `no_force(peak_bytes, headroom_bytes, running_calls)` -> `NoForce`: whether a call whose
  bounded wait has ended may start now. It may start only when its peak fits the headroom or
  when it would run alone: an expired wait makes a call first in line, never a licence to run
  beside others into a full domain (the 8.6x sweep forced calls into red and lost 68 sandboxes
  to the OOM killer).

Pure and I/O-free.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from execgate.policy.pressure import fmt_bytes


@dataclass(frozen=True)
class HeadroomConfig:
    """How fast idle memory can be pushed out ([headroom] in config.toml)."""

    # Call admission counts what idle sandboxes can give back in time (false: free memory only).
    count_idle: bool = True
    # Sandbox and call admission count an active sandbox's cold pages as pushable too (swap on).
    count_cold: bool = True
    # Bytes/s memory.reclaim can push into swap across the domain. 256 MiB/s is a conservative
    # figure for zram with zstd on one core (page cache goes faster, disk swap much slower).
    swap_out_bytes_per_s: float = 256 << 20  # 256 MiB/s (1 << 20 = 1 MiB)
    # Time from a call's start to its peak when the caller knows nothing better.
    default_time_to_peak_s: float = 1.0
    # Call admission and the growth gate count the domain's swap room as available memory
    # while it does not thrash (policy/swap_credit.py): the kernel swaps cold pages out itself.
    count_swap: bool = True
    # Anonymous refaults per second, as a share of the budget, from which the domain thrashes,
    thrash_refault_fraction: float = 0.02
    thrash_window_s: float = 2.0  # measured over this window;
    thrash_hold_s: float = 30.0  # no swap counted for this long after the domain last thrashed.

    def __post_init__(self) -> None:
        if self.swap_out_bytes_per_s < 0 or self.default_time_to_peak_s < 0:
            raise ValueError("swap_out_bytes_per_s and default_time_to_peak_s must be >= 0")
        if self.thrash_refault_fraction < 0 or self.thrash_window_s <= 0 \
                or self.thrash_hold_s < 0:
            raise ValueError("thrash_refault_fraction and thrash_hold_s must be >= 0, "
                             "thrash_window_s > 0")


# Of a byte swapped out through zswap, the compressed copy zswap keeps in memory stays charged
# to the cgroup: 1/ratio, about a third for real process memory (2.5-3.5:1). zram's pool and
# disk swap are charged to no cgroup.
ZSWAP_KEPT_DEFAULT = 1 / 3


def swap_kept_share(zswap: bool, compressed: int | None = None,
                    original: int | None = None) -> float:
    """The share of a swapped-out byte still charged to its cgroup: 0 unless zswap is on, then
    the host's measured compressed/original (/proc/meminfo Zswap/Zswapped) once zswap holds
    anything, else ZSWAP_KEPT_DEFAULT. Counting a push into zswap as freeing all it moves let
    the simulator's 1,000 sandboxes pile up under zswap (726 of 1,000 done, 3,691 OOM kills)."""
    if not zswap:
        return 0.0
    if compressed is not None and original:
        return min(max(compressed / original, 0.0), 1.0)
    return ZSWAP_KEPT_DEFAULT


def freed_bytes(file_bytes: int, anon_bytes: int, kept: float) -> int:
    """What pushing out this page cache and this anonymous memory takes off the domain's
    charge: page cache leaves whole, a swapped-out byte leaves less the share `kept`."""
    return max(file_bytes, 0) + int(max(anon_bytes, 0) * (1.0 - min(max(kept, 0.0), 1.0)))


@dataclass(frozen=True)
class LiveSandbox:
    """One live sandbox in the daemon's snapshot.

    resident_bytes: its memory *outside* running tool calls (init, agent, servers, page cache);
    running calls are counted by their charges instead. reclaimable_bytes: what memory.reclaim,
    taking what it can now (down to the residency floor; anonymous memory only as far as swap
    has room), would take off the domain's charge (`freed_bytes`: under zswap a swapped byte
    leaves less its compressed copy). idle_s: seconds since its last tool call ended, None
    while a call runs or waits in it or it is busy (an active sandbox gives nothing back).
    next_call_peak_bytes: the predicted peak of its next tool call — of the one queued in it,
    if any — for sandbox admission's "one call can always run" (so a new sandbox never takes
    the room of the largest call waiting).
    """

    sandbox_id: str
    resident_bytes: int
    reclaimable_bytes: int = 0
    idle_s: float | None = None
    next_call_peak_bytes: int = 0
    # Of an active sandbox: its cold pages (its init leaf's inactive LRU lists, anonymous ones
    # as far as swap has room), which the kernel itself swaps out under the limit while a call
    # runs beside them: an agent's baseline is not what its tool call touches.
    cold_bytes: int = 0
    # Of what it can push out (reclaimable or cold), the anonymous part: it goes to swap. Each
    # sandbox's figure counts it as far as the whole free swap has room, so the room is shared
    # out where they are summed (`swap_over_promised`).
    swap_bytes: int = 0
    # Derived, set at construction: every step reads both for every live sandbox (the daemon's
    # pushable sum, sandbox admission's pinned sum); properties recomputed them on each read.
    # What can be pushed out: an idle sandbox's reclaimable bytes, an active one's cold.
    pushable_bytes: int = field(init=False, repr=False, compare=False)
    # What stays resident whatever residency does: resident minus pushable.
    pinned_bytes: int = field(init=False, repr=False, compare=False)
    # Of pushable, what goes to swap: its claim on the free swap the live sandboxes share.
    swap_claim_bytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        give = self.cold_bytes if self.idle_s is None else self.reclaimable_bytes
        resident = max(self.resident_bytes, 0)
        pushable = min(max(give, 0), resident)
        object.__setattr__(self, "pushable_bytes", pushable)
        object.__setattr__(self, "pinned_bytes", resident - pushable)
        object.__setattr__(self, "swap_claim_bytes", min(max(self.swap_bytes, 0), pushable))


def swap_over_promised(claimed: int, swap_free: int) -> tuple[int, int]:
    """(what the live sandboxes' swap claims, summed, promise beyond the free swap, the swap
    left after them). At 15x in the simulator (64 sandboxes arriving at once, 1 GiB of zram),
    42 live sandboxes each counted its ~30 MiB as pushable against the same 641 MiB of free
    swap: sandbox admission let 56 in within 3 s and their calls were OOM-killed when the swap
    filled (at hardware costs 22 kills in 326 s; with the room shared out, none, in 127 s)."""
    free = max(swap_free, 0)
    return max(claimed - free, 0), max(free - claimed, 0)


@dataclass(frozen=True)
class Headroom:
    """Headroom for one call: free bytes plus the idle bytes that can leave before its peak."""

    free_bytes: int  # as passed in: net of S (and of predicted growth, for call admission)
    reclaimable_bytes: int  # what idle sandboxes could give back in all
    in_time_bytes: int  # the part of it swap-out bandwidth moves within the time to peak
    time_to_peak_s: float
    reason: str

    @property
    def total_bytes(self) -> int:
        return self.free_bytes + self.in_time_bytes


def time_to_peak(rise: Sequence[tuple[float, int]], start: float, peak_bytes: int,
                 share: float = 0.9) -> float | None:
    """Seconds from a call's start until its memory first reached `share` of its peak, from
    the samples at which it grew (time, bytes); None when no sample got there (a peak between
    samples: nothing to learn)."""
    want = share * max(peak_bytes, max((m for _t, m in rise), default=0))
    for t, mem in rise:
        if mem >= want:
            return max(t - start, 0.0)
    return None


class PeakTimes:
    """The time to peak of calls that finished on this host: how long swap-out has to make
    the room an admitted call will need (issue 15 §3: "discounted by swap-out bandwidth over
    the call's time to peak"). A low quantile of the last `window` calls that peaked at
    MIN_PEAK_BYTES or more (small calls peak at once and need no room); the configured default
    until MIN_CALLS are known. Lower is the safe side: an over-estimate lends bytes swap cannot
    move before the call peaks."""

    MIN_PEAK_BYTES = 16 << 20
    MIN_CALLS = 8

    def __init__(self, window: int = 64, quantile: float = 0.25) -> None:
        self.quantile = quantile
        self._seen: deque[float] = deque(maxlen=window)

    def observe(self, seconds: float | None, peak_bytes: int) -> None:
        if seconds is not None and peak_bytes >= self.MIN_PEAK_BYTES and seconds >= 0:
            self._seen.append(seconds)

    def estimate(self, default_s: float) -> float:
        if len(self._seen) < self.MIN_CALLS:
            return default_s
        ordered = sorted(self._seen)
        return ordered[min(int(self.quantile * len(ordered)), len(ordered) - 1)]

    @property
    def learned(self) -> int:
        return len(self._seen)


def in_time_bytes(reclaimable_bytes: int, bytes_per_s: float, time_to_peak_s: float) -> int:
    """The part of what idle sandboxes can give back that swap-out moves before a call started
    now reaches its peak: min(reclaimable, bandwidth · time to peak)."""
    movable = int(max(bytes_per_s, 0.0) * max(time_to_peak_s, 0.0))
    return min(max(reclaimable_bytes, 0), movable)


def headroom_with_idle(
    free_bytes: int,
    sandboxes: Iterable[LiveSandbox],
    cfg: HeadroomConfig,
    time_to_peak_s: float | None = None,
) -> Headroom:
    """free_bytes + min(reclaimable of idle sandboxes, bandwidth · time to peak).

    The discount is the point: counting every reclaimable byte would admit a burst that peaks
    before swap-out has made its room, which is how a full domain OOM-kills."""
    t = cfg.default_time_to_peak_s if time_to_peak_s is None else max(time_to_peak_s, 0.0)
    free = max(free_bytes, 0)
    reclaimable = sum(s.pushable_bytes for s in sandboxes)
    in_time = in_time_bytes(reclaimable, cfg.swap_out_bytes_per_s, t)
    reason = f"headroom {fmt_bytes(free + in_time)}: free {fmt_bytes(free)}"
    if in_time < reclaimable:
        reason += (
            f" + {fmt_bytes(in_time)} of {fmt_bytes(reclaimable)} idle reclaimable"
            f" (swap-out {fmt_bytes(cfg.swap_out_bytes_per_s)}/s over {t:g} s to peak)"
        )
    else:
        reason += f" + {fmt_bytes(in_time)} idle reclaimable"
    return Headroom(free, reclaimable, in_time, t, reason)


@dataclass(frozen=True)
class Reclaim:
    """Reclaim this many bytes from this sandbox (memory.reclaim)."""

    sandbox_id: str
    amount_bytes: int


@dataclass(frozen=True)
class ReclaimPlan:
    """Reclaims that cover a deficit, longest-idle sandbox first."""

    steps: tuple[Reclaim, ...]
    deficit_bytes: int
    planned_bytes: int

    @property
    def covered(self) -> bool:
        return self.planned_bytes >= self.deficit_bytes

    @property
    def shortfall_bytes(self) -> int:
        """What idle sandboxes cannot give back: only waiting (or a call ending) makes it."""
        return max(self.deficit_bytes - self.planned_bytes, 0)


def reclaim_plan(deficit_bytes: int, sandboxes: Iterable[LiveSandbox]) -> ReclaimPlan:
    """Take the deficit from idle sandboxes, the longest idle first, each no more than it can
    give, and stop once it is covered. Longest idle first: the sandbox idle the longest is the
    least likely to be woken by its agent's next call before the room is used (ties: the one
    with more to give, then by id, so the plan is deterministic)."""
    deficit = max(deficit_bytes, 0)
    idle = sorted(
        (s for s in sandboxes if s.pushable_bytes > 0),
        key=lambda s: (-(s.idle_s or 0.0), -s.pushable_bytes, s.sandbox_id),
    )
    steps: list[Reclaim] = []
    planned = 0
    for s in idle:
        if planned >= deficit:
            break
        amount = min(s.pushable_bytes, deficit - planned)
        steps.append(Reclaim(s.sandbox_id, amount))
        planned += amount
    return ReclaimPlan(tuple(steps), deficit, planned)


@dataclass(frozen=True)
class NoForce:
    """The no-force rule's verdict for the oldest call whose bounded wait has ended.

    run: it may start now. hold_others: admit nothing else meanwhile — it is the head of the
    queue, and letting smaller calls take the room as it frees would starve it. deficit_bytes:
    the room it lacks, to reclaim from idle sandboxes (`reclaim_plan`)."""

    run: bool
    hold_others: bool
    deficit_bytes: int
    reason: str


def no_force(peak_bytes: int, headroom_bytes: int, running_calls: int) -> NoForce:
    """May a call whose bounded wait has ended start now?

    Yes when its predicted peak fits the headroom (counted with `headroom_with_idle`) or when
    no other call runs (alone it can only hurt itself, and it must make progress); otherwise it
    stays first in line and nothing else is admitted. Never beside others into a full domain.
    """
    peak = max(peak_bytes, 0)
    headroom = max(headroom_bytes, 0)
    deficit = max(peak - headroom, 0)
    if deficit == 0:
        return NoForce(True, False, 0, f"wait over: peak {fmt_bytes(peak)} fits headroom "
                                       f"{fmt_bytes(headroom)}")
    if running_calls <= 0:
        return NoForce(True, False, deficit, f"wait over: nothing else runs, peak "
                                             f"{fmt_bytes(peak)} runs alone")
    return NoForce(False, True, deficit, (
        f"wait over, first in line: peak {fmt_bytes(peak)} > headroom {fmt_bytes(headroom)}"
        f" beside {running_calls} running call(s); needs {fmt_bytes(deficit)} more"
    ))
