"""The workload domain whose memory the daemon schedules: the host, or one parent cgroup.

Read every control period, so it is a handful of small file reads and nothing else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from execgate.cgroups import v2
from execgate.common import meminfo


@dataclass(frozen=True)
class DomainSample:
    available: int  # bytes that could still be allocated
    budget: int  # the domain's size
    used: int
    psi_some_avg10: float | None


def _psi_some_avg10(path: str) -> float | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("some "):
                    for field in line.split()[1:]:
                        k, _, v = field.partition("=")
                        if k == "avg10":
                            return float(v)
    except (OSError, ValueError):
        return None
    return None


class Domain:
    """A cgroup domain that does not exist (yet) is measured as the host until it appears."""

    def __init__(self, spec: str, budget_override: int = 0) -> None:
        self.spec = spec
        self.cgroup = None if spec == "host" else spec
        self.budget_override = budget_override

    def describe(self) -> str:
        if self.cgroup is None:
            return "host"
        missing = "" if os.path.isdir(self.cgroup) else " (missing: measuring the host)"
        return f"cgroup {self.cgroup}{missing}"

    def sample(self) -> DomainSample:
        if self.cgroup is None or not os.path.isdir(self.cgroup):
            mem = meminfo.read()
            budget = self.budget_override or mem["MemTotal"]
            available = mem.get("MemAvailable", mem.get("MemFree", 0))
            if self.budget_override:  # a configured budget smaller than the host's
                used = max(mem["MemTotal"] - available, 0)
                available = min(available, max(self.budget_override - used, 0))
            return DomainSample(available, budget, max(budget - available, 0),
                                _psi_some_avg10("/proc/pressure/memory"))
        current = v2.read_int(self.cgroup, "memory.current") or 0
        raw_max = v2.read(self.cgroup, "memory.max").strip()
        if self.budget_override:
            budget = self.budget_override
        elif raw_max == "max":
            budget = meminfo.read()["MemTotal"]
        else:
            budget = int(raw_max)
        available = max(budget - current, 0)
        if raw_max == "max":  # an unlimited cgroup is still bounded by the host
            available = min(available, meminfo.read().get("MemAvailable", available))
        return DomainSample(available, budget, current,
                            _psi_some_avg10(os.path.join(self.cgroup, "memory.pressure")))
