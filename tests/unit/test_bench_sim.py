"""The policy simulator (bench/sim): invariants of the memory model and the run loop on a few
small tasks, the execgate scheme through the real Admission, the cost fit, and the validation
command on the committed VM results. Seconds in all."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.schemes import SCHEMES, bench_config, static_scheme
from bench.sim import __main__ as cli
from bench.sim import memory as simmem
from bench.sim.cost import fit, fixed
from bench.sim.run import SimSettings, Simulation, simulate
from bench.trace import LlmWait, MemoryProfile, Task, ToolCall
from execgate.common.units import MiB
from execgate.policy import admission as policy_admission

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "replay" / "sweep" / "results.json.gz"


def _task(i: int, baseline_mib: float = 20, peak_mib: float = 50, calls: int = 2) -> Task:
    steps: list[LlmWait | ToolCall] = []
    for k in range(calls):
        peak = int(peak_mib * MiB)
        steps.append(LlmWait(0.5))
        steps.append(ToolCall("python -m pytest -q", 2.0 + k,
                              MemoryProfile(peak // 4, peak, "ramp", 0.5, 0.5, min(2 * MiB, peak))))
    steps.append(LlmWait(0.3))
    return Task(f"t{i}", steps, int(baseline_mib * MiB))


TASKS = [_task(i) for i in range(4)]
ARRIVALS = [0.0, 0.2, 0.4, 0.6]
SETTINGS = SimSettings(cost=fixed(0.5, 0.1, 0.2))


def _sim(scheme_name: str, budget: int, tasks: list[Task] = TASKS,
         settings: SimSettings = SETTINGS) -> tuple[Simulation, dict]:
    scheme = SCHEMES[scheme_name] if scheme_name in SCHEMES else static_scheme(2)
    cfg = bench_config({}, scheme, domain="/sim") if scheme.daemon else None
    sim = Simulation(scheme, tasks, ARRIVALS[: len(tasks)], budget, settings, cfg)
    return sim, sim.run()


def _ended(result: dict, n_tasks: int, retry_limit: int = 5) -> None:
    """Every task ended done, or failed with its retries used up."""
    by: dict[str, list[dict]] = {}
    for a in result["attempts"]:
        by.setdefault(a["task_id"], []).append(a)
    assert len(by) == n_tasks
    for atts in by.values():
        atts.sort(key=lambda a: a["attempt"])
        assert all(not a["ok"] for a in atts[:-1])
        assert atts[-1]["ok"] or len(atts) == retry_limit + 1
        assert all(a["end"] >= a["start"] for a in atts)


def test_huge_budget_eager_has_no_oom_and_finishes_everything() -> None:
    _, r = _sim("eager", 64 << 30)
    m = r["metrics"]
    assert m["oom_kills"] == 0 and m["kernel_oom_kills"] == 0
    assert m["tasks_completed"] == 4 and m["attempts"] == 4
    _ended(r, 4)
    # Makespan: at least the longest task's own time plus its control-plane costs.
    assert m["makespan_s"] >= TASKS[0].duration_s + 0.5 + 4 * 0.1


def test_budget_below_one_sandbox_and_its_peak_forces_ooms_under_eager() -> None:
    budget = 20 * MiB + 40 * MiB  # < baseline 20 + call peak 50
    sim, r = _sim("eager", budget, [_task(0)])
    assert r["metrics"]["oom_kills"] > 0
    assert r["metrics"]["tasks_completed"] == 0
    _ended(r, 1)
    assert all(k.usage > budget for k in sim.domain.kills)  # each at the limit


def test_memory_never_exceeds_the_budget_without_an_oom_kill(monkeypatch) -> None:
    budget = 150 * MiB  # 4 baselines (80) + bursts of 50: eager must kill
    seen: list[tuple[float, int]] = []
    enforce = simmem.Domain.enforce

    def spy(self: simmem.Domain, now: float, dt: float) -> list[simmem.Kill]:
        over = self.usage() > self.budget + simmem.SLACK
        kills = enforce(self, now, dt)
        assert self.usage() <= self.budget + 1  # after the kernel acted
        if over:
            assert kills  # over the limit: someone was killed (no swap to push to)
            seen.append((now, len(kills)))
        return kills

    monkeypatch.setattr(simmem.Domain, "enforce", spy)
    for name in ("eager", "static-2", "reserve", "execgate"):
        _, r = _sim(name, budget)
        _ended(r, 4)
        assert r["metrics"]["mem_peak_bytes"] <= budget + 1  # what the samples saw
    assert seen  # eager at least went over


def test_sandbox_init_can_be_the_victim() -> None:
    # Baselines alone above the budget, calls tiny: only inits can be chosen.
    tasks = [_task(i, baseline_mib=60, peak_mib=1, calls=1) for i in range(3)]
    sim, r = _sim("eager", 100 * MiB, tasks)
    assert sim.domain.kills and all(k.call is None for k in sim.domain.kills)
    assert r["metrics"]["init_oom_kills"] > 0
    assert any(a["reason"] == "sandbox-oom" for a in r["attempts"])


def test_execgate_goes_through_the_real_admission(monkeypatch) -> None:
    calls = {"submit": 0, "step": 0, "release": 0}
    for name in calls:
        orig = getattr(policy_admission.Admission, name)

        def wrapped(self, *a, _orig=orig, _name=name, **k):  # type: ignore[no-untyped-def]
            calls[_name] += 1
            return _orig(self, *a, **k)

        monkeypatch.setattr(policy_admission.Admission, name, wrapped)
    sim, r = _sim("execgate", 150 * MiB)
    assert isinstance(sim.hands.admission, policy_admission.Admission)
    assert calls["submit"] == r["metrics"]["tool_calls"] >= 4
    assert calls["step"] > calls["submit"] and calls["release"] >= 4
    assert r["daemon"]["admitted"] >= 4
    _ended(r, 4)


def test_compressed_swap_turns_kills_into_swap_out() -> None:
    tasks = [_task(i, baseline_mib=60, peak_mib=1, calls=1) for i in range(3)]
    on = SimSettings(cost=fixed(0.5, 0.1, 0.2),
                     memory=simmem.MemoryConfig(swap=True, swap_ratio=4.0,
                                                swap_bandwidth_bps=1 << 40))
    sim, r = _sim("eager", 100 * MiB, tasks, on)
    assert r["metrics"]["oom_kills"] == 0 and sim.domain.swap_out_bytes > 0


def test_cost_fit_recovers_a_hinge() -> None:
    pts = [(n, 5.0 + 10.0 * min(max(n - 3, 0), 6)) for n in range(1, 15) for _ in range(3)]
    f = fit(pts)
    assert (f.k, f.hi) == (3, 9)
    assert f.a == pytest.approx(5.0) and f.b2 == pytest.approx(10.0) and f.rmse < 1e-6
    assert f(1) == pytest.approx(5.0) and f(20) == pytest.approx(65.0)


def test_rate_model_slows_an_operation_when_sandboxes_join() -> None:
    from bench.sim.cost import CostModel, Fit

    slow = CostModel(Fit(1.0, b2=1.0, k=1, hi=10), Fit(0.0), Fit(0.0))
    alone = simulate(SCHEMES["eager"], TASKS[:1], [0.0], 64 << 30, SimSettings(cost=slow))
    crowd = simulate(SCHEMES["eager"], TASKS, [0.0] * 4, 64 << 30, SimSettings(cost=slow))
    assert crowd["metrics"]["makespan_s"] > alone["metrics"]["makespan_s"] + 2


def test_a_cost_seed_draws_each_operation_around_its_fit() -> None:
    """Seeded runs spread around the fit (the same seed, the same run); no seed, or a fit with
    no residual, costs exactly the fit."""
    from dataclasses import replace

    from bench.sim.cost import CostModel, Fit

    noisy = CostModel(Fit(2.0, n_points=9, rmse=1.0, mean_y=2.0), Fit(0.5), Fit(1.0))

    def span(settings: SimSettings, tasks: list[Task] = TASKS[:1]) -> float:
        """One task by default: its ops in a row, no max over tasks."""
        return simulate(SCHEMES["eager"], tasks, ARRIVALS[: len(tasks)], 64 << 30,
                        settings)["metrics"]["makespan_s"]

    spans = [span(SimSettings(cost=noisy, cost_seed=seed)) for seed in range(10)]
    again = span(SimSettings(cost=noisy, cost_seed=0))
    plain = span(SimSettings(cost=noisy))
    assert again == spans[0] and len(set(spans)) > 1
    assert min(spans) < plain < max(spans)
    exact = replace(noisy, run=Fit(2.0))  # no residual: nothing to draw from
    assert {span(SimSettings(cost=exact, cost_seed=s), TASKS) for s in range(3)} == {
        span(SimSettings(cost=exact), TASKS)}


def test_validate_draws_give_each_row_a_range() -> None:
    from bench.sim.validate import summary, table, validate

    small = RESULTS.parents[1] / "sweep-1b705b4" / "repeat-1.json.gz"  # two runs
    res = validate(small, draws=2)
    assert len(res["rows"]) == 2
    assert all(len(r["sim_draws"]["tasks_completed"]) == 2 for r in res["rows"])
    assert all(r["sim_draws"]["makespan_s"] == sorted(r["sim_draws"]["makespan_s"])
               for r in res["rows"])
    lines = table(res["rows"])
    assert "drawn costs" in lines[0] and lines[2].count("|") == lines[0].count("|")
    assert "within the draws' range on" in summary(res["rows"])[-1]


@pytest.mark.skipif(not RESULTS.exists(), reason="no committed VM results")
def test_validate_runs_on_the_committed_results(capsys) -> None:
    assert cli.main(["validate", str(RESULTS)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| x")]
    assert len(rows) == 15  # 5 schemes x 3 points
    assert "static-4" in out and "makespan within 20 %" in out
    assert "run " in out and "R^2" in out  # the cost fit is shown


def test_validate_gives_the_sim_the_swap_the_vm_had() -> None:
    """A burst run with zram (docs/replay/fleet): without its swap the simulator OOM-killed 96
    attempts where the VM had 2. The point's swap, the device's size and the measured ratio go
    to the memory model of the schemes that swap; a swap-off point and plain eager get none."""
    from bench.sim.validate import VM_SWAP_OUT_BPS, memory_of

    results = {"params": {"zram_size_bytes": 1 << 30, "workload": {"fill_ratio": 3.0}}}
    run = {"scheme": "eager+swap", "swap": {"zram_peak": {"orig_bytes": 900 * MiB,
                                                          "compr_bytes": 300 * MiB}}}
    mem = memory_of(results, run, {"swap": "on"})
    assert mem.swap and mem.zram and mem.swap_max_bytes == 1 << 30
    assert mem.swap_ratio == pytest.approx(3.0) and mem.swap_bandwidth_bps == VM_SWAP_OUT_BPS
    assert memory_of(results, {"scheme": "execgate"}, {"swap": "on"}).swap_ratio == 3.0
    assert not memory_of(results, {"scheme": "eager"}, {"swap": "off"}).swap
    assert not memory_of(results, {"scheme": "execgate"}, {}).swap


def test_sandbox_admission_follows_the_daemon_config() -> None:
    """As in the daemon: on for execgate by default, off where the config says so, never for a
    scheme without the daemon; execgate-sandboxadmit forces it on."""
    from bench.sim import schemes as sim_schemes

    def sa(name: str, cfg: dict) -> object:
        scheme = sim_schemes.parse(name)[0]
        return sim_schemes.sandbox_admission(scheme, cfg, 1.0, lambda: 0.0)

    assert sa("execgate", {}) is not None
    assert sa("execgate", {"sandbox_admission": {"enabled": False}}) is None
    assert sa("execgate-nosandboxadmit", bench_config({}, SCHEMES["execgate-nosandboxadmit"],
                                                     domain="/sys/fs/cgroup/x.slice")) is None
    assert sa("eager", {}) is None
    assert sa("execgate-sandboxadmit", {"sandbox_admission": {"enabled": False}}) is not None


def test_incremental_views_match_a_full_rebuild(monkeypatch) -> None:
    """The policy's sandbox views, kept up to date where the memory model or the hands say they
    moved (bench/sim/views.py), equal a rebuild of every view on every read: with swap and
    page cache (reclaims, swap-outs), sandbox admission, OOM kills and retries."""
    from bench.sim import schemes as sim_schemes
    from bench.sim.views import BoxViews

    monkeypatch.setattr(BoxViews, "verify", True)
    reads = 0
    read = BoxViews.read

    def counted(self: BoxViews, now: float) -> list:
        nonlocal reads
        reads += 1
        return read(self, now)

    monkeypatch.setattr(BoxViews, "read", counted)

    def task(i: int) -> Task:  # LLM waits past idle_after_s: idle sandboxes for residency
        peak = (40 + 15 * i) * MiB
        steps: list[LlmWait | ToolCall] = []
        for k in range(3):
            steps.append(LlmWait(25.0 if k else 0.5))
            steps.append(ToolCall("python -m pytest -q", 2.0 + k,
                                  MemoryProfile(peak // 4, peak, "ramp", 0.5, 0.5, 4 * MiB)))
        return Task(f"t{i}", steps, 30 * MiB)

    tasks = [task(i) for i in range(6)]
    scheme = sim_schemes.parse("execgate-sandboxadmit")[0]
    for swap in (False, True):
        mem = simmem.MemoryConfig(swap=swap, cache_fraction=0.5, swap_bandwidth_bps=64 * MiB,
                                  direct_reclaim=False)  # kills at the limit: the OOM paths
        settings = SimSettings(cost=fixed(0.5, 0.1, 0.2), memory=mem)
        cfg = bench_config({}, scheme, domain="/sim")
        # Unlimited swap counted as memory would keep the domain green: no reclaim to check.
        cfg.setdefault("headroom", {})["count_swap"] = False
        # Creates that fail open into a full domain: the OOM paths.
        cfg.setdefault("sandbox_admission", {})["max_start_wait_s_no_deadline"] = 100.0
        r = Simulation(scheme, tasks, [0.1 * i for i in range(6)], 160 * MiB, settings,
                       cfg).run()
        _ended(r, 6)
        d = r["daemon"]
        assert r["metrics"]["oom_kills"] and d["reclaims"] and d["freezes"]
    assert reads > 20


def test_sweep_smoke_every_scheme(tmp_path, capsys) -> None:
    """`python3 -m bench.sim sweep` end to end on 12 of the generator's calibrated tasks: every
    scheme runs (in the worker pool), the table and the JSON carry each, the daemon's schemes
    with the policy's summary."""
    import json

    assert cli.main(["sweep", "--sandboxes", "12", "--budget", "8g", "--jobs", "2",
                     "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "sweep-12.json").read_text())
    names = [r["scheme"] for r in data["runs"]]
    assert {"eager", "reserve", "agentcgroup", "execgate", "execgate-sandboxadmit"} <= set(names)
    for r in data["runs"]:
        assert r["metrics"]["tasks_total"] == 12 and f"| {r['scheme']} |" in out
    daemon = {r["scheme"]: r["daemon"] for r in data["runs"]}
    assert daemon["execgate"]["admitted"] > 0 and daemon["eager"] is None
    shared = {r["scheme"]: r.get("same_as") for r in data["runs"]}
    assert shared["execgate-sandboxadmit"] == "execgate" and shared["execgate"] is None
    assert "wall time:" in out


def test_schemes_with_one_run_key_have_one_result() -> None:
    """A sweep runs a scheme whose fields and config equal an earlier one's once (run_key):
    execgate-sandboxadmit is execgate while the config leaves sandbox admission on, and
    simulated apart the two agree in everything but their names; turned off, they differ."""
    from bench.sim import schemes as sim_schemes

    eg, sa = sim_schemes.parse("execgate,execgate-sandboxadmit")
    cfg = bench_config({}, eg, domain="/sim")
    assert sim_schemes.run_key(eg, cfg) == sim_schemes.run_key(sa, bench_config({}, sa,
                                                                                domain="/sim"))
    off = {**cfg, "sandbox_admission": {"enabled": False}}
    assert sim_schemes.run_key(eg, off) != sim_schemes.run_key(sa, off)
    eager = SCHEMES["eager"]
    assert sim_schemes.run_key(eager, None) != sim_schemes.run_key(static_scheme(2), None)

    def result(scheme: object) -> dict:
        r = Simulation(scheme, TASKS, ARRIVALS, 150 * MiB, SETTINGS, cfg).run()
        return {k: v for k, v in r.items() if k not in ("scheme", "family")}

    assert result(eg) == result(sa)


def test_the_burst_at_15x_with_1_gib_of_zram_ends_without_an_oom_kill(tmp_path) -> None:
    """Issue 15's 15x point (64 of the generator's tasks at once, hardware costs): sandbox
    admission counted each live sandbox's cold pages against the whole free swap, let 56 in
    within 3 s, and the swap filled (22 OOM kills, 326 s); with the room shared out, none."""
    import json

    assert cli.main(["replay", "--cost", "hw", "--out", str(tmp_path), "--name", "x15", "--",
                     "--tasks", "64", "--seed", "13", "--mem-scale", "6", "--cpu-scale", "0",
                     "--oversub", "15", "--swap", "on", "--zram-size", "1g", "--workload",
                     "burst", "--speed", "10", "--admission-wait", "60",
                     "--schemes", "execgate"]) == 0
    (run,) = json.loads((tmp_path / "x15.json").read_text())["runs"]
    m = run["metrics"]
    assert m["oversubscription"] > 14.9 and m["tasks_completed"] == 64
    assert m["oom_kills"] == 0


def test_a_finished_sandbox_teaches_its_init_and_what_its_calls_left() -> None:
    """The policy learns a sandbox's baseline as the daemon measures it (daemon/sandboxes.py):
    what it held outside calls at its largest, its init and the files its calls left in
    /dev/shm. (For two days the daemon measured the init alone while the simulator taught
    both: the simulator's figures at 1,000 sandboxes were not the daemon's.)"""
    from bench.sim import schemes as sim_schemes

    def task(i: int) -> Task:
        peak = 40 * MiB
        steps: list[LlmWait | ToolCall] = [
            LlmWait(0.5),
            ToolCall("pip install x", 2.0,
                     MemoryProfile(peak // 4, peak, "ramp", 0.5, 0.5, 25 * MiB))]
        return Task(f"t{i}", steps, 30 * MiB)

    scheme = sim_schemes.parse("execgate-sandboxadmit")[0]
    sim = Simulation(scheme, [task(i) for i in range(3)], [0.0, 0.1, 0.2], 400 * MiB,
                     SETTINGS, bench_config({}, scheme, domain="/sim"))
    r = sim.run()
    _ended(r, 3)
    assert sim.hands is not None and sim.hands.sandboxes is not None
    model = sim.hands.sandboxes.model
    assert model.mean_baseline("bench") == 55 * MiB  # what they grow to
    assert model.predict("bench").baseline_bytes == 30 * MiB  # what a new one arrives with


def test_a_scheme_the_vm_did_not_run_drops_the_recorded_runs_ablation() -> None:
    """Beside a run of execgate-nolaunchbound, an extra `execgate` kept max_launching = 0 and
    was simulated as that ablation; it now starts from the defaults the run's scheme changed,
    and prefers a run whose scheme changed none."""
    from bench.sim.validate import extra_config

    ablated = {"scheme": "execgate-nolaunchbound",
               "config": {"sandbox_admission": {"max_launching": 0, "settle_s": 30.0}}}
    cfg = extra_config([ablated], "execgate", {}, {})
    assert cfg == {"sandbox_admission": {"settle_s": 30.0}}
    cfg = extra_config([ablated], "execgate-nogrowth", {}, {})
    assert cfg == {"sandbox_admission": {"settle_s": 30.0}, "daemon": {"gate": "off"}}
    plain = {"scheme": "execgate", "config": {"sandbox_admission": {"settle_s": 20.0}}}
    cfg = extra_config([ablated, plain], "execgate-nolaunchbound", {}, {})
    assert cfg == {"sandbox_admission": {"settle_s": 20.0, "max_launching": 0}}
    no_daemon = {"scheme": "execgate-noadmit", "config": {"memory_high_from_hint": False}}
    assert extra_config([no_daemon, plain], "execgate", {}, {}) == plain["config"]
