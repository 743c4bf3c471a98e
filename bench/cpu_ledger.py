"""Where the host's CPU went over one run: by cgroup, and how much was left idle.

Under single-threaded TCG all vCPUs of the VM share one host thread, so the CPU a scheme's
daemon, runtime and engine spend is CPU its sandboxes do not get; at light load that, more
than any memory decision, sets the latency ratio between schemes. A cgroup's `cpu.stat`
`usage_usec` keeps the CPU of its removed children (the kernel flushes their counts into
it), so the bench's slice and the engine's units account for every container, exec and
shim of the run, ended or not.
"""

from __future__ import annotations

import os
from typing import Any

from bench import sysfs
from execgate.cgroups import v2

ROOT = "/sys/fs/cgroup"
# The units whose CPU is the engine's: the daemons, their shims, and the runtime they call
# (runc, or execgate's front and its per-exec watcher), which runs in the shim's cgroup.
ENGINE_UNITS = ("docker.service", "containerd.service", "crio.service", "podman.service")
DAEMON_UNIT = "execgated.service"


def _usage_s(cg: str) -> float | None:
    text = sysfs.read(os.path.join(cg, "cpu.stat"))
    usec = None if text is None else v2.parse_keyed(text).get("usage_usec")
    return None if usec is None else usec / 1e6


def _proc_stat(path: str = "/proc/stat") -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole host since boot, over all CPUs."""
    hz = os.sysconf("SC_CLK_TCK")
    with open(path) as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    fields += [0] * (8 - len(fields))
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / hz, (idle + iowait) / hz


def snapshot(root: str = ROOT, stat: str = "/proc/stat") -> dict[str, float]:
    """Cumulative CPU seconds: the host's `busy` and `idle`, each top-level cgroup's, and
    each of system.slice's units (named by their path under the root)."""
    out: dict[str, float] = {}
    try:
        out["busy"], out["idle"] = _proc_stat(stat)
    except (OSError, ValueError):
        pass
    for parent in ("", "system.slice"):
        try:
            entries = list(os.scandir(os.path.join(root, parent)))
        except OSError:
            continue
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                used = _usage_s(e.path)
                if used is not None:
                    out[os.path.join(parent, e.name)] = used
    return out


def delta(before: dict[str, float], after: dict[str, float], min_s: float = 0.5
          ) -> dict[str, float]:
    """What each key added between two snapshots, largest first; under min_s left out."""
    d = {k: round(after[k] - before[k], 1) for k in after.keys() & before.keys()}
    return dict(sorted(((k, v) for k, v in d.items() if v >= min_s),
                       key=lambda kv: -kv[1]))


def parties(ledger: dict[str, float], slice_name: str) -> dict[str, float | None]:
    """A run's ledger by party: the sandboxes (the bench's slice), the engine (its units,
    the runtime included), execgated, the rest of the busy time, and idle."""
    engine = sum(v for k, v in ledger.items() if k.rsplit("/", 1)[-1] in ENGINE_UNITS)
    sandboxes = ledger.get(slice_name, 0.0)
    daemon = ledger.get(f"system.slice/{DAEMON_UNIT}", 0.0)
    busy = ledger.get("busy")
    return {"busy": busy, "idle": ledger.get("idle"), "sandboxes": sandboxes,
            "engine": round(engine, 1), "execgated": daemon,
            "other": None if busy is None else round(busy - sandboxes - engine - daemon, 1)}


def row(run: dict[str, Any]) -> list[str] | None:
    """The report's row for a run with a ledger (None: recorded before it existed)."""
    p = run.get("cpu_parties")
    if not p:
        return None
    return [f"{v:.0f}" if isinstance(v, int | float) else "–"
            for v in (p.get("busy"), p.get("sandboxes"), p.get("engine"), p.get("execgated"),
                      p.get("other"), p.get("idle"))]


HEADER = ["busy s", "sandboxes", "engine (runtime included)", "execgated", "other", "idle s"]
