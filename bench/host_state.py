"""The host's memory state around a run, and the bench's own CPU split in two.

At light load the scheme run second in a sweep was often the slower, whichever it was. What
a first run could leave behind for the second (page cache, fragmented memory that denies
huge pages, dying cgroups that reclaim and stat reads still walk, an engine grown larger) is
recorded before and after each run, so a results file says whether it did. The bench's own
CPU is split into the driver's and its waited children's (`docker` CLI clients): the two
parts of the bench unit's line in the CPU ledger. The kernel's stall warnings over a run
(`kernel_stalls`) say whether the emulator starved the guest: on 6 Dec, evening, one boot
logged RCU stalls every minute or two for an hour, and every run in it took 2-4x as long as
the day before.
"""

from __future__ import annotations

import os
import re
import resource
from collections.abc import Iterable
from typing import Any

from bench import cpu_ledger, sysfs
from execgate.cgroups import v2
from execgate.common import meminfo

ROOT = "/sys/fs/cgroup"
MEMINFO = ("MemFree", "MemAvailable", "Cached", "AnonPages", "AnonHugePages", "Slab")
# Faults, reclaim and huge-page fallbacks: the counters in which a host's leftovers show up as
# a sandbox's extra CPU. allocstall_* are summed (one per zone type).
VMSTAT = ("pgfault", "thp_fault_alloc", "thp_fault_fallback", "pgscan_kswapd", "pgscan_direct",
          "pgsteal_kswapd", "pgsteal_direct", "compact_stall", "workingset_refault_file")


# The kernel's words for a CPU or task that could not run: each record is one warning.
STALLS = {"rcu": ("detected stalls on CPUs/tasks", "self-detected stall on CPU",
                  "detected expedited stalls on CPUs/tasks"),
          "soft_lockup": ("soft lockup - CPU#",), "hard_lockup": ("detected hard LOCKUP",),
          "hung_task": ("blocked for more than",)}


_BLOCKED = re.compile(r"\bP(\d+)")


def kernel_stalls(records: Iterable[tuple[int, str]], proc: str = "/proc") -> dict[str, Any]:
    """How many stall warnings of each kind the kernel's log records hold, and the tasks an
    RCU stall named as blocking it (`blocked`: pid -> its name now, "" when gone)."""
    out: dict[str, Any] = dict.fromkeys(STALLS, 0)
    pids: set[int] = set()
    for _, msg in records:
        for kind, phrases in STALLS.items():
            if any(p in msg for p in phrases):
                out[kind] += 1
        if "Tasks blocked on" in msg:
            pids.update(int(p) for p in _BLOCKED.findall(msg.partition("Tasks blocked on")[2]))
    out["blocked"] = {str(pid): (sysfs.read(os.path.join(proc, str(pid), "comm")) or "").strip()
                      for pid in sorted(pids)}
    return out


def _vmstat(text: str) -> dict[str, int]:
    keyed = v2.parse_keyed(text)
    out = {k: keyed[k] for k in VMSTAT if k in keyed}
    out["allocstall"] = sum(v for k, v in keyed.items() if k.startswith("allocstall"))
    return out


def _rusage_s(who: int) -> float:
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


def thp_mode(sys_dir: str = "/sys") -> str | None:
    """Transparent huge pages' mode (always, madvise, never), the bracketed word; None where
    the kernel has none. With `always` a saturated test VM starves khugepaged into RCU stalls
    (tests/vm/boot.sh)."""
    text = sysfs.read(os.path.join(sys_dir, "kernel/mm/transparent_hugepage/enabled")) or ""
    m = re.search(r"\[(\w+)\]", text)
    return m.group(1) if m else None


def snapshot(root: str = ROOT, proc: str = "/proc", sys_dir: str = "/sys") -> dict[str, Any]:
    """Memory (bytes), vmstat's cumulative counters, the cgroup tree's live and dying
    descendants, THP's mode, and this process's and its waited children's CPU seconds."""
    out: dict[str, Any] = {"thp": thp_mode(sys_dir)}
    info = (sysfs.read(os.path.join(proc, "meminfo")) or "").encode()
    out["meminfo"] = {k: v for k in MEMINFO if (v := meminfo.field(info, k)) is not None}
    out["vmstat"] = _vmstat(sysfs.read(os.path.join(proc, "vmstat")) or "")
    out["cgroups"] = v2.parse_keyed(sysfs.read(os.path.join(root, "cgroup.stat")) or "")
    out["bench_cpu_s"] = {"driver": round(_rusage_s(resource.RUSAGE_SELF), 3),
                          "clients": round(_rusage_s(resource.RUSAGE_CHILDREN), 3)}
    status = v2.parse_keyed((sysfs.read(os.path.join(proc, "self/status")) or "")
                            .replace(":", "").replace("\t", " ").replace(" kB", ""))
    out["driver"] = {"threads": status.get("Threads"), "rss_kib": status.get("VmRSS")}
    # The engine's own memory: a dockerd or containerd that grew over the first run does more
    # work (GC, lookups) in the second.
    out["engine_bytes"] = {u: int(v) for u in cpu_ledger.ENGINE_UNITS if (v := sysfs.read(
        os.path.join(root, "system.slice", u, "memory.current"))) and v.isdigit()}
    return out


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The counters' growth over a run; the levels (memory, cgroups) as they were before and
    after it."""
    grew = {k: after["vmstat"].get(k, 0) - v for k, v in before.get("vmstat", {}).items()}
    cpu = {k: round(after["bench_cpu_s"].get(k, 0.0) - v, 3)
           for k, v in before.get("bench_cpu_s", {}).items()}
    levels = ("meminfo", "cgroups", "driver", "engine_bytes", "thp")
    return {"before": {k: before.get(k) for k in levels},
            "after": {k: after.get(k) for k in levels},
            "vmstat": grew, "bench_cpu_s": cpu}
