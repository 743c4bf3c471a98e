"""cgroups/sched_policy.py with real processes in a stand-in cgroup tree (cgroup.threads files
in a temp dir). This host's kernel has no sched_ext, so SCHED_EXT is refused (EINVAL) here:
what a refused switch does is tested for real; the switch itself is the VM's
(tests/e2e/test_gate_partial.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_bpf_gate import _hash_map  # stand-in BPF maps

from execgate.bpf import gate
from execgate.cgroups import sched_policy

HAS_SCX = os.path.exists("/sys/kernel/sched_ext")


@pytest.fixture
def sleeper() -> Iterator[int]:
    p = subprocess.Popen(["sleep", "60"])
    yield p.pid
    p.kill()
    p.wait()


def _cgroup(root: Path, name: str, *tids: int) -> Path:
    cg = root / name
    cg.mkdir(parents=True, exist_ok=True)
    (cg / "cgroup.threads").write_text("".join(f"{t}\n" for t in tids))
    return cg


def test_threads_reads_the_whole_subtree(tmp_path: Path) -> None:
    tool = _cgroup(tmp_path, "tool-a", 11, 12)
    _cgroup(tool, "sub/deeper", 13)
    (tool / "empty").mkdir()
    assert sched_policy.threads(str(tool)) == {11, 12, 13}
    assert sched_policy.threads(str(tmp_path / "gone")) == set()


@pytest.mark.skipif(HAS_SCX, reason="this kernel accepts SCHED_EXT")
def test_a_refused_switch_is_counted_and_leaves_the_task_as_it_was(tmp_path: Path,
                                                                    sleeper: int) -> None:
    os.sched_setscheduler(sleeper, sched_policy.SCHED_BATCH, os.sched_param(0))
    tool = _cgroup(tmp_path, "tool-a", sleeper, 999_999_999)  # the second one is gone
    saved: dict[int, int] = {}
    assert sched_policy.to_ext(str(tool), saved) == (0, 1)
    assert saved == {} and sched_policy.policy(sleeper) == sched_policy.SCHED_BATCH
    assert sched_policy.restore(str(tool), saved) == 0  # nothing was switched


def test_real_time_and_gone_tasks_are_left_alone(tmp_path: Path, sleeper: int) -> None:
    try:
        os.sched_setscheduler(sleeper, os.SCHED_FIFO, os.sched_param(1))
    except OSError:
        pytest.skip("no real-time scheduling here")
    tool = _cgroup(tmp_path, "tool-rt", sleeper, 999_999_999)
    assert sched_policy.to_ext(str(tool), {}) == (0, 0)
    assert sched_policy.policy(sleeper) == os.SCHED_FIFO
    assert sched_policy.policy(999_999_999) is None


@pytest.mark.skipif(HAS_SCX, reason="this kernel accepts SCHED_EXT")
def test_gate_deny_counts_tasks_it_could_not_switch(tmp_path: Path, sleeper: int) -> None:
    """Gate.set(deny) writes the map entry, then switches the cgroup's tasks while execgate's
    scheduler is the loaded one; one refused is counted (the daemon's status shows it), never
    raised: the call then is not held."""
    maps = {"deny": gate.BpfMap(_hash_map(8, 4)), "cfg": gate.BpfMap(_hash_map(4, 16, 1)),
            "stat": gate.BpfMap(_hash_map(4, gate._STAT.size, 1))}
    root = tmp_path / "cg"
    tool = _cgroup(root, "c/tool-a", sleeper)
    sysfs = tmp_path / "sched_ext"
    (sysfs / "root").mkdir(parents=True)
    (sysfs / "state").write_text("enabled\n")
    (sysfs / "root" / "ops").write_text("other\n")
    g = gate.Gate(str(tmp_path / "pins"), maps, cgroup_root=str(root), sysfs=str(sysfs))
    try:
        assert g.set(str(tool), allow=False)  # another scheduler runs: no task is switched
        assert g.denied() == [os.stat(tool).st_ino] and g.switch_failed == 0
        (sysfs / "root" / "ops").write_text("execgate\n")
        assert g.set(str(tool), allow=False)
        assert g.switch_failed == 1
        assert g.set(str(tool), allow=True) and g.denied() == []
        assert sched_policy.policy(sleeper) == sched_policy.SCHED_OTHER
    finally:
        g.unload()


def test_recover_restores_nothing_when_nothing_was_switched(tmp_path: Path,
                                                            sleeper: int) -> None:
    _cgroup(tmp_path, "box/tool-a", sleeper)
    assert sched_policy.restore_all(str(tmp_path)) == []
    assert sched_policy.policy(sleeper) == sched_policy.SCHED_OTHER
