"""Replay benchmark: scheme definitions, workload transforms, arrivals, runner-side gates, the
config each scheme writes, and the runner's bookkeeping against a simulated Docker."""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import threading
import time
import tomllib
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench import schemes as S
from bench import workload as W
from bench.generate import generate
from bench.trace import LlmWait, MemoryProfile, Task, ToolCall, profiled_peak
from execgate.common.hints import parse
from execgate.common.units import MiB
from execgate.ctl import configure_toml


def _call(peak_mib: float, dur: float = 1.0, retained_mib: float = 0,
          cmd: str = "pytest") -> ToolCall:
    peak = int(peak_mib * MiB)
    return ToolCall(cmd, dur, MemoryProfile(peak // 2, peak, "ramp", 0.5, 0.8,
                                            int(retained_mib * MiB)))


def _task(tid: str, *peaks: float, baseline_mib: float = 0, gap: float = 1.0) -> Task:
    steps: list[Any] = []
    for p in peaks:
        steps += [LlmWait(gap), _call(p)]
    steps.append(LlmWait(gap))
    return Task(tid, steps, int(baseline_mib * MiB))


# -- schemes ----------------------------------------------------------------------------------


def test_scheme_definitions_match_the_issue() -> None:
    sc = S.SCHEMES
    assert (sc["eager"].runtime, sc["eager"].daemon, sc["eager"].hints, sc["eager"].gate) == (
        "runc", False, False, "none")
    assert sc["static"].runtime == "runc" and sc["static"].gate == "static"
    assert sc["reserve"].runtime == "runc" and sc["reserve"].gate == "reserve"
    ag = sc["agentcgroup"]
    assert (ag.runtime, ag.daemon, ag.hints, ag.memory_high_from_hint) == (
        "execgate", False, True, True)
    full = sc["execgate"]
    assert (full.runtime, full.daemon, full.hints, full.memory_high_from_hint, full.gate) == (
        "execgate", True, True, False, "none")
    ablation = sc["execgate-noadmit"]
    assert (ablation.runtime, ablation.daemon, ablation.hints) == ("execgate", False, True)
    assert [s.name for s in S.parse_schemes(S.DEFAULT_SCHEMES, (2,))] == [
        "eager", "eager+swap", "static-2", "reserve", "agentcgroup", "execgate",
        "execgate-noadmit", "execgate-nogrowth", "execgate-noresidency",
        "execgate-nosandboxadmit", "execgate-noswap"]


def test_parse_schemes_expands_static_and_rejects_unknown() -> None:
    got = S.parse_schemes("eager, static ,static-3,execgate,eager", (1, 2, 4, 8), n_tasks=3)
    assert [s.name for s in got] == ["eager", "static-1", "static-2", "static-3", "execgate"]
    assert all(s.family == "static" and s.k == int(s.name[-1]) for s in got[1:4])
    assert [s.name for s in S.parse_schemes("all", (4,))][:3] == [
        "eager", "eager+swap", "static-4"]
    for bad in ("nope", "static-x", "static-0"):
        with pytest.raises(ValueError):
            S.parse_schemes(bad)
    with pytest.raises(ValueError):
        S.Scheme("x", "runc", False, False, gate="static")  # no K
    with pytest.raises(ValueError):
        S.Scheme("x", "runc", False, False, gate="fifo")


def test_an_ablation_is_a_replace_and_reaches_the_daemon_config() -> None:
    nogrowth = replace(S.EXECGATE, name="execgate-nogrowth", family="execgate-nogrowth",
                       daemon_tables={"growth": {"enabled": False}})
    cfg = S.bench_config({}, nogrowth, domain="/sys/fs/cgroup/x.slice", mem_scale=1)
    assert cfg["growth"] == {"enabled": False}
    assert cfg["daemon"]["domain"] == "/sys/fs/cgroup/x.slice"
    assert nogrowth.to_dict()["daemon_tables"] == {"growth": {"enabled": False}}


def test_the_growth_gate_ablation_turns_the_daemons_gate_off() -> None:
    nogrowth = S.SCHEMES["execgate-nogrowth"]
    orig = {"daemon": {"domain": "host", "gate": "freeze"}, "pressure": {"red_fraction": 0.1}}
    cfg = S.bench_config(orig, nogrowth, domain="/sys/fs/cgroup/x.slice", mem_scale=1)
    assert cfg["daemon"] == {"domain": "/sys/fs/cgroup/x.slice", "gate": "off"}
    assert cfg["pressure"]["red_fraction"] == 0.1
    full = S.bench_config(orig, S.EXECGATE, domain="/sys/fs/cgroup/x.slice", mem_scale=1)
    assert full["daemon"]["gate"] == "freeze"  # the full scheme keeps the host's actuator
    assert nogrowth.daemon and nogrowth.hints and nogrowth.runtime == "execgate"
    resident = S.bench_config(orig, S.SCHEMES["execgate-noresidency"],
                              domain="/sys/fs/cgroup/x.slice", mem_scale=1)
    assert resident["residency"] == {"enabled": False} and resident["daemon"]["gate"] == "freeze"


# -- workload transforms -----------------------------------------------------------------------


def test_memory_scale_divides_every_byte_count() -> None:
    t = Task("t", [LlmWait(1), _call(800, retained_mib=40), LlmWait(1), _call(3000)],
             185 * MiB, {"speed": 2.0})
    s = W.scale_memory(t, 8)
    assert s.baseline_bytes == round(185 * MiB / 8)
    c0 = s.tool_calls[0].memory
    assert (c0.peak_bytes, c0.baseline_bytes, c0.retained_bytes) == (100 * MiB, 50 * MiB, 5 * MiB)
    assert profiled_peak(s) == pytest.approx(profiled_peak(t) / 8, abs=2)
    assert s.metadata == {"speed": 2.0, "mem_scale": 8.0}
    assert W.scale_memory(s, 2).metadata["mem_scale"] == 16.0
    assert t.tool_calls[0].memory.peak_bytes == 800 * MiB  # input untouched
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            W.scale_memory(t, bad)


def test_scaled_generated_traces_fit_a_small_vm() -> None:
    tasks = W.prepare(generate(6, 1), W.Workload(speed=20, mem_scale=8))
    assert max(profiled_peak(t) for t in tasks) < 1024 * MiB
    assert all(t.metadata["speed"] == 20 and t.metadata["mem_scale"] == 8 for t in tasks)
    assert all(c.memory.cpu_share <= 0.25 for t in tasks for c in t.tool_calls)


def test_fold_keeps_time_and_heaviest_calls() -> None:
    t = Task("t", [LlmWait(1), _call(5, 2), _call(300, 3), LlmWait(1), _call(100, 4),
                   _call(2, 5), LlmWait(2)], 0)
    f = W.fold_calls(t, min_peak_bytes=10 * MiB)
    assert f.duration_s == pytest.approx(t.duration_s)
    assert [c.memory.peak_bytes // MiB for c in f.tool_calls] == [300, 100]
    assert [type(s).__name__ for s in f.steps] == ["LlmWait", "ToolCall", "LlmWait", "ToolCall",
                                                  "LlmWait"]  # adjacent idle merged
    assert f.steps[0].duration_s == 3 and f.steps[-1].duration_s == 7
    assert f.metadata["folded_calls"] == 2
    top = W.fold_calls(t, max_calls=1)
    assert [c.memory.peak_bytes // MiB for c in top.tool_calls] == [300]
    assert W.fold_calls(t, max_calls=0).tool_calls == []


def test_idle_scale_shrinks_only_the_waits() -> None:
    t = _task("t", 100, 50, gap=10.0)
    s = W.scale_idle(t, 0.1)
    assert [c.duration_s for c in s.tool_calls] == [c.duration_s for c in t.tool_calls]
    assert s.llm_wait_s == pytest.approx(t.llm_wait_s * 0.1)
    assert s.metadata["idle_scale"] == pytest.approx(0.1)
    w = W.prepare([t], W.Workload(speed=2, mem_scale=1, cpu_scale=1, idle_scale=0.5))[0]
    assert w.duration_s == pytest.approx((t.llm_wait_s * 0.5 + 2.0) / 2)
    with pytest.raises(ValueError):
        W.scale_idle(t, -1)


def test_hint_is_the_profiled_peak_and_parses() -> None:
    call = _call(250)
    assert W.hint_for(call) == "memory:265m"
    parsed = parse(W.hint_for(call))
    assert parsed.error is None and parsed.hint is not None
    assert parsed.hint.memory_bytes >= call.memory.peak_bytes
    assert S.call_env(call, hints=True) == ["AGENT_RESOURCE_HINT=memory:265m"]
    assert S.call_env(call, hints=False) == []


def test_sandbox_holds_the_framework_baseline() -> None:
    assert S.sandbox_command(_task("t", 10)) == ["sleep", "inf"]
    argv = S.sandbox_command(_task("t", 10, baseline_mib=23.5))
    assert argv[0] == "memload"
    assert argv[argv.index("--peak-mib") + 1] == "23.500"
    assert argv[argv.index("--shape") + 1] == "plateau"


# -- arrivals ----------------------------------------------------------------------------------


def test_arrival_schedules_are_deterministic() -> None:
    a = W.arrival_schedule(20, 7, "poisson", 30)
    assert a == W.arrival_schedule(20, 7, "poisson", 30)
    assert a != W.arrival_schedule(20, 8, "poisson", 30)
    assert a[0] == 0 and a == sorted(a)
    assert W.arrival_schedule(30, 7, "poisson", 30)[:20] == a  # more tasks, same first ones
    assert W.arrival_schedule(4, 1, "burst") == [0.0] * 4
    assert W.arrival_schedule(3, 1, "staggered", 5) == [0, 5, 10]
    gaps = [b - a for a, b in zip(*(lambda x: (x, x[1:]))(W.arrival_schedule(4000, 3)),
                                  strict=False)]
    assert statistics.mean(gaps) == pytest.approx(30, rel=0.1)
    with pytest.raises(ValueError):
        W.arrival_schedule(3, 1, "uniform")


# -- runner-side gates ---------------------------------------------------------------------------


def test_static_gate_holds_k_slots() -> None:
    g = S.SlotGate(2)
    q: deque[tuple[str, int]] = deque([("a", 1), ("b", 1), ("c", 1)])
    assert S.admit_fifo(q, g) == ["a", "b"] and list(q) == [("c", 1)]
    g.release("a")
    assert S.admit_fifo(q, g) == ["c"]


def test_reservation_gate_is_fifo_and_admits_an_oversized_task_alone() -> None:
    g = S.ReservationGate(512 * MiB)
    q: deque[tuple[str, int]] = deque([("a", 300 * MiB), ("b", 300 * MiB), ("c", 100 * MiB)])
    assert S.admit_fifo(q, g) == ["a"]  # b does not fit; c waits behind it (no backfill)
    assert g.reserved == 300 * MiB
    g.release("a")
    assert S.admit_fifo(q, g) == ["b", "c"]
    g.release("b")
    g.release("c")
    q.extend([("huge", 900 * MiB), ("d", 10 * MiB)])
    assert S.admit_fifo(q, g) == ["huge"]  # larger than the budget: runs alone
    g.release("huge")
    assert S.admit_fifo(q, g) == ["d"]
    assert isinstance(S.make_gate(S.SCHEMES["reserve"], MiB), S.ReservationGate)
    assert isinstance(S.make_gate(S.static_scheme(3), MiB), S.SlotGate)
    assert isinstance(S.make_gate(S.SCHEMES["execgate"], MiB), S.OpenGate)


# -- load --------------------------------------------------------------------------------------


def test_budget_for_oversubscription() -> None:
    tasks = [_task(f"t{i}", 100) for i in range(10)]  # 100 MiB each
    b = W.budget_for_oversubscription(tasks, 4)
    assert b == 250 * MiB and W.oversubscription(tasks, b) == pytest.approx(4)
    assert W.budget_for_oversubscription(tasks, 100, floor_bytes=110 * MiB) == 110 * MiB


def test_eager_peak_estimate_adds_coincident_tasks() -> None:
    one = _task("a", 100)
    assert W.eager_peak_estimate([one], [0]) == pytest.approx(100 * MiB)
    assert W.eager_peak_estimate([one, replace(one, id="b")], [0, 0]) == pytest.approx(
        200 * MiB)
    assert W.eager_peak_estimate([one, replace(one, id="b")], [0, 100]) == pytest.approx(
        100 * MiB)


def test_no_scheme_beats_the_last_arrival_plus_its_task() -> None:
    """The floor under every makespan: what "≤ ½ of the best static-K" cannot go below."""
    a, b = _task("a", 100), replace(_task("a", 100), id="b")
    assert W.makespan_floor([a, b], [0.0, 5.0]) == pytest.approx(5.0 + b.duration_s)
    assert W.makespan_floor([], []) == 0.0
    with pytest.raises(ValueError):
        W.makespan_floor([a], [])


# -- config ------------------------------------------------------------------------------------


def test_the_shipped_config_round_trips_through_a_schemes_config() -> None:
    """The bench rewrites the installed config per scheme; the shipped one holds an infinity
    (max_start_wait_s_no_deadline = inf), which its own TOML writer refused (a VM run's
    "replay: cannot write inf to TOML")."""
    shipped = Path(__file__).resolve().parents[2] / "packaging" / "config.toml"
    original = tomllib.loads(shipped.read_text())
    assert original["sandbox_admission"]["max_start_wait_s_no_deadline"] == math.inf
    for name in ("execgate", "eager"):
        full = S.bench_config(original, S.SCHEMES[name], domain="/sys/fs/cgroup/e.slice",
                              mem_scale=6, admission_wait_s=300)
        assert tomllib.loads(configure_toml.dump(full)) == full


def test_bench_config_per_scheme() -> None:
    original = {"runtime": ["runc"], "daemon_timeout_ms": 2000,
                "pressure": {"safety_margin_bytes": "512m"}, "estimate": {"avg_fraction": 0.3}}
    defaults = {"pressure": {"safety_margin_bytes": 256 * MiB},
                "admission": {"heavy_peak_bytes": 1 << 30, "yellow_peak_limit_bytes": 256 * MiB}}
    dom = "/sys/fs/cgroup/egbench.slice"
    ag = S.bench_config(original, S.SCHEMES["agentcgroup"], domain=dom, mem_scale=8,
                        defaults=defaults)
    assert ag["memory_high_from_hint"] is True and "daemon" not in ag
    assert ag["pressure"] == {"safety_margin_bytes": "512m"}  # daemon stopped: untouched
    full = S.bench_config(original, S.SCHEMES["execgate"], domain=dom, mem_scale=8,
                          admission_wait_s=120, defaults=defaults)
    assert full["memory_high_from_hint"] is False
    assert full["daemon"] == {"domain": dom}
    assert full["pressure"]["safety_margin_bytes"] == 64 * MiB  # the configured 512m, /8
    assert full["admission"] == {"heavy_peak_bytes": 128 * MiB,
                                 "yellow_peak_limit_bytes": 32 * MiB,
                                 "max_admission_wait_s": 120.0}
    assert full["estimate"] == {"avg_fraction": 0.3} and full["daemon_timeout_ms"] == 2000
    assert original["pressure"] == {"safety_margin_bytes": "512m"}  # not mutated
    unscaled = S.bench_config(original, S.SCHEMES["execgate"], domain=dom, mem_scale=8,
                              scale_daemon=False, defaults=defaults)
    assert "admission" not in unscaled
    tomllib.loads(configure_toml.dump(full))


def test_real_daemon_defaults_are_scaled() -> None:
    tables = S.scaled_daemon_tables({}, 8)
    assert tables["pressure"]["safety_margin_bytes"] == 32 * MiB
    assert tables["estimate"]["test_peak_bytes"] == 128 * MiB
    assert "window_bytes" not in tables.get("admission", {})  # None default: left alone


def test_slice_path() -> None:
    assert S.slice_path("egbench.slice") == "/sys/fs/cgroup/egbench.slice"
    assert S.slice_path("a-b.slice", "/cg") == "/cg/a.slice/a-b.slice"
    with pytest.raises(ValueError):
        S.slice_path("../etc")


# -- the runner against a simulated Docker -------------------------------------------------------


class FakeHost:
    """Docker and a slice in memory: sandboxes hold their baseline, a call holds its peak for its
    duration, and a call that would take the slice past its budget is 'OOM-killed' (137)."""

    slice = "egbench.slice"
    cgroup = "/nonexistent/egbench.slice"
    image = "img"

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.lock = threading.Lock()
        self.sandboxes: dict[str, int] = {}
        self.calls = 0
        self.used = 0
        self.n = 0
        self.run_timeouts: list[float] = []
        self.counter_reads = 0

    def run_sandbox(self, runtime: str, label: str, cmd: list[str], shm_size: int,
                    timeout: float) -> subprocess.CompletedProcess[str]:
        with self.lock:
            self.run_timeouts.append(timeout)
            self.n += 1
            cid = f"c{self.n}"
            base = 0
            if "--baseline-mib" in cmd:
                base = int(float(cmd[cmd.index("--baseline-mib") + 1]) * MiB)
            self.sandboxes[cid] = base
            self.used += base
            return subprocess.CompletedProcess(cmd, 0, cid + "\n", "")

    def remove(self, cid: str, timeout: float = 0) -> bool:
        with self.lock:
            self.used -= self.sandboxes.pop(cid, 0)
        return True

    def exists(self, cid: str) -> bool:
        return cid in self.sandboxes

    def oom_killed(self, cid: str) -> bool:
        return False

    def exec_call(self, cid: str, cmd: list[str], env: list[str],
                  timeout: float) -> subprocess.CompletedProcess[str]:
        peak = int(float(cmd[cmd.index("--peak-mib") + 1]) * MiB)
        dur = float(cmd[cmd.index("--duration") + 1])
        with self.lock:
            self.calls += 1
            fits = self.used + peak <= self.budget
            if fits:
                self.used += peak
        began = time.monotonic()
        time.sleep(dur if fits else dur / 2)
        if not fits:
            return subprocess.CompletedProcess(cmd, 137, "", "Killed")
        with self.lock:
            self.used -= peak
        ended = time.monotonic()  # memload's last line, when the bench asks for it
        line = (f"memload: timings start={began} full={began} left={ended} end={ended}\n"
                if "MEMLOAD_TIMINGS=1" in env else "")
        return subprocess.CompletedProcess(cmd, 0, "", line)

    def memory_current(self) -> int:
        return self.used

    def swap_current(self) -> int:
        return 0

    def memory_counters(self) -> dict[str, float]:
        self.counter_reads += 1
        return {"refault_bytes": 0, "swap_out_bytes": 0, "swap_in_bytes": 0, "stall_s": 0.0}

    def swap_stats(self) -> None:
        return None

    def init_pid(self, cid: str) -> int:
        return 1000 + int(cid[1:])

    def budget_ok(self, budget: int) -> bool:
        return True

    def set_budget(self, budget: int) -> None:
        pass


def _replay(scheme: S.Scheme, tasks: list[Task], budget: int,
            host: FakeHost | None = None) -> dict[str, Any]:
    from bench.host import Log
    from bench.runner import Replayer, RunSettings

    host = host or FakeHost(budget)
    rep = Replayer(host, scheme, tasks, [0.0] * len(tasks), budget,  # type: ignore[arg-type]
                   RunSettings(sample_s=0.01), Log(None, quiet=True))
    out = rep.run()
    assert host.sandboxes == {}, "sandboxes left behind"
    return out


def _burst() -> list[Task]:
    # Four tasks of one 60 MiB call each on a 100 MiB budget: only one fits at a time.
    return [Task(f"t{i}", [LlmWait(0.01), _call(60, 0.15), LlmWait(0.01)], 0)
            for i in range(4)]


def test_runner_retries_oom_killed_tasks_and_accounts_for_every_attempt() -> None:
    out = _replay(S.EAGER, _burst(), 100 * MiB)
    m = out["metrics"]
    assert m["tasks_total"] == 4 and m["oom_kills"] >= 1
    assert m["attempts"] == len(out["attempts"]) == sum(t["attempts"] for t in out["tasks"])
    assert m["failed_attempts"] == sum(not a["ok"] for a in out["attempts"])
    for t in out["tasks"]:
        tries = sorted(a["attempt"] for a in out["attempts"] if a["task_id"] == t["id"])
        assert tries == list(range(1, t["attempts"] + 1))
        assert t["ok"] or t["attempts"] == 6
    assert all(a["reason"] == "oom" for a in out["attempts"] if not a["ok"])
    assert out["samples"]["rows"] and out["calls"]
    assert m["latency_arrival_p50_s"] >= m["latency_p50_s"] - 1e-6
    # memload's own span, on the bench's clock, inside its exec's; none for a killed call
    for c in out["calls"]:
        assert "memload: timings" not in c["stderr"]
        if c["exit"] != 0:
            assert c["ran"] is None and c["stderr"] == "Killed", c
            continue
        ran = c["ran"]
        assert c["start"] <= ran["start"] <= ran["full"] <= ran["left"] <= ran["end"] <= c["end"]
        assert ran["end"] - ran["start"] == pytest.approx(0.15, abs=0.05)
    assert 0 <= m["exec_lead_p50_s"] <= m["exec_lead_p95_s"] < 0.05
    assert 0 <= m["exec_tail_p50_s"] <= m["exec_tail_p95_s"] < 0.05


def test_a_slow_sandbox_start_is_not_cut_short_by_the_bench() -> None:
    """Under TCG with 16 sandboxes a `docker run` took 400-490 s (a sandbox-admission wait
    included); the bench's own 300 s timeout failed those attempts, not the scheme."""
    from bench.runner import RunSettings

    host = FakeHost(100 * MiB)
    _replay(S.EAGER, _burst()[:1], 100 * MiB, host)
    assert host.run_timeouts == [RunSettings().run_timeout_s] and host.run_timeouts[0] >= 600


class HeldStartHost(FakeHost):
    """Docker whose first `docker run` outlives the bench's timeout while its start is held
    (sandbox admission): the CLI printed the id at create, and dockerd removes the container
    only once the start is over, so the first `docker rm -f`s time out too."""

    def __init__(self, budget: int, held_rms: int) -> None:
        super().__init__(budget)
        self.held_rms = held_rms
        self.rms = 0

    def remove(self, cid: str, timeout: float = 0) -> bool:
        if cid == "c1" and self.rms < self.held_rms:
            self.rms += 1
            return False  # timed out
        return super().remove(cid, timeout)

    def run_sandbox(self, runtime: str, label: str, cmd: list[str], shm_size: int,
                    timeout: float) -> subprocess.CompletedProcess[str]:
        p = super().run_sandbox(runtime, label, cmd, shm_size, timeout)
        if self.n == 1:
            return subprocess.CompletedProcess(cmd, 124, p.stdout, "timed out after 1800s")
        return p


def test_a_sandbox_whose_start_timed_out_is_removed_not_left_holding_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At 15x under TCG two `docker run`s outlived the bench's timeout, the `docker rm -f` after
    each timed out as well, and their sandboxes held memory beside the retries to the end."""
    from bench import runner

    monkeypatch.setattr(runner, "RM_RETRY_S", 0.01)
    host = HeldStartHost(100 * MiB, held_rms=2)
    out = _replay(S.EAGER, _burst()[:1], 100 * MiB, host)  # asserts no sandbox left behind
    first, second = out["attempts"]
    assert (first["ok"], first["reason"]) == (False, "sandbox") and "timed out" in first["detail"]
    assert second["ok"] and host.rms == 2


def test_runner_gates_serialise_tasks_and_avoid_kills() -> None:
    for scheme in (S.static_scheme(1), S.RESERVE):
        out = _replay(scheme, _burst(), 100 * MiB)
        m = out["metrics"]
        assert (m["tasks_completed"], m["oom_kills"], m["concurrency_max"]) == (4, 0, 1)
        assert m["queue_wait_max_s"] > 0.1  # the last task waited for three others
        assert m["latency_arrival_p95_s"] > m["latency_p95_s"]


def test_host_memory_counters_read_the_slice_stat_and_pressure(tmp_path: Path) -> None:
    """Refaults and swap traffic in bytes (memory.stat counts pages), stall from PSI's `some`
    total (µs): the figures the simulator's memory model reports, from a real cgroup's files."""
    from bench.host import Host, Log

    page = os.sysconf("SC_PAGE_SIZE")
    (tmp_path / "memory.stat").write_text(
        "anon 100\nworkingset_refault_anon 3\npswpin 2\npswpout 5\nworkingset_refault_file 9\n")
    (tmp_path / "memory.pressure").write_text(
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=2500000\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=1000000\n")
    host = Host("bench.slice", "img", str(tmp_path / "config.toml"), Log(None, quiet=True))
    host.cgroup = str(tmp_path)
    assert host.memory_counters() == {"refault_bytes": 3 * page, "swap_out_bytes": 5 * page,
                                      "swap_in_bytes": 2 * page, "stall_s": 2.5}
    host.cgroup = str(tmp_path / "gone")  # a slice already removed: zeros, no exception
    assert host.memory_counters() == {"refault_bytes": 0, "swap_out_bytes": 0,
                                      "swap_in_bytes": 0, "stall_s": 0.0}


@pytest.mark.parametrize(("out", "cpu"), [("466400000000\n", 466.4), ("[not set]\n", None),
                                          ("", None)])
def test_the_daemons_cpu_is_systemds_account_of_its_unit(
        monkeypatch: pytest.MonkeyPatch, out: str, cpu: float | None) -> None:
    from bench import host as host_mod

    monkeypatch.setattr(host_mod, "_run", lambda argv, timeout=0: subprocess.CompletedProcess(
        argv, 0, out, ""))
    h = host_mod.Host("bench.slice", "img", "/nonexistent.toml", host_mod.Log(None, quiet=True))
    assert h.daemon_cpu_s() == cpu


def test_the_sampler_reads_the_slice_counters_once_a_second_not_every_sample() -> None:
    """memory.stat and PSI are cumulative; read at every 150-ms sample they cost the saturated
    TCG VM CPU the schemes under test did not get."""
    from bench.runner import COUNTERS_EVERY_S

    host = FakeHost(1000 * MiB)
    tasks = [Task("t0", [LlmWait(0.01), _call(10, 1.2), LlmWait(0.01)], 0)]
    out = _replay(S.EAGER, tasks, 1000 * MiB, host)
    rows = out["samples"]["rows"]
    span = rows[-1][0] - rows[0][0]
    assert len(rows) > 20  # sampled every 10 ms
    assert host.counter_reads <= span / COUNTERS_EVERY_S + 2
