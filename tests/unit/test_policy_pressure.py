"""Memory-pressure state Q(t) (TenonAgent §3.2): regions, margin S, predicted growth, PSI."""

from __future__ import annotations

import pytest

from execgate.common.units import GiB, MiB
from execgate.policy.pressure import (
    PressureConfig,
    assess_pressure,
    predicted_remaining_growth,
    region_limits,
)
from execgate.policy.pressure_state import Pressure

S = 256 * MiB
BUDGET = 8 * GiB  # red limit 1 GiB (12.5 %), yellow limit 2 GiB (25 %)
CFG = PressureConfig()


def state(available: int, **kw) -> Pressure:
    return assess_pressure(CFG, available, BUDGET, **kw).state


@pytest.mark.parametrize(
    ("headroom", "expected"),
    [
        (8 * GiB, Pressure.GREEN),
        (2 * GiB + 1, Pressure.GREEN),
        (2 * GiB, Pressure.YELLOW),  # boundary goes to the worse state
        (1 * GiB + 1, Pressure.YELLOW),
        (1 * GiB, Pressure.RED),  # red wins the tie
        (1, Pressure.RED),
        (0, Pressure.RED),
    ],
)
def test_region_boundaries(headroom: int, expected: Pressure) -> None:
    reading = assess_pressure(CFG, S + headroom, BUDGET)
    assert reading.state is expected
    assert reading.headroom == headroom
    assert reading.effective_headroom == headroom
    assert reading.reason.startswith(str(expected))


def test_custom_region_fractions() -> None:
    cfg = PressureConfig(red_fraction=0.25, yellow_fraction=0.25, red_max_bytes=None,
                         yellow_max_bytes=None)  # red <= 2 GiB, yellow <= 4 GiB
    assert assess_pressure(cfg, S + 4 * GiB + 1, BUDGET).state is Pressure.GREEN
    assert assess_pressure(cfg, S + 4 * GiB, BUDGET).state is Pressure.YELLOW
    assert assess_pressure(cfg, S + 2 * GiB, BUDGET).state is Pressure.RED


def test_regions_are_capped_in_bytes_on_a_large_domain() -> None:
    """12.5 % of a 64 GiB domain held 8 GiB back as red, where admission runs one call at a
    time: 1,000 sandboxes (simulated) ran 1-2 calls at once for 5,000 s beside 7 GiB free."""
    big = 64 * GiB
    assert region_limits(CFG, big) == (1 * GiB, 2 * GiB)
    assert assess_pressure(CFG, S + 7 * GiB, big).state is Pressure.GREEN
    assert assess_pressure(CFG, S + 2 * GiB, big).state is Pressure.YELLOW
    assert assess_pressure(CFG, S + 1 * GiB, big).state is Pressure.RED
    # A small domain keeps its fractions (the VM's, the test bed's): 512 MiB of 4 GiB.
    assert region_limits(CFG, 4 * GiB) == (512 * MiB, 1 * GiB)
    uncapped = PressureConfig(red_max_bytes=None, yellow_max_bytes=None)
    assert region_limits(uncapped, big) == (8 * GiB, 16 * GiB)
    assert assess_pressure(uncapped, S + 7 * GiB, big).state is Pressure.RED
    assert "red limit 1 GiB" in assess_pressure(CFG, S + 1 * GiB, big).reason


def test_safety_margin_is_not_headroom() -> None:
    available = 2 * GiB + 100 * MiB  # would be green without S
    reading = assess_pressure(CFG, available, BUDGET)
    assert reading.headroom == available - S
    assert reading.state is Pressure.YELLOW
    no_margin = PressureConfig(safety_margin_bytes=0)
    assert assess_pressure(no_margin, available, BUDGET).state is Pressure.GREEN


def test_available_below_margin_or_negative_is_zero_headroom() -> None:
    for available in (S - 1, 0, -GiB):  # a parent cgroup can be over its max
        reading = assess_pressure(CFG, available, BUDGET)
        assert reading.headroom == 0
        assert reading.effective_headroom == 0
        assert reading.state is Pressure.RED


def test_predicted_growth_turns_yellow_before_usage_does() -> None:
    available = S + 3 * GiB  # green by usage alone
    assert state(available) is Pressure.GREEN
    reading = assess_pressure(CFG, available, BUDGET, predicted_growth=1536 * MiB)
    assert reading.state is Pressure.YELLOW
    assert reading.headroom == 3 * GiB
    assert reading.effective_headroom == 1536 * MiB
    assert "predicted growth" in reading.reason
    assert reading.predicted_growth == 1536 * MiB


def test_predicted_growth_can_turn_red_and_clamps_at_zero() -> None:
    available = S + 3 * GiB
    assert state(available, predicted_growth=2 * GiB) is Pressure.RED  # effective 1 GiB: tie
    reading = assess_pressure(CFG, available, BUDGET, predicted_growth=10 * GiB)
    assert reading.state is Pressure.RED
    assert reading.effective_headroom == 0
    assert reading.headroom == 3 * GiB


def test_growth_boundary_and_negative_growth() -> None:
    available = S + 3 * GiB
    assert state(available, predicted_growth=1 * GiB - 1) is Pressure.GREEN  # effective 2 GiB + 1
    assert state(available, predicted_growth=1 * GiB) is Pressure.YELLOW  # effective = 2 GiB
    assert state(available, predicted_growth=-GiB) is Pressure.GREEN  # nonsense growth ignored


def test_red_wins_between_usage_and_growth() -> None:
    # Usage alone says yellow, usage + growth says red: red is reported.
    reading = assess_pressure(CFG, S + 1536 * MiB, BUDGET, predicted_growth=512 * MiB)
    assert reading.state is Pressure.RED
    assert max(Pressure.YELLOW, Pressure.RED) is Pressure.RED


def test_empty_domain_is_red() -> None:
    assert assess_pressure(CFG, 0, 0).state is Pressure.RED


def test_psi_rule_is_off_by_default() -> None:
    assert state(S + 8 * GiB, psi_some_avg10=99.0) is Pressure.GREEN


def test_psi_raises_state_above_thresholds() -> None:
    cfg = PressureConfig(psi_yellow_some_avg10=20.0, psi_red_some_avg10=60.0)
    green = S + 8 * GiB
    assert assess_pressure(cfg, green, BUDGET, psi_some_avg10=20.0).state is Pressure.GREEN
    reading = assess_pressure(cfg, green, BUDGET, psi_some_avg10=20.5)
    assert reading.state is Pressure.YELLOW
    assert "PSI" in reading.reason
    assert reading.psi_some_avg10 == 20.5
    assert assess_pressure(cfg, green, BUDGET, psi_some_avg10=61.0).state is Pressure.RED


def test_psi_never_lowers_state() -> None:
    cfg = PressureConfig(psi_yellow_some_avg10=20.0)
    reading = assess_pressure(cfg, S + GiB, BUDGET, psi_some_avg10=30.0)
    assert reading.state is Pressure.RED
    assert "PSI" not in reading.reason
    assert assess_pressure(cfg, S + GiB, BUDGET, psi_some_avg10=0.0).state is Pressure.RED


def test_reading_carries_budget_for_admission() -> None:
    reading = assess_pressure(CFG, S + 4 * GiB, BUDGET)
    assert reading.budget == BUDGET
    assert reading.safety_margin == S
    assert reading.logical_budget == BUDGET - S
    assert reading.available == S + 4 * GiB
    assert "green" in reading.reason


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        PressureConfig(red_fraction=0.75, yellow_fraction=0.5)
    with pytest.raises(ValueError):
        PressureConfig(safety_margin_bytes=-1)
    with pytest.raises(ValueError):
        PressureConfig(red_max_bytes=-1)
    with pytest.raises(ValueError):
        assess_pressure(CFG, 0, -1)


def test_predicted_remaining_growth() -> None:
    calls = [(1 * GiB, 256 * MiB), (100 * MiB, 200 * MiB), (64 * MiB, 0)]
    assert predicted_remaining_growth(calls) == 768 * MiB + 0 + 64 * MiB
    assert predicted_remaining_growth([]) == 0


def test_safety_margin_is_at_most_an_eighth_of_the_budget() -> None:
    """S_eff = min(S, budget / 8), like the growth gate's reserve: a 384 MiB cgroup domain keeps
    48 MiB, not two thirds of itself, out of the headroom."""
    small = 384 * MiB
    r = assess_pressure(CFG, small, small)
    assert r.safety_margin == 48 * MiB
    assert r.headroom == small - 48 * MiB
    assert r.logical_budget == small - 48 * MiB
    assert assess_pressure(CFG, BUDGET, BUDGET).safety_margin == S  # 1 GiB / 8 > 256 MiB
    no_cap = PressureConfig(safety_margin_fraction=1.0)
    assert assess_pressure(no_cap, small, small).safety_margin == S
    with pytest.raises(ValueError):
        PressureConfig(safety_margin_fraction=1.5)


def test_gate_state_counts_only_undeclared_growth() -> None:
    """The growth gate paces by headroom minus the growth predicted for undeclared calls: a
    declared call's growth is the room admission set aside for it."""
    r = assess_pressure(CFG, S + 3 * GiB, BUDGET, predicted_growth=2 * GiB + 512 * MiB)
    assert (r.state, r.gate_state) == (Pressure.RED, Pressure.GREEN)
    assert r.red_limit == 1 * GiB
    r = assess_pressure(CFG, S + 3 * GiB, BUDGET, predicted_growth=2 * GiB + 512 * MiB,
                        undeclared_growth=1536 * MiB)
    assert r.gate_state is Pressure.YELLOW  # 3 GiB - 1.5 GiB <= 2 GiB
    psi = PressureConfig(psi_yellow_some_avg10=20.0)
    r = assess_pressure(psi, S + 3 * GiB, BUDGET, psi_some_avg10=30.0)
    assert r.gate_state is Pressure.YELLOW  # PSI is measured pressure
