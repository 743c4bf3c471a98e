"""Unit tests of the growth gate's controller: simulated footprints, a simulated clock, no sleeps.

The simulation steps by 1/8 s instead of the daemon's 100 ms: every time is then exact in binary
floating point, so the D_min / D_max / hold-cap / AIMD boundaries can be asserted to the period.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

import pytest

from execgate.common.units import GiB, MiB
from execgate.policy.growth import (
    CallState,
    GateDecision,
    GrowthConfig,
    GrowthController,
    Reason,
    Sample,
    pick_last_resort_victim,
)
from execgate.policy.pressure import PressureConfig, assess_pressure, effective_margin
from execgate.policy.pressure_state import Pressure

G, Y, R = Pressure.GREEN, Pressure.YELLOW, Pressure.RED
STEP = 0.125
RESERVE = 256 * MiB
BIG = 64 * GiB  # MemAvailable that leaves all the headroom anyone needs


def avail(headroom_mib: float) -> int:
    """MemAvailable that yields the given headroom H (after the 256 MiB reserve)."""
    return RESERVE + int(headroom_mib * MiB)


class FakeClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@dataclass
class Proc:
    """A simulated tool call: grows at `rate` bytes/s and burns CPU only while allowed."""

    cid: str
    memory: int
    rate: float
    started_at: float
    declared: int | None = None
    busy: bool = True
    cpu: int = 0

    def sample(self) -> Sample:
        return Sample(self.cid, self.memory, self.cpu, self.declared, self.started_at)


class Sim:
    def __init__(self, **config: object) -> None:
        self.clock = FakeClock()
        self.ctl = GrowthController(GrowthConfig(**config), self.clock)  # type: ignore[arg-type]
        self.procs: dict[str, Proc] = {}
        self.last: GateDecision | None = None

    def add(self, cid: str, rate_mib: float = 0.0, memory_mib: int = 256,
            started_at: float | None = None, **kw: object) -> Proc:
        t = self.clock() if started_at is None else started_at
        p = Proc(cid, memory_mib * MiB, rate_mib * MiB, t, **kw)  # type: ignore[arg-type]
        self.procs[cid] = p
        return p

    def remove(self, cid: str) -> None:
        del self.procs[cid]

    def step(self, pressure: Pressure = G, mem_available: int = BIG, n: int = 1) -> GateDecision:
        """Let one period pass under the last decision, then sample and decide."""
        for _ in range(n):
            if self.last is not None:
                self.clock.advance(STEP)
                for p in self.procs.values():
                    if self.last.allow.get(p.cid, False):
                        p.memory += round(p.rate * STEP)
                        if p.busy:
                            p.cpu += round(STEP * 1e6)
            samples = [p.sample() for p in self.procs.values()]
            self.last = self.ctl.update(samples, pressure, mem_available)
        assert self.last is not None
        return self.last

    def warm(self) -> GateDecision:
        """Two green periods: every call then has ĝ equal to its simulated rate."""
        self.step(G)
        return self.step(G)


def direct(clock: FakeClock, ctl: GrowthController, points: list[tuple[float, int, int]]):
    """Feed one call (t, memory, cpu) points in green; returns the decisions."""
    out = []
    for t, mem, cpu in points:
        clock.t = t
        out.append(ctl.update([Sample("c", mem, cpu)], G, BIG))
    return out


# -- configuration ---------------------------------------------------------------------------


def test_defaults_are_table_5() -> None:
    c = GrowthConfig()
    assert c.period_s == 0.1
    assert c.ewma_alpha == 0.35
    assert c.growth_threshold_bps == 4 * MiB
    assert c.horizon_s == 1.0
    assert c.boot_demand_bytes == 16 * MiB
    assert GrowthController(c).pressure.safety_margin_bytes == 256 * MiB  # S: [pressure]'s
    assert (c.slots_initial, c.slots_max, c.slots_increase_after_s) == (1, 4, 5.0)
    assert (c.min_deny_s, c.overdue_after_s, c.max_hold_s) == (1.0, 3.0, 20.0)
    assert c.last_resort_after_s == 2.0
    assert c.critical_headroom_bytes == 64 * MiB


@pytest.mark.parametrize(
    "bad",
    [
        {"ewma_alpha": 0.0},
        {"ewma_alpha": 1.5},
        {"max_hold_s": 30.0},  # the sched_ext watchdog ceiling
        {"slots_initial": 5},
        {"slots_initial": 0},
        {"min_deny_s": 4.0},  # D_min > D_max
        {"horizon_s": 0.0},
    ],
)
def test_config_rejects_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        GrowthConfig(**bad)  # type: ignore[arg-type]


# -- growth estimate -------------------------------------------------------------------------


def test_ewma_hand_computed() -> None:
    clock = FakeClock()
    ctl = GrowthController(GrowthConfig(period_s=0.5), clock)  # one sample, one period
    d = direct(
        clock,
        ctl,
        [
            (0.0, 0, 0),
            (0.5, 5 * MiB, 100),  # 10 MiB/s: seeds ĝ
            (1.0, 7 * MiB, 200),  # 4 MiB/s: 0.35*4 + 0.65*10 = 7.9
            (1.5, 6 * MiB, 300),  # -2 MiB/s: 0.35*-2 + 0.65*7.9 = 4.435
            (2.0, 6 * MiB, 400),  # 0: 0.65*4.435 = 2.88275
        ],
    )
    g = [x.calls["c"].growth_bps for x in d]
    assert g[0] is None
    assert g[1] == pytest.approx(10 * MiB)
    assert g[2] == pytest.approx(7.9 * MiB)
    assert g[3] == pytest.approx(4.435 * MiB)
    assert g[4] == pytest.approx(2.88275 * MiB)
    states = [x.calls["c"].state for x in d]
    assert states == [CallState.GROWING] * 4 + [CallState.RESIDENT]
    assert [x.calls["c"].demand_bytes for x in d][1:3] == [10 * MiB, math.ceil(7.9 * MiB)]


def _fed(points: list[tuple[float, int, int, int | None]]) -> list[GateDecision]:
    """One call's (t, memory, cpu, cumulative fault bytes) points in green, 0.5 s apart."""
    clock = FakeClock()
    ctl = GrowthController(GrowthConfig(period_s=0.5), clock)
    out = []
    for t, mem, cpu, faults in points:
        clock.t = t
        out.append(ctl.update([Sample("c", mem, cpu, fault_bytes=faults)], G, BIG))
    return out


def test_a_longer_interval_weighs_as_that_many_periods() -> None:
    """At green the daemon samples every green_period_s, not every period: one 0.5-s sample
    must move ĝ as five 0.1-s samples of the same rate do, or a call that starts to burst
    just before yellow would look slow to the gate."""
    def fed(step: float) -> float:
        clock = FakeClock()
        ctl = GrowthController(GrowthConfig(period_s=0.125), clock)
        mem, cpu, t, out = 0, 0, 0.0, None
        for rate, span in ((2 * MiB, 1.0), (200 * MiB, 1.0)):  # resident, then a burst
            for _ in range(round(span / step)):
                ctl.update([Sample("c", mem, cpu)], G, BIG)
                t += step
                clock.t, mem, cpu = t, mem + int(rate * step), cpu + 1000
            out = ctl.update([Sample("c", mem, cpu)], G, BIG).calls["c"].growth_bps
        assert out is not None
        return out

    assert fed(0.5) == pytest.approx(fed(0.125), rel=1e-6)
    assert fed(0.5) > 150 * MiB


def test_green_is_sampled_every_green_period() -> None:
    clock = FakeClock()
    ctl = GrowthController(GrowthConfig(period_s=0.125, green_period_s=0.5), clock)
    wanted = []
    for i in range(12):
        clock.t = i * STEP
        q = Y if i in (6, 7) else G
        wanted.append(ctl.wants_samples(q))
        if wanted[-1]:
            ctl.update([Sample("c", 0, i)], q, BIG)
    # green at 0, then 0.5 s later; yellow every period; the first green after it at once
    assert [i for i, w in enumerate(wanted) if w] == [0, 4, 6, 7, 8]
    assert GrowthController(GrowthConfig(green_period_s=0), clock).wants_samples(G)


def test_fault_burst_sets_the_rate_at_onset() -> None:
    # Resident for a while, then a burst: the endpoints see +20 MiB in 0.5 s (40 MiB/s; the
    # EWMA moves to 0.35*40 = 14 MiB/s), but 120 MiB were faulted in between (touched and
    # partly freed again): the demand follows the faults at once.
    d = _fed([(0.0, 100 * MiB, 0, 0), (0.5, 100 * MiB, 100, 4 * MiB),
              (1.0, 120 * MiB, 200, 124 * MiB)])
    assert d[1].calls["c"].burst_bps == 0.0  # no growth: the 4 MiB of faults are churn
    assert d[1].calls["c"].state == CallState.RESIDENT
    c = d[2].calls["c"]
    assert c.growth_bps == pytest.approx(14 * MiB)
    assert c.burst_bps == pytest.approx(240 * MiB)
    assert c.state == CallState.GROWING
    assert c.demand_bytes == 240 * MiB  # rate x horizon (1 s), from the faults


def test_faults_without_growth_are_churn() -> None:
    d = _fed([(0.0, 100 * MiB, 0, 0), (0.5, 100 * MiB, 100, 200 * MiB),
              (1.0, 90 * MiB, 200, 400 * MiB)])
    for x in d[1:]:
        assert x.calls["c"].burst_bps == 0.0
    assert d[2].calls["c"].state == CallState.COOLING
    assert d[2].calls["c"].demand_bytes == 0


def test_without_probes_the_memory_samples_decide_alone() -> None:
    with_none = _fed([(0.0, 0, 0, None), (0.5, 5 * MiB, 100, None), (1.0, 7 * MiB, 200, None)])
    assert [x.calls["c"].burst_bps for x in with_none] == [0.0, 0.0, 0.0]
    assert with_none[2].calls["c"].demand_bytes == math.ceil(7.9 * MiB)
    # fewer faults than growth (huge pages, memory charged without a fault each) never lowers ĝ
    slow = _fed([(0.0, 0, 0, 0), (0.5, 5 * MiB, 100, 1 * MiB), (1.0, 7 * MiB, 200, 2 * MiB)])
    assert slow[2].calls["c"].demand_bytes == math.ceil(7.9 * MiB)


def test_faults_of_an_invalid_interval_are_not_evidence() -> None:
    # no CPU time in the second interval: skipped, burst frozen at its last valid value
    d = _fed([(0.0, 0, 0, 0), (0.5, 10 * MiB, 100, 10 * MiB), (1.0, 60 * MiB, 100, 500 * MiB)])
    assert d[1].calls["c"].burst_bps == pytest.approx(20 * MiB)
    assert d[2].calls["c"].burst_bps == pytest.approx(20 * MiB)


def test_first_sample_uses_boot_demand() -> None:
    sim = Sim()
    sim.add("a", rate_mib=0)
    d = sim.step(G).calls["a"]
    assert d.growth_bps is None
    assert d.demand_bytes == 16 * MiB
    assert d.state == CallState.GROWING  # presumed to grow at d_boot / horizon
    d = sim.step(G).calls["a"]  # first valid sample: the boot presumption is gone
    assert d.growth_bps == 0.0
    assert d.demand_bytes == 0
    assert d.state == CallState.RESIDENT


def test_boot_demand_is_headroom_checked() -> None:
    sim = Sim()
    sim.add("new")
    assert sim.step(Y, avail(16)).calls["new"].reason == Reason.ADMITTED
    sim2 = Sim()
    sim2.add("new")
    assert sim2.step(Y, avail(15)).calls["new"].reason == Reason.NO_HEADROOM


def test_interval_without_cpu_is_skipped_and_rebases() -> None:
    clock = FakeClock()
    ctl = GrowthController(GrowthConfig(period_s=1.0), clock)
    d = direct(
        clock,
        ctl,
        [
            (0.0, 0, 0),
            (1.0, 10 * MiB, 50),  # 10 MiB/s
            (2.0, 30 * MiB, 50),  # no CPU: skipped (a +20 MiB step that isn't growth)
            (3.0, 34 * MiB, 60),  # measured from the skipped sample: 4 MiB/s
        ],
    )
    assert d[2].calls["c"].growth_bps == pytest.approx(10 * MiB)
    assert d[3].calls["c"].growth_bps == pytest.approx((0.35 * 4 + 0.65 * 10) * MiB)
    snap = ctl.snapshot()["calls"]["c"]  # type: ignore[index]
    assert (snap["valid_samples"], snap["invalid_samples"]) == (2, 1)


def test_interval_after_permission_change_is_skipped() -> None:
    clock = FakeClock()
    ctl = GrowthController(GrowthConfig(period_s=1.0), clock)

    def at(t: float, mem_mib: float, cpu: int, q: Pressure, h_mib: float = 0):
        clock.t = t
        return ctl.update([Sample("c", int(mem_mib * MiB), cpu)], q, avail(h_mib)).calls["c"]

    at(0.0, 0, 0, G)
    assert at(1.0, 10, 10, G).growth_bps == pytest.approx(10 * MiB)
    d = at(2.0, 20, 20, R)  # valid (10 MiB/s); red with H = 0: denied -> permission flips
    assert not d.allow and d.state == CallState.PAUSED_GROWING
    # CPU still advanced (parking took effect late) and memory jumped: the flip makes it invalid.
    d = at(3.0, 50, 30, R)
    assert d.growth_bps == pytest.approx(10 * MiB)
    # No flip at 3.0, but denied: what CPU a held call gets (entering the freezer, finishing a
    # slice) says nothing about its growth, so ĝ stays frozen.
    d = at(4.0, 52, 40, R)
    assert d.growth_bps == pytest.approx(10 * MiB) and d.state == CallState.PAUSED_GROWING
    d = at(5.0, 53, 50, G)  # green: allowed -> flips back
    assert d.allow and d.growth_bps == pytest.approx(10 * MiB)
    assert at(5.25, 90, 60, G).growth_bps == d.growth_bps  # the catch-up burst is skipped
    assert at(5.5, 91, 70, G).growth_bps == d.growth_bps  # ... for catchup_s after the flip
    d = at(6.5, 93, 80, G)  # valid again: 2 MiB/s
    assert d.growth_bps == pytest.approx((0.35 * 2 + 0.65 * 10) * MiB)


def test_first_decision_deny_counts_as_permission_change() -> None:
    """New cgroups start allowed (not in the deny map), so a first deny is a flip."""
    clock = FakeClock()
    ctl = GrowthController(GrowthConfig(), clock)
    ctl.update([Sample("c", 0, 0)], R, avail(0))
    clock.t = 1.0
    d = ctl.update([Sample("c", 8 * MiB, 5)], R, avail(0)).calls["c"]
    assert d.growth_bps is None


@pytest.mark.parametrize(
    ("rate_mib", "state"),
    [
        (8, CallState.GROWING),
        (4.5, CallState.GROWING),
        (4, CallState.RESIDENT),  # |ĝ| <= 4 MiB/s is resident, boundary included
        (0, CallState.RESIDENT),
        (-4, CallState.RESIDENT),
        (-4.5, CallState.COOLING),
        (-16, CallState.COOLING),
    ],
)
def test_state_classification(rate_mib: float, state: CallState) -> None:
    sim = Sim()
    sim.add("c", rate_mib=rate_mib)
    d = sim.warm().calls["c"]
    assert d.growth_bps == pytest.approx(rate_mib * MiB)
    assert d.state == state
    assert d.demand_bytes == max(round(rate_mib * MiB), 0)


def test_paused_growing_while_denied_then_growing_again() -> None:
    sim = Sim()
    sim.add("g", rate_mib=16)
    sim.warm()
    for _ in range(12):  # frozen ĝ while parked: stays paused, not resident
        d = sim.step(R, avail(0)).calls["g"]
        assert not d.allow
        assert d.state == CallState.PAUSED_GROWING
        assert d.growth_bps == pytest.approx(16 * MiB)
    d = sim.step(G).calls["g"]
    assert d.allow and d.state == CallState.GROWING


# -- green / yellow / red --------------------------------------------------------------------


def test_green_allows_everything_even_just_denied() -> None:
    sim = Sim()
    sim.add("a", rate_mib=64)
    sim.add("b", rate_mib=128)
    sim.add("r", rate_mib=0)
    sim.warm()
    assert not sim.step(R, avail(0)).allow["a"]
    d = sim.step(G, avail(0))  # 1/8 s after the deny: green overrides D_min
    assert d.allow == {"a": True, "b": True, "r": True}
    assert {c.reason for c in d.calls.values()} == {Reason.GREEN}
    assert d.slot_limit is None


def test_yellow_slot_limit_b() -> None:
    """b slots for the running growers, oldest first: the newest ones are paused."""
    sim = Sim()
    for cid, rate, started in [("a", 24, -1.0), ("b", 8, -3.0), ("c", 16, -2.0)]:
        sim.add(cid, rate_mib=rate, started_at=started)
    sim.add("r", rate_mib=1)
    sim.add("cool", rate_mib=-32, memory_mib=1024)
    sim.warm()
    d = sim.step(Y)
    assert d.slots == 1 and d.slot_limit == 1
    assert d.allow == {"a": False, "b": True, "c": False, "r": True, "cool": True}
    assert d.calls["b"].reason == Reason.ADMITTED
    assert d.calls["a"].reason == d.calls["c"].reason == Reason.NO_SLOT
    assert d.calls["r"].reason == d.calls["cool"].reason == Reason.ZERO_DEMAND


def test_yellow_aggregate_demand_within_headroom() -> None:
    sim = Sim(slots_initial=4)
    for cid, rate in [("a", 8), ("b", 16), ("c", 24)]:
        sim.add(cid, rate_mib=rate)
    d = sim.step(Y)  # first observation: nothing to compare with, so no halving
    assert d.slots == 4 and all(d.allow.values())  # 3 * d_boot fits in a large H
    d = sim.step(Y, avail(33))
    # 8 fits (25 left), 16 fits (9 left), 24 doesn't: the headroom binds, not the slots.
    assert d.allow == {"a": True, "b": True, "c": False}
    assert d.calls["c"].reason == Reason.NO_HEADROOM
    total = sum(c.demand_bytes for c in d.calls.values() if c.allow)
    assert total == 24 * MiB <= d.headroom_bytes == 33 * MiB


def test_yellow_slots_and_headroom_both_bind() -> None:
    sim = Sim()
    for cid, rate, started in [("a", 8, 0.0), ("b", 16, 0.0), ("c", 4.5, -1.0)]:
        sim.add(cid, rate_mib=rate, started_at=started)
    sim.step(G, n=81)  # 10 s of green: b = 3
    d = sim.step(Y, avail(100))  # green -> yellow: b = 1
    assert d.slots == 1
    assert d.allow == {"a": False, "b": False, "c": True}


def test_yellow_zero_demand_calls_run_without_headroom_and_reserve_it() -> None:
    sim = Sim()
    sim.add("r", rate_mib=3)  # resident, but still growing 3 MiB per horizon
    sim.add("cool", rate_mib=-8, memory_mib=1024)
    sim.add("g", rate_mib=8)
    sim.warm()
    d = sim.step(Y, avail(0))
    assert d.allow == {"r": True, "cool": True, "g": False}
    sim.step(G)
    # H = 10 MiB: the resident's 3 MiB are reserved first, so the 8 MiB grower doesn't fit.
    d = sim.step(Y, avail(10))
    assert d.allow["r"] and not d.allow["g"]
    assert d.calls["g"].reason == Reason.NO_HEADROOM
    sim.step(G)
    assert sim.step(Y, avail(11)).allow["g"]


def test_red_single_probe_with_headroom_check() -> None:
    sim = Sim(slots_initial=4)
    for cid, rate, started in [("a", 24, -1.0), ("b", 8, -3.0), ("c", 16, -2.0)]:
        sim.add(cid, rate_mib=rate, started_at=started)
    sim.add("r", rate_mib=0)
    sim.warm()
    d = sim.step(R)
    assert d.slot_limit == 1
    assert d.allow == {"a": False, "b": True, "c": False, "r": True}
    assert d.calls["b"].reason == Reason.PROBE
    assert d.calls["a"].reason == Reason.NO_SLOT

    sim = Sim()
    for cid, rate in [("a", 24), ("b", 8)]:
        sim.add(cid, rate_mib=rate)
    sim.add("r", rate_mib=0)
    sim.warm()
    d = sim.step(R, avail(7))  # even the smallest probe (8 MiB) doesn't fit in H = 7 MiB
    assert d.allow == {"a": False, "b": False, "r": True}
    assert d.calls["b"].reason == Reason.NO_HEADROOM


# -- AIMD on b -------------------------------------------------------------------------------


def test_aimd_additive_increase_per_5s_continuous_green() -> None:
    sim = Sim()
    sim.add("a")
    slots = [sim.step(G).slots for _ in range(int(21 / STEP))]  # t = 0 .. 20.875
    at = {round(i * STEP, 3): b for i, b in enumerate(slots)}
    assert at[4.875] == 1 and at[5.0] == 2
    assert at[9.875] == 2 and at[10.0] == 3
    assert at[15.0] == 4 and at[20.0] == 4  # capped at b_max


def test_aimd_halves_once_per_pressure_increase() -> None:
    sim = Sim()
    sim.add("a")
    sim.step(G, n=121)
    assert sim.ctl.slots == 4
    assert [sim.step(Y).slots for _ in range(10)] == [2] * 10  # once, not per period
    assert sim.step(R).slots == 1
    assert sim.step(Y).slots == 1  # a decrease doesn't touch b
    assert sim.step(R).slots == 1  # floor at 1

    sim = Sim(slots_initial=4)
    sim.add("a")
    sim.step(G)
    assert sim.step(R).slots == 2  # green -> red counts once: 4 -> 2, not 1
    assert sim.step(R).slots == 2


def test_aimd_green_must_be_continuous() -> None:
    sim = Sim(slots_initial=2)
    sim.add("a")
    sim.step(G, n=40)  # 4.875 s of green
    assert sim.step(Y).slots == 1
    b = [sim.step(G).slots for _ in range(41)]  # the green timer restarted at the yellow
    assert b[39] == 1 and b[40] == 2


# -- anti-flapping, overdue, tie-break -------------------------------------------------------


def test_min_deny_keeps_a_fresh_deny() -> None:
    sim = Sim()
    sim.add("a", rate_mib=8)
    sim.add("b", rate_mib=16)
    sim.warm()
    d = sim.step(Y)
    assert d.allow == {"a": True, "b": False}
    denied_at = sim.clock()
    sim.remove("a")  # the slot is free now, but b was denied < 1 s ago
    for _ in range(7):
        d = sim.step(Y).calls["b"]
        assert not d.allow and d.reason == Reason.MIN_DENY
    d = sim.step(Y).calls["b"]
    assert sim.clock() - denied_at == 1.0
    assert d.allow and d.reason == Reason.ADMITTED and d.denied_for_s == 1.0


def test_overdue_checked_first_and_tie_break_order() -> None:
    """Waiting calls are checked in tie-break order, overdue ones first, but after the running
    ones: a running grower keeps its slot (a paused call's memory is not given back, so a swap
    only adds the newcomer's footprint), and the slot goes to the waiters once it stops."""
    sim = Sim()
    sim.add("g-d", rate_mib=24)
    sim.add("g-c", rate_mib=16)
    sim.add("g-b", rate_mib=8)
    sim.add("g-a", rate_mib=8, started_at=-1.0)  # the oldest
    sim.add("r", rate_mib=0)
    sim.add("c", rate_mib=-8, memory_mib=1024)
    sim.warm()
    d = sim.step(Y)
    denied_at = sim.clock()
    assert d.allow == {"g-a": True, "g-b": False, "g-c": False, "g-d": False, "r": True, "c": True}
    d = sim.step(Y, n=8)  # denied 1 s: eligible, not overdue
    assert d.order == ("r", "c", "g-a", "g-b", "g-c", "g-d")  # running, then state, demand, id
    assert not any(c.overdue for c in d.calls.values())
    d = sim.step(Y, n=16)  # denied 3 s: overdue, still behind the running call
    assert sim.clock() - denied_at == 3.0
    assert {cid for cid, c in d.calls.items() if c.overdue} == {"g-b", "g-c", "g-d"}
    assert d.allow["g-a"] and d.calls["g-b"].reason == Reason.NO_SLOT
    sim.add("g-e", rate_mib=4)  # a new grower is no overdue call's rival: it waits too
    d = sim.step(Y, n=8)
    assert d.allow["g-a"] and not d.allow["g-e"]
    # g-a stops growing: it no longer needs a slot, and the first overdue call gets it.
    sim.procs["g-a"].rate = 0
    d = sim.step(Y, n=3)
    assert d.calls["g-a"].state == CallState.RESIDENT and d.calls["g-a"].allow
    assert d.order[:3] == ("g-a", "r", "c")  # running: state, then the oldest
    assert d.order[3:6] == ("g-b", "g-c", "g-d")  # overdue: state, demand, id
    assert d.allow["g-b"] and not d.allow["g-c"] and not d.allow["g-d"]


def test_held_calls_demand_includes_their_backlog() -> None:
    """A held call projects over the horizon plus its hold: released, a clock-paced call catches
    up in one burst, and re-admitting it needs that much room."""
    sim = Sim()
    sim.add("a", rate_mib=8, started_at=-1.0)
    sim.add("b", rate_mib=16)
    sim.warm()
    d = sim.step(Y)
    assert d.calls["b"].demand_bytes == 16 * MiB and not d.allow["b"]
    d = sim.step(Y, n=8)  # held 1 s
    assert d.calls["b"].demand_bytes == 32 * MiB
    d = sim.step(Y, n=16)  # held 3 s
    assert d.calls["b"].demand_bytes == 64 * MiB
    sim.remove("a")  # the slot is free, but 64 MiB of backlog don't fit in 40 MiB
    d = sim.step(R, avail(40))
    assert d.calls["b"].reason == Reason.NO_HEADROOM
    d = sim.step(R, avail(80))
    assert d.allow["b"] and d.calls["b"].reason == Reason.PROBE


def test_demand_is_capped_by_what_is_left_of_the_declaration() -> None:
    """Below its declared peak a call cannot need more than the rest of its declaration, however
    fast it ramped or long it was held; at or above it (under-declared) the projection stands."""
    sim = Sim()
    sim.add("b", rate_mib=64, memory_mib=100, declared=120 * MiB)
    sim.add("liar", rate_mib=64, memory_mib=100, declared=50 * MiB)
    sim.add("silent", rate_mib=64, memory_mib=100)
    d = sim.warm()  # one allowed period: 108 MiB each, ĝ = 64 MiB/s
    assert d.calls["b"].demand_bytes == 12 * MiB  # 120 - 108, not 64 MiB/s x 1 s
    assert d.calls["liar"].demand_bytes == 64 * MiB
    assert d.calls["silent"].demand_bytes == 64 * MiB
    sim.procs["b"].rate = 0  # b levels off below its declaration (116 MiB after a period)
    d = sim.step(R, avail(0), n=24)  # the others held ~3 s
    assert d.allow["b"] and d.calls["b"].reason == Reason.DECLARED  # never held
    assert d.calls["b"].demand_bytes <= 4 * MiB  # what is left of its declaration
    assert not d.allow["liar"] and d.calls["liar"].held_s > 2.5
    assert d.calls["liar"].demand_bytes > 192 * MiB


def test_running_call_loses_its_slot_when_it_no_longer_fits() -> None:
    """Incumbency orders the checks, it never overrides the limits."""
    sim = Sim()
    sim.add("a", rate_mib=8)
    sim.add("b", rate_mib=16, started_at=-1.0)
    sim.warm()
    d = sim.step(Y)
    assert d.allow == {"a": False, "b": True}
    d = sim.step(R, avail(12))  # b runs, but 16 MiB no longer fit: paused at once
    assert not d.allow["b"] and d.calls["b"].reason == Reason.NO_HEADROOM


def test_overdue_still_needs_headroom() -> None:
    """Overdue changes the order, not the limits: a big overdue call can't break H."""
    sim = Sim(slots_initial=4)
    sim.add("small", rate_mib=8)
    sim.add("big", rate_mib=64)
    sim.warm()
    d = sim.step(Y, avail(32), n=30)
    assert d.slot_limit == 2
    assert d.calls["big"].overdue
    assert d.calls["big"].reason == Reason.NO_HEADROOM
    assert d.allow["small"]


# -- hold cap --------------------------------------------------------------------------------


def test_hold_cap_forces_an_allow_in_red() -> None:
    sim = Sim()
    sim.add("g", rate_mib=16, memory_mib=100)
    sim.warm()
    d = sim.step(R, avail(0))
    denied_at = sim.clock()
    assert not d.allow["g"]
    d = sim.step(R, avail(0), n=159)
    assert sim.clock() - denied_at == 19.875 and not d.allow["g"]
    d = sim.step(R, avail(0))
    c = d.calls["g"]
    assert c.allow and c.forced and c.reason == Reason.HOLD_CAP
    assert c.denied_for_s == 20.0 and c.held_s == 20.0
    assert d.forced == {"g"}
    d = sim.step(R, avail(0))  # one period, then held again in a new episode
    assert not d.allow["g"] and d.calls["g"].reason == Reason.NO_HEADROOM
    snap = sim.ctl.snapshot()["calls"]["g"]  # type: ignore[index]
    assert (snap["episodes"], snap["forced_allows"]) == (2, 1)
    assert sim.procs["g"].memory == 100 * MiB + 2 * MiB * 2 + 2 * MiB  # 2 warm + 1 forced period


def test_hold_cap_takes_a_slot_in_yellow() -> None:
    sim = Sim()
    sim.add("small", rate_mib=8)
    sim.add("big", rate_mib=64)
    sim.warm()
    d = sim.step(Y, avail(32), n=161)  # big never fits in H: held 20 s
    assert d.calls["big"].forced and d.allow["big"]
    assert not d.allow["small"] and d.calls["small"].reason == Reason.NO_SLOT


# -- accounting and lifecycle ----------------------------------------------------------------


def test_held_time_and_finished_summary() -> None:
    sim = Sim()
    sim.add("g", rate_mib=16)
    sim.step(G, n=8)  # 0.875 s
    d = sim.step(R, avail(0), n=13)  # denied at t=1.0, held through 2.5
    assert d.calls["g"].held_s == 1.5
    sim.step(G, n=5)  # allowed at 2.625 until 3.125
    sim.step(R, avail(0), n=4)  # denied at 3.25, held through 3.625
    s = sim.ctl.finished("g")
    assert s is not None
    # Live finish at 3.625: episodes [1.0, 2.625) + [3.25, 3.625)
    assert s.held_s == 1.625 + 0.375
    assert s.episodes == 2 and s.longest_hold_s == 1.625
    assert s.run_time_s == 3.625
    assert s.feedback() == "held 2.0 of 3.6 s"
    assert sim.ctl.finished("g") is None
    assert sim.ctl.snapshot()["calls"] == {}


def test_disappearing_calls_are_forgotten_and_summarised_once() -> None:
    sim = Sim()
    sim.add("a", rate_mib=8)
    sim.add("b", rate_mib=16)
    sim.warm()
    sim.step(Y, n=4)  # b denied at 0.25 for 3 more periods
    sim.remove("b")
    d = sim.step(Y)
    assert d.vanished == ("b",)
    assert set(d.allow) == {"a"}
    assert "b" not in sim.ctl.snapshot()["calls"]  # type: ignore[operator]
    assert sim.ctl.snapshot()["finished_pending"] == ["b"]
    s = sim.ctl.finished("b")
    assert s is not None and s.held_s == 0.375  # up to the last period it was seen in
    assert s.last_state == CallState.PAUSED_GROWING
    assert sim.ctl.finished("b") is None
    assert sim.step(Y).vanished == ()


def test_finished_buffer_is_bounded() -> None:
    sim = Sim(finished_buffer=2)
    for cid in "abc":
        sim.add(cid)
    sim.step(G)
    for cid in "abc":
        sim.remove(cid)
    assert sim.step(G).vanished == ("a", "b", "c")
    assert sim.ctl.finished("a") is None  # oldest dropped
    assert sim.ctl.finished("c") is not None


def test_duplicate_sample_rejected() -> None:
    ctl = GrowthController(GrowthConfig(), FakeClock())
    with pytest.raises(ValueError):
        ctl.update([Sample("a", 0, 0), Sample("a", 1, 1)], G, BIG)


def test_snapshot_is_json_ready() -> None:
    sim = Sim()
    sim.add("a", rate_mib=8)
    sim.warm()
    sim.step(R, avail(0), n=3)
    snap = sim.ctl.snapshot()
    assert json.loads(json.dumps(snap)) == snap
    assert snap["pressure"] == "red"
    a = snap["calls"]["a"]  # type: ignore[index]
    assert a["state"] == "paused_growing" and a["allowed"] is False
    assert a["denied_for_s"] == 0.25


def test_a_declared_call_is_never_held_and_its_declaration_is_reserved() -> None:
    """Issue 15 §4: the gate paces undeclared growth only. A declared grower below its peak
    runs in red (admission set its growth aside), and what is left of its declaration is taken
    off H before an undeclared grower is checked; past its declaration it is paced as well."""
    sim = Sim()
    sim.add("decl", rate_mib=32, memory_mib=100, declared=200 * MiB)
    sim.add("undecl", rate_mib=32, memory_mib=100)
    sim.warm()
    d = sim.step(R, avail(60))  # H 60 MiB; decl's demand (32 MiB) reserved: 28 left < 32
    assert d.allow["decl"] and d.calls["decl"].reason == Reason.DECLARED
    assert not d.allow["undecl"] and d.calls["undecl"].reason == Reason.NO_HEADROOM
    for _ in range(int(3 / STEP)):  # 3 s of red at no headroom: decl runs on, never held
        d = sim.step(R, avail(0))
        if sim.procs["decl"].memory >= 200 * MiB:
            break
        assert d.allow["decl"] and d.calls["decl"].held_s == 0.0
    # It reached its declaration, and from there it is paced as an undeclared grower.
    assert sim.procs["decl"].memory >= 200 * MiB
    assert not d.allow["decl"] and d.calls["decl"].reason == Reason.NO_HEADROOM


def test_held_oom_score_adj_is_validated() -> None:
    assert GrowthConfig().held_oom_score_adj == -500
    with pytest.raises(ValueError):
        GrowthConfig(held_oom_score_adj=1001)


def test_max_park_s_is_validated() -> None:
    assert GrowthConfig().max_park_s == 1.0
    for bad in (0.0, -1.0, 21.0):  # above max_hold_s (20): it would never freeze before the cap
        with pytest.raises(ValueError):
            GrowthConfig(max_park_s=bad)


# -- last resort -----------------------------------------------------------------------------


def _s(cid: str, u_mib: float, d_mib: float | None, started: float) -> Sample:
    return Sample(cid, int(u_mib * MiB), 0, None if d_mib is None else int(d_mib * MiB), started)


def test_last_resort_hand_computed() -> None:
    samples = [
        _s("a", 300, 100, 0.0),  # (300 - 100) / 10 = 20 MiB/s
        _s("b", 150, None, 5.0),  # (150 - 0) / 5 = 30 MiB/s
        _s("c", 50, 100, 0.0),  # within its declaration: never a victim
        _s("d", 2.5, None, 9.95),  # T floored to 0.1 s: 25 MiB/s (not 50)
    ]
    v = pick_last_resort_victim(samples, now=10.0, red_for_s=2.0, headroom_bytes=63 * MiB)
    assert v is not None
    assert v.call_id == "b"
    assert v.excess_bytes == 150 * MiB and v.run_time_s == 5.0
    assert v.score == pytest.approx(30 * MiB)
    v = pick_last_resort_victim(
        [*samples[2:], _s("e", 4, None, 9.99)], now=10.0, red_for_s=3.0, headroom_bytes=0
    )
    assert v is not None and v.call_id == "e" and v.score == pytest.approx(40 * MiB)
    assert v.run_time_s == 0.1


def test_last_resort_preconditions() -> None:
    samples = [_s("a", 300, 100, 0.0)]
    kw = {"now": 10.0}
    assert pick_last_resort_victim(samples, red_for_s=1.9, headroom_bytes=0, **kw) is None
    assert pick_last_resort_victim(samples, red_for_s=5, headroom_bytes=64 * MiB, **kw) is None
    within = [_s("a", 100, 100, 0.0), _s("b", 10, 20, 0.0)]
    assert pick_last_resort_victim(within, red_for_s=5, headroom_bytes=0, **kw) is None
    assert pick_last_resort_victim([], red_for_s=5, headroom_bytes=0, **kw) is None


def test_last_resort_uses_the_red_streak_seen_by_the_controller() -> None:
    sim = Sim()
    p = sim.add("hog", rate_mib=0, memory_mib=512, declared=128 * MiB)
    sim.warm()
    mib = 60
    for _ in range(16):  # red since 0.25, now 2.125: 1.875 s, available falling below 64 MiB
        mib -= 1
        sim.step(R, mib * MiB)
    assert sim.ctl.last_resort_victim([p.sample()], mib * MiB) is None
    sim.step(R, (mib - 1) * MiB)  # 2.0 s of red
    v = sim.ctl.last_resort_victim([p.sample()], (mib - 1) * MiB)
    assert v is not None and v.call_id == "hog"
    assert v.score == pytest.approx(384 * MiB / 2.25)
    sim.step(R, 80 * MiB)
    assert sim.ctl.last_resort_victim([p.sample()], 80 * MiB) is None  # not critical
    sim.step(Y, 20 * MiB)
    assert sim.ctl.last_resort_victim([p.sample()], 10 * MiB) is None  # streak broken


def test_last_resort_never_picks_a_held_call() -> None:
    """A held call keeps what it allocated but cannot grow: killing it frees its memory at the
    price of a call we stopped ourselves; the victim is a running call."""
    sim = Sim()
    held = sim.add("held", rate_mib=64, memory_mib=400)
    runner = sim.add("runner", rate_mib=0, memory_mib=200)
    sim.warm()
    mib = 60
    for _ in range(20):  # red, critical and falling: held is denied, runner (resident) runs
        mib -= 1
        d = sim.step(R, mib * MiB)
    assert not d.allow["held"] and d.allow["runner"]
    v = sim.ctl.last_resort_victim([held.sample(), runner.sample()], (mib - 1) * MiB)
    assert v is not None and v.call_id == "runner"
    # Alone and held: nobody is killed (the memory falling is not a tool call's doing).
    assert sim.ctl.last_resort_victim([held.sample()], (mib - 2) * MiB) is None


def test_last_resort_trusts_a_declaration_only_up_to_the_calls_share() -> None:
    """Issue 21 §3: a huge declaration must not move the kill onto a neighbour."""
    hog = _s("hog", 700, 1_000_000, 0.0)  # declares about 1 TiB, uses 700 MiB
    small = [_s(f"n{i}", 100, None, 0.0) for i in range(3)]  # 100 MiB each, undeclared
    kw = {"now": 10.0, "red_for_s": 5.0, "headroom_bytes": 0}
    v = pick_last_resort_victim([hog, *small], **kw)
    assert v is not None and v.call_id.startswith("n")  # trusting the declaration: a neighbour
    v = pick_last_resort_victim([hog, *small], budget_bytes=1024 * MiB, **kw)
    assert v is not None and v.call_id == "hog"  # share 256 MiB: 700 - 256 = 444 MiB over
    assert v.excess_bytes == 444 * MiB


def test_no_declaration_above_a_share_moves_the_last_resort_kill() -> None:
    """Issue 21 §3, adversarially: over random sets of running calls, a call that declares
    anything above its share (up to the 2^60 a hint may say) is ranked exactly as if it had
    declared its share, so no declaration can buy more than a share's worth of cover."""
    r = random.Random(21)
    kw = {"now": 10.0, "red_for_s": 5.0, "headroom_bytes": 0}
    for _ in range(2000):
        n = r.randrange(2, 7)
        budget = r.randrange(256, 8192) * MiB
        share = budget // n
        others = [_s(f"n{i}", r.randrange(1, 3000), r.choice((None, r.randrange(1, 3000))),
                     r.uniform(0.0, 9.5)) for i in range(n - 1)]
        use, started = r.randrange(1, 6000) * MiB, r.uniform(0.0, 9.5)

        def victim(declared: int, use: int = use, started: float = started,
                   others: list[Sample] = others, budget: int = budget) -> str | None:
            hog = Sample("hog", use, 0, declared, started)
            v = pick_last_resort_victim([hog, *others], budget_bytes=budget, **kw)
            return None if v is None else v.call_id

        assert victim(r.choice((share + 1, 1 << 40, 1 << 60))) == victim(share)


def test_the_daemon_path_bounds_a_declaration_by_the_domain_budget() -> None:
    """Through the controller, as growth_gate.py drives it (budget from update): the hog that
    declares about 1 TiB and uses 700 MiB of a 1 GiB domain is the victim. The gate holds its
    three neighbours, but they still share the budget: the hog's share is 256 MiB, not the
    whole domain (counting only the calls let run, its declaration covered all it used)."""
    clock = FakeClock()
    ctl = GrowthController(GrowthConfig(), clock)  # type: ignore[arg-type]
    hog = _s("hog", 700, 1_000_000, 0.0)
    small = [_s(f"n{i}", 100, None, 0.0) for i in range(3)]
    mib = 60
    for _ in range(40):  # red, critical and falling
        mib -= 1
        clock.advance(STEP)
        ctl.update([hog, *small], R, mib * MiB, 1024 * MiB)
    v = ctl.last_resort_victim([hog, *small], (mib - 1) * MiB)
    assert v is not None and v.call_id == "hog"


def test_no_last_resort_while_swap_has_room() -> None:
    samples = [_s("a", 300, None, 0.0)]
    kw = {"now": 10.0, "red_for_s": 5.0, "headroom_bytes": 0}
    assert pick_last_resort_victim(samples, swap_free_bytes=512 * MiB, **kw) is None
    assert pick_last_resort_victim(samples, swap_free_bytes=1 * MiB, **kw) is not None  # full
    assert pick_last_resort_victim(samples, swap_free_bytes=None, **kw) is not None  # none


def test_no_last_resort_while_the_gate_holds_the_domain_steady() -> None:
    """Critical but no longer falling: the gate is doing its job, nobody is killed; the reserve
    is the gate's slack, not the kernel's, so it is not taken off what is available."""
    sim = Sim()
    p = sim.add("hog", rate_mib=0, memory_mib=512)
    sim.warm()
    sim.step(R, 40 * MiB, n=30)
    assert sim.ctl.last_resort_victim([p.sample()], 40 * MiB) is None
    sim.step(R, 39 * MiB)
    assert sim.ctl.last_resort_victim([p.sample()], 39 * MiB) is not None
    sim.step(R, avail(10))
    assert sim.ctl.last_resort_victim([p.sample()], avail(10)) is None  # H 10 MiB: not critical


def test_reserve_is_bounded_by_the_domain_budget() -> None:
    """256 MiB is host-sized: in a 512 MiB cgroup domain the reserve is 1/8 of it, 64 MiB."""
    sim = Sim()
    sim.add("g", rate_mib=8)
    sim.warm()
    d = sim.ctl.update([sim.procs["g"].sample()], R, 200 * MiB, budget=512 * MiB)
    assert d.headroom_bytes == 136 * MiB
    d = sim.ctl.update([sim.procs["g"].sample()], R, 3 * GiB, budget=8 * GiB)
    assert d.headroom_bytes == 3 * GiB - RESERVE
    assert sim.ctl.update([sim.procs["g"].sample()], R, 200 * MiB).headroom_bytes == 0


@pytest.mark.parametrize("margin", [
    PressureConfig(),
    PressureConfig(safety_margin_bytes=512 * MiB),
    PressureConfig(safety_margin_bytes=0),
    PressureConfig(safety_margin_bytes=GiB, safety_margin_fraction=0.5),
])
@pytest.mark.parametrize("budget", [384 * MiB, 512 * MiB, 8 * GiB])
def test_the_gate_and_admission_see_the_same_safety_margin(
        margin: PressureConfig, budget: int) -> None:
    """One S: whatever [pressure] safety_margin_* says, the gate's H is admission's headroom."""
    ctl = GrowthController(GrowthConfig(), FakeClock(), margin)
    for available in (0, 100 * MiB, budget // 2, budget):
        reading = assess_pressure(margin, available, budget)
        assert ctl.update([], Y, available, budget).headroom_bytes == reading.headroom
        assert reading.safety_margin == effective_margin(margin, budget)


# -- the e2e scenario, simulated -------------------------------------------------------------


@dataclass
class ClockPaced:
    """A memload ramp: its target footprint follows the wall clock, so a held call catches up
    (at most `fault` bytes/s) once released, and it exits when its time is up."""

    cid: str
    peak: float
    duration: float
    fault: float = 150 * MiB
    memory: float = 0.0
    cpu: int = 0
    done: bool = False

    def run(self, t: float, dt: float) -> None:
        if t >= self.duration:
            self.done, self.memory = True, 0.0
            return
        want = self.peak * min(t / (0.95 * self.duration), 1.0)
        self.memory = min(want, self.memory + self.fault * dt)
        self.cpu += round(dt * 2e5)


def test_three_clock_paced_ramps_fit_a_512_mib_domain() -> None:
    """tests/e2e/test_growth_gate.py in miniature: 3 x 200 MiB ramps over 8 s in 512 MiB with
    the daemon's pressure rules. Eager they need 600 MiB; gated, one grows at a time, the others
    wait and catch up later, nobody is killed and the domain never overflows."""

    budget, overhead, dt = 512 * MiB, 24 * MiB, 1 / 64
    clock = FakeClock()
    ctl = GrowthController(GrowthConfig(), clock)
    calls = [ClockPaced(f"c{i}", 200 * MiB, 8.0) for i in range(3)]
    allow = dict.fromkeys((c.cid for c in calls), True)
    peak = 0.0
    for k in range(1, 64 * 60):
        for c in calls:
            if allow[c.cid] and not c.done:
                c.run(clock(), dt)
        used = overhead + sum(c.memory for c in calls)
        peak = max(peak, used)
        clock.advance(dt)
        if k % 8 == 0:  # a decision every 1/8 s
            live = [c for c in calls if not c.done]
            if not live:
                break
            avail_now = int(budget - used)
            q = assess_pressure(PressureConfig(), avail_now, budget).state
            samples = [Sample(c.cid, int(c.memory), c.cpu) for c in live]
            allow.update(ctl.update(samples, q, avail_now, budget).allow)
            assert ctl.last_resort_victim(samples, avail_now) is None
    assert all(c.done for c in calls)
    assert peak <= budget - 64 * MiB, peak / MiB
    assert sum(ctl.finished(c.cid).held_s for c in calls) > 8.0  # type: ignore[union-attr]

