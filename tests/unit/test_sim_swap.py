"""The simulator's swap of running calls (bench/sim/memory.py): a cold call's pages leave for
free, a hot call's come back every period at the swap-in bandwidth (refaults, slower progress),
and reclaim takes cold memory before the pages of a call that reads them. Pure, milliseconds."""

from __future__ import annotations

import pytest

from bench.schemes import SCHEMES
from bench.sim.cost import fixed
from bench.sim.memory import SWAP_IN_OVER_OUT, Domain, MemoryConfig, SimBox, SimCall
from bench.sim.run import SimSettings, Simulation
from bench.trace import LlmWait, MemoryProfile, Task, ToolCall
from execgate.common.units import MiB

PLATEAU = MemoryProfile(80 * MiB, 80 * MiB, "plateau", 0.0, 0.0, 0)


def _domain(budget_mib: float, out_mib_s: float = 1024, in_mib_s: float | None = None,
            call_cgroups: bool = True) -> Domain:
    cfg = MemoryConfig(swap=True, zram=True, swap_bandwidth_bps=out_mib_s * MiB,
                       swap_in_bandwidth_bps=None if in_mib_s is None else in_mib_s * MiB)
    return Domain(int(budget_mib * MiB), cfg, call_cgroups=call_cgroups)


def _call(domain: Domain, box: SimBox, hot: bool, duration: float = 10.0,
          profile: MemoryProfile = PLATEAU, at: float = 0.0) -> SimCall:
    call = SimCall(f"{box.id}/1", box, profile, duration, 0, started=at, last=at, hot=hot)
    domain.start_call(call)
    return call


def _periods(domain: Domain, ticks: int, dt: float = 0.1, t0: float = 0.0) -> tuple[float, list]:
    """`ticks` periods from t0: the time reached, and the OOM kills on the way."""
    t, kills = t0, []
    for _ in range(ticks):
        t += dt
        domain.advance(t, dt)
        kills += domain.enforce(t, dt)
        domain.end_period(dt)
    return t, kills


def _run(domain: Domain, ticks: int, dt: float = 0.1, t0: float = 0.0) -> float:
    t, kills = _periods(domain, ticks, dt, t0)
    assert not kills
    return t


def test_swap_in_defaults_to_the_vms_ratio() -> None:
    cfg = MemoryConfig(swap=True, swap_bandwidth_bps=5 * MiB)
    assert cfg.swap_in_bps == pytest.approx(SWAP_IN_OVER_OUT * 5 * MiB)
    assert 5 < SWAP_IN_OVER_OUT < 6  # ~27 MB/s in against ~5 MB/s out under TCG
    with pytest.raises(ValueError):
        MemoryConfig(swap_in_bandwidth_bps=0.0)


def test_a_cold_call_goes_to_swap_under_the_limit_and_never_refaults() -> None:
    """memload without --hot writes each page once: the kernel swaps the call out under
    itself, the call never waits and nothing comes back. Under runc the call shares its
    sandbox's memcg, whose oldest pages (the baseline) go first."""
    domain = _domain(50, call_cgroups=False)
    box = SimBox("a", 10 * MiB)
    domain.add_box(box)
    call = _call(domain, box, hot=False)
    _run(domain, 20)
    assert box.swapped == 10 * MiB
    assert call.swapped == pytest.approx(30 * MiB, abs=1)  # 80 of it, 50 resident
    assert domain.usage() <= domain.budget + 1
    assert domain.refault_bytes == 0 and call.lag == 0 and domain.stall_s == 0
    assert call.end_at() == 10.0


def test_a_hot_calls_swapped_bytes_come_back_each_period_at_the_swap_in_bandwidth() -> None:
    """With room free, a hot call's pass brings its swapped pages back at the swap-in
    bandwidth; the wait is taken off its progress and counted as refaults and PSI stall."""
    domain = _domain(200, out_mib_s=5, in_mib_s=20)
    box = SimBox("a", 0)
    domain.add_box(box)
    call = _call(domain, box, hot=True, profile=MemoryProfile(0, 80 * MiB, "ramp", 1.0, 0, 0))
    domain.advance(1.0, 0.1)  # ramped to ~8 MiB by t = 1 s
    level = call.level
    call.swapped, domain.call_swapped = 1 * MiB, 1 * MiB  # as if reclaim had taken 1 MiB
    domain.advance(1.1, 0.1)
    assert call.swapped == 0 and domain.refault_bytes == pytest.approx(1 * MiB)
    assert call.lag == pytest.approx(1 / 20)  # 1 MiB at 20 MiB/s
    assert domain.stall_s == pytest.approx(1 / 20)
    # its trace advanced 0.05 s of the 0.1: the ramp grew half as much as a free period's
    assert call.level - level == pytest.approx(0.05 * 8 * MiB, rel=0.02)
    # More than a period's worth: it brings back what the period allows and does not advance.
    call.swapped, domain.call_swapped = 5 * MiB, 5 * MiB
    level = call.level
    domain.advance(1.2, 0.1)
    assert call.swapped == pytest.approx(3 * MiB)  # 2 MiB came back (20 MiB/s x 0.1 s)
    assert call.level == pytest.approx(level) and call.lag == pytest.approx(0.15)
    assert domain.refault_bytes == pytest.approx(3 * MiB)


def test_a_hot_call_at_the_limit_thrashes_and_slows() -> None:
    """Hot pages beyond the limit go out and come straight back every period: refaults add
    up, the call's trace falls behind its clock and it ends later (a cold one does not)."""
    ends = {}
    for hot in (False, True):
        domain = _domain(50, out_mib_s=5, in_mib_s=27)
        box = SimBox("a", 0)
        domain.add_box(box)
        call = _call(domain, box, hot=hot)
        _run(domain, 50)
        ends[hot] = call.end_at()
        if hot:
            # each page in waits for one out: ~1/(1/27 + 1/5) = 4.2 MiB/s of refaults
            assert 15 * MiB < domain.refault_bytes < 5 * 4.3 * MiB and call.lag > 2.0
            assert domain.stall_s > 2.0 and domain.psi_some_avg10 > 10
        else:
            assert domain.refault_bytes == 0 and call.lag == 0
    assert ends[True] > ends[False] + 2.0


def test_hot_calls_whose_working_sets_outgrow_memory_still_finish() -> None:
    """Three hot calls of 40 MiB in 50 MiB: swap-in serves the oldest first, so each pass ends
    and each call runs out its 2 s. Shared in proportion, every pass was pushed out again
    before it ended and none finished in 300 s (a simulated poisson-hot boot ran 560x long)."""
    domain = _domain(50, out_mib_s=5, in_mib_s=27)
    flat = MemoryProfile(40 * MiB, 40 * MiB, "plateau", 0.0, 0.0, 0)
    calls = []
    for name in "abc":
        box = SimBox(name, 0)
        domain.add_box(box)
        calls.append(_call(domain, box, hot=True, duration=2.0, profile=flat))
    t = 0.0
    while t < 300 and domain.running:
        t += 0.1
        domain.advance(t, 0.1)
        domain.enforce(t, 0.1)
        domain.end_period(0.1)
        for c in [c for c in calls if c.end_at() <= t and c.id in domain.running]:
            domain.end_call(c)
    assert not domain.running and t < 30
    assert calls[0].end_at() < calls[-1].end_at()  # the oldest is served first


def test_reclaim_takes_an_idle_baseline_before_a_hot_call() -> None:
    domain = _domain(100, out_mib_s=10)
    idle = SimBox("idle", 40 * MiB)
    busy = SimBox("busy", 0)
    domain.add_box(idle)
    domain.add_box(busy)
    call = _call(domain, busy, hot=True)
    _run(domain, 30)  # 20 MiB over: the idle baseline covers it
    assert idle.swapped == pytest.approx(20 * MiB, abs=1 * MiB)
    assert call.swapped == 0 and domain.refault_bytes == 0


@pytest.mark.parametrize("call_cgroups", [True, False])
def test_reclaim_takes_a_cold_call_before_a_hot_one(call_cgroups: bool) -> None:
    """Under runc a call shares its sandbox's memcg, under execgate it has its own: either
    way a hot call keeps its pages while a cold one can give them."""
    domain = _domain(150, call_cgroups=call_cgroups)
    a, b = SimBox("a", 0), SimBox("b", 0)
    domain.add_box(a)
    domain.add_box(b)
    cold = _call(domain, a, hot=False)
    hot = _call(domain, b, hot=True)
    _run(domain, 5)
    assert cold.swapped == pytest.approx(10 * MiB, abs=1) and hot.swapped == 0


def test_cold_memory_is_reclaimed_from_every_memcg_in_proportion() -> None:
    """Reclaim at the domain's limit walks every memcg under it and each gives in proportion
    to its size (not the single longest-idle sandbox first)."""
    domain = _domain(100, out_mib_s=1024)
    a, b = SimBox("a", 60 * MiB), SimBox("b", 30 * MiB)
    domain.add_box(a)
    domain.add_box(b)
    domain.add_box(SimBox("c", 40 * MiB))  # 130 of 100: 30 over
    _run(domain, 1)
    assert a.swapped / b.swapped == pytest.approx(2.0, rel=0.01)


def _task(i: int) -> Task:
    steps: list[LlmWait | ToolCall] = [
        LlmWait(0.2), ToolCall("make test", 10.0, MemoryProfile(60 * MiB, 60 * MiB, "plateau",
                                                                0.0, 0.0, 0))]
    return Task(f"t{i}", steps, 10 * MiB)


def test_hot_calls_in_a_simulation_refault_and_finish_later() -> None:
    """The run loop: with --hot-calls the calls that do not fit beside each other refault and
    end later; cold, the same calls swap out for free."""
    res = {}
    for hot in (False, True):
        mem = MemoryConfig(swap=True, zram=True, swap_bandwidth_bps=50 * MiB)
        s = SimSettings(cost=fixed(0.1, 0.05, 0.1), memory=mem, hot_calls=hot)
        sim = Simulation(SCHEMES["eager"], [_task(i) for i in range(3)], [0.0, 0.0, 0.0],
                         120 * MiB, s)
        res[hot] = sim.run()["metrics"]
    assert res[False]["refault_bytes"] == 0 and res[False]["tasks_completed"] == 3
    assert res[True]["refault_bytes"] > 0 and res[True]["stall_s"] > res[False]["stall_s"]
    assert res[True]["tasks_completed"] == 3
    assert res[True]["makespan_s"] > res[False]["makespan_s"] + 1.0


def test_a_hot_call_stuck_on_swap_in_loses_its_pages_before_one_that_runs() -> None:
    """Once nothing cold is left, the hot call that last read all its pages longest ago (one
    still waiting for swap-in) gives first: thrash piles on the calls already behind."""
    domain = _domain(100, in_mib_s=1)
    a, b = SimBox("a", 0), SimBox("b", 0)
    domain.add_box(a)
    domain.add_box(b)
    flat = MemoryProfile(40 * MiB, 40 * MiB, "plateau", 0.0, 0.0, 0)
    stuck = _call(domain, a, hot=True, profile=flat)
    runs = _call(domain, b, hot=True, profile=flat)
    t = _run(domain, 1)
    stuck.swapped, domain.call_swapped = 10 * MiB, 10 * MiB  # 10 s of swap-in at 1 MiB/s
    runs.profile = MemoryProfile(80 * MiB, 80 * MiB, "plateau", 0.0, 0.0, 0)  # 10 MiB over
    domain.advance(t + 0.1, 0.1)
    assert stuck.owed > 0 and stuck.touched < runs.touched
    assert not domain.enforce(t + 0.1, 0.1)
    assert stuck.swapped > 10 * MiB and runs.swapped == 0


def test_hot_protection_zero_takes_hot_pages_beside_cold_ones() -> None:
    """hot_protection < 1: a hot call gives part of its proportional share even while cold
    pages are left (1, the default: only once none is)."""
    for protection, hot_gives in ((1.0, False), (0.0, True)):
        cfg = MemoryConfig(swap=True, zram=True, swap_bandwidth_bps=1024 * MiB,
                           hot_protection=protection)
        domain = Domain(100 * MiB, cfg, call_cgroups=True)
        idle = SimBox("idle", 50 * MiB)
        busy = SimBox("busy", 0)
        domain.add_box(idle)
        domain.add_box(busy)
        call = _call(domain, busy, hot=True)  # 130 of 100
        _run(domain, 1)
        assert (call.swapped > 0) is hot_gives and idle.swapped > 0
    with pytest.raises(ValueError):
        MemoryConfig(hot_protection=1.5)


def _plateau_call(domain: Domain, name: str, mib: float, at: float = 0.0) -> SimCall:
    box = SimBox(name, 0)
    domain.add_box(box)
    profile = MemoryProfile(int(mib * MiB), int(mib * MiB), "plateau", 0.0, 0.0, 0)
    return _call(domain, box, hot=False, duration=100.0, profile=profile, at=at)


def test_a_kill_frees_swap_for_the_charges_that_wait() -> None:
    """The kernel kills for one charge at a time: the victim's swap slots free, the other
    charges wait on reclaim again. The simulator killed on until the period's whole growth fit
    (14 calls in one period at the 15x burst, 139 kills against the VM's 69)."""
    cfg = MemoryConfig(swap=True, zram=True, swap_bandwidth_bps=5 * MiB,
                       swap_max_bytes=70 * MiB)
    domain = Domain(100 * MiB, cfg)
    idle = SimBox("idle", 80 * MiB)
    domain.add_box(idle)
    domain.reclaim("idle", 70 * MiB)
    domain.step_reclaim(20.0)
    assert idle.swapped == 70 * MiB  # swap full
    x, y = _plateau_call(domain, "x", 60), _plateau_call(domain, "y", 60)
    _, kills = _periods(domain, 50)
    assert [(k.box, k.call) for k in kills] == [("idle", None)]  # the largest, and only it
    assert x.level == y.level == 60 * MiB and domain.usage() <= domain.budget + 1


def test_swap_full_but_for_a_residue_is_full() -> None:
    """Swap within a float's residue of swap.max has no room: the growing calls met the OOM
    killer, where they stalled on reclaim for ever (a livelock: nothing moved, nothing died)."""
    cfg = MemoryConfig(swap=True, zram=True, swap_bandwidth_bps=5 * MiB,
                       swap_max_bytes=60 * MiB)
    domain = Domain(100 * MiB, cfg)
    _plateau_call(domain, "v", 70)
    x, y = _plateau_call(domain, "x", 60, at=1.0), _plateau_call(domain, "y", 60, at=1.0)
    _, kills = _periods(domain, 400)
    assert [k.call for k in kills] == ["v/1"]
    assert x.level == y.level == 60 * MiB


def test_a_sandbox_arriving_in_a_full_domain_writes_its_baseline_as_swap_out_allows() -> None:
    """memload's init writes its baseline as fast as reclaim gives it pages: into a full domain
    at 5 MiB/s of swap-out, 30 MiB over the limit take 6 s, with the init waiting (PSI), and it
    counts as the OOM killer's candidate only for what it has written. Swapped out at once
    beyond the bandwidth, a burst of 27 sandboxes filled the VM's 1 GiB of zram in one period
    and the simulator killed the calls that followed (the 15x burst, eager+swap)."""
    domain = _domain(50, out_mib_s=5)
    old, new = SimBox("old", 40 * MiB), SimBox("new", 40 * MiB)
    domain.add_box(old)
    t = _run(domain, 5)
    domain.add_box(new)
    t = _run(domain, 10, t0=t)  # 1 s: 5 MiB out, 5 more of the new baseline in
    assert domain.swap_used() == pytest.approx(5 * MiB, rel=0.15)
    assert new.pending == pytest.approx(25 * MiB, rel=0.05)
    assert domain.usage() == pytest.approx(domain.budget, abs=1)  # full, not over, not less
    assert domain.stall_s == pytest.approx(1.0, abs=0.11)
    victim = domain._victim()
    assert victim is not None and victim[1] is old  # 40 MiB written against ~15
    _run(domain, 60, t0=t)
    assert new.pending == 0 and domain.swap_used() == pytest.approx(30 * MiB, abs=1)
    assert 5.5 < domain.stall_s < 7.0


def test_inits_and_a_call_waiting_together_keep_the_accounts_whole() -> None:
    """Two sandboxes arriving beside a growing call, in 10 MiB: what each gives back to direct
    reclaim leaves its own account (the call's level, the inits' baselines), never below what
    is resident; the domain stays full until the baselines are written and out."""
    domain = _domain(10, out_mib_s=5)
    a, b, host = SimBox("a", 40 * MiB), SimBox("b", 40 * MiB), SimBox("host", 0)
    for box in (a, b, host):
        domain.add_box(box)
    ramp = MemoryProfile(0, 20 * MiB, "ramp", 1.0, 0, 0)
    call = _call(domain, host, hot=False, duration=100.0, profile=ramp)
    t = 0.0
    for _ in range(30):
        t, kills = _periods(domain, 1, t0=t)
        assert not kills
        assert domain.usage() == pytest.approx(domain.budget, abs=1)
        assert min(a.anon, b.anon, call.resident) >= 0
        assert domain.levels == pytest.approx(call.charge)
    assert a.pending > 0 and b.pending > 0  # 3 s at 5 MiB/s: most of 80 MiB still to write
