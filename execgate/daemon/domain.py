"""The workload domain whose memory the daemon schedules: the host, or one parent cgroup.

Read every control period, so it is a handful of preads on descriptors kept open (opening a
/proc or cgroup file costs far more than reading it again) and nothing else.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from execgate.common import meminfo

from .cgfiles import KeptFiles, parse_key

_PAGE = os.sysconf("SC_PAGE_SIZE")
REFAULTS_EVERY_S = 0.5  # the refault counter is read this often (swap_credit: over 2 s)


@dataclass(frozen=True)
class DomainSample:
    available: int  # bytes that could still be allocated
    budget: int  # the domain's size
    used: int
    psi_some_avg10: float | None
    # Swap the domain can still use (host SwapFree, within the domain's memory.swap.max);
    # 0 without swap, None unknown. The last resort fires only once it is (nearly) gone.
    swap_free: int | None = None
    # Cumulative bytes of anonymous memory that came back from swap soon after it left
    # (workingset_refault_anon): a working set in swap (policy/swap_credit.py). None unknown,
    # or not read this period (REFAULTS_EVERY_S).
    refault_bytes: int | None = None


def psi_some_avg10(data: bytes | None) -> float | None:
    """`some avg10=` of a PSI file (/proc/pressure/memory, a cgroup's memory.pressure)."""
    if not data or not data.startswith(b"some "):
        return None
    start = data.find(b"avg10=")
    if start < 0:
        return None
    end = data.find(b" ", start)
    try:
        return float(data[start + 6:end if end >= 0 else len(data)])
    except ValueError:
        return None


class Domain:
    """A cgroup domain that does not exist (yet) is measured as the host until it appears."""

    def __init__(self, spec: str, budget_override: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self.clock = clock
        self.cgroup = None if spec == "host" else spec
        self.budget_override = budget_override
        self.files = KeptFiles(max_open=8)
        self._swap_free: int | None = None
        self._refaults_at = float("-inf")

    def describe(self) -> str:
        if self.cgroup is None:
            return "host"
        missing = "" if os.path.isdir(self.cgroup) else " (missing: measuring the host)"
        return f"cgroup {self.cgroup}{missing}"

    def _meminfo(self) -> tuple[int, int]:
        """(MemTotal, MemAvailable) of the host; SwapFree is kept in self._swap_free."""
        data = self.files.read("/proc", "meminfo") or b""
        total = meminfo.field(data, "MemTotal") or 0
        available = meminfo.field(data, "MemAvailable")
        if available is None:
            available = meminfo.field(data, "MemFree") or 0
        self._swap_free = meminfo.field(data, "SwapFree")
        return total, available

    def sample(self) -> DomainSample:
        if self.cgroup is not None:
            current = self.files.read_int(self.cgroup, "memory.current")
            raw = self.files.read(self.cgroup, "memory.max")
            if current is not None and raw is not None:
                return self._cgroup(current, raw.strip())
        total, available = self._meminfo()
        budget = self.budget_override or total
        if self.budget_override:  # a configured budget smaller than the host's
            used = max(total - available, 0)
            available = min(available, max(self.budget_override - used, 0))
        return DomainSample(available, budget, max(budget - available, 0),
                            psi_some_avg10(self.files.read("/proc/pressure", "memory")),
                            self._swap_free, self._refaults("/proc", "vmstat"))

    def _cgroup(self, current: int, raw_max: bytes) -> DomainSample:
        assert self.cgroup is not None
        unlimited = raw_max == b"max"
        host_total, host_available = self._meminfo()
        budget = self.budget_override or (host_total if unlimited else int(raw_max))
        available = max(budget - current, 0)
        if unlimited:  # an unlimited cgroup is still bounded by the host
            available = min(available, host_available)
        return DomainSample(available, budget, current,
                            psi_some_avg10(self.files.read(self.cgroup, "memory.pressure")),
                            self._cgroup_swap_free(), self._refaults(self.cgroup, "memory.stat"))

    def _refaults(self, directory: str, name: str) -> int | None:
        """workingset_refault_anon of /proc/vmstat or a cgroup's memory.stat, in bytes; None
        within REFAULTS_EVERY_S of the last read (a memory.stat read flushes the whole
        domain's statistics: under TCG the costliest file of a period, and the refault rate
        is taken over seconds)."""
        now = self.clock()
        if now - self._refaults_at < REFAULTS_EVERY_S:
            return None
        self._refaults_at = now
        data = self.files.read(directory, name, absent_for_good=True)
        pages = parse_key(data, "workingset_refault_anon") if data else None
        return None if pages is None else pages * _PAGE

    def _cgroup_swap_free(self) -> int | None:
        """Host SwapFree, within the domain cgroup's own memory.swap.max when it sets one."""
        assert self.cgroup is not None
        free = self._swap_free
        limit = self.files.read(self.cgroup, "memory.swap.max", absent_for_good=True)
        used = self.files.read_int(self.cgroup, "memory.swap.current", absent_for_good=True)
        if free is None or limit is None or limit.strip() == b"max" or used is None:
            return free
        try:
            return max(min(free, int(limit) - used), 0)
        except ValueError:
            return free
