"""The simulator's hands follow the daemon's wiring (bench/sim/hands.py, room.py): a sandbox whose
call just ended is idle at once (the action boundary) and reclaimed under yellow; a call that
does not fit the free headroom is admitted on what idle sandboxes can give back (the idle room),
and residency is asked for those bytes (make_room). Seconds in all."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from bench.schemes import EXECGATE, bench_config
from bench.sim.hands import ExecgateHands, settings_from_config
from bench.sim.memory import Domain, MemoryConfig, SimBox, SimCall
from bench.trace import MemoryProfile
from execgate.common.units import MiB
from execgate.policy.pressure_state import Pressure

BUDGET = 400 * MiB


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _hands(tables: dict[str, dict[str, Any]] | None = None,
           budget: int = BUDGET, zram: bool = True) -> tuple[ExecgateHands, Domain, Clock]:
    cfg = bench_config({}, EXECGATE, domain="/sim")
    for name, values in (tables or {}).items():
        cfg.setdefault(name, {}).update(values)
    settings, _warnings = settings_from_config(cfg)
    clock = Clock()
    domain = Domain(budget, MemoryConfig(swap=True, zram=zram))
    return ExecgateHands(settings, domain, clock), domain, clock


def _box(domain: Domain, name: str, baseline_mib: int, clock: Clock) -> SimBox:
    box = SimBox(name, baseline_mib * MiB, last_active=clock.t)
    domain.add_box(box)
    return box


def _run_call(hands: ExecgateHands, domain: Domain, box: SimBox, cid: str, mib: float,
              clock: Clock) -> SimCall:
    hands.submit(cid, box.id, ["true"], None)
    prof = MemoryProfile(int(mib * MiB), int(mib * MiB), "plateau", 0.0, 0.0, 0)
    call = SimCall(cid, box, prof, 100.0, 0, started=clock.t, last=clock.t)
    domain.start_call(call)
    hands.started(call)
    domain.advance(clock.t)
    return call


def _yellow_with_an_ended_sandbox(tables: dict[str, dict[str, Any]] | None = None
                                  ) -> tuple[ExecgateHands, Domain]:
    """A: a 120 MiB sandbox whose call has just ended; B: a call running beside it, which puts
    the domain in yellow (not red: reclaim, no freeze). Swap is unlimited here, so its room
    would count as memory and keep the domain green: the swap credit is off."""
    tables = {name: dict(values) for name, values in (tables or {}).items()}
    tables.setdefault("headroom", {})["count_swap"] = False
    hands, domain, clock = _hands(tables)
    a, b = _box(domain, "A", 120, clock), _box(domain, "B", 20, clock)
    call = _run_call(hands, domain, a, "A/1", 10, clock)
    clock.t += 1.0
    domain.end_call(call)
    a.last_active = clock.t
    hands.finished("A/1", call, False)
    busy = _run_call(hands, domain, b, "B/1", 140, clock)
    assert busy.level > 0
    clock.t += 0.5
    hands.tick(0.1)
    # no swap here: the reading residency acts on has no credit (engine: one reading)
    assert hands.physical is not None and hands.physical.state == Pressure.YELLOW, hands.physical
    return hands, domain


def test_a_sandbox_idle_at_call_end_is_reclaimed_under_yellow() -> None:
    hands, domain = _yellow_with_an_ended_sandbox()
    assert "A" in domain.reclaiming and "B" not in domain.reclaiming
    assert hands.stats.reclaims == 1 and hands.stats.reclaims_at_call_end == 1
    assert hands.stats.reclaimed_bytes > 100 * MiB  # down to keep_bytes: page cache + swap room


def test_without_the_action_boundary_it_waits_out_idle_after() -> None:
    hands, domain = _yellow_with_an_ended_sandbox({"residency": {"reclaim_at_call_end": False}})
    assert not domain.reclaiming and hands.stats.reclaims == 0


def _idle_room_case(tables: dict[str, dict[str, Any]] | None = None, zram: bool = True
                    ) -> tuple[ExecgateHands, Domain, Clock, list[Any]]:
    """A 200 MiB sandbox idle since its call ended, a call running in C; a call in B declaring
    250 MiB, more than the free headroom, less than it plus what A can push out in time.
    Swap room not counted as memory (the swap credit would admit B on its own)."""
    tables = {**(tables or {})}
    tables["headroom"] = {"count_swap": False, **tables.get("headroom", {})}
    hands, domain, clock = _hands(tables, zram=zram)
    a, b = _box(domain, "A", 200, clock), _box(domain, "B", 20, clock)
    c = _box(domain, "C", 20, clock)
    call = _run_call(hands, domain, a, "A/1", 5, clock)
    clock.t += 1.0
    domain.end_call(call)
    a.last_active = clock.t
    hands.finished("A/1", call, False)
    _run_call(hands, domain, c, "C/1", 20, clock)  # not alone: no lone-call admission
    clock.t += 2.0
    got = hands.submit("B/1", b.id, ["python", "-c", "pass"], 250 * MiB)
    reading = hands.reading
    assert reading is not None and reading.effective_headroom < 250 * MiB
    return hands, domain, clock, got


def test_a_call_is_admitted_on_idle_room_and_residency_is_asked_for_it() -> None:
    hands, domain, clock, got = _idle_room_case()
    assert [d.call_id for d in got] == ["B/1"]
    assert hands.idle_room is not None
    assert hands.idle_room.stats["admissions_on_idle"] == 1
    assert hands.idle_room.stats["borrowed_bytes"] > 0
    assert hands.res.room_wanted() > 0  # make_room: residency acts on it, green or not
    clock.t += 0.5
    hands.tick(0.1)
    assert "A" in domain.reclaiming and hands.stats.reclaims_on_room == 1


def test_under_zswap_the_idle_room_is_what_a_push_frees() -> None:
    """zswap keeps a third of each pushed byte charged: what A lends shrinks by a third, too
    little for B's call, which waits (with zram it was admitted above)."""
    hands, _domain, _clock, got = _idle_room_case(zram=False)
    assert hands.res.swap_kept() == 1 / 3
    assert got == [] and "B/1" in hands.waiting


def test_without_the_idle_room_the_call_waits() -> None:
    hands, _domain, _clock, got = _idle_room_case({"headroom": {"count_idle": False}})
    assert got == [] and "B/1" in hands.waiting


def test_direct_reclaim_stalls_a_growing_call_instead_of_killing() -> None:
    """A call growing past the limit faster than swap-out frees its neighbour's idle baseline
    waits for reclaim (the kernel's direct reclaim), where it was OOM-killed before."""
    for direct, killed in ((True, False), (False, True)):
        domain = Domain(100 * MiB, MemoryConfig(swap=True, swap_bandwidth_bps=1 * MiB,
                                                direct_reclaim=direct))
        idle = SimBox("idle", 60 * MiB)
        busy = SimBox("busy", 10 * MiB)
        domain.add_box(idle)
        domain.add_box(busy)
        prof = MemoryProfile(50 * MiB, 50 * MiB, "plateau", 0.0, 0.0, 0)
        call = SimCall("busy/1", busy, prof, 10.0, 0, started=0.0, last=0.0)
        domain.start_call(call)
        kills = []
        for k in range(1, 6):
            domain.advance(0.1 * k)
            kills += domain.enforce(0.1 * k, 0.1)
        assert bool(kills) is killed, kills
        assert domain.usage() <= domain.budget + 1
        if direct:
            assert domain.stalled_bytes > 0 and call.level < 50 * MiB and idle.swapped > 0


def test_zram_copies_are_not_charged_to_the_domain() -> None:
    """zswap charges a swapped page's compressed copy to the memcg; zram's pool is the host's."""
    for zram, charged in ((False, 20 * MiB), (True, 0)):
        domain = Domain(100 * MiB, MemoryConfig(swap=True, swap_ratio=3.0, zram=zram))
        domain.add_box(SimBox("idle", 60 * MiB))
        domain.reclaim("idle", 60 * MiB)
        domain.step_reclaim(10.0)
        assert domain.usage() == charged


def test_swap_room_counts_as_available_until_the_domain_refaults() -> None:
    """engine._step's swap credit: the hands' reading counts the domain's swap room while
    anonymous refaults stay low (the physical one, kept for the summary, does not); refaults above
    thrash_refault_fraction of the budget per second turn it off."""
    hands, _, clock = _hands()
    domain = Domain(BUDGET, MemoryConfig(swap=True, zram=True, swap_max_bytes=200 * MiB))
    hands = ExecgateHands(hands.settings, domain, clock)
    box = _box(domain, "A", 100, clock)
    _run_call(hands, domain, box, "A/1", 250, clock)
    hands.tick(0.1)
    assert hands.reading is not None and hands.physical is not None
    assert hands.credit > 100 * MiB
    assert hands.reading.headroom == hands.physical.headroom + hands.credit
    for _ in range(30):  # 8 MiB/s of refaults: 2 % of 400 MiB is 8 MiB/s
        clock.t += 0.1
        domain.refault_bytes += 2 * MiB
        hands.tick(0.1)
    assert hands.credit == 0 and hands.reading.headroom == hands.physical.headroom
    assert hands.summary()["thrashing_s"] > 0


def test_a_held_call_is_not_the_kernels_pick_over_a_running_one() -> None:
    """growth_gate._oom: a held call's tasks at held_oom_score_adj (-500), their own back when
    released. The VM case: a held 198 MiB call beside a running 40 MiB one in a 256 MiB domain;
    at the running calls' 500 the kernel took the held one."""
    hands, domain, clock = _hands(budget=256 * MiB)
    held = _run_call(hands, domain, _box(domain, "A", 4, clock), "A/1", 198, clock)
    running = _run_call(hands, domain, _box(domain, "B", 4, clock), "B/1", 40, clock)
    held.oom_score_adj = running.oom_score_adj = 500
    verdict = {"A/1": False, "B/1": True}
    hands.growth.update = lambda *a, **k: SimpleNamespace(allow=dict(verdict))  # type: ignore
    hands.growth.last_resort_victim = lambda *a, **k: None  # type: ignore[method-assign]
    hands.tick(0.1)
    assert held.held and held.oom_score_adj == -500 and running.oom_score_adj == 500
    victim = domain._victim()
    assert victim is not None and victim[2] == "B/1"
    verdict["A/1"] = True
    hands.tick(0.1)
    assert not held.held and held.oom_score_adj == 500
