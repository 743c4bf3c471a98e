"""Admission (TenonAgent §3.4, ToolSched §3.2–3.3) against a simulated clock: charges, gates,
queues, heavy credit, bounded wait, fairness, release and cancel."""

from __future__ import annotations

import random

import pytest

from execgate.common.units import GiB, MiB
from execgate.policy.admission import Admission, AdmissionConfig, Decision, logical_charge
from execgate.policy.estimate import CallInfo, Demand, Outcome
from execgate.policy.pressure import PressureReading, predicted_remaining_growth
from execgate.policy.pressure_state import Pressure

GREEN, YELLOW, RED = Pressure.GREEN, Pressure.YELLOW, Pressure.RED


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class StubEstimator:
    """Returns the demand registered for each call id."""

    def __init__(self) -> None:
        self.demands: dict[str, Demand] = {}

    def estimate(self, call: CallInfo) -> Demand:
        return self.demands[call.call_id]

    def observe(self, call: CallInfo, outcome: Outcome) -> None:
        pass


def reading(
    state: Pressure = GREEN, budget: int = 4 * GiB, eff: int | None = None, margin: int = 0
) -> PressureReading:
    eff = budget if eff is None else eff
    return PressureReading(state, eff, eff, "test", budget=budget, safety_margin=margin)


class Harness:
    def __init__(self, config: AdmissionConfig | None = None) -> None:
        self.clock = Clock()
        self.est = StubEstimator()
        self.adm = Admission(config or AdmissionConfig(), self.est, self.clock)

    def submit(
        self,
        cid: str,
        peak: int,
        avg: int | None = None,
        *,
        sandbox: str = "sb",
        priority: str = "normal",
        arrival: float | None = None,
        source: str = "stub",
    ):
        self.est.demands[cid] = Demand(peak if avg is None else avg, peak, source)
        call = CallInfo(cid, sandbox, ["x"], priority=priority, arrival=arrival)
        return self.adm.submit(call)

    def step(self, r: PressureReading | None = None) -> list[Decision]:
        return self.adm.step(r or reading())

    def ids(self, r: PressureReading | None = None) -> list[str]:
        return [d.call_id for d in self.step(r)]


# -- charges -------------------------------------------------------------------------------------


def test_logical_charge_alpha_interpolation_hand_computed() -> None:
    d = Demand(avg_bytes=100, peak_bytes=500, source="t")
    assert logical_charge(d, 0, 1000) == 100  # α = 0: average
    assert logical_charge(d, 250, 1000) == 200  # α = 0.25: 0.75*100 + 0.25*500
    assert logical_charge(d, 500, 1000) == 300
    assert logical_charge(d, 1000, 1000) == 500  # α = 1: peak
    assert logical_charge(d, 5000, 1000) == 500  # α clamped to 1
    assert logical_charge(d, 100, 0) == 500  # no window: peak
    assert logical_charge(Demand(0, 3, "t"), 1, 2) == 2  # 1.5 rounds up


def test_charges_follow_admitted_bytes() -> None:
    h = Harness()  # window = budget = 4 GiB
    for i in range(3):
        h.submit(f"c{i}", peak=768 * MiB, avg=256 * MiB, sandbox=f"s{i}")
    decisions = h.step()
    # c0: α=0 -> 256 MiB; c1: α=256/4096 -> 256 + 512/16 = 288 MiB;
    # c2: α=544/4096 -> 256 + 512*544/4096 = 324 MiB.
    assert [d.charge_bytes for d in decisions] == [256 * MiB, 288 * MiB, 324 * MiB]
    snap = h.adm.snapshot()
    assert snap["admitted_bytes"] == 868 * MiB
    assert snap["alpha"] == pytest.approx(868 / 4096)


def test_configured_window() -> None:
    h = Harness(AdmissionConfig(window_bytes=1 * GiB))
    h.submit("a", peak=512 * MiB, avg=0)
    h.submit("b", peak=512 * MiB, avg=0)
    h.submit("c", peak=512 * MiB, avg=0)
    # Admitted charges stay 0, so α stays 0 and every call is charged its average.
    assert [d.charge_bytes for d in h.step()] == [0, 0, 0]
    h.submit("d", peak=400 * MiB, avg=200 * MiB)
    assert [d.charge_bytes for d in h.step()] == [200 * MiB]  # admitted 0 -> α 0
    h.submit("e", peak=712 * MiB, avg=200 * MiB)
    assert [d.charge_bytes for d in h.step()] == [300 * MiB]  # α = 200/1024: 200 + 512 * α


def test_logical_budget_is_budget_minus_safety_margin() -> None:
    h = Harness()
    r = reading(budget=1 * GiB, margin=256 * MiB)  # logical 768 MiB
    h.submit("a", peak=512 * MiB)
    h.submit("b", peak=256 * MiB)
    h.submit("c", peak=1)
    assert h.ids(r) == ["a", "b"]  # 768 MiB exactly fits; c does not
    assert h.adm.release("b")
    assert h.ids(r) == ["c"]


def test_release_frees_budget() -> None:
    h = Harness()
    r = reading(budget=1 * GiB)
    h.submit("a", peak=768 * MiB)
    h.submit("b", peak=768 * MiB)
    assert h.ids(r) == ["a"]
    assert h.ids(r) == []
    assert h.adm.release("a") is True
    assert h.adm.release("a") is False  # idempotent
    assert h.ids(r) == ["b"]
    assert h.adm.snapshot()["admitted_bytes"] == 768 * MiB


def test_submit_twice_is_an_error() -> None:
    h = Harness()
    h.submit("a", peak=MiB)
    with pytest.raises(ValueError):
        h.submit("a", peak=MiB)


# -- queues: light first, no head-of-line blocking, heavy credit ---------------------------------


def test_queue_assignment_and_light_first() -> None:
    h = Harness()
    heavy = h.submit("heavy", peak=1 * GiB)  # at the 1 GiB threshold: heavy
    light = h.submit("light", peak=1 * GiB - 1)
    assert (heavy.queue, light.queue) == ("heavy", "light")
    assert h.ids() == ["light", "heavy"]


def test_no_head_of_line_blocking() -> None:
    h = Harness()
    h.submit("big", peak=3328 * MiB)
    assert h.ids() == ["big"]
    h.submit("heavy", peak=2 * GiB)  # does not fit next to big
    h.submit("light-big", peak=900 * MiB)  # does not fit either (768 MiB left)
    h.submit("light", peak=512 * MiB)
    assert h.ids() == ["light"]
    assert h.adm.release("big")
    assert h.ids() == ["light-big", "heavy"]


def _stream(config: AdmissionConfig) -> Decision:
    """Ten light calls always queued from five sandboxes, each running 1 s; one heavy call.

    Returns the heavy call's decision.
    """
    h = Harness(config)
    running: dict[str, float] = {}
    n = 0
    queued: set[str] = set()
    for tick in range(600):  # 60 s of 100 ms control periods
        now = h.clock()
        for cid, end in list(running.items()):
            if end <= now:
                h.adm.release(cid)
                del running[cid]
        while len(queued) < 10:
            cid = f"l{n}"
            h.submit(cid, peak=768 * MiB, sandbox=f"s{n % 5}")
            queued.add(cid)
            n += 1
        if tick == 5:
            h.submit("heavy", peak=2 * GiB, sandbox="h")
        for d in h.step():
            if d.call_id == "heavy":
                return d
            queued.discard(d.call_id)
            running[d.call_id] = now + 1.0
        h.clock.advance(0.1)
    raise AssertionError("heavy call never admitted")


def test_light_stream_starves_heavy_without_credit() -> None:
    d = _stream(AdmissionConfig(credit_rate_bytes_per_s=0))
    assert d.forced  # only the bounded wait rescued it
    assert d.waited_s == pytest.approx(30.0, abs=0.11)  # the first control period past 30 s


def test_heavy_credit_prevents_starvation() -> None:
    # β = budget/10 = 0.4 GiB/s: a 2 GiB charge is fully covered after 5 s; by then at most one
    # light run (1 s) later, releases have gathered enough room.
    d = _stream(AdmissionConfig())
    assert not d.forced
    assert d.waited_s <= 6.0


def test_credit_reserves_capacity_from_light_calls() -> None:
    h = Harness(AdmissionConfig(credit_rate_bytes_per_s=1 * GiB))
    h.submit("big", peak=3 * GiB, sandbox="A")
    assert h.ids() == ["big"]
    h.submit("heavy", peak=2 * GiB, sandbox="H")
    h.clock.advance(0.5)  # credit 512 MiB: of the 1 GiB left, light calls may use 512 MiB
    h.submit("l1", peak=512 * MiB, sandbox="B")
    h.submit("l2", peak=256 * MiB, sandbox="C")
    assert h.ids() == ["l1"]
    snap = h.adm.snapshot()
    assert snap["credit"]["target"] == "heavy"
    assert snap["credit"]["bytes"] == 512 * MiB
    h.clock.advance(2.0)  # credit now covers the whole 2 GiB charge
    h.adm.release("big")
    h.submit("l3", peak=1000 * MiB, sandbox="D")
    h.submit("l4", peak=1000 * MiB, sandbox="E")
    # 512 MiB admitted: l2 and l3 fit beside the 2 GiB reservation, l4 would only fit without
    # it; the heavy call gets its room.
    assert h.ids() == ["l2", "l3", "heavy"]
    assert h.adm.snapshot()["credit"]["target"] is None
    h.adm.release("heavy")
    assert h.ids() == ["l4"]


def test_unfittable_heavy_target_reserves_nothing() -> None:
    h = Harness()
    h.submit("huge", peak=8 * GiB)  # its average alone exceeds the 4 GiB logical budget
    h.clock.advance(20.0)
    for i in range(4):
        h.submit(f"l{i}", peak=1000 * MiB, sandbox=f"s{i}")
    assert h.ids() == ["l0", "l1", "l2", "l3"]
    h.clock.advance(10.0)
    assert h.step() == []  # overdue, but it would not fit beside the four: first in line
    for i in range(4):
        h.adm.release(f"l{i}")
    [d] = h.step()
    assert (d.call_id, d.forced) == ("huge", True)  # alone


def test_credit_target_is_sticky_and_moves_on_cancel() -> None:
    h = Harness(AdmissionConfig(credit_rate_bytes_per_s=1 * GiB))
    h.submit("full", peak=4 * GiB)
    assert h.ids() == ["full"]
    h.submit("h1", peak=2 * GiB, sandbox="a")
    h.submit("h2", peak=2 * GiB, sandbox="b")
    h.clock.advance(1.0)
    h.step()
    assert h.adm.snapshot()["credit"] == {
        "target": "h1",
        "bytes": 1 * GiB,
        "rate_bytes_per_s": 1 * GiB,
    }
    assert h.adm.cancel("h1")
    assert h.adm.snapshot()["credit"]["target"] == "h2"
    assert h.adm.snapshot()["credit"]["bytes"] == 0


# -- physical gate ------------------------------------------------------------------------------


def test_yellow_admits_only_calls_that_fit_effective_headroom() -> None:
    h = Harness()
    h.submit("heavy", peak=2 * GiB)
    h.submit("medium", peak=256 * MiB)
    h.submit("too-big", peak=200 * MiB)
    h.submit("small", peak=100 * MiB)
    decisions = h.step(reading(YELLOW, eff=150 * MiB))
    assert [d.call_id for d in decisions] == ["small"]
    assert decisions[0].reason.startswith("yellow")
    assert not decisions[0].probe
    # Headroom is consumed within a step: 300 MiB fits three 100 MiB calls, not four.
    for i in range(4):
        h.submit(f"t{i}", peak=100 * MiB, sandbox=f"y{i}")
    assert h.ids(reading(YELLOW, eff=300 * MiB)) == ["t0", "t1", "t2"]
    assert h.ids(reading(GREEN)) == ["t3", "medium", "too-big", "heavy"]


def test_yellow_admits_heavy_calls_with_a_known_peak_but_guessed_ones_keep_red_free() -> None:
    """A declared or observed peak that fits the effective headroom is admitted in yellow
    whatever its size (the headroom already excludes every admitted call's predicted growth);
    a heavy call whose peak is a class default (a guess) must also leave the red region free."""

    def yellow(eff: int) -> PressureReading:
        return PressureReading(YELLOW, eff, eff, "t", budget=4 * GiB, safety_margin=0,
                               red_limit=512 * MiB)

    h = Harness()
    h.submit("declared", peak=300 * MiB, source="declared", sandbox="a")
    h.submit("history", peak=300 * MiB, source="class-history:test", sandbox="b")
    h.submit("guess", peak=300 * MiB, source="class-default:test", sandbox="c")
    decisions = h.step(yellow(700 * MiB))
    # Both known peaks fit 700 MiB (300 + 300); the guess would not even fit the 100 MiB left.
    assert [d.call_id for d in decisions] == ["declared", "history"]
    assert all(d.reason.startswith("yellow: peak 300 MiB") for d in decisions)
    assert h.ids(yellow(700 * MiB)) == []  # fits 700 MiB, but 700 - 512 of red < 300
    [d] = h.step(yellow(812 * MiB))  # 812 - 512 = 300: the red region stays free
    assert d.call_id == "guess" and d.reason.startswith("yellow: guessed peak")


def test_red_admits_a_single_headroom_checked_probe() -> None:
    h = Harness()
    h.submit("wide", peak=300 * MiB)  # larger than the headroom: never a probe
    h.submit("p1", peak=50 * MiB)
    h.submit("p2", peak=50 * MiB)
    red = reading(RED, eff=200 * MiB)
    [d] = h.step(red)
    assert (d.call_id, d.probe, d.forced) == ("p1", True, False)
    assert d.reason.startswith("red probe")
    assert h.adm.snapshot()["probe"] == "p1"
    h.clock.advance(1.0)
    assert h.step(red) == []  # one probe in flight
    assert h.adm.release("p1")
    [d] = h.step(red)
    assert (d.call_id, d.probe) == ("p2", True)
    assert h.step(reading(RED, eff=0)) == []
    # Back to green: everything goes, and nothing admitted in green is a probe.
    decisions = h.step(reading(GREEN))
    assert [(d.call_id, d.probe) for d in decisions] == [("wide", False)]
    assert h.adm.snapshot()["probe"] == "p2"  # still a probe until it ends
    assert h.adm.cancel("p2")
    assert h.adm.snapshot()["probe"] is None


def test_probe_still_needs_the_logical_budget() -> None:
    h = Harness()
    h.submit("big", peak=4 * GiB)
    assert h.ids() == ["big"]
    h.submit("p", peak=1 * MiB)
    assert h.ids(reading(RED, eff=1 * GiB)) == []


# -- bounded wait --------------------------------------------------------------------------------


def test_bounded_wait_forces_admission_in_any_state() -> None:
    h = Harness()
    t0 = h.clock()
    ticket = h.submit("a", peak=8 * GiB)  # never fits the 4 GiB budget
    assert ticket.arrival == t0
    assert ticket.deadline == t0 + 30.0
    h.clock.advance(29.9)
    assert h.step(reading(RED, eff=0)) == []
    h.clock.advance(0.1)
    [d] = h.step(reading(RED, eff=0))
    assert (d.call_id, d.forced, d.probe) == ("a", True, False)
    assert d.waited_s == pytest.approx(30.0, abs=0.11)  # the first control period past 30 s
    assert d.admitted_at == h.clock()
    assert d.charge_bytes == 4 * GiB  # never more than the budget (issue 21, item 2)
    assert d.reason.startswith("forced")


def test_bounded_wait_uses_the_callers_arrival_and_admits_oldest_first() -> None:
    h = Harness(AdmissionConfig(max_admission_wait_s=5.0))
    now = h.clock()
    h.submit("young", peak=1 * MiB, arrival=now - 6.0)
    h.submit("old", peak=1 * MiB, arrival=now - 9.0)
    decisions = h.step(reading(RED, eff=0))
    # The oldest runs alone; the next would run beside it into red, so it waits first in line.
    assert [(d.call_id, d.forced, d.waited_s) for d in decisions] == [("old", True, 9.0)]
    assert h.adm.first_in_line is not None and h.adm.first_in_line.call_id == "young"
    h.adm.release("old")
    [d] = h.step(reading(RED, eff=0))
    assert (d.call_id, d.forced, d.waited_s) == ("young", True, 6.0)


def test_forced_calls_use_up_headroom_of_the_step() -> None:
    h = Harness()
    h.submit("old", peak=200 * MiB, arrival=h.clock() - 31.0, sandbox="A")
    h.submit("y1", peak=100 * MiB, sandbox="B")
    h.submit("y2", peak=100 * MiB, sandbox="C")
    decisions = h.step(reading(YELLOW, eff=300 * MiB))
    assert [(d.call_id, d.forced) for d in decisions] == [("old", True), ("y1", False)]


def test_overdue_call_that_does_not_fit_is_not_admitted_beside_running_calls() -> None:
    """The 8.6x sweep forced calls into red; an expired wait now only puts a call first in line:
    it runs when its peak fits, or alone, and nothing behind it overtakes."""
    h = Harness(AdmissionConfig(max_admission_wait_s=5.0, max_queued_s=1e9))
    h.submit("run", peak=300 * MiB, sandbox="A")
    assert h.ids(reading(GREEN, eff=400 * MiB)) == ["run"]
    h.submit("big", peak=300 * MiB, sandbox="B")
    h.clock.advance(1.0)
    h.submit("small", peak=10 * MiB, sandbox="C")
    red = reading(RED, eff=50 * MiB)
    assert h.ids(red) == ["small"]  # not overdue yet: the red probe
    h.adm.release("small")
    h.clock.advance(10.0)
    h.submit("tiny", peak=1 * MiB, sandbox="D")
    for _ in range(3):  # waits past max_wait; even a call that fits may not overtake it
        assert h.step(red) == []
        h.clock.advance(10.0)
    first = h.adm.first_in_line
    assert first is not None and first.call_id == "big"
    assert first.deficit_bytes == 250 * MiB
    assert h.adm.snapshot()["first_in_line"]["deficit_bytes"] == 250 * MiB
    waited, why = h.adm.explain("big") or (0.0, "")
    assert waited == pytest.approx(41.0) and why.startswith("first in line, needs 250 MiB")
    assert h.adm.explain("tiny") == (pytest.approx(30.0), "behind a call that has waited longer")
    assert h.adm.explain("run") is None  # running, not queued
    # Room frees (green, enough headroom): it fits and runs first, then the rest.
    decisions = h.step(reading(GREEN, eff=350 * MiB))
    assert [(d.call_id, d.forced) for d in decisions] == [("big", True), ("tiny", True)]
    assert "fits headroom" in decisions[0].reason
    assert h.adm.first_in_line is None


def test_overdue_call_runs_alone_once_the_running_calls_end() -> None:
    h = Harness(AdmissionConfig(max_admission_wait_s=5.0))
    h.submit("run", peak=300 * MiB, sandbox="A")
    assert h.ids() == ["run"]
    h.submit("big", peak=8 * GiB, sandbox="B")  # larger than the whole domain
    h.clock.advance(6.0)
    assert h.step(reading(RED, eff=0)) == []
    h.adm.release("run")
    [d] = h.step(reading(RED, eff=0))
    assert (d.call_id, d.forced, d.probe) == ("big", True, False)
    assert "runs alone" in d.reason


def test_overdue_call_in_red_takes_the_single_probe_slot() -> None:
    h = Harness(AdmissionConfig(max_admission_wait_s=5.0))
    red = reading(RED, eff=200 * MiB)
    h.submit("p1", peak=50 * MiB, sandbox="A")
    assert h.ids(red) == ["p1"]  # the probe
    h.submit("old", peak=50 * MiB, sandbox="B")
    h.clock.advance(6.0)
    assert h.step(red) == []  # it fits, but the probe slot is taken: it waits first in line
    assert h.adm.first_in_line is not None and h.adm.first_in_line.deficit_bytes == 0
    h.adm.release("p1")
    [d] = h.step(red)
    assert (d.call_id, d.forced, d.probe) == ("old", True, True)


def test_max_queued_s_fails_open_and_is_counted() -> None:
    h = Harness(AdmissionConfig(max_admission_wait_s=5.0, max_queued_s=60.0))
    h.submit("server", peak=4 * GiB, sandbox="A")  # a detached call that never ends
    assert h.ids() == ["server"]
    h.submit("big", peak=1 * GiB, sandbox="B")
    h.clock.advance(59.0)
    assert h.step(reading(RED, eff=0)) == []
    h.clock.advance(1.0)
    [d] = h.step(reading(RED, eff=0))
    assert (d.call_id, d.forced, d.overheld) == ("big", True, True)
    assert d.reason.startswith("overheld")
    assert h.adm.overheld == 1 and h.adm.snapshot()["overheld"] == 1


@pytest.mark.parametrize("cap", [10.0, 0.0])
def test_max_queued_s_below_the_bounded_wait_forces_at_the_bounded_wait(cap: float) -> None:
    """The rule before no-force, for tests and ablations that take admission out of the way."""
    with pytest.raises(ValueError):
        AdmissionConfig(max_queued_s=-1.0)
    h = Harness(AdmissionConfig(max_admission_wait_s=30.0, max_queued_s=cap))
    h.submit("run", peak=4 * GiB, sandbox="A")
    assert h.ids() == ["run"]
    h.submit("late", peak=1 * GiB, sandbox="B")
    h.clock.advance(29.0)
    assert h.step(reading(RED, eff=0)) == []
    h.clock.advance(1.0)
    [d] = h.step(reading(RED, eff=0))
    assert (d.call_id, d.overheld) == ("late", True)


# -- fairness and priority -----------------------------------------------------------------------


def test_fairness_one_call_is_not_starved_by_fifty() -> None:
    h = Harness()
    r = reading(budget=512 * MiB)  # one call at a time
    for i in range(50):
        h.submit(f"a{i}", peak=512 * MiB, sandbox="A")
    h.submit("b0", peak=512 * MiB, sandbox="B")
    order: list[str] = []
    while len(order) < 4:
        [d] = h.step(r)
        order.append(d.call_id)
        h.clock.advance(0.5)
        h.adm.release(d.call_id)
    assert order[:2] == ["a0", "b0"]
    assert order[2:] == ["a1", "a2"]


def test_fairness_round_robin_within_one_step() -> None:
    h = Harness()
    for i in range(3):
        for sb in "ABC":
            h.submit(f"{sb}{i}", peak=MiB, sandbox=sb)
    assert h.ids() == ["A0", "B0", "C0", "A1", "B1", "C1", "A2", "B2", "C2"]


def test_priority_within_a_queue() -> None:
    h = Harness()
    h.submit("low", peak=MiB, sandbox="A", priority="low")
    h.submit("n1", peak=MiB, sandbox="B")
    h.submit("n2", peak=MiB, sandbox="A")
    h.submit("high", peak=MiB, sandbox="A", priority="high")
    h.submit("heavy-high", peak=2 * GiB, sandbox="C", priority="high")
    # high first, then round-robin between A and B, low last; the heavy queue after the light one.
    assert h.ids() == ["high", "n1", "n2", "low", "heavy-high"]


# -- cancel, snapshot, growth, determinism -------------------------------------------------------


def test_cancel() -> None:
    h = Harness()
    r = reading(budget=1 * GiB)
    h.submit("a", peak=1 * GiB)
    h.submit("b", peak=1 * GiB)
    h.submit("c", peak=1 * GiB)
    assert h.ids(r) == ["a"]
    assert h.adm.cancel("b") is True
    assert h.adm.cancel("b") is False
    assert h.adm.cancel("nope") is False
    assert h.adm.cancel("a") is True  # admitted already: released
    assert h.ids(r) == ["c"]
    h.clock.advance(60.0)
    assert h.step(r) == []  # the cancelled call is never forced in


def test_snapshot_shows_queues_charges_and_waits() -> None:
    h = Harness()
    assert h.adm.snapshot()["state"] is None
    h.submit("run", peak=3 * GiB, avg=1 * GiB, sandbox="A")
    h.step()
    h.clock.advance(2.0)
    h.submit("wait", peak=2 * GiB, sandbox="B")
    h.clock.advance(1.5)
    h.step(reading(YELLOW, eff=GiB))
    snap = h.adm.snapshot()
    assert snap["state"] == "yellow"
    assert snap["budget"] == snap["logical_budget"] == 4 * GiB
    assert snap["admitted_bytes"] == 1 * GiB
    [run] = snap["running"]
    assert run["call_id"] == "run"
    assert run["charge_bytes"] == 1 * GiB
    assert run["running_s"] == pytest.approx(3.5)
    assert run["waited_s"] == 0.0
    [wait] = snap["queued"]
    assert wait["call_id"] == "wait"
    assert wait["queue"] == "heavy"
    assert wait["waited_s"] == pytest.approx(1.5)
    assert wait["charge_bytes"] == 2 * GiB  # avg = peak
    assert wait["demand"] == {"avg_bytes": 2 * GiB, "peak_bytes": 2 * GiB, "source": "stub"}
    assert snap["credit"]["target"] == "wait"
    assert snap["credit"]["bytes"] == int(1.5 * 0.4 * GiB)


def test_predicted_growth_of_admitted_calls() -> None:
    h = Harness()
    h.submit("a", peak=1 * GiB)
    h.submit("b", peak=512 * MiB)
    h.submit("queued", peak=8 * GiB)
    h.step()
    assert h.adm.predicted_growth({"a": 256 * MiB, "b": 600 * MiB}) == 768 * MiB
    assert h.adm.predicted_growth({}) == 1536 * MiB  # unsampled calls count from zero
    h.submit("declared", peak=100 * MiB, source="declared", sandbox="d")
    h.step()
    assert h.adm.predicted_growth({}) == 1636 * MiB
    assert h.adm.predicted_growth({}, undeclared_only=True) == 1536 * MiB


def test_predicted_growths_in_one_pass_equal_the_full_sums() -> None:
    """predicted_growths (one pass, both figures) against predicted_remaining_growth over every
    running call, and over the undeclared ones."""
    h = Harness()
    for i in range(12):
        h.submit(f"c{i}", peak=(i % 5 + 1) * 200 * MiB, sandbox=f"s{i}",
                 source="declared" if i % 3 == 0 else "default")
    h.step(reading(GREEN, budget=64 * GiB))
    h.submit("queued", peak=80 * GiB)  # not admitted: counts in neither
    running = h.adm._running
    assert len(running) == 12
    for usage in ({}, {f"c{i}": i * 150 * MiB for i in range(12)}, {"c1": 10 * GiB}):
        def full(undeclared: bool, usage: dict[str, int] = usage) -> int:
            return predicted_remaining_growth(
                (e.demand.peak_bytes, usage.get(cid, 0)) for cid, e in running.items()
                if not (undeclared and e.demand.source == "declared"))
        assert h.adm.predicted_growths(usage) == (full(False), full(True))
        assert h.adm.predicted_growth(usage, True) == full(True)


def test_deterministic_given_the_clock() -> None:
    def run() -> list[tuple]:
        h = Harness()
        out = []
        for i in range(40):
            h.submit(f"c{i}", peak=(i % 7 + 1) * 300 * MiB, sandbox=f"s{i % 3}")
            state = (GREEN, YELLOW, RED)[i % 3]
            out += [(d.call_id, d.charge_bytes, d.probe, d.forced) for d in h.step(reading(state))]
            if i % 4 == 0 and out:
                h.adm.release(out[-1][0])
            h.clock.advance(1.0)
        return out

    assert run() == run()


def test_idle_room_admits_what_free_memory_alone_would_not_and_says_what_it_borrowed() -> None:
    """Issue 15 §3: headroom counts what idle sandboxes can give back in time; the admissions
    that count on it say how much (the daemon then has it reclaimed)."""
    h = Harness()
    h.submit("r", peak=100 * MiB, sandbox="R")
    assert h.ids(reading(GREEN, eff=400 * MiB)) == ["r"]  # so the next does not run alone
    h.submit("a", peak=300 * MiB, sandbox="A")
    assert h.ids(reading(GREEN, eff=200 * MiB)) == []  # free memory alone: it waits
    assert h.adm.borrowed_bytes == 0
    assert h.adm.step(reading(GREEN, eff=200 * MiB), idle_room=150 * MiB)[0].call_id == "a"
    assert h.adm.borrowed_bytes == 100 * MiB  # 300 peak - 200 free
    h.submit("b", peak=40 * MiB, sandbox="B")
    assert h.adm.step(reading(GREEN, eff=100 * MiB), idle_room=500 * MiB)[0].call_id == "b"
    assert h.adm.borrowed_bytes == 0  # it fitted in free memory
    assert h.adm.step(reading(GREEN, eff=100 * MiB), idle_room=500 * MiB) == []
    assert h.adm.borrowed_bytes == 0  # nothing admitted, nothing borrowed


def test_an_overdue_call_counts_idle_room_under_the_no_force_rule() -> None:
    h = Harness(AdmissionConfig(max_admission_wait_s=5.0, max_queued_s=1e9))
    h.submit("run", peak=100 * MiB, sandbox="A")
    assert h.ids(reading(GREEN, eff=400 * MiB)) == ["run"]
    h.submit("big", peak=300 * MiB, sandbox="B")
    h.clock.advance(10.0)
    y = reading(YELLOW, eff=100 * MiB)
    assert h.adm.step(y, idle_room=100 * MiB) == []
    first = h.adm.first_in_line
    assert first is not None and first.deficit_bytes == 100 * MiB  # 300 - (100 + 100)
    [d] = h.adm.step(y, idle_room=200 * MiB)
    assert d.call_id == "big" and d.forced and h.adm.borrowed_bytes == 200 * MiB


def test_overdue_calls_go_oldest_first_whether_or_not_they_came_in_order() -> None:
    """The overdue head is found without sorting the queue while calls arrive in order; the same
    random run with the queue treated as out of order (sorted every step) decides the same,
    and calls submitted with earlier arrivals than their predecessors still go oldest first."""
    import random

    def run(fast: bool) -> list[tuple[str, float, bool]]:
        rng = random.Random(3)
        h = Harness(AdmissionConfig(max_admission_wait_s=5.0, max_queued_s=50.0))
        out = []
        for i in range(300):
            h.clock.advance(rng.choice([0.0, 0.5, 1.0]))
            if rng.random() < 0.5:
                h.submit(f"c{i}", rng.randrange(1, 900) * MiB, sandbox=f"s{i % 7}")
            if not fast:
                h.adm._fifo = False
            state = rng.choice([GREEN, YELLOW, RED, RED])
            for d in h.step(reading(state, eff=rng.randrange(0, 1024) * MiB)):
                out.append((d.call_id, d.admitted_at, d.forced))
            for cid in list(h.adm._running):
                if rng.random() < 0.2:
                    h.adm.release(cid)
        return out

    fast = run(True)
    assert fast == run(False)
    assert sum(f for _, _, f in fast) > 10 and len(fast) > 100
    h = Harness(AdmissionConfig(max_admission_wait_s=5.0))
    h.submit("late", 900 * MiB, arrival=h.clock.t - 6)
    h.submit("early", 900 * MiB, arrival=h.clock.t - 9)
    assert not h.adm._fifo
    first = h.step(reading(RED, eff=1000 * MiB))
    assert [d.call_id for d in first] == ["early"] and first[0].forced


def test_queued_bytes_running_total_equals_the_sum_over_the_queue() -> None:
    """queued_bytes is kept as calls are submitted, admitted, cancelled and released: at
    every point it equals the sum of the queued calls' predicted peaks."""
    rng = random.Random(7)
    h = Harness()
    ids: list[str] = []
    for i in range(300):
        op = rng.random()
        if op < 0.5:
            ids.append(f"c{i}")
            h.submit(ids[-1], peak=rng.randint(1, 3000) * MiB, sandbox=f"s{i % 9}")
        elif op < 0.7:
            h.step(reading(rng.choice((GREEN, YELLOW, RED)), eff=rng.randint(0, 4096) * MiB))
        elif ids:
            cid = ids.pop(rng.randrange(len(ids)))
            (h.adm.cancel if op < 0.85 else h.adm.release)(cid)
        h.clock.advance(rng.choice((0.1, 5.0, 40.0)))
        assert h.adm.queued_bytes() == sum(e.demand.peak_bytes for e in h.adm._queued.values())
    assert h.adm._running and h.adm._queued  # both kinds were exercised


def test_the_idle_room_is_needed_only_when_the_queue_does_not_fit_at_green() -> None:
    """Measuring what idle sandboxes could give back costs a memory.stat read per sandbox on
    every request; at green, when every waiting call's predicted peak fits, each is admitted
    with or without it, so it is not measured."""
    h = Harness()
    assert not h.adm.needs_idle_room(reading(eff=1 * GiB))  # nothing waits
    h.submit("a", 300 * MiB)
    h.submit("b", 300 * MiB, sandbox="sb2")
    assert not h.adm.needs_idle_room(reading(eff=1 * GiB))  # 600 MiB fit
    assert h.adm.needs_idle_room(reading(eff=500 * MiB))  # they do not all fit
    assert h.adm.needs_idle_room(reading(YELLOW, eff=1 * GiB))  # not green
    assert h.ids(reading(eff=1 * GiB)) == ["a", "b"]
    assert not h.adm.needs_idle_room(reading(YELLOW, eff=0))  # the queue is empty again
