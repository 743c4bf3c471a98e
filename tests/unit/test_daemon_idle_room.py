"""Call admission counts what idle sandboxes can give back in time, and has it given back
(daemon/idle_room.py; issue 15 §3), on a temp-dir cgroupfs."""

from __future__ import annotations

import asyncio
from pathlib import Path

from test_daemon_sandboxes import Bed

from execgate.common.units import MiB


def _call(i: int, container: str, mem: int) -> dict:
    return {"call": f"tool-{i}", "container": container, "sandbox": container,
            "cgroup": f"/nope/tool-{i}", "argv": ["pytest"], "hint": {"memory_bytes": mem}}


def test_a_call_is_admitted_on_an_idle_sandboxs_page_cache_which_is_then_reclaimed(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        bed = Bed(tmp_path)  # 256 MiB, S 32 MiB
        idle = bed.sandbox("idle", 120 * MiB, file=120 * MiB)  # domain: 128 MiB used
        (idle / "memory.reclaim").write_text("")
        eng = bed.engine
        eng.tick()
        first = eng.submit(_call(0, "a", 60 * MiB))[1]
        assert first.done()  # 96 MiB of headroom
        second = eng.submit(_call(1, "b", 60 * MiB))[1]
        # 36 MiB left beside the first call's predicted growth; the idle sandbox can give
        # 104 MiB (down to keep_bytes 16 MiB) within a second at the configured 256 MiB/s.
        assert second.done(), eng.snapshot()["admission"]
        snap = eng.snapshot()["idle_room"]
        assert snap["borrowed_bytes"] == 24 * MiB and snap["admissions_on_idle"] == 1, snap
        assert eng.residency.room_wanted() == 24 * MiB
        eng.tick()  # residency acts on the ask: the longest idle sandbox is reclaimed
        if eng.residency.worker is not None:
            eng.residency.worker.join(timeout=5)
        assert (idle / "memory.reclaim").read_text() == str(104 * MiB)

    asyncio.run(scenario())


def test_a_busy_sandbox_lends_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        bed = Bed(tmp_path)
        bed.sandbox("busy", 120 * MiB, file=120 * MiB)
        eng = bed.engine
        eng.tick()
        assert eng.submit(_call(0, "busy", 60 * MiB))[1].done()  # its sandbox is busy now
        assert not eng.submit(_call(1, "b", 60 * MiB))[1].done()
        assert eng.snapshot()["idle_room"]["borrowed_bytes"] == 0

    asyncio.run(scenario())


def test_count_idle_off_counts_free_memory_only_and_a_slow_host_lends_less(
        tmp_path: Path) -> None:
    from execgate.policy.headroom import HeadroomConfig

    async def scenario() -> None:
        bed = Bed(tmp_path)
        bed.sandbox("idle", 120 * MiB, file=120 * MiB)
        eng = bed.engine
        eng.idle_room.cfg = HeadroomConfig(count_idle=False)
        eng.tick()
        assert eng.submit(_call(0, "a", 60 * MiB))[1].done()
        assert not eng.submit(_call(1, "b", 60 * MiB))[1].done()
        # On: a host whose reclaims moved 10 MiB/s lends 10 MiB within the 1 s to peak: short.
        eng.idle_room.cfg = HeadroomConfig()
        eng.residency.swap_out_rate = 10 * MiB
        eng.tick()
        assert eng.snapshot()["idle_room"]["offered_bytes"] == 10 * MiB
        assert eng.admission.first_in_line is None and not eng.pending["tool-1"][1].done()
        eng.residency.swap_out_rate = 1024 * MiB  # faster than configured: the config bounds
        eng.tick()
        assert eng.snapshot()["idle_room"]["offered_bytes"] == 104 * MiB
        assert eng.pending.get("tool-1") is None

    asyncio.run(scenario())


def test_an_active_sandboxs_cold_baseline_counts_for_calls(tmp_path: Path,
                                                           monkeypatch: object) -> None:
    from execgate.policy.headroom import HeadroomConfig

    async def scenario() -> None:
        bed = Bed(tmp_path)  # 256 MiB, S 32 MiB
        busy = bed.sandbox("busy", 120 * MiB, file=0, anon=120 * MiB)
        (busy / "init" / "memory.stat").write_text(f"inactive_anon {100 * MiB}\ninactive_file 0\n")
        eng = bed.engine
        monkeypatch.setattr(eng.residency, "swap_free", lambda: 1 << 30)  # type: ignore
        eng.tick()
        assert eng.submit(_call(0, "busy", 60 * MiB))[1].done()  # 96 MiB free
        # 36 MiB free beside it; the busy sandbox's cold 100 MiB is the kernel's to push out
        assert eng.submit(_call(1, "b", 60 * MiB))[1].done()
        assert eng.residency.cold_bytes("busy") == 100 * MiB
        eng.idle_room.cfg = HeadroomConfig(count_cold=False)
        eng.idle_room.measured_at = float("-inf")
        assert not eng.submit(_call(2, "c", 60 * MiB))[1].done()

    asyncio.run(scenario())


def test_under_zswap_a_push_counts_what_it_frees_not_what_it_moves(tmp_path: Path,
                                                                  monkeypatch: object) -> None:
    """zswap keeps a compressed copy charged to the cgroup: a sandbox's cold 99 MiB pushed
    out at 3:1 frees 66 MiB, and that is what admission may count on; residency's ask stays
    what memory.reclaim must move."""
    from execgate.daemon import idle_sandboxes

    enabled = tmp_path / "zswap-enabled"
    enabled.write_text("N\n")
    monkeypatch.setattr(idle_sandboxes, "ZSWAP_ENABLED", str(enabled))  # type: ignore
    bed = Bed(tmp_path)
    busy = bed.sandbox("busy", 120 * MiB, file=0, anon=120 * MiB)
    (busy / "init" / "memory.stat").write_text(f"inactive_anon {99 * MiB}\ninactive_file 0\n")
    bed.sandbox("idle", 120 * MiB, file=30 * MiB, anon=90 * MiB)
    res = bed.engine.residency
    monkeypatch.setattr(res, "swap_free", lambda: 1 << 30)  # type: ignore
    res._rescan(force=True)
    assert res.swap_kept() == 0.0  # zram or disk swap: nothing stays charged
    enabled.write_text("Y\n")
    info = {"SwapFree": 1 << 30}
    monkeypatch.setattr(idle_sandboxes.meminfo, "read", lambda: info)  # type: ignore
    bed.clock.t += 1  # what it saw is a second old: looked at again
    assert res.swap_kept() == 1 / 3  # nothing in zswap yet: the assumed 3:1
    info.update(Zswap=25 * MiB, Zswapped=100 * MiB)
    assert res.swap_kept() == 1 / 3  # within the second: as seen
    bed.clock.t += 1
    assert res.swap_kept() == 0.25  # measured: 4:1
    info.pop("Zswap")
    bed.clock.t += 1
    kept = 1 / 3
    assert res.cold_bytes("busy", 1 << 30) == 99 * MiB
    assert res.cold_bytes("busy", 1 << 30, kept) == 66 * MiB
    # an idle one: page cache leaves whole, anonymous memory less its copy
    assert res.reclaimable_bytes("idle", set(), 1 << 30) == 104 * MiB  # to keep_bytes 16 MiB
    net = res.reclaimable_bytes("idle", set(), 1 << 30, kept=kept)
    assert net == 30 * MiB + int(74 * MiB * 2 / 3)
    res.busy = lambda: {"busy"}  # type: ignore[method-assign]
    assert res.pushable(cold=True) == 66 * MiB + net


def test_a_quiet_agents_whole_memory_is_cold_a_busy_ones_inactive_lists_only(
        tmp_path: Path, monkeypatch: object) -> None:
    """With MGLRU an untouched page stays on the "active" lists until reclaim ages it: the VM's
    idle memload baselines showed as active, and admission counted none of them as pushable
    though the kernel swapped them out under eager. A CPU-quiet init/ touches no page."""
    bed = Bed(tmp_path)
    busy = bed.sandbox("busy", 120 * MiB, file=0, anon=120 * MiB)
    init = busy / "init"
    (init / "memory.stat").write_text(
        f"anon {100 * MiB}\nfile {4 * MiB}\ninactive_anon {10 * MiB}\ninactive_file 0\n")
    cpu = init / "cpu.stat"
    cpu.write_text("usage_usec 5000000\n")
    res = bed.engine.residency
    monkeypatch.setattr(res, "swap_free", lambda: 1 << 30)  # type: ignore
    res._rescan(force=True)
    assert res.cold_bytes("busy") == 10 * MiB  # first look: nothing known of its CPU yet
    bed.clock.t += 2.0
    assert res.cold_bytes("busy") == 104 * MiB  # quiet for 2 s: all of init/'s memory
    bed.clock.t += 2.0
    cpu.write_text("usage_usec 6000000\n")  # 0.5 CPU over the last 2 s: at work
    assert res.cold_bytes("busy") == 10 * MiB
    assert res.cold_bytes("busy", 5 * MiB) == 5 * MiB  # anonymous only as far as swap has room


def test_idle_sandboxes_are_measured_only_when_the_queue_does_not_fit(tmp_path: Path) -> None:
    """Every request steps admission; measuring what idle sandboxes can give back reads each
    one's memory.stat, which at 1x was most of the daemon's request CPU. A call that fits the
    headroom at green is admitted without it; one that does not fit still gets the idle room."""
    async def scenario() -> None:
        bed = Bed(tmp_path)  # 256 MiB, S 32 MiB
        bed.sandbox("idle", 120 * MiB, file=120 * MiB)
        eng = bed.engine
        measured: list[bool] = []
        real = eng.residency.pushable

        def pushable(cold: bool) -> int:
            measured.append(cold)
            return real(cold)

        eng.residency.pushable = pushable  # type: ignore[method-assign]
        eng.tick()
        assert eng.submit(_call(0, "a", 60 * MiB))[1].done()
        assert measured == [] and eng.snapshot()["idle_room"]["offered_bytes"] == 0
        assert eng.submit(_call(1, "b", 60 * MiB))[1].done()  # on the idle sandbox's room
        assert len(measured) == 1
        assert eng.snapshot()["idle_room"]["admissions_on_idle"] == 1

    asyncio.run(scenario())
