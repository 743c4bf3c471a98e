"""What idle sandboxes can give back, and admission's asks for it: the daemon's Residency as
call admission (`daemon/idle_room.IdleRoom`, used here as it is) and sandbox admission see it.

The daemon's `idle_sandboxes.Residency` reads memory.stat and the swap files for these figures;
this is the same interface (`cfg`, `pushable`, `cold_bytes`, `reclaimable_bytes`,
`swap_out_bytes_per_s`, `make_room`, `room_wanted`) on the simulator's memory model:

* reclaimable (an idle sandbox): page cache, and its anonymous memory (baseline + retained
  shmem, resident) as far as swap has room, down to keep_bytes; 0 while a call runs or waits in
  it or once reclaimed in this idle period (`Residency.reclaimable_bytes`, `_swap_room`);
* cold (an active sandbox): its init leaf's inactive anonymous pages within swap room. The
  bench's agent is memload's init, which allocates its baseline at start and never touches it
  again, and retained shmem is touched by no one; a call's own bytes live in the call's cgroup.
  So the simulator counts an active sandbox's whole resident anonymous memory as cold (a real
  agent framework would keep part of it hot: this is the optimistic end);
* the swap-out bandwidth: the configured one until a reclaim of at least 4 MiB has run, then
  the lower of it and what reclaims achieve here (the memory model's bandwidth), as the daemon
  learns it from its reclaims;
* kept (`swap_kept`): the share of a swapped-out byte still charged to the domain, 1/ratio
  under zswap (the model's default), 0 with zram; admission's figures (`pushable`, the hands'
  views) count what a push frees, residency's plan what it moves, as the daemon does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection

from bench.sim.memory import Domain, SimBox
from execgate.policy.residency import ResidencyConfig

ROOM_TTL_S = 5.0  # as daemon/idle_sandboxes.py: an ask not renewed for this long lapses
RATE_MIN_BYTES = 4 << 20  # reclaims of at least this much teach the bandwidth


class SimResidency:
    def __init__(self, cfg: ResidencyConfig, domain: Domain, clock: Callable[[], float],
                 busy: Callable[[], Collection[str]], reclaimed: Collection[str]) -> None:
        self.cfg = cfg
        self.domain = domain
        self.clock = clock
        self.busy = busy  # sandboxes with a call running or waiting (the hands' own)
        self.reclaimed = reclaimed  # reclaimed in their current idle period (the hands')
        self.room = 0
        self.room_at = -math.inf
        self.swap_out_rate: float | None = None
        self.asks = 0  # make_room calls with a positive ask

    def swap_room(self) -> float:
        mem = self.domain.config
        if not mem.swap:
            return 0.0
        if mem.swap_max_bytes is None:
            return math.inf
        return max(mem.swap_max_bytes - self.domain.swap_used(), 0)

    def swap_kept(self) -> float:
        """As the daemon's (`headroom.swap_kept_share`), from the model's own ratio."""
        mem = self.domain.config
        return 0.0 if not mem.swap or mem.zram else 1 / mem.swap_ratio

    def reclaimable_bytes(self, b: SimBox, busy: Collection[str] | None = None,
                          room: float | None = None, kept: float = 0.0) -> int:
        return self.reclaimable_parts(b, busy, room, kept)[0]

    def reclaimable_parts(self, b: SimBox, busy: Collection[str] | None = None,
                          room: float | None = None, kept: float = 0.0) -> tuple[int, int]:
        """As the daemon's: what a reclaim frees, and the anonymous part it moves to swap."""
        if b.id in self.reclaimed or b.id in (self.busy() if busy is None else busy):
            return 0, 0
        anon = min(b.anon, self.swap_room() if room is None else room)
        moved = max(min(b.cache + anon, b.anon + b.cache - self.cfg.keep_bytes), 0)
        file = min(b.cache, moved)
        return int(file + (moved - file) * (1.0 - kept)), int(moved - file)

    def cold_bytes(self, b: SimBox, room: float | None = None, kept: float = 0.0) -> int:
        return self.cold_parts(b, room, kept)[0]

    def cold_parts(self, b: SimBox, room: float | None = None, kept: float = 0.0
                   ) -> tuple[int, int]:
        """As the daemon's: an active sandbox's cold bytes, and the anonymous part of them."""
        anon = min(b.anon, self.swap_room() if room is None else room)
        return int(anon * (1.0 - kept)), int(anon)

    def pushable(self, cold: bool = False) -> int:
        busy = self.busy()
        room = self.swap_room()
        kept = self.swap_kept()
        cold = cold and room > 0  # no swap room: no active sandbox's page can leave
        total = 0
        for b in self.domain.boxes.values():  # the swap room is shared, as the daemon's
            if b.id in busy and not cold:
                continue
            got, swapped = (self.cold_parts(b, room, kept) if b.id in busy
                            else self.reclaimable_parts(b, busy, room, kept))
            total += got
            room = max(room - swapped, 0)
        return total

    def swap_out_bytes_per_s(self, configured: float) -> float:
        rate = self.swap_out_rate
        return configured if rate is None else min(configured, rate)

    def reclaimed_bytes(self, nbytes: int) -> None:
        """A reclaim of nbytes was asked: the bandwidth it runs at is learned."""
        if nbytes >= RATE_MIN_BYTES:
            self.swap_out_rate = self.domain.config.swap_bandwidth_bps

    def make_room(self, nbytes: int) -> None:
        """As the daemon's: the ask holds for ROOM_TTL_S unless renewed; nothing measured."""
        self.room, self.room_at = max(int(nbytes), 0), self.clock()
        self.asks += self.room > 0

    def room_wanted(self) -> int:
        if self.room and self.clock() - self.room_at > ROOM_TTL_S:
            self.room = 0
        return self.room
