"""config.toml tables onto the policy configs: deprecated keys still read, with a warning."""

from __future__ import annotations

from execgate.common.config import Config
from execgate.common.units import MiB
from execgate.daemon import settings
from execgate.policy.growth import GrowthController
from execgate.policy.pressure import assess_pressure


def test_old_growth_reserve_keys_are_read_as_the_safety_margin_and_warn() -> None:
    s, errors = settings.load(Config(tables={
        "growth": {"headroom_reserve_bytes": "128m", "headroom_reserve_fraction": 0.25,
                   "max_hold_s": 10},
    }))
    assert s.pressure.safety_margin_bytes == 128 * MiB
    assert s.pressure.safety_margin_fraction == 0.25
    assert s.growth.max_hold_s == 10.0
    assert errors == [
        "[growth] headroom_reserve_bytes is deprecated: read as [pressure] safety_margin_bytes;"
        " rename it",
        "[growth] headroom_reserve_fraction is deprecated: read as [pressure]"
        " safety_margin_fraction; rename it",
    ]


def test_the_new_safety_margin_key_wins_over_the_old_one() -> None:
    s, errors = settings.load(Config(tables={
        "pressure": {"safety_margin_bytes": "64m"},
        "growth": {"headroom_reserve_bytes": "512m"},
    }))
    assert s.pressure.safety_margin_bytes == 64 * MiB
    assert errors == ["[growth] headroom_reserve_bytes is deprecated and ignored: "
                      "[pressure] safety_margin_bytes is set"]


def test_the_configured_margin_reaches_admission_and_the_gate_alike() -> None:
    s, errors = settings.load(Config(tables={"pressure": {"safety_margin_bytes": "96m"}}))
    assert errors == []
    ctl = GrowthController(s.growth, pressure=s.pressure)
    budget, available = 4 << 30, 1 << 30
    reading = assess_pressure(s.pressure, available, budget)
    assert reading.headroom == available - 96 * MiB
    assert ctl.update([], reading.state, available, budget).headroom_bytes == reading.headroom


def test_loading_does_not_touch_the_config_tables() -> None:
    tables = {"growth": {"headroom_reserve_bytes": "128m"}}
    settings.load(Config(tables=tables))
    assert tables == {"growth": {"headroom_reserve_bytes": "128m"}}


def test_old_growth_budget_keys_are_read_as_slots_and_warn() -> None:
    s, errors = settings.load(Config(tables={
        "growth": {"budget_initial": 2, "budget_max": 6, "budget_increase_after_s": 2.5},
    }))
    assert (s.growth.slots_initial, s.growth.slots_max, s.growth.slots_increase_after_s) == (
        2, 6, 2.5)
    assert errors == [
        f"[growth] budget_{name} is deprecated: read as [growth] slots_{name}; rename it"
        for name in ("initial", "max", "increase_after_s")
    ]
    s, errors = settings.load(Config(tables={"growth": {"slots_max": 3, "budget_max": 8}}))
    assert s.growth.slots_max == 3
    assert errors == ["[growth] budget_max is deprecated and ignored: [growth] slots_max is set"]
