"""Headroom that counts idle sandboxes' reclaimable memory (discounted by swap-out bandwidth), the
reclaim plan (longest idle first, stop when covered) and the no-force rule for expired waits."""

from __future__ import annotations

import dataclasses

import pytest

from execgate.common.units import MiB
from execgate.policy.headroom import (
    HeadroomConfig,
    LiveSandbox,
    Reclaim,
    headroom_with_idle,
    no_force,
    reclaim_plan,
)

CFG = HeadroomConfig(swap_out_bytes_per_s=100 * MiB, default_time_to_peak_s=1.0)


def idle(sid: str, idle_s: float, reclaimable: int, resident: int | None = None) -> LiveSandbox:
    return LiveSandbox(sid, reclaimable if resident is None else resident, reclaimable, idle_s)


def test_only_idle_sandboxes_give_back_and_never_more_than_they_hold() -> None:
    assert idle("a", 5.0, 80 * MiB).pushable_bytes == 80 * MiB
    assert LiveSandbox("b", 200 * MiB, 80 * MiB, None).pushable_bytes == 0
    over = LiveSandbox("c", 50 * MiB, 80 * MiB, 5.0)
    assert (over.pushable_bytes, over.pinned_bytes) == (50 * MiB, 0)
    assert LiveSandbox("d", 200 * MiB, 80 * MiB, 5.0).pinned_bytes == 120 * MiB


def test_headroom_adds_reclaimable_memory_that_can_leave_in_time() -> None:
    boxes = [idle("a", 10.0, 30 * MiB), idle("b", 20.0, 20 * MiB),
             LiveSandbox("busy", 500 * MiB, 400 * MiB, None)]
    h = headroom_with_idle(64 * MiB, boxes, CFG)
    assert (h.reclaimable_bytes, h.in_time_bytes, h.total_bytes) == (
        50 * MiB, 50 * MiB, 114 * MiB)
    assert h.reason == "headroom 114 MiB: free 64 MiB + 50 MiB idle reclaimable"


def test_bandwidth_discount_bytes_that_cannot_leave_before_the_peak_do_not_count() -> None:
    boxes = [idle("a", 10.0, 600 * MiB)]
    h = headroom_with_idle(64 * MiB, boxes, CFG, time_to_peak_s=2.0)
    assert (h.in_time_bytes, h.total_bytes) == (200 * MiB, 264 * MiB)
    assert "200 MiB of 600 MiB idle reclaimable" in h.reason and "over 2 s to peak" in h.reason
    # default time to peak; a call that peaks at once gets no reclaim credit
    assert headroom_with_idle(0, boxes, CFG).in_time_bytes == 100 * MiB
    assert headroom_with_idle(0, boxes, CFG, time_to_peak_s=0).in_time_bytes == 0
    # negative free headroom (a domain over its limit) counts as none
    assert headroom_with_idle(-5, [], CFG).total_bytes == 0


def test_reclaim_plan_takes_the_longest_idle_first_and_stops_when_covered() -> None:
    boxes = [idle("recent", 2.0, 300 * MiB), idle("oldest", 90.0, 100 * MiB),
             idle("middle", 30.0, 100 * MiB), LiveSandbox("busy", 1 << 30, 1 << 30, None)]
    plan = reclaim_plan(150 * MiB, boxes)
    assert plan.steps == (Reclaim("oldest", 100 * MiB), Reclaim("middle", 50 * MiB))
    assert plan.covered and plan.shortfall_bytes == 0 and plan.planned_bytes == 150 * MiB


def test_reclaim_plan_says_what_idle_sandboxes_cannot_cover() -> None:
    plan = reclaim_plan(1 << 30, [idle("a", 10.0, 100 * MiB), idle("b", 5.0, 0)])
    assert plan.steps == (Reclaim("a", 100 * MiB),)
    assert not plan.covered and plan.shortfall_bytes == (1 << 30) - 100 * MiB
    assert reclaim_plan(0, [idle("a", 10.0, 100 * MiB)]).steps == ()


def test_no_force_runs_an_expired_call_when_it_fits() -> None:
    v = no_force(100 * MiB, 100 * MiB, running_calls=3)
    assert v.run and not v.hold_others and v.deficit_bytes == 0
    assert v.reason == "wait over: peak 100 MiB fits headroom 100 MiB"


def test_no_force_runs_an_expired_call_alone_even_when_it_does_not_fit() -> None:
    v = no_force(800 * MiB, 100 * MiB, running_calls=0)
    assert v.run and v.deficit_bytes == 700 * MiB and "runs alone" in v.reason


def test_no_force_never_runs_beside_others_into_a_full_domain_and_holds_the_queue() -> None:
    v = no_force(800 * MiB, 100 * MiB, running_calls=2)
    assert not v.run and v.hold_others and v.deficit_bytes == 700 * MiB
    assert "first in line" in v.reason and "needs 700 MiB more" in v.reason


def test_no_force_admission_loop_with_reclaim_credit() -> None:
    # How admission adopts it: oldest expired call first, headroom counted with idle sandboxes,
    # each started call taking its peak off; the first that may not run stops the loop.
    boxes = [idle("a", 60.0, 100 * MiB)]
    h = headroom_with_idle(50 * MiB, boxes, CFG)
    headroom, running, started = h.total_bytes, 1, []
    for cid, peak in (("x", 120 * MiB), ("y", 120 * MiB), ("z", 1 * MiB)):
        v = no_force(peak, headroom, running)
        if not v.run:
            assert v.hold_others and v.deficit_bytes == 90 * MiB
            break
        started.append(cid)
        headroom -= peak
        running += 1
    assert started == ["x"]  # z, small as it is, does not overtake y
    # x counted on a's memory: the daemon reclaims what free headroom lacked before starting it
    assert reclaim_plan(120 * MiB - h.free_bytes, boxes).steps == (Reclaim("a", 70 * MiB),)


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        HeadroomConfig(swap_out_bytes_per_s=-1)


def test_an_active_sandbox_gives_its_cold_pages_only() -> None:
    """Its call runs in its own cgroup; the baseline beside it is mostly cold, which the kernel
    swaps out under the limit (issue 15: an agent's baseline is not what its call touches)."""
    busy = LiveSandbox("busy", 200 * MiB, 150 * MiB, None, cold_bytes=120 * MiB)
    assert (busy.pushable_bytes, busy.pinned_bytes) == (120 * MiB, 80 * MiB)
    assert LiveSandbox("idle", 200 * MiB, 150 * MiB, 3.0, cold_bytes=10 * MiB).pushable_bytes \
        == 150 * MiB  # idle: what memory.reclaim can take, not only the cold part
    assert LiveSandbox("x", 50 * MiB, 0, None, cold_bytes=80 * MiB).pushable_bytes == 50 * MiB


def test_a_push_into_zswap_frees_less_its_compressed_copy() -> None:
    from execgate.policy.headroom import ZSWAP_KEPT_DEFAULT, freed_bytes, swap_kept_share

    assert swap_kept_share(False, 10, 40) == 0.0  # zram, disk swap: charged to no cgroup
    assert swap_kept_share(True) == ZSWAP_KEPT_DEFAULT == 1 / 3  # nothing measured yet
    assert swap_kept_share(True, 25, 100) == 0.25
    assert swap_kept_share(True, 0, 0) == ZSWAP_KEPT_DEFAULT
    assert freed_bytes(30, 90, 0.0) == 120
    assert freed_bytes(30, 90, 1 / 3) == 90  # page cache whole, anon less a third
    assert freed_bytes(-5, 90, 2.0) == 0  # nonsense is clamped, never negative


def test_time_to_peak_from_the_samples_where_a_call_grew() -> None:
    from execgate.policy.headroom import PeakTimes, time_to_peak

    rise = [(10.0, 5), (11.0, 50), (12.5, 91), (14.0, 100)]
    assert time_to_peak(rise, 10.0, 100) == 2.5  # 90 % at 12.5 s
    assert time_to_peak(rise, 10.0, 200) is None  # peaked between samples: nothing learned
    times = PeakTimes(window=16)
    for s in (8.0, 1.0, 4.0, 2.0, 6.0, 3.0, 5.0):
        times.observe(s, 64 << 20)
    times.observe(0.0, 1 << 20)  # a small call peaks at once: not what the room is for
    times.observe(None, 64 << 20)
    assert times.learned == 7 and times.estimate(1.5) == 1.5  # fewer than MIN_CALLS
    times.observe(7.0, 64 << 20)
    assert times.estimate(1.5) == 3.0  # the low quantile of 1..8


def test_pushable_and_pinned_are_set_at_construction_from_the_fields() -> None:
    """Computed once per LiveSandbox (read every step for every live sandbox): as the rule
    says for every mix of fields, after `replace` too, and left out of eq and repr."""
    for resident in (-5, 0, 100):
        for give in (-3, 0, 40, 150):
            for idle in (None, 2.0):
                box = LiveSandbox("s", resident, give, idle, 7, cold_bytes=give + 1)
                own = give + 1 if idle is None else give
                pushable = min(max(own, 0), max(resident, 0))
                assert (box.pushable_bytes, box.pinned_bytes) == (
                    pushable, max(resident, 0) - pushable)
                moved = dataclasses.replace(box, idle_s=None if idle else 1.0)
                assert moved.pushable_bytes == min(max(moved.cold_bytes if moved.idle_s is None
                                                       else give, 0), max(resident, 0))
    assert LiveSandbox("a", 10, 5) == LiveSandbox("a", 10, 5)
    assert "pushable" not in repr(LiveSandbox("a", 10, 5))
