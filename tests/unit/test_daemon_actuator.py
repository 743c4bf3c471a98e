"""daemon/actuator.py on fake cgroup and sysfs trees: the cgroup.freeze fallback, the choice
between it and the sched_ext gate, and recovery of what a dead daemon left frozen."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from execgate.bpf import gate
from execgate.cgroups import freeze
from execgate.daemon import actuator

# -- cgroup.freeze fallback -----------------------------------------------------------------------

def _fake_cgroups(root: Path, *names: str) -> None:
    (root / "cgroup.controllers").parent.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for n in names:
        (root / n).mkdir(parents=True, exist_ok=True)
        (root / n / "cgroup.freeze").write_text("0\n")


def test_freeze_gate(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _fake_cgroups(root, "c1/tool-a", "c1/tool-b")
    g = actuator.FreezeGate(str(root))
    assert g.attached() and g.kind == "freeze"
    assert g.set("c1/tool-a", allow=False)
    assert (root / "c1/tool-a/cgroup.freeze").read_text() == "1"
    tid = os.stat(root / "c1/tool-b").st_ino
    assert g.set(tid, allow=False)  # by id: found by walking the tree
    assert (root / "c1/tool-b/cgroup.freeze").read_text() == "1"
    assert sorted(g.denied()) == [str(root / "c1/tool-a"), str(root / "c1/tool-b")]
    assert g.set(root / "c1/tool-a", allow=True)
    assert (root / "c1/tool-a/cgroup.freeze").read_text() == "0"
    assert not g.set("c1/gone", allow=False)
    assert not g.set(987654321, allow=True)  # never frozen here: no tree walk, nothing to do
    with pytest.raises(ValueError):
        g.set(str(root), allow=False)
    assert g.clear() == 1
    assert (root / "c1/tool-b/cgroup.freeze").read_text() == "0"
    g.set("c1/tool-a", allow=False)
    assert g.unload() and g.unload()
    assert (root / "c1/tool-a/cgroup.freeze").read_text() == "0"
    assert not g.attached()


def test_thaw_all_only_thaws_matching_frozen(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _fake_cgroups(root, "c1/tool-a", "c1/tool-b", "c1/other", "c2/tool-c/sub")
    (root / "c1/tool-a/cgroup.freeze").write_text("1")
    (root / "c1/other/cgroup.freeze").write_text("1")
    (root / "c2/tool-c/cgroup.freeze").write_text("1")
    thawed = freeze.thaw_all(str(root))
    assert sorted(thawed) == [str(root / "c1/tool-a"), str(root / "c2/tool-c")]
    assert (root / "c1/other/cgroup.freeze").read_text() == "1"


# -- selection and recovery -----------------------------------------------------------------------

def test_select_gate_falls_back_without_sched_ext(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _fake_cgroups(root)
    g, reason = actuator.select_gate(tmp_path / "build", str(tmp_path / "pins"),
                                     cgroup_root=str(root), sysfs=str(tmp_path / "none"))
    assert isinstance(g, actuator.FreezeGate)
    assert "no sched_ext" in reason and "cgroup.freeze" in reason
    with pytest.raises(gate.GateUnavailable):
        actuator.select_gate(tmp_path / "build", str(tmp_path / "pins"), prefer="sched_ext",
                             cgroup_root=str(root), sysfs=str(tmp_path / "none"))
    g, reason = actuator.select_gate(prefer="freeze", cgroup_root=str(root))
    assert isinstance(g, actuator.FreezeGate) and reason == "cgroup.freeze requested"
    with pytest.raises(ValueError):
        actuator.select_gate(prefer="bogus")


def test_select_gate_falls_back_when_another_scheduler_runs(tmp_path: Path) -> None:
    sysfs = tmp_path / "sched_ext"
    (sysfs / "root").mkdir(parents=True)
    (sysfs / "state").write_text("enabled\n")
    (sysfs / "root" / "ops").write_text("rusty\n")
    g, reason = actuator.select_gate(tmp_path / "build", str(tmp_path / "pins"),
                                     cgroup_root=str(tmp_path), sysfs=str(sysfs))
    assert isinstance(g, actuator.FreezeGate)
    assert reason == ("sched_ext unavailable (another sched_ext scheduler (rusty) is loaded; "
                      "execgate leaves it loaded); using cgroup.freeze")
    assert (sysfs / "state").read_text() == "enabled\n"  # left as it was
    assert (sysfs / "root" / "ops").read_text() == "rusty\n"


def test_recover_with_nothing_left_behind(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _fake_cgroups(root, "c/tool-x")
    assert gate.recover(str(tmp_path / "pins"), cgroup_root=str(root),
                        sysfs=str(tmp_path / "none")) == "nothing to recover"
    (root / "c/tool-x/cgroup.freeze").write_text("1")
    assert "thawed 1 cgroups" in gate.recover(str(tmp_path / "pins"), cgroup_root=str(root),
                                              sysfs=str(tmp_path / "none"))
