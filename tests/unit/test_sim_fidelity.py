"""What the simulator knows must be what the daemon knows, and the VM's times must not be
counted twice: two ways the burst point's simulation was off against the VM."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.schemes import SCHEMES, bench_config
from bench.sim.cost import (
    UNMEASURED_EXEC_BEFORE,
    UNMEASURED_EXEC_DURING,
    Fit,
    exec_split,
    fit,
    fit_level,
    fit_pooled,
    fixed,
    observations,
    stalled_overhead,
)
from bench.sim.run import SimSettings, Simulation
from bench.trace import LlmWait, MemoryProfile, Task, ToolCall
from execgate.common.units import MiB
from execgate.policy import sandbox_admission as sa


def _task(i: int) -> Task:
    peak = 120 * MiB
    return Task(f"t{i}", [LlmWait(1.0), ToolCall("python -m pytest -q", 2.0, MemoryProfile(
        peak // 4, peak, "ramp", 0.5, 0.5, 2 * MiB)), LlmWait(0.5)], 20 * MiB)


def test_a_create_carries_no_call_peak(monkeypatch) -> None:
    """The runtime's create asks before any exec: the daemon learns a call's hint with the call,
    so the simulated create must not hand sandbox admission the first call's declared peak."""
    seen: list[int | None] = []
    orig = sa.SandboxAdmission.submit

    def submit(self, req, *a, **k):  # type: ignore[no-untyped-def]
        seen.append(req.call_peak_bytes)
        return orig(self, req, *a, **k)

    monkeypatch.setattr(sa.SandboxAdmission, "submit", submit)
    scheme = SCHEMES["execgate"]
    sim = Simulation(scheme, [_task(i) for i in range(3)], [0.0, 0.1, 0.2], 400 * MiB,
                     SimSettings(cost=fixed(0.5, 0.1, 0.2)),
                     bench_config({}, scheme, domain="/sim"))
    sim.run()
    assert seen == [None, None, None]


def _run(daemon: bool, verdict: dict | None) -> dict:
    attempt = {"task_id": "t0", "attempt": 1, "start": 10.0, "end": 60.0, "ok": True}
    if verdict is not None:
        attempt["sandbox_admission"] = verdict
    return {"scheme_def": {"runtime": "execgate" if daemon else "runc", "daemon": daemon},
            "config": {"sandbox_admission": {"enabled": True}} if daemon else None,
            "metrics": {}, "attempts": [attempt], "tasks": [{"id": "t0", "end_s": 61.0}],
            "samples": {"rows": [[0.0, 0, 1, 0, 0, 0], [100.0, 0, 1, 0, 0, 0]]},
            "calls": [{"task": "t0", "attempt": 1, "call": 1, "start": 46.0, "end": 50.0,
                       "duration_s": 2.0, "exit": 0}]}


def test_a_docker_run_fit_leaves_out_the_create_wait_the_simulator_adds() -> None:
    """run = first exec - attempt start - opening LLM wait; under the daemon the create's
    sandbox-admission wait is in that gap too, and the simulator adds its own: fitted with it,
    execgate's docker run cost every wait twice."""
    tasks = {"t0": _task(0)}
    runtime = {True: "execgate", False: "runc"}
    for daemon, verdict, want in ((False, None, 35.0),
                                  (True, {"waited_s": 30.0, "verdict": "admitted"}, 5.0)):
        run = _run(daemon, verdict)
        got = observations({"runs": [run]}, tasks, runtime[daemon])["run"]
        assert got == [(1, want)]
    # A daemon run with no verdict for the create holds an unknown wait: not fitted at all.
    assert observations({"runs": [_run(True, None)]}, tasks, "execgate")["run"] == []
    # Runs from before sandbox admission (the VM sweep's) held no create: fitted whole.
    old = dict(_run(True, None), config={"admission": {}})
    assert observations({"runs": [old]}, tasks, "execgate")["run"] == [(1, 35.0)]


def test_a_held_create_is_not_a_live_sandbox_in_the_fit() -> None:
    """A create the daemon holds costs the VM's control plane nothing: counted in n, execgate's
    burst execs looked 2-3x as costly as runc's at the same n (all 16 tasks "running")."""
    run = _run(True, {"waited_s": 30.0, "verdict": "admitted"})
    # a second task whose create is held from 0 to 80 s while t0's docker run goes on
    run["attempts"].append({"task_id": "t1", "attempt": 1, "start": 0.0, "end": 90.0,
                            "ok": True, "sandbox_admission": {"waited_s": 80.0}})
    run["samples"]["rows"] = [[float(t), 0, 2, 0, 0, 0] for t in range(0, 101, 10)]
    got = observations({"runs": [run]}, {"t0": _task(0)}, "execgate")["run"]
    assert got == [(1, 5.0)]  # t0's run (40-45 s) beside a held create: one live sandbox


def test_an_exec_fit_subtracts_each_calls_own_admission_wait() -> None:
    """Under the daemon an exec's gap holds its admission wait and growth-gate hold, which the
    simulator adds itself: from the call's record they are subtracted, so a burst's execs are
    fitted too (before, only runs in which no call waited gave exec figures)."""
    run = _run(True, {"waited_s": 30.0, "verdict": "admitted"})
    run["metrics"] = {"admission_wait_max_s": 12.0}
    tasks = {"t0": _task(0)}
    assert observations({"runs": [run]}, tasks, "execgate")["exec"] == []  # no record: unknown
    run["calls"][0]["daemon"] = {"waited_s": 1.5, "held_s": 0.5}
    assert observations({"runs": [run]}, tasks, "execgate")["exec"] == [(1, 0.0)]  # 4 - 2 - 2


def test_one_shape_two_levels_when_runc_saw_one_load() -> None:
    """A burst's runc runs all happen with every sandbox live: alone they fit no shape, and the
    line through them gave 0 s per docker run at execgate's few live sandboxes. With
    execgate's points (r times as costly) the shape comes from both."""
    def cost(n: int) -> float:
        return 10.0 + 8.0 * min(max(n - 4, 0), 12)

    runc = [(n, cost(n)) for n in (15, 16) for _ in range(5)]
    other = [(n, 0.5 * cost(n)) for n in range(2, 17)]
    base, eg = fit_level(runc, other)
    for n in (2, 8, 16):
        assert abs(base(n) - cost(n)) < 0.5 and abs(eg(n) - 0.5 * cost(n)) < 0.5
    alone = fit(runc)  # what runc's points alone made of few live sandboxes
    assert alone(2) < 0.5 * base(2)


def test_runc_keeps_its_own_level_where_it_has_points_beside_execgates_own_shape() -> None:
    """A 15x burst boot with reserve as its only runc scheme: runc's execs at one or two live
    sandboxes (2.0-2.8 s), execgate's at 1-27 (50-130 s) with a shape of their own. The shape
    shared for runc put its execs at 9.8 s where it measured 2.0 (reserve simulated +47 %)."""
    runc = [(1, 2.0)] * 20 + [(2, 2.8)] * 20
    eg = [(n, 50.0 + 3.0 * n) for n in range(1, 28)] * 3
    base, own = fit_level(runc, eg)
    assert base(1) == pytest.approx(2.4, abs=0.5) and base(2) == pytest.approx(2.4, abs=1)
    assert own(1) == pytest.approx(53.0, abs=1) and own(20) == pytest.approx(110.0, abs=1)
    assert base.r2 > -1  # before: -693


def test_runtimes_measured_at_loads_apart_fit_their_own_points() -> None:
    """A 15x burst boot with reserve and static-8 as its runc schemes: runc's docker runs at 1-2
    live sandboxes (3-5 s) and at 7-8 (44 s), execgate's at 23-27 (85-300 s). No load has
    both, so there is no ratio to learn; the shape shared across the gap was flat below its
    knee at 25 and gave every runc run 24.8 s (reserve simulated +35 %, static-8 -9 %)."""
    runc = [(1, 3.4), (2, 5.6)] * 6 + [(7, 35.2)] + [(8, 44.4)] * 26
    eg = [(23, 90.0)] * 5 + [(26, 110.0)] * 4 + [(27, 300.0)] * 18
    base, own = fit_level(runc, eg)
    assert base(1) == pytest.approx(4.5, abs=1.5) and base(8) == pytest.approx(44.4, abs=2)
    assert own(27) == pytest.approx(300.0, abs=5) and own(23) < 120


def test_the_simulator_counts_no_held_create_in_n() -> None:
    """The simulator's n is the fit's: a create held by sandbox admission is not live."""
    scheme = SCHEMES["execgate"]
    sim = Simulation(scheme, [_task(i) for i in range(3)], [0.0, 0.0, 0.0], 100 * MiB,
                     SimSettings(cost=fixed(0.5, 0.1, 0.2)),
                     bench_config({}, scheme, domain="/sim"))
    seen: list[tuple[int, int]] = []
    orig = sim._set_live

    def spy(delta: int) -> None:
        orig(delta)
        seen.append((sim.live, len(sim.creates)))

    sim._set_live = spy  # type: ignore[method-assign]
    sim.run()
    assert seen and max(n for n, _ in seen) < 3  # 100 MiB holds fewer than three at once
    assert any(held for _, held in seen)  # while creates were held
    assert sim.live == 0


def test_an_exec_slowed_under_emulation_holds_its_call_memory_longer() -> None:
    """exec_during: the share of an exec's cost the tool process itself spends, its trace
    stretched while it holds its memory. Two calls 10 s apart with 20 s execs: as setup and
    teardown only, each runs its 2 s alone (peak one call); half of it in the process, they
    overlap (two calls at once), and the exec still costs the same in all."""
    flat = MemoryProfile(40 * MiB, 40 * MiB, "plateau", 0.0, 0.0, 0)
    tasks = [Task(f"t{i}", [ToolCall("make", 2.0, flat)], 0) for i in range(2)]
    peaks, ends = {}, {}
    for during in (0.0, 0.5):
        cost = replace(fixed(0.0, 20.0, 0.0), exec_during=during)
        res = Simulation(SCHEMES["eager"], tasks, [0.0, 10.0], 400 * MiB,
                         SimSettings(cost=cost)).run()
        peaks[during] = res["metrics"]["mem_peak_bytes"]
        ends[during] = [a["end"] for a in res["attempts"]]
    assert peaks[0.0] < 50 * MiB < 70 * MiB < peaks[0.5]
    assert ends[0.0] == ends[0.5]


def test_exec_during_is_the_share_of_exec_overhead_the_slice_stalled() -> None:
    """The fitted exec_during is measured, not chosen: of each successful exec's overhead (its
    gap beyond the trace), the slice's PSI `some` over it (samples' cumulative stall_s); a
    file whose runs kept no stall column falls back to the measured boots' median."""
    run = _run(False, None)  # one exec: 46-50 s, a 2 s trace: 2 s of overhead
    run["samples"] = {"columns": ["t", "memory_bytes", "running_tasks", "inflight_calls",
                                  "queued_tasks", "swap_bytes", "refault_bytes", "stall_s"],
                      "rows": [[0.0, 0, 1, 0, 0, 0, 0, 0.0], [46.0, 0, 1, 1, 0, 0, 0, 10.0],
                               [50.0, 0, 1, 0, 0, 0, 0, 11.5]]}
    assert stalled_overhead({"runs": [run]}, "runc") == (2.0, 1.5)
    tasks = {"t0": _task(0)}
    assert fit_pooled([({"runs": [run]}, tasks)])["runc"].exec_during == 0.75
    old = _run(False, None)
    old["samples"]["columns"] = ["t", "memory_bytes", "running_tasks", "inflight_calls",
                                 "queued_tasks", "swap_bytes"]
    assert fit_pooled([({"runs": [old]}, tasks)])["runc"].exec_during == \
        UNMEASURED_EXEC_DURING["runc"]


def test_exec_before_is_the_share_of_exec_overhead_before_the_tool_started() -> None:
    """The fitted exec_before is measured from memload's own timings (`ran`), not assumed
    half: of an exec's 46-50 s with the tool at 47.6-49.6, 1.6 s came before and 0.4 s after.
    Under the daemon its admission wait, which the simulator adds itself, is not overhead; a
    call that ran no tool, or one whose wait is unknown where calls waited, is left out; a
    file without timings falls back to the measured runs' median."""
    tasks = {"t0": _task(0)}
    run = _run(False, None)
    run["calls"][0]["ran"] = {"start": 47.6, "full": 48.0, "left": 49.5, "end": 49.6}
    assert exec_split({"runs": [run]}, "runc") == pytest.approx((1.6, 2.0))
    assert fit_pooled([({"runs": [run]}, tasks)])["runc"].exec_before == pytest.approx(0.8)
    waited = _run(True, {"waited_s": 0.0})
    waited["metrics"] = {"admission_wait_max_s": 5.0}
    waited["calls"][0].update(ran={"start": 47.6, "end": 49.6}, daemon={"waited_s": 1.0})
    assert exec_split({"runs": [waited]}, "execgate") == pytest.approx((0.6, 1.0))
    del waited["calls"][0]["daemon"]
    killed = _run(False, None)
    killed["calls"][0].update(exit=137, ran=None)
    assert exec_split({"runs": [waited, killed]}, "execgate") == (0.0, 0.0)
    assert exec_split({"runs": [waited, killed]}, "runc") == (0.0, 0.0)
    assert fit_pooled([({"runs": [_run(False, None)]}, tasks)])["runc"].exec_before == \
        UNMEASURED_EXEC_BEFORE


def test_execgate_gets_its_own_shape_where_its_points_cover_enough_loads() -> None:
    """A 602adcf burst: runc's execs jump at n = 16, execgate's cost ~20 s at every n from 9
    to 16. runc's shape times a ratio made execgate's 4-5 s below 16 (its burst simulated 35 %
    fast); its own shape, fitted to its mean at each n (dozens of points at 16 do not outweigh
    the few below), gives ~20 s there."""
    runc = [(n, 16.0) for n in (4, 6, 7, 11, 13, 15) for _ in range(2)] + [(16, 87.0)] * 32
    eg = [(n, 20.0 + (n % 2)) for n in range(9, 16)] + [(16, 18.0)] * 28
    base, own = fit_level(runc, eg)
    assert base(12) == pytest.approx(16.0, abs=1) and base(16) == pytest.approx(87.0, abs=1)
    assert 18 <= own(10) <= 22 and 18 <= own(12) <= 22 and 16 <= own(16) <= 20
    # few loads of its own (a burst's execgate runs at one n): runc's shape times a ratio
    _, ratio = fit_level(runc, [(16, 40.0)] * 10)
    assert ratio(16) == pytest.approx(40.0, abs=1) and ratio(12) < 10


def test_operations_replanned_as_n_changes_wake_in_task_order() -> None:
    """When n changes, every operation in flight is re-planned; they were woken in the order of
    a set of task states (memory addresses), so ties went either way from run to run (one
    fleet boot simulated 283 or 290 s). Now in task order, whatever the container's order."""
    sim = Simulation(SCHEMES["eager"], [_task(i) for i in range(3)], [0.0, 0.0, 0.0], 400 * MiB,
                     SimSettings(cost=replace(fixed(0.0, 0.0, 0.0),
                                              run=Fit(1.0, b2=1.0, k=0, hi=10))))
    woken: list[str] = []
    sim._wake = lambda st, at, value=None: woken.append(st.task.id)  # type: ignore[method-assign]
    for st in sim.states:
        st.op = ("run", 1.0, 0.0)
    sim.in_op = list(reversed(sim.states))  # type: ignore[assignment]
    sim._set_live(+1)
    assert woken == ["t0", "t1", "t2"]
