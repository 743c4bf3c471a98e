"""A snapshot of what execgate manages on this host, from records and cgroupfs.

Used by the daemon to answer `status` and by execgatectl when the daemon is down, so the two
can never disagree on what is there.
"""

from __future__ import annotations

import os
import time
from typing import Any

from execgate.cgroups import container, v2
from execgate.common import journal, records
from execgate.common.config import Config

from . import names


def _live_call(path: str, now: float) -> dict[str, Any]:
    pids = v2.procs(path)
    try:
        age = now - os.stat(path).st_mtime
    except OSError:
        age = None
    return {
        "call": os.path.basename(path),
        "memory_current": v2.read_int(path, "memory.current"),
        "memory_peak": v2.read_int(path, "memory.peak"),
        "pids": len(pids),
        "argv": _command(pids),
        "frozen": v2.read_int(path, "cgroup.freeze") == 1,
        "age": age,
    }


def _command(pids: list[int]) -> list[str]:
    """The command line of a call's first process (what it runs now: an `sh -c` may have
    exec'd its command), or [] once it is gone."""
    for pid in pids[:1]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                raw = f.read(CMDLINE_MAX)
        except OSError:
            return []
        return [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    return []


CMDLINE_MAX = 4096  # status shows a shortened command anyway


# memory.stat fields shown per sandbox: anonymous memory in RAM, and what zswap holds of it
# (zswap: compressed size; zswapped: the pages' own size); absent fields are left out.
SWAP_STAT = ("anon", "file", "zswap", "zswapped")


def _swap(cg: str) -> dict[str, Any]:
    """Where the sandbox's memory is: memory.swap.current (swapped out: in zram or on disk, or
    in zswap's pool) and memory.stat's anon/zswap fields, as memory_<field>."""
    stat = v2.read_keyed(cg, "memory.stat")
    return {"memory_swap_current": v2.read_int(cg, "memory.swap.current"),
            **{f"memory_{k}": stat[k] for k in SWAP_STAT if k in stat}}


def collect(cfg: Config, recent: int = 20) -> dict[str, Any]:
    now = time.time()
    sandboxes = []
    docker_root = names.docker_root()
    for rec in records.containers(cfg.state_dir):
        cg = rec.get("cgroup")
        alive = bool(cg) and os.path.isdir(cg)
        sandboxes.append({
            "id": rec["id"],
            "name": names.name_of(rec, docker_root),
            "sandbox": rec.get("sandbox", rec["id"]),
            "managed": bool(rec.get("managed")),
            "reason": rec.get("reason"),
            "cgroup": cg,
            "alive": alive,
            "memory_current": v2.read_int(cg, "memory.current") if alive else None,
            "memory_max": (v2.read(cg, "memory.max").strip() if alive and
                           os.path.exists(os.path.join(cg, "memory.max")) else None),
            "calls": [_live_call(p, now) for p in container.tool_cgroups(cg)] if alive else [],
            # init/ frozen by residency (an idle sandbox under red pressure)
            "frozen": alive and v2.read_int(container.init_leaf(cg), "cgroup.freeze") == 1,
            **(_swap(cg) if alive else {}),
            # how its create was admitted (runtime/create.py): verdict, waited_s; None: not asked
            "start": rec.get("start"),
        })
    finished = journal.tail(cfg.journal, recent)
    return {"time": now, "sandboxes": sandboxes, "recent_calls": finished}
