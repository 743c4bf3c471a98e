"""Swap room counted as memory while the domain does not thrash (policy/swap_credit.py), the
pressure reading that carries it, the domain's refault counter, and the engine admitting calls
beyond free memory on it — until refaults say the swapped memory is a working set."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from test_daemon_engine import _admit_msg, _engine

from execgate.common.units import MiB
from execgate.daemon.domain import Domain
from execgate.policy.headroom import HeadroomConfig
from execgate.policy.pressure import PressureConfig, assess_pressure
from execgate.policy.pressure_state import Pressure
from execgate.policy.swap_credit import SwapCredit, swap_room

BUDGET = 1024 * MiB


def test_swap_room_is_free_swap_less_zswaps_copy_and_the_margin() -> None:
    assert swap_room(None, 0.0, 0) == 0 and swap_room(0, 0.0, 0) == 0
    assert swap_room(600 * MiB, 0.0, 100 * MiB) == 500 * MiB  # zram: a swapped byte frees all
    assert swap_room(600 * MiB, 1 / 3, 0) == 400 * MiB  # zswap keeps a third charged
    assert swap_room(50 * MiB, 0.0, 100 * MiB) == 0


def test_credit_until_refaults_show_a_working_set_then_held_off() -> None:
    cfg = HeadroomConfig(thrash_refault_fraction=0.02, thrash_window_s=2.0, thrash_hold_s=30.0)
    sc = SwapCredit(cfg)
    assert sc.credit(0.0, 500 * MiB) == 500 * MiB  # nothing measured yet: no thrash seen
    refaults = 0
    for t in range(10):  # cold memory in swap: a trickle of refaults, 1 MiB/s < 20 MiB/s
        refaults += 1 * MiB
        sc.observe(float(t), refaults, BUDGET)
    assert not sc.thrashing(9.0) and sc.credit(9.0, 500 * MiB) == 500 * MiB
    for t in range(10, 13):  # a working set comes back: 60 MiB/s
        refaults += 60 * MiB
        sc.observe(float(t), refaults, BUDGET)
    assert sc.thrashing(12.0) and sc.credit(12.0, 500 * MiB) == 0
    sc.observe(20.0, refaults, BUDGET)  # quiet again, but within the hold
    assert sc.credit(30.0, 500 * MiB) == 0
    sc.observe(43.0, refaults, BUDGET)
    assert sc.credit(43.0, 500 * MiB) == 500 * MiB  # 30 s after the last thrashing sample
    sc.observe(44.0, 0, BUDGET)  # a counter that went back (a new cgroup) starts over
    sc.observe(45.0, 1 * MiB, BUDGET)
    assert sc.refault_bytes_per_s == 1 * MiB
    assert SwapCredit(HeadroomConfig(count_swap=False)).credit(0.0, 500 * MiB) == 0


def test_the_credit_raises_headroom_and_the_logical_budget() -> None:
    cfg = PressureConfig()
    plain = assess_pressure(cfg, 50 * MiB, BUDGET)
    more = assess_pressure(cfg, 50 * MiB, BUDGET, swap_credit=400 * MiB)
    assert (plain.state, more.state) == (Pressure.RED, Pressure.GREEN)
    assert (plain.headroom, more.headroom) == (0, 50 * MiB + 400 * MiB - plain.safety_margin)
    assert more.logical_budget == plain.logical_budget + 400 * MiB
    assert "swap counts 400 MiB" in more.reason


def test_the_domain_reports_anonymous_refaults_in_bytes(tmp_path: Path) -> None:
    cg = tmp_path / "agents.slice"
    cg.mkdir()
    (cg / "memory.max").write_text(f"{BUDGET}\n")
    (cg / "memory.current").write_text(f"{100 * MiB}\n")
    dom = Domain(str(cg))
    assert dom.sample().refault_bytes is None  # no memory.stat: unknown
    (cg / "memory.stat").write_text("anon 1\nworkingset_refault_anon 256\n"
                                    "workingset_refault_file 9\n")
    now = [0.0]
    dom = Domain(str(cg), clock=lambda: now[0])
    assert dom.sample().refault_bytes == 256 * 4096
    # memory.stat flushes the whole domain's statistics (under TCG the costliest read of a
    # period): read twice a second, not at every period
    now[0] += 0.1
    assert dom.sample().refault_bytes is None
    now[0] += 0.4
    assert dom.sample().refault_bytes == 256 * 4096


def test_calls_run_beyond_free_memory_on_swap_until_the_domain_thrashes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three 300 MiB calls in a 1 GiB domain with 600 MiB used: without swap one at a time
    (alone); with 1 GiB of free swap all three; once the domain refaults, the next one waits."""
    async def scenario() -> None:
        eng, clock, _journal = _engine(tmp_path, budget=BUDGET, used=600 * MiB)
        dom = tmp_path / "domain"
        (dom / "memory.stat").write_text("workingset_refault_anon 0\n")
        swap_free = {"bytes": 0}

        def meminfo() -> tuple[int, int]:
            eng.domain._swap_free = swap_free["bytes"]
            return 8 * BUDGET, 4 * BUDGET

        monkeypatch.setattr(eng.domain, "_meminfo", meminfo)
        eng.tick()
        futs = [eng.submit(_admit_msg(i, 300 * MiB))[1] for i in range(3)]
        eng.tick()
        assert sum(f.done() for f in futs) == 1, "no swap: only the call that runs alone"
        assert eng.snapshot()["swap_credit"]["credit_bytes"] == 0
        swap_free["bytes"] = 1024 * MiB
        clock.t += 1
        eng.tick()
        assert all(f.done() for f in futs), eng.snapshot()["pressure"]
        assert eng.snapshot()["swap_credit"]["credit_bytes"] > 0
        # One reading for admission, the gate and residency: with swap room, no pressure that
        # would push idle sandboxes out ahead of the kernel (it swaps what a call needs).
        assert eng.reading is not None and eng.reading.swap_credit > 0
        assert "swap counts" in eng.snapshot()["pressure"]["reason"]
        # ... and the kernel pushes out what the calls need: the idle room lends nothing.
        assert eng.snapshot()["idle_room"]["offered_bytes"] == 0
        # The swapped memory comes straight back: a working set in swap.
        for _ in range(3):
            clock.t += 1
            (dom / "memory.stat").write_text(
                f"workingset_refault_anon {int(clock.t - 1000) * 100 * 256}\n")  # 100 MiB/s
            eng.tick()
        late = eng.submit(_admit_msg(9, 300 * MiB))[1]
        eng.tick()
        assert not late.done()
        snap = eng.snapshot()["swap_credit"]
        assert snap["thrashing"] and snap["credit_bytes"] == 0

    asyncio.run(scenario())
