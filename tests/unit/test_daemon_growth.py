"""The daemon's growth-gate glue over a fake cgroupfs, with cgroup.freeze as the actuator."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from execgate.daemon.actuator import FreezeGate
from execgate.daemon.growth_gate import HPAGE_SIZE, PAGE_SIZE, GrowthGate
from execgate.policy.estimate import CallInfo
from execgate.policy.growth import GrowthConfig
from execgate.policy.pressure_state import Pressure

MiB = 1 << 20


@dataclass
class Call:
    info: CallInfo
    cgroup: str
    admitted_at: float
    last_mem: int = 0
    seen: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def _cg(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir()
    (d / "cgroup.freeze").write_text("0\n")
    (d / "cpu.stat").write_text("usage_usec 0\n")
    return d


def test_growing_call_is_frozen_under_red_and_reported(tmp_path: Path) -> None:
    clock = Clock()
    gg = GrowthGate(GrowthConfig(), "freeze", clock)
    gg.actuator, gg.reason = FreezeGate(str(tmp_path)), "test"
    a, b = _cg(tmp_path, "tool-a"), _cg(tmp_path, "tool-b")
    calls = {n: Call(CallInfo(n, "s", ["x"]), str(d), clock.t) for n, d in
             (("tool-a", a), ("tool-b", b))}
    avail = 600 * MiB  # headroom 344 MiB: room for one call growing 200 MiB/s, not two
    for i in range(1, 30):
        clock.t += 0.1
        for n, d in (("tool-a", a), ("tool-b", b)):
            calls[n].last_mem = i * 20 * MiB  # both grow 200 MiB/s
            (d / "cpu.stat").write_text(f"usage_usec {i * 50_000}\n")
        gg.update(calls, Pressure.RED, avail)
    frozen = [n for n, d in (("tool-a", a), ("tool-b", b))
              if (d / "cgroup.freeze").read_text().strip() == "1"]
    assert len(frozen) == 1, "red lets exactly one growing call (the probe) run"
    assert gg.snapshot()["held"] == frozen
    out = gg.outcome(frozen[0])
    assert out["held_s"] > 2.0 and out["killed_by_execgate"] is False
    assert (tmp_path / frozen[0] / "cgroup.freeze").read_text().strip() == "0", \
        "a finished call's cgroup is released"


def test_gate_off_holds_nothing_and_reports_no_hold(tmp_path: Path) -> None:
    """With no actuator (gate = "off") the same red run records no hold: the journal and the
    agent's feedback must not speak of a pause that never happened."""
    clock = Clock()
    gg = GrowthGate(GrowthConfig(), "off", clock)
    gg.start()
    assert gg.actuator is None
    a = _cg(tmp_path, "tool-a")
    (a / "cgroup.kill").write_text("")
    calls = {"tool-a": Call(CallInfo("tool-a", "s", ["x"], declared_bytes=10 * MiB), str(a),
                            clock.t)}
    for i in range(1, 40):
        clock.t += 0.1
        calls["tool-a"].last_mem = i * 20 * MiB
        (a / "cpu.stat").write_text(f"usage_usec {i * 50_000}\n")
        gg.update(calls, Pressure.RED, (60 - i) * MiB, 512 * MiB)
        assert gg.last.allow == {"tool-a": True}
    assert (a / "cgroup.kill").read_text() == "", "no last resort without the gate"
    out = gg.outcome("tool-a")
    assert out["held_s"] == 0.0 and out["killed_by_execgate"] is False, out


def test_last_resort_kills_the_worst_offender(tmp_path: Path) -> None:
    clock = Clock()
    gg = GrowthGate(GrowthConfig(), "freeze", clock)
    gg.actuator = FreezeGate(str(tmp_path))
    a, b = _cg(tmp_path, "tool-a"), _cg(tmp_path, "tool-b")
    for d in (a, b):
        (d / "cgroup.kill").write_text("")
    calls = {"tool-a": Call(CallInfo("tool-a", "s", ["x"], declared_bytes=400 * MiB), str(a),
                            clock.t, last_mem=450 * MiB),
             "tool-b": Call(CallInfo("tool-b", "s", ["y"], declared_bytes=100 * MiB), str(b),
                            clock.t, last_mem=450 * MiB)}
    for i in range(1, 40):  # red, under 64 MiB available and still falling: about to OOM
        clock.t += 0.1
        for d in (a, b):
            (d / "cpu.stat").write_text(f"usage_usec {i * 1000}\n")
        gg.update(calls, Pressure.RED, (60 - i) * MiB, 512 * MiB)
    assert (b / "cgroup.kill").read_text() == "1", "b is furthest above what it declared"
    assert (a / "cgroup.kill").read_text() == ""
    assert gg.outcome("tool-b")["killed_by_execgate"] is True


def test_green_allows_everything(tmp_path: Path) -> None:
    clock = Clock()
    gg = GrowthGate(GrowthConfig(), "freeze", clock)
    gg.actuator = FreezeGate(str(tmp_path))
    d = _cg(tmp_path, "tool-a")
    calls = {"tool-a": Call(CallInfo("tool-a", "s", ["x"]), str(d), clock.t)}
    for i in range(1, 10):
        clock.t += 0.1
        calls["tool-a"].last_mem = i * 100 * MiB
        (d / "cpu.stat").write_text(f"usage_usec {i * 50_000}\n")
        gg.update(calls, Pressure.GREEN, 8 << 30)
    assert (d / "cgroup.freeze").read_text().strip() == "0"
    assert gg.outcome("tool-a")["held_s"] == 0.0


def test_probe_fault_counts_reach_the_controller_as_bytes(tmp_path: Path) -> None:
    clock = Clock()
    gg = GrowthGate(GrowthConfig(), "freeze", clock)
    d = _cg(tmp_path, "tool-a")
    call = Call(CallInfo("tool-a", "s", ["x"]), str(d), clock.t)
    for i, (pages, thp) in enumerate(((0, 0), (1000, 0), (51_000, 0), (51_010, 10))):
        clock.t += 0.5
        call.last_mem = 100 * MiB + i * MiB
        call.extra["faults"] = {"count": pages, "rate": 0.0, "peak_10ms": 0}
        (d / "cpu.stat").write_text(f"usage_usec {(i + 1) * 50_000}\n")
        (d / "memory.stat").write_text(f"anon 1\nthp_fault_alloc {thp}\nthp_collapse_alloc 0\n")
        gg.update({"tool-a": call}, Pressure.GREEN, 8 << 30)
        c = gg.last.calls["tool-a"]
        if i == 2:  # grew 1 MiB, faulted 50,000 pages
            assert c.burst_bps == 50_000 * PAGE_SIZE / 0.5
            assert c.demand_bytes == 50_000 * PAGE_SIZE * 2
    # ten faults that each allocated a transparent huge page brought in ten of them
    assert c.burst_bps == 10 * HPAGE_SIZE / 0.5
