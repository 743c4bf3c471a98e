"""The scheduling policy of a cgroup's tasks: how a held call enters the gate's scheduler.

The sched_ext gate is a partial switch (SCX_OPS_SWITCH_PARTIAL): it schedules only SCHED_EXT
tasks, and every other task stays on the fair class. A call's tasks get SCHED_EXT while the
call is held and their own policy back when it is released, so a running call is a fair task
like any other (its container's cpu.max and cpu.weight apply; the fair class runs before
sched_ext, which would starve a SCHED_EXT call behind every busy fair task). Threads forked
while the tasks are switched are caught by re-reading the cgroup until nothing new appears;
what a SCHED_EXT task forks inherits the policy. Real-time and deadline tasks are left alone
(never held, as before the partial switch).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os

SCHED_OTHER, SCHED_BATCH, SCHED_IDLE, SCHED_EXT = 0, 3, 5, 7
RESET_ON_FORK = 0x40000000  # or'ed into the policy: kept as the task had it
FAIR = frozenset({SCHED_OTHER, SCHED_BATCH, SCHED_IDLE})
ROUNDS = 8  # re-reads of the cgroup; a fork storm outrunning them leaves a task unswitched


def threads(cg: str) -> set[int]:
    """Thread ids in cg and every cgroup below it (gone cgroups count as empty)."""
    tids: set[int] = set()
    for dirpath, _dirs, _files in os.walk(cg):
        with contextlib.suppress(OSError), open(os.path.join(dirpath, "cgroup.threads")) as f:
            tids.update(int(line) for line in f if line.strip())
    return tids


def policy(tid: int) -> int | None:
    """The task's policy (SCHED_RESET_ON_FORK included), None when it is gone."""
    try:
        return os.sched_getscheduler(tid)
    except OSError:
        return None


def _set(tid: int, pol: int) -> bool:
    try:
        os.sched_setscheduler(tid, pol, os.sched_param(0))
        return True
    except OSError:
        return False


def to_ext(cg: str, saved: dict[int, int]) -> tuple[int, int]:
    """Gives every fair-class task of cg's subtree SCHED_EXT; ``saved`` gets the policy each
    switched task had. Returns (switched, failed): a failed task stays on the fair class, so
    it is not held (the caller may freeze the cgroup instead)."""
    seen: set[int] = set()
    switched = failed = 0
    for _ in range(ROUNDS):
        new = threads(cg) - seen
        if not new:
            break
        seen |= new
        for tid in new:
            pol = policy(tid)
            if pol is None or (pol & ~RESET_ON_FORK) not in FAIR:
                continue  # gone, already SCHED_EXT, or real-time: not ours to move
            if _set(tid, SCHED_EXT | (pol & RESET_ON_FORK)):
                saved[tid] = pol
                switched += 1
            elif policy(tid) is not None:
                failed += 1
    return switched, failed


def restore(cg: str, saved: dict[int, int]) -> int:
    """Gives the SCHED_EXT tasks of cg's subtree their policy from ``saved`` (SCHED_OTHER for
    threads born while they were switched); how many. Re-reads until none is left: a task may
    fork while the others are switched back."""
    n = 0
    for _ in range(ROUNDS):
        left = 0
        for tid in threads(cg):
            pol = policy(tid)
            if pol is None or (pol & ~RESET_ON_FORK) != SCHED_EXT:
                continue
            left += 1
            n += _set(tid, saved.get(tid, SCHED_OTHER | (pol & RESET_ON_FORK)))
        if not left:
            break
    return n


def restore_all(root: str, pattern: str = "tool-*") -> list[str]:
    """What a dead daemon left switched: SCHED_EXT tasks of every cgroup named ``pattern``
    under root go back to SCHED_OTHER. Returns those cgroups."""
    done = []
    for dirpath, dirs, _files in os.walk(root):
        for d in dirs:
            if fnmatch.fnmatch(d, pattern):
                path = os.path.join(dirpath, d)
                if restore(path, {}):
                    done.append(path)
    return done
