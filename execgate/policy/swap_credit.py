"""Swap that absorbs cold memory counts as room, until the domain thrashes (issue 15 §3).

With compressed swap, a domain at its memory.max is not full: when a call grows, the kernel
swaps out the coldest pages under it (an idle agent's baseline, what a running tool wrote once
and no longer reads) and the call stalls only as long as the swap-out takes. Admission that
counts only free memory runs two calls where the kernel alone (eager with swap) runs four.
But swap is room only for memory nobody touches: pages of a working set come straight back
(a *refault*), and a domain that refaults is thrashing, however much swap is free.

So the domain's swap room (what its free swap can still take, less zswap's compressed copy)
counts as available memory — for call admission, the growth gate and residency alike: pushing
idle sandboxes out by resident memory alone, ahead of the kernel, compressed 400-500 MiB in a
VM run where the kernel, swapping what calls needed, moved 260-350 — as long as the domain's
anonymous refaults (memory.stat `workingset_refault_anon`) stay below
`thrash_refault_fraction` of its budget per second, and for `thrash_hold_s` after they last
rose above it (a working set in swap shows itself only after the calls that own it were let
in, so one sighting keeps the credit off for a while, not for one period). While it counts,
the idle room (what residency could push out of idle sandboxes, from the same swap) lends
nothing: the daemon asks for one or the other, never both.

Pure: the daemon (and the simulator) feed the cumulative refault counter and the room.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from execgate.policy.headroom import HeadroomConfig


def swap_room(swap_free: int | None, kept: float, margin: int) -> int:
    """What the domain's free swap can still take off its charge, less the margin S kept free
    (the last resort fires once swap is nearly gone): a swapped byte frees 1 - kept of itself
    (zswap keeps a compressed copy charged)."""
    if not swap_free:
        return 0
    return max(int(swap_free * (1.0 - min(max(kept, 0.0), 1.0))) - max(margin, 0), 0)


class SwapCredit:
    """Follows the domain's refaults; says how much of its swap room counts as available."""

    def __init__(self, cfg: HeadroomConfig) -> None:
        self.cfg = cfg
        self.samples: deque[tuple[float, int]] = deque()
        self.thrashed_at = float("-inf")
        self.refault_bytes_per_s: float | None = None
        self.last_credit = 0

    def observe(self, now: float, refault_bytes: int | None, budget: int) -> None:
        """One reading of the domain's cumulative anonymous refault bytes (None: unknown)."""
        if refault_bytes is None:
            return
        if self.samples and refault_bytes < self.samples[-1][1]:
            self.samples.clear()  # the counter was reset (a new domain cgroup)
        self.samples.append((now, refault_bytes))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.cfg.thrash_window_s:
            self.samples.popleft()
        t0, r0 = self.samples[0]
        if now - t0 <= 0:
            return
        self.refault_bytes_per_s = (refault_bytes - r0) / (now - t0)
        if self.refault_bytes_per_s > self.cfg.thrash_refault_fraction * max(budget, 0):
            self.thrashed_at = now

    def thrashing(self, now: float) -> bool:
        return now - self.thrashed_at < self.cfg.thrash_hold_s

    def credit(self, now: float, room: int) -> int:
        """Bytes of swap room to count as available now: all of it, none while thrashing or
        turned off."""
        off = not self.cfg.count_swap or self.thrashing(now)
        self.last_credit = 0 if off else max(room, 0)
        return self.last_credit

    def snapshot(self, now: float) -> dict[str, Any]:
        rate = self.refault_bytes_per_s
        return {"enabled": self.cfg.count_swap, "credit_bytes": self.last_credit,
                "thrashing": self.thrashing(now),
                "refault_bytes_per_s": None if rate is None else round(rate)}
