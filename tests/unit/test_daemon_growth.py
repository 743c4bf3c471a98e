"""The daemon's growth-gate glue over a fake cgroupfs, with cgroup.freeze as the actuator."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from execgate.common.units import MiB
from execgate.daemon.actuator import FreezeGate
from execgate.daemon.cgfiles import KeptFiles
from execgate.daemon.growth_gate import HPAGE_SIZE, PAGE_SIZE, RELOAD_AFTER_S, GrowthGate
from execgate.policy.estimate import CallInfo
from execgate.policy.growth import GrowthConfig
from execgate.policy.pressure_state import Pressure


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
        green = i <= 2  # sampled while they ran: resident (not growing), so never held
        gg.update(calls, Pressure.GREEN if green else Pressure.RED,
                  (8 << 30) if green else (60 - i) * MiB, 512 * MiB)
    assert gg.snapshot()["held"] == []
    assert (b / "cgroup.kill").read_text() == "1", "b is furthest above what it declared"
    assert (a / "cgroup.kill").read_text() == ""
    assert gg.outcome("tool-b")["killed_by_execgate"] is True


class CountedFiles(KeptFiles):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def read(self, cg: str, name: str, absent_for_good: bool = False) -> bytes | None:
        self.reads.append(name)
        return super().read(cg, name, absent_for_good)


def test_green_reads_the_calls_files_every_green_period(tmp_path: Path) -> None:
    """Under an emulator the per-period reads were 45 % of the loop at 1×: at green the gate
    holds nothing, so it reads a call's cpu.stat twice a second, and every period again once
    pressure rises."""
    clock = Clock()
    files = CountedFiles()
    gg = GrowthGate(GrowthConfig(), "freeze", clock, files)
    gg.actuator = FreezeGate(str(tmp_path))
    d = _cg(tmp_path, "tool-a")
    calls = {"tool-a": Call(CallInfo("tool-a", "s", ["x"]), str(d), clock.t)}
    for _ in range(20):  # 2 s at green
        clock.t += 0.1
        gg.update(calls, Pressure.GREEN, 8 << 30)
    assert files.reads.count("cpu.stat") == 4
    for _ in range(5):
        clock.t += 0.1
        gg.update(calls, Pressure.YELLOW, 8 << 30)
    assert files.reads.count("cpu.stat") == 9


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


def _tasks(root: Path, cg: Path, values: dict[int, int]) -> Path:
    """cgroup.procs of cg and a fake /proc with each task's oom_score_adj."""
    proc = root / "proc"
    for pid, v in values.items():
        (proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc / str(pid) / "oom_score_adj").write_text(f"{v}\n")
    (cg / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in values))
    return proc


def _adj(proc: Path, pid: int) -> int:
    return int((proc / str(pid) / "oom_score_adj").read_text())


def test_held_values_are_the_decision_of_oom_score() -> None:
    from execgate.calls import oom_score

    assert oom_score.held_value(500, 0) == 0
    assert oom_score.held_value(-100, 0) is None  # already below: never raised by a hold
    saved = {1: 500, 2: -100}
    assert oom_score.restored_value(1, 0, saved, 0, 500) == 500
    assert oom_score.restored_value(2, -100, saved, 0, 500) == -100
    assert oom_score.restored_value(1, 300, saved, 0, 500) is None  # someone else changed it
    assert oom_score.restored_value(3, 0, saved, 0, 500) == 500  # born while held
    assert oom_score.restored_value(3, 800, saved, 0, 500) is None


def test_a_held_call_is_not_the_preferred_oom_victim_while_held(tmp_path: Path) -> None:
    """Issue 15 §4: a held call's tasks drop from tool_oom_score_adj (500) to
    held_oom_score_adj (-500) while the gate holds it, so the kernel kills a running grower; a
    task it forks meanwhile is lowered too, and all get their value back when released."""
    clock = Clock()
    gg = GrowthGate(GrowthConfig(), "freeze", clock, tool_oom_score_adj=500)
    gg.actuator = FreezeGate(str(tmp_path))
    a, b = _cg(tmp_path, "tool-a"), _cg(tmp_path, "tool-b")
    gg.proc = str(_tasks(tmp_path, a, {101: 500, 102: 500}))
    _tasks(tmp_path, b, {201: 500})
    calls = {n: Call(CallInfo(n, "s", ["x"]), str(d), clock.t) for n, d in
             (("tool-a", a), ("tool-b", b))}
    proc = Path(gg.proc)
    held = None
    for i in range(1, 12):
        clock.t += 0.1
        for n, d in (("tool-a", a), ("tool-b", b)):
            calls[n].last_mem = i * 20 * MiB
            (d / "cpu.stat").write_text(f"usage_usec {i * 50_000}\n")
        gg.update(calls, Pressure.RED, 600 * MiB)
        if gg.snapshot()["held"]:
            held = gg.snapshot()["held"]
            break
    assert held is not None and len(held) == 1
    cg, pids = (a, (101, 102)) if held == ["tool-a"] else (b, (201,))
    running_pids = (201,) if held == ["tool-a"] else (101, 102)
    assert [_adj(proc, p) for p in pids] == [-500] * len(pids)
    assert [_adj(proc, p) for p in running_pids] == [500] * len(running_pids)
    # The held call forks (the child inherits -500) and a watcher raises one task again.
    _tasks(tmp_path, cg, {**{p: -500 for p in pids}, 999: -500})
    (proc / str(pids[0]) / "oom_score_adj").write_text("500\n")
    clock.t += 0.1
    gg.update(calls, Pressure.RED, 600 * MiB)
    assert _adj(proc, pids[0]) == -500, "lowered again while held"
    for _ in range(3):
        clock.t += 0.1
        gg.update(calls, Pressure.GREEN, 8 << 30)  # released
    assert gg.snapshot()["held"] == []
    assert [_adj(proc, p) for p in (*pids, 999)] == [500] * (len(pids) + 1)


def test_no_lowering_when_calls_are_not_raised(tmp_path: Path) -> None:
    clock = Clock()
    gg = GrowthGate(GrowthConfig(held_oom_score_adj=0), "freeze", clock, tool_oom_score_adj=0)
    gg.actuator = FreezeGate(str(tmp_path))
    a = _cg(tmp_path, "tool-a")
    gg.proc = str(_tasks(tmp_path, a, {101: 0}))
    calls = {"tool-a": Call(CallInfo("tool-a", "s", ["x"]), str(a), clock.t)}
    for i in range(1, 5):
        clock.t += 0.1
        calls["tool-a"].last_mem = i * 20 * MiB
        (a / "cpu.stat").write_text(f"usage_usec {i * 50_000}\n")
        gg.update(calls, Pressure.RED, 0)
    assert gg.snapshot()["held"] == ["tool-a"]
    assert _adj(Path(gg.proc), 101) == 0


def _sysfs(root: Path, state: str, ops: str | None = None) -> str:
    (root / "root").mkdir(parents=True, exist_ok=True)
    (root / "state").write_text(state + "\n")
    if ops is not None:
        (root / "root" / "ops").write_text(ops + "\n")
    elif (root / "root" / "ops").exists():
        (root / "root" / "ops").unlink()
    return str(root)


def test_sched_ext_is_retried_once_another_scheduler_unloads(tmp_path: Path) -> None:
    """Another scheduler held the kernel when the daemon started (the gate froze instead):
    sched_ext is tried again once it is gone, not while it runs, not before RELOAD_AFTER_S."""
    clock = Clock()
    gg = GrowthGate(GrowthConfig(), "auto", clock)
    gg.sysfs = _sysfs(tmp_path, "enabled", "eg_other")
    assert gg._other_scheduler()
    gg._fallback_at = clock.t
    clock.t += RELOAD_AFTER_S + 1
    assert not gg._retry_due(clock.t), "the other scheduler is still loaded"
    _sysfs(tmp_path, "disabled")
    assert not gg._other_scheduler()
    assert gg._retry_due(clock.t)
    assert not gg._retry_due(gg._fallback_at + 1), "too soon after the fallback"
    gg.mode = "freeze"
    assert not gg._retry_due(clock.t), "freeze by config stays freeze"
    _sysfs(tmp_path, "enabled", "execgate")
    assert not gg._other_scheduler(), "execgate's own scheduler is not another one"
    assert not GrowthGate(GrowthConfig(), "auto", clock)._retry_due(clock.t), "no fallback"


class ParkingGate:
    """The sched_ext gate as the daemon sees it: a deny set keyed by cgroup path."""

    kind = "sched_ext"

    def __init__(self) -> None:
        self.denied: set[str] = set()
        self.calls: list[tuple[str, bool]] = []

    def set(self, cg: int | str, allow: bool) -> bool:
        self.calls.append((str(cg), allow))
        was = str(cg) in self.denied
        if allow:
            self.denied.discard(str(cg))
        else:
            self.denied.add(str(cg))
        return was == allow

    def clear(self) -> int:
        n = len(self.denied)
        self.denied.clear()
        return n

    def attached(self) -> bool:
        return True

    def exit_reason(self) -> str | None:
        return None

    def unload(self, timeout: float = 10.0) -> bool:
        return True


def test_a_call_parked_past_max_park_s_is_frozen_instead_and_thawed_on_release(
        tmp_path: Path) -> None:
    """A parked task keeps its CPU from taking fair work (the kernel never counts that CPU
    idle): after max_park_s the call is frozen first, then allowed by the gate, so its tasks leave
    every runqueue; it stays held, and release, stop and a vanished call all thaw it."""
    clock = Clock()
    park_s = 0.5
    gg = GrowthGate(GrowthConfig(max_park_s=park_s), "sched_ext", clock)
    scx = ParkingGate()
    gg.actuator = scx
    a, b = _cg(tmp_path, "tool-a"), _cg(tmp_path, "tool-b")
    calls = {n: Call(CallInfo(n, "s", ["x"]), str(d), clock.t) for n, d in
             (("tool-a", a), ("tool-b", b))}

    def step(i: int, pressure: Pressure, avail: int) -> None:
        clock.t += 0.1
        for n, d in (("tool-a", a), ("tool-b", b)):
            calls[n].last_mem = i * 20 * MiB
            (d / "cpu.stat").write_text(f"usage_usec {i * 50_000}\n")
        gg.update(calls, pressure, avail)

    i = 0
    while not gg.snapshot()["held"]:
        i += 1
        step(i, Pressure.RED, 600 * MiB)
        assert i < 20
    [held] = gg.snapshot()["held"]
    cg = tmp_path / held
    parked_at = clock.t
    assert scx.denied == {str(cg)} and (cg / "cgroup.freeze").read_text().strip() == "0"
    while clock.t - parked_at < park_s - 0.05:
        i += 1
        step(i, Pressure.RED, 600 * MiB)
        assert (cg / "cgroup.freeze").read_text().strip() == "0", "parked, not yet frozen"
    for _ in range(2):
        i += 1
        step(i, Pressure.RED, 600 * MiB)
    assert (cg / "cgroup.freeze").read_text().strip() == "1"
    assert scx.denied == set() and scx.calls[-1] == (str(cg), True)  # frozen, then allowed
    assert gg.snapshot()["held"] == [held]  # still held, by the freezer now
    for _ in range(3):
        i += 1
        step(i, Pressure.GREEN, 8 << 30)
    assert gg.snapshot()["held"] == [] and (cg / "cgroup.freeze").read_text().strip() == "0"
    # held and frozen again, then its container is killed (spare): thawed to handle it
    gg.tracked[held].allowed = False
    gg.tracked[held].frozen = True
    (cg / "cgroup.freeze").write_text("1\n")
    assert gg.spare([held]) == 1 and (cg / "cgroup.freeze").read_text().strip() == "0"
    # and again, then the daemon stops: nothing stays frozen
    gg.tracked[held].allowed = False
    gg.tracked[held].frozen = True
    (cg / "cgroup.freeze").write_text("1\n")
    gg.stop()
    assert (cg / "cgroup.freeze").read_text().strip() == "0"
