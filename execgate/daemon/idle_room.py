"""Room idle sandboxes can give back, offered to call admission (issue 15 §3).

While calls wait, admission fits them in the effective headroom plus what idle sandboxes can
push out (`residency.pushable`: page cache, anonymous memory as far as swap has room; with
`count_cold`, also the cold pages of active sandboxes, which the kernel swaps out itself)
before a call started now reaches its peak (`headroom.in_time_bytes`: the bandwidth is the
configured one, or what reclaims on this host achieved if slower; the time to peak is what
calls that finished here took, `headroom.PeakTimes`, the configured default until enough
did). What the admitted calls count on, and the room the call first in line still lacks, is
asked of residency (`make_room`), which reclaims from the longest idle sandbox on. Measured at
most once a second (one memory.stat per sandbox); between measurements what was borrowed is
taken off, so the same idle bytes are not lent twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from execgate.policy.headroom import HeadroomConfig, PeakTimes, in_time_bytes

from .idle_sandboxes import Residency

PERIOD_S = 1.0  # pushable bytes re-measured at most this often while calls wait


class IdleRoom:
    def __init__(self, cfg: HeadroomConfig, residency: Residency,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.residency = residency
        self.clock = clock
        self.pushable = 0
        self.measured_at = float("-inf")
        self.offered = 0
        self.stats = {"borrowed_bytes": 0, "admissions_on_idle": 0}
        self.peak_times = PeakTimes()  # what calls here took to peak

    @property
    def enabled(self) -> bool:
        res = self.residency.cfg
        return self.cfg.count_idle and res.enabled and res.reclaim

    def offer(self, calls_waiting: bool) -> int:
        """Bytes admission may count on in this step beyond the effective headroom."""
        if not calls_waiting or not self.enabled:
            self.offered = 0
            return 0
        now = self.clock()
        if now - self.measured_at >= PERIOD_S:
            self.measured_at, self.pushable = now, self.residency.pushable(self.cfg.count_cold)
        rate = self.residency.swap_out_bytes_per_s(self.cfg.swap_out_bytes_per_s)
        self.offered = in_time_bytes(self.pushable, rate, self.time_to_peak_s())
        return self.offered

    def time_to_peak_s(self) -> float:
        return self.peak_times.estimate(self.cfg.default_time_to_peak_s)

    def settle(self, borrowed: int, first_deficit: int) -> None:
        """This step's admissions count on `borrowed` idle bytes and the call first in line
        lacks `first_deficit`: have idle sandboxes give them back."""
        if borrowed > 0:
            self.pushable = max(self.pushable - borrowed, 0)
            self.stats["borrowed_bytes"] += borrowed
            self.stats["admissions_on_idle"] += 1
        want = max(borrowed, 0) + (max(first_deficit, 0) if self.enabled else 0)
        if want > 0:
            self.residency.make_room(max(self.residency.room_wanted(), want))

    def snapshot(self) -> dict[str, Any]:
        rate = self.residency.swap_out_bytes_per_s(self.cfg.swap_out_bytes_per_s)
        return {"enabled": self.enabled, "offered_bytes": self.offered,
                "pushable_bytes": self.pushable, "swap_out_bytes_per_s": round(rate),
                "time_to_peak_s": self.time_to_peak_s(),
                "time_to_peak_learned": self.peak_times.learned, **self.stats}
