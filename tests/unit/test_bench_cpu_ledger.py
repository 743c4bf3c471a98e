"""The bench's CPU ledger: by cgroup over a run, and by party in the report."""

from __future__ import annotations

import os
from pathlib import Path

from bench import cpu_ledger, report


def _cg(root: Path, rel: str, usec: int) -> None:
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.stat").write_text(f"usage_usec {usec}\nuser_usec {usec}\nsystem_usec 0\n")


def _tree(root: Path, k: int) -> Path:
    """A cgroupfs after k seconds of a run, and /proc/stat to go with it."""
    _cg(root, "egbench.slice", 10_000_000 * k)
    _cg(root, "system.slice/docker.service", 2_000_000 * k)
    _cg(root, "system.slice/containerd.service", 1_000_000 * k)
    _cg(root, "system.slice/execgated.service", 500_000 * k)
    _cg(root, "system.slice/docker-abc.scope/deep", 7)  # below a unit: not read
    (root / "init.scope").mkdir(exist_ok=True)  # no cpu.stat (controller off): left out
    hz = os.sysconf("SC_CLK_TCK")
    stat = root / "stat"
    # user nice system idle iowait irq softirq steal
    stat.write_text(f"cpu  {14 * hz * k} 0 {hz * k} {5 * hz * k} 0 0 0 0 0 0\ncpu0 1 2 3\n")
    return stat


def test_a_run_is_split_by_cgroup_and_by_party(tmp_path: Path) -> None:
    stat = _tree(tmp_path, 1)
    before = cpu_ledger.snapshot(str(tmp_path), str(stat))
    assert "init.scope" not in before and "system.slice/docker-abc.scope/deep" not in before
    stat = _tree(tmp_path, 3)
    ledger = cpu_ledger.delta(before, cpu_ledger.snapshot(str(tmp_path), str(stat)))
    assert ledger == {"busy": 30.0, "egbench.slice": 20.0, "idle": 10.0,
                      "system.slice/docker.service": 4.0,
                      "system.slice/containerd.service": 2.0,
                      "system.slice/execgated.service": 1.0}
    assert list(ledger)[:2] == ["busy", "egbench.slice"]  # largest first
    parties = cpu_ledger.parties(ledger, "egbench.slice")
    assert parties == {"busy": 30.0, "idle": 10.0, "sandboxes": 20.0, "engine": 6.0,
                       "execgated": 1.0, "other": 3.0}


def test_a_cgroup_that_appeared_or_went_during_the_run_is_left_out(tmp_path: Path) -> None:
    assert cpu_ledger.delta({"a": 1.0, "gone": 5.0}, {"a": 1.2, "new": 9.0}) == {}
    assert cpu_ledger.delta({"a": 1.0}, {"a": 3.0}) == {"a": 2.0}


def test_the_report_shows_the_ledger_only_for_runs_that_have_one() -> None:
    parties = {"busy": 600.4, "idle": 20.0, "sandboxes": 400.0, "engine": 100.0,
               "execgated": 90.0, "other": 10.4}
    assert cpu_ledger.row({"cpu_parties": parties}) == ["600", "400", "100", "90", "10", "20"]
    assert cpu_ledger.row({}) is None
    assert cpu_ledger.row({"cpu_parties": {**parties, "busy": None}})[0] == "–"
    assert "Where the host's CPU went" not in report.markdown({"points": [], "runs": []})
