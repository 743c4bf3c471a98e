"""Residency policy: which idle sandboxes give memory back or are frozen, and when they thaw."""

from __future__ import annotations

import pytest

from execgate.policy.pressure_state import Pressure
from execgate.policy.residency import Action, ResidencyConfig, SandboxView, plan

MiB = 1 << 20
CFG = ResidencyConfig(idle_after_s=20.0, keep_bytes=16 * MiB, reclaim_min_bytes=8 * MiB,
                      thaw_after_green_s=10.0)


def box(cid: str, idle: float | None, mem: int = 200 * MiB, freezable: bool = True,
        frozen: bool = False, reclaimed: bool = False) -> SandboxView:
    return SandboxView(cid, idle, mem, freezable, frozen, reclaimed)


def test_green_leaves_everything_alone_until_it_has_lasted() -> None:
    boxes = [box("a", 100.0), box("b", 300.0, frozen=True)]
    assert plan(CFG, Pressure.GREEN, 5.0, 0, boxes, False) == []
    assert plan(CFG, Pressure.GREEN, 10.0, 0, boxes, False) == [Action("thaw", "b")]
    never = ResidencyConfig(thaw_after_green_s=0)
    assert plan(never, Pressure.GREEN, 1e6, 0, boxes, False) == []


def test_yellow_reclaims_the_longest_idle_sandbox_once() -> None:
    boxes = [box("busy", None), box("fresh", 5.0), box("a", 30.0), box("b", 90.0)]
    assert plan(CFG, Pressure.YELLOW, 0, 64 * MiB, boxes, False) == [
        Action("reclaim", "b", 184 * MiB)]
    boxes[3] = box("b", 90.0, reclaimed=True)
    assert plan(CFG, Pressure.YELLOW, 0, 64 * MiB, boxes, False) == [
        Action("reclaim", "a", 184 * MiB)]
    # one reclaim at a time; nothing when nothing is needed or it is not worth it
    assert plan(CFG, Pressure.YELLOW, 0, 64 * MiB, boxes, True) == []
    assert plan(CFG, Pressure.YELLOW, 0, 0, boxes, False) == []
    assert plan(CFG, Pressure.YELLOW, 0, 1, [box("s", 60.0, mem=20 * MiB)], False) == []


def test_red_freezes_idle_sandboxes_but_never_an_inside_agent() -> None:
    boxes = [box("busy", None), box("agent", 60.0, freezable=False), box("a", 30.0),
             box("done", 50.0, frozen=True, reclaimed=True)]
    acts = plan(CFG, Pressure.RED, 0, 64 * MiB, boxes, False)
    assert Action("freeze", "a") in acts
    assert not any(a.kind == "freeze" and a.cid in ("busy", "agent", "done") for a in acts)
    assert [a for a in acts if a.kind == "reclaim"] == [Action("reclaim", "agent", 184 * MiB)]
    no_freeze = ResidencyConfig(freeze=False)
    assert all(a.kind == "reclaim" for a in plan(no_freeze, Pressure.RED, 0, 1, boxes, False))


def test_disabled_only_thaws() -> None:
    off = ResidencyConfig(enabled=False)
    boxes = [box("a", 60.0, frozen=True), box("b", 60.0)]
    assert plan(off, Pressure.RED, 0, 1 << 30, boxes, False) == [Action("thaw", "a")]


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError):
        ResidencyConfig(idle_after_s=-1)
    with pytest.raises(ValueError):
        ResidencyConfig(keep_bytes=-1)
