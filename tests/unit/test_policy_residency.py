"""Residency policy: which idle sandboxes give memory back or are frozen, and when they thaw."""

from __future__ import annotations

import pytest

from execgate.common.units import MiB
from execgate.policy.pressure_state import Pressure
from execgate.policy.residency import Action, ResidencyConfig, SandboxView, plan

CFG = ResidencyConfig(idle_after_s=20.0, keep_bytes=16 * MiB, reclaim_min_bytes=8 * MiB,
                      thaw_after_green_s=10.0)


def box(cid: str, idle: float | None, mem: int = 200 * MiB, freezable: bool = True,
        frozen: bool = False, reclaimed: bool = False, ended: bool = False) -> SandboxView:
    return SandboxView(cid, idle, mem, freezable, frozen, reclaimed, ended)


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


def test_red_freezes_idle_sandboxes_once_reclaimed_but_never_an_inside_agent() -> None:
    boxes = [box("busy", None), box("agent", 60.0, freezable=False),
             box("a", 30.0, reclaimed=True), box("small", 25.0, mem=20 * MiB),
             box("b", 40.0), box("done", 50.0, frozen=True, reclaimed=True)]
    acts = plan(CFG, Pressure.RED, 0, 64 * MiB, boxes, False)
    # reclaimed (or with nothing worth reclaiming): frozen; b must give memory back first
    assert sorted(a.cid for a in acts if a.kind == "freeze") == ["a", "small"]
    assert [a for a in acts if a.kind == "reclaim"] == [Action("reclaim", "agent", 184 * MiB)]
    # ... and nothing is frozen while a reclaim is still in flight
    assert [a for a in plan(CFG, Pressure.RED, 0, 64 * MiB, boxes, True)
            if a.kind == "freeze"] == [Action("freeze", "small")]
    no_freeze = ResidencyConfig(freeze=False)
    assert all(a.kind == "reclaim" for a in plan(no_freeze, Pressure.RED, 0, 1, boxes, False))
    no_reclaim = ResidencyConfig(reclaim=False)  # freezing alone: at once, as before
    assert {a.cid for a in plan(no_reclaim, Pressure.RED, 0, 1, boxes, False)} == {"a", "small",
                                                                                   "b"}


def test_the_action_boundary_makes_a_sandbox_idle_at_once_under_yellow() -> None:
    """A call has just ended: its agent waits on its model, so the sandbox gives memory back
    now, not after idle_after_s (which replayed LLM waits never reach)."""
    ended = box("ended", 1.0, ended=True)
    fresh = box("fresh", 1.0)  # never ran a call: its start-up may still be at work
    assert plan(CFG, Pressure.YELLOW, 0, 64 * MiB, [fresh, ended], False) == [
        Action("reclaim", "ended", 184 * MiB)]
    assert plan(CFG, Pressure.GREEN, 0, 64 * MiB, [fresh, ended], False) == []
    # once per idle period: reclaimed, it is not asked again until its next call
    assert plan(CFG, Pressure.YELLOW, 0, 64 * MiB,
                [box("ended", 5.0, ended=True, reclaimed=True)], False) == []
    off = ResidencyConfig(idle_after_s=20.0, reclaim_at_call_end=False)
    assert plan(off, Pressure.YELLOW, 0, 64 * MiB, [ended], False) == []
    # red: reclaimed first, frozen after (an inside agent: reclaimed, never frozen)
    assert plan(CFG, Pressure.RED, 0, 64 * MiB, [ended], False) == [
        Action("reclaim", "ended", 184 * MiB)]
    done = box("ended", 3.0, ended=True, reclaimed=True)
    assert plan(CFG, Pressure.RED, 0, 64 * MiB, [done], False) == [Action("freeze", "ended")]
    agent = box("agent", 3.0, ended=True, reclaimed=True, freezable=False)
    assert plan(CFG, Pressure.RED, 0, 64 * MiB, [agent], False) == []


def test_room_for_admission_reclaims_whatever_the_pressure() -> None:
    """make_room: a waiting sandbox or call needs bytes; every idle sandbox may give, green or
    not, the longest idle first; nothing is frozen for it."""
    boxes = [box("busy", None), box("new", 2.0), box("old", 9.0)]
    assert plan(CFG, Pressure.GREEN, 0, 0, boxes, False, room=32 * MiB) == [
        Action("reclaim", "old", 184 * MiB)]
    assert plan(CFG, Pressure.GREEN, 0, 0, boxes, False) == []
    assert plan(CFG, Pressure.GREEN, 0, 0, boxes, True, room=32 * MiB) == []  # one at a time


def test_disabled_only_thaws() -> None:
    off = ResidencyConfig(enabled=False)
    boxes = [box("a", 60.0, frozen=True), box("b", 60.0)]
    assert plan(off, Pressure.RED, 0, 1 << 30, boxes, False) == [Action("thaw", "a")]


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError):
        ResidencyConfig(idle_after_s=-1)
    with pytest.raises(ValueError):
        ResidencyConfig(keep_bytes=-1)


def test_reclaim_asks_only_for_what_can_leave_and_freezes_the_rest_at_once() -> None:
    """A sandbox of anonymous memory with no swap room has nothing to give: no futile reclaim
    (a long scan that holds every other reclaim and freeze back), frozen at once in red."""
    anon = SandboxView("anon", 90.0, 380 * MiB, True, False, False, reclaimable=0)
    cache = SandboxView("cache", 30.0, 220 * MiB, True, False, False, reclaimable=200 * MiB)
    assert plan(CFG, Pressure.RED, 0, 64 * MiB, [anon, cache], False) == [
        Action("freeze", "anon"), Action("reclaim", "cache", 200 * MiB)]
    # room is bounded by the floor too
    most = SandboxView("m", 30.0, 100 * MiB, True, False, False, reclaimable=95 * MiB)
    assert plan(CFG, Pressure.YELLOW, 0, 64 * MiB, [most], False) == [
        Action("reclaim", "m", 84 * MiB)]
