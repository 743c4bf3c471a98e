"""The host's memory state around a bench run, and the bench's CPU split in two."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench import host_state


def _fake(root: Path, faults: int, dying: int) -> tuple[Path, Path]:
    cg, proc = root / "cg", root / "proc"
    (cg / "system.slice" / "containerd.service").mkdir(parents=True, exist_ok=True)
    (cg / "system.slice" / "containerd.service" / "memory.current").write_text("4096\n")
    (cg / "cgroup.stat").write_text(f"nr_descendants 40\nnr_dying_descendants {dying}\n")
    (proc / "self").mkdir(parents=True, exist_ok=True)
    (proc / "meminfo").write_text("MemTotal:  6000 kB\nMemFree:   1000 kB\nCached:  200 kB\n")
    (proc / "vmstat").write_text(f"pgfault {faults}\nthp_fault_fallback {faults // 10}\n"
                                 "allocstall_dma32 2\nallocstall_normal 3\n")
    (proc / "self" / "status").write_text("Name:\tpython3\nVmRSS:\t  5120 kB\nThreads:\t7\n")
    thp = root / "sys" / "kernel" / "mm" / "transparent_hugepage"
    thp.mkdir(parents=True, exist_ok=True)
    (thp / "enabled").write_text("always [madvise] never\n")
    return cg, proc


def test_a_run_records_levels_before_and_after_and_the_counters_growth(tmp_path: Path) -> None:
    cg, proc = _fake(tmp_path, 1000, 3)
    before = host_state.snapshot(str(cg), str(proc), str(tmp_path / "sys"))
    assert before["thp"] == "madvise"
    assert host_state.thp_mode(str(tmp_path / "nosys")) is None
    assert before["meminfo"] == {"MemFree": 1000 * 1024, "Cached": 200 * 1024}
    assert before["vmstat"]["allocstall"] == 5
    assert before["driver"] == {"threads": 7, "rss_kib": 5120}
    assert before["engine_bytes"] == {"containerd.service": 4096}
    cg, proc = _fake(tmp_path, 1500, 9)
    # A waited child's CPU lands in RUSAGE_CHILDREN: the bench's `docker` clients.
    subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)
    d = host_state.delta(before, host_state.snapshot(str(cg), str(proc), str(tmp_path / "sys")))
    assert d["vmstat"]["pgfault"] == 500 and d["vmstat"]["thp_fault_fallback"] == 50
    assert d["before"]["cgroups"]["nr_dying_descendants"] == 3
    assert d["after"]["cgroups"]["nr_dying_descendants"] == 9
    assert d["before"]["thp"] == d["after"]["thp"] == "madvise"
    assert d["bench_cpu_s"]["clients"] > 0


def test_kernel_stall_warnings_are_counted_by_kind(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "43").mkdir(parents=True)
    (proc / "43" / "comm").write_text("khugepaged\n")
    records = [
        (10, "rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:"),
        (11, "rcu: \tTasks blocked on level-0 rcu_node (CPUs 0-1): P43/1:b..l"),
        (12, "rcu: INFO: rcu_preempt self-detected stall on CPU"),
        (13, "watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [memload:812]"),
        (14, "INFO: task kworker/u4:2:97 blocked for more than 120 seconds."),
        (15, "Memory cgroup out of memory: Killed process 1246 (memload)"),
    ]
    assert host_state.kernel_stalls(records, str(proc)) == {
        "rcu": 2, "soft_lockup": 1, "hard_lockup": 0, "hung_task": 1,
        "blocked": {"43": "khugepaged"}}
    assert host_state.kernel_stalls([(1, "rcu: \tTasks blocked on level-0 rcu_node (CPUs 0-1):"
                                          " P7 P9/1:b..l")], str(proc))["blocked"] == {
        "7": "", "9": ""}  # gone since
    assert host_state.kernel_stalls([]) == {"rcu": 0, "soft_lockup": 0, "hard_lockup": 0,
                                            "hung_task": 0, "blocked": {}}
