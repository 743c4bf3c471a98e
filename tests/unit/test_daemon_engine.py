"""The daemon's engine against a fake cgroupfs domain, a temp journal and a simulated clock."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from execgate.common import protocol, records
from execgate.common.config import Config
from execgate.common.units import MiB
from execgate.daemon import settings
from execgate.daemon.engine import Engine
from execgate.daemon.journal_follow import JournalFollower
from execgate.daemon.store import Store


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _engine(tmp: Path, budget: int, used: int, **daemon: Any) -> tuple[Engine, Clock, Path]:
    dom = tmp / "domain"
    dom.mkdir()
    (dom / "memory.max").write_text(f"{budget}\n")
    (dom / "memory.current").write_text(f"{used}\n")
    journal = tmp / "calls.jsonl"
    cfg = Config(state_dir=str(tmp / "state"), journal=str(journal),
                 tables={"daemon": {"domain": str(dom), "store": str(tmp / "h.sqlite"),
                                    **daemon}})
    s, errors = settings.load(cfg)
    assert errors == []
    clock = Clock()
    return Engine(cfg, s, clock), clock, journal


def _admit_msg(i: int, mem: int) -> dict:
    return {"call": f"tool-{i}", "container": "c", "sandbox": "c", "cgroup": f"/nope/tool-{i}",
            "argv": ["pytest"], "hint": {"memory_bytes": mem}}


def test_calls_wait_for_room_and_run_when_earlier_ones_finish(tmp_path: Path) -> None:
    async def scenario() -> None:
        eng, clock, journal = _engine(tmp_path, budget=1024 * MiB, used=64 * MiB)
        eng.tick()
        futs = [eng.submit(_admit_msg(i, 300 * MiB))[1] for i in range(3)]
        assert futs[0].done() and not futs[2].done()
        waiting = [i for i, f in enumerate(futs) if not f.done()]
        assert waiting, "three 300 MiB calls cannot all start in a 1 GiB domain"
        # The first call finishes: its watcher's journal line frees its charge.
        clock.t += 5
        with open(journal, "a") as f:
            f.write(json.dumps({"call": "tool-0", "container": "c", "sandbox": "c",
                                "argv": ["pytest"], "memory_peak": 280 * MiB, "pids_peak": 1,
                                "duration": 5.0, "oom_killed": False,
                                "hint": {"memory_bytes": 300 * MiB}}) + "\n")
        eng.tick()
        assert futs[waiting[0]].done()
        assert futs[waiting[0]].result().waited_s == 5.0
        assert eng.store.count() == 1
        snap = eng.snapshot()
        assert snap["pressure"]["state"] in ("green", "yellow", "red")
        assert {r["call_id"] for r in snap["admission"]["running"]} >= {f"tool-{waiting[0]}"}
        assert {tuple(r["argv"]) for r in snap["admission"]["running"]} == {("pytest",)}

    asyncio.run(scenario())


def test_bounded_wait_and_cancel(tmp_path: Path) -> None:
    async def scenario() -> None:
        eng, clock, _ = _engine(tmp_path, budget=512 * MiB, used=500 * MiB)  # red
        eng.tick()
        _, fut = eng.submit(_admit_msg(1, 100 * MiB))
        _, gone = eng.submit(_admit_msg(2, 100 * MiB))
        assert not fut.done()
        eng.cancel("tool-2")
        clock.t += 31
        eng.tick()
        assert fut.done() and fut.result().forced
        assert not gone.done()
        assert [q["call_id"] for q in eng.admission.snapshot()["queued"]] == []

    asyncio.run(scenario())


def test_a_huge_declaration_is_cut_to_the_budget_and_so_is_its_charge(tmp_path: Path) -> None:
    """`mem=1000000000g` with no container limit: never a 2.7e17-byte charge, a red domain
    for ever, or a neighbour held behind it once it is gone (issue 21, item 2)."""
    async def scenario() -> None:
        eng, clock, _ = _engine(tmp_path, budget=1024 * MiB, used=64 * MiB)
        eng.tick()
        huge = {**_admit_msg(1, 1_000_000_000 << 30), "sandbox": "greedy"}
        ticket, fut = eng.submit(huge)
        assert ticket["peak"] <= 1024 * MiB
        clock.t += 31  # past max_wait_s: it runs alone
        eng.tick()
        assert fut.done() and fut.result().charge_bytes <= 1024 * MiB
        assert eng.reading is not None and eng.reading.predicted_growth <= 1024 * MiB
        eng.done("tool-1")
        _, small = eng.submit({**_admit_msg(2, 50 * MiB), "sandbox": "neighbour"})
        assert small.done() and small.result().waited_s == 0.0

    asyncio.run(scenario())


def test_vanished_call_is_released(tmp_path: Path) -> None:
    async def scenario() -> None:
        eng, clock, _ = _engine(tmp_path, budget=2048 * MiB, used=0)
        eng.tick()
        _, fut = eng.submit(_admit_msg(1, 100 * MiB))
        assert fut.done()
        assert "tool-1" in eng.calls
        clock.t += 3  # its cgroup never appeared: grace passes once, then again
        eng.tick()
        clock.t += 3
        eng.tick()
        assert "tool-1" not in eng.calls
        assert eng.admission.snapshot()["running"] == []

    asyncio.run(scenario())


def test_an_empty_leaked_tool_cgroup_does_not_keep_its_charge(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its watcher was killed (or its fork failed with EAGAIN): the cgroup stays, empty, and
    no `done` or journal line will come. Released once it has held no task for EMPTIED_S;
    one that never held a task only after NEVER_POPULATED_S (an exec may take seconds to land
    under load: it must not lose its charge before it starts); a populated one is kept
    however long it runs (issue 21, item 10)."""
    from execgate.cgroups import v2
    from execgate.daemon.engine import EMPTIED_S, NEVER_POPULATED_S

    removed: list[str] = []
    monkeypatch.setattr(v2, "remove", lambda cg, *a, **k: removed.append(cg) or True)

    async def scenario() -> None:
        eng, clock, _ = _engine(tmp_path, budget=2048 * MiB, used=0)
        eng.tick()
        events = {}
        for i in (1, 2, 3):
            cg = tmp_path / "box" / f"tool-{i}"
            cg.mkdir(parents=True)
            (cg / "memory.current").write_text(f"{4 * MiB}\n")
            events[i] = cg / "cgroup.events"
            events[i].write_text("populated 0\nfrozen 0\n")
            _, fut = eng.submit({**_admit_msg(i, 100 * MiB), "cgroup": str(cg)})
            assert fut.done()

        def running() -> list[str]:
            return sorted(r["call_id"] for r in eng.admission.snapshot()["running"])

        def tick(seconds: float) -> None:
            for _ in range(int(seconds)):
                clock.t += 1.0
                eng.tick()

        tick(10)  # tool-1 and tool-2 land late: not released while they wait to start
        assert running() == ["tool-1", "tool-2", "tool-3"]
        events[1].write_text("populated 1\nfrozen 0\n")
        events[2].write_text("populated 1\nfrozen 0\n")
        tick(3)
        events[1].write_text("populated 0\nfrozen 0\n")  # ended; its watcher is gone
        tick(5)  # a loaded host's watcher may journal seconds late: kept for now
        assert running() == ["tool-1", "tool-2", "tool-3"]
        tick(EMPTIED_S)
        assert running() == ["tool-2", "tool-3"] and "tool-1" not in eng.calls
        assert removed == []  # the cgroup stays: a late watcher still reads its figures
        tick(NEVER_POPULATED_S)  # tool-3's exec never landed
        assert running() == ["tool-2"] and set(eng.calls) == {"tool-2"}

    asyncio.run(scenario())


def test_learning_survives_a_restart(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "h.sqlite"))
    for i in range(3):
        store.add({"call": f"tool-{i}", "sandbox": "s", "argv": ["pytest", "-x"],
                   "start": float(i), "memory_peak": 900 * MiB, "pids_peak": 3,
                   "duration": 2.0, "oom_killed": False}, 400 * MiB)
    store.close()
    eng, _, _ = _engine(tmp_path, budget=4096 * MiB, used=0)
    assert eng.warm_up() == 3
    from execgate.policy.estimate import CallInfo

    demand = eng.estimator.estimate(CallInfo("t", "s", ["pytest", "tests/"]))
    assert demand.peak_bytes == 900 * MiB and demand.source.startswith("sandbox-history")


def test_journal_follower_resumes_and_handles_rotation(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "h.sqlite"))
    path = tmp_path / "calls.jsonl"
    path.write_text('{"call": "a"}\n{"call": "b"}\n{"call": "c"')  # c is half written
    f = JournalFollower(str(path), store)
    assert [e["call"] for e in f.read_new()] == ["a", "b"]
    with open(path, "a") as fh:
        fh.write("}\n")
    assert [e["call"] for e in f.read_new()] == ["c"]
    assert JournalFollower(str(path), store).read_new() == []  # position persisted
    path.unlink()
    path.write_text('{"call": "d"}\n')
    assert [e["call"] for e in JournalFollower(str(path), store).read_new()] == ["d"]


def test_a_torn_journal_line_never_swallows_the_next_entry(tmp_path: Path) -> None:
    """A watcher killed mid-write leaves a line without its end; the next watcher's entry is
    appended to it (O_APPEND). Only the torn part is lost (issue 21, item 10)."""
    store = Store(str(tmp_path / "h.sqlite"))
    path = tmp_path / "calls.jsonl"
    path.write_text('{"call":"a","argv":["x"]}\n{"call":"torn","argv":["{\\"call\\":')
    f = JournalFollower(str(path), store)
    assert [e["call"] for e in f.read_new()] == ["a"]
    with open(path, "a") as fh:
        fh.write('{"call":"b","argv":["y"]}\n{"call":"c"}\n')
    assert [e["call"] for e in f.read_new()] == ["b", "c"]
    assert [e["call"] for e in records.tail_journal(str(path), 10)] == ["a", "b", "c"]
    assert [e["call"] for e in records.read_journal(str(path))] == ["a", "b", "c"]


def test_settings_sizes_and_errors() -> None:
    s, errors = settings.load(Config(tables={
        "daemon": {"budget_bytes": "8g", "nope": 1},
        "pressure": {"safety_margin_bytes": "128m", "red_fraction": "high"},
        "admission": {"max_admission_wait_s": 10},
    }))
    assert s.daemon.budget_bytes == 8 << 30
    assert s.pressure.safety_margin_bytes == 128 * MiB
    assert s.pressure.red_fraction == 0.125
    assert s.admission.max_admission_wait_s == 10.0
    assert len(errors) == 2


def test_protocol_round_trip_and_versions() -> None:
    frame = protocol.encode(protocol.request("admit", call="tool-1", argv=["a", "b"]))
    n = protocol.frame_length(frame[:4])
    msg = protocol.decode_body(frame[4:4 + n])
    assert msg == {"v": protocol.VERSION, "op": "admit", "call": "tool-1", "argv": ["a", "b"]}
    try:
        protocol.decode_body(b"\xc1")
    except protocol.ProtocolError:
        pass
    else:
        raise AssertionError("garbage must not decode")


def test_the_loop_slows_down_only_while_nothing_runs_waits_or_presses(tmp_path: Path) -> None:
    async def scenario() -> None:
        eng, clock, _journal = _engine(tmp_path, budget=1024 * MiB, used=64 * MiB)
        eng.tick()
        assert eng.period() == 0.5 and not eng.wake.is_set()
        eng.submit(_admit_msg(0, 100 * MiB))
        assert eng.wake.is_set() and eng.period() == 0.1  # a call runs: every 100 ms
        eng.wake.clear()
        eng.submit(_admit_msg(2, 100 * MiB))
        assert not eng.wake.is_set()  # ticking fast already: no extra tick per request
        eng.cancel("tool-2")
        eng.cancel("tool-0")
        eng.tick()
        assert eng.period() == 0.5
        (tmp_path / "domain" / "memory.current").write_text(f"{1000 * MiB}\n")
        eng.tick()
        assert eng.reading.state and eng.period() == 0.1  # under pressure: every 100 ms
        # A request after an idle period sees the domain as it is now, not as last sampled.
        (tmp_path / "domain" / "memory.current").write_text(f"{64 * MiB}\n")
        clock.t += 0.5
        eng.submit(_admit_msg(1, 100 * MiB))
        assert not eng.reading.state

    asyncio.run(scenario())


def test_running_calls_tick_slower_while_the_domain_is_calm(tmp_path: Path) -> None:
    """At green, calls running and none waiting, the loop ticks every calm_period_s while the
    effective headroom clears the yellow limit by calm_margin_bytes plus two periods of the
    fastest recent growth; every 100 ms otherwise (1 GiB: S 128 MiB, yellow at 256 MiB)."""
    async def scenario() -> None:
        eng, clock, _journal = _engine(tmp_path, budget=1024 * MiB, used=64 * MiB,
                                       calm_period_s=0.3)  # (off by default)
        current = tmp_path / "domain" / "memory.current"
        eng.tick()
        tool = tmp_path / "tool-0"
        tool.mkdir()
        (tool / "memory.current").write_text("0\n")
        eng.submit({**_admit_msg(0, 100 * MiB), "cgroup": str(tool)})  # effective 732 MiB:
        # 220 MiB above the margin
        assert eng.wake.is_set()  # a request wakes the calm loop: the next tick re-judges
        eng.tick()
        assert eng.period() == 0.3
        clock.t += 0.3
        current.write_text(f"{94 * MiB}\n")  # 100 MiB/s: 60 MiB in two periods, 190 left
        eng.tick()
        assert eng.period() == 0.3
        clock.t += 0.1
        current.write_text(f"{134 * MiB}\n")  # 400 MiB/s: 240 MiB > the 150 MiB left
        eng.tick()
        assert not eng.reading.state and eng.period() == 0.1
        clock.t += 3.1  # the burst leaves the window
        eng.tick()
        clock.t += 0.3
        eng.tick()
        assert eng.period() == 0.3
        current.write_text(f"{480 * MiB}\n")  # green (effective 316 MiB), but no margin
        clock.t += 3.1
        eng.tick()
        clock.t += 0.3
        eng.tick()
        assert not eng.reading.state and eng.period() == 0.1
        assert eng.next_period() == 0.1
        eng.submit(_admit_msg(1, 900 * MiB))  # waits: every 100 ms
        assert eng.pending and eng.period() == 0.1
        eng.cancel("tool-1")
        assert eng.next_period() == 0.1  # (not calm: the burst's margin is gone)
        current.write_text(f"{64 * MiB}\n")
        clock.t += 3.1
        eng.tick()
        assert eng.next_period() == 0.3
        assert eng.snapshot()["loop"]["periods"] == {"sample": 2, "calm": 1}

    asyncio.run(scenario())


def test_the_idle_room_learns_how_long_calls_take_to_peak(tmp_path: Path) -> None:
    """The idle room's time to peak is what calls here took, once enough have finished: memory
    sampled as it grows, the journal's memory.peak its end (issue 15 §3)."""
    async def scenario() -> None:
        eng, clock, journal = _engine(tmp_path, budget=2048 * MiB, used=0)
        eng.tick()
        room = eng.idle_room
        assert room.time_to_peak_s() == 1.0  # [headroom] default_time_to_peak_s
        for i in range(8):
            cg = tmp_path / "box" / f"tool-{i}"
            cg.mkdir(parents=True)
            _, fut = eng.submit({**_admit_msg(i, 100 * MiB), "cgroup": str(cg)})
            assert fut.done()
            for mib in (10, 40, 70, 95, 100, 100):  # 1 s apart: 90 % of its peak after 3 s
                (cg / "memory.current").write_text(f"{mib * MiB}\n")
                eng.tick()
                clock.t += 1.0
            with open(journal, "a") as f:
                f.write(json.dumps({"call": f"tool-{i}", "container": "c", "sandbox": "c",
                                    "argv": ["pytest"], "memory_peak": 100 * MiB,
                                    "pids_peak": 1, "exit_code": 0}) + "\n")
            eng.tick()
            assert f"tool-{i}" not in eng.calls
        assert room.peak_times.learned == 8 and room.time_to_peak_s() == 3.0
        assert eng.snapshot()["idle_room"]["time_to_peak_s"] == 3.0

    asyncio.run(scenario())


def test_a_corrupt_or_unopenable_store_never_stops_the_daemon(tmp_path: Path) -> None:
    """A corrupt SQLite store aborted start-up before any thaw (issue 21, item 9): it is
    moved aside and a new one begins; one that cannot be opened gives way to memory."""
    import sqlite3

    from execgate.daemon.store import open_store

    bad = tmp_path / "h.sqlite"
    bad.write_bytes(b"this is not a database, it is a text file" * 100)
    with pytest.raises(sqlite3.DatabaseError):
        Store(str(bad))
    store = open_store(str(bad))
    store.add({"call": "tool-1", "start": 1.0, "memory_peak": 5})
    assert store.count() == 1
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith("h.sqlite.corrupt-")]
    assert aside.read_bytes().startswith(b"this is not a database")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    mem = open_store(str(blocked / "h.sqlite"))  # its directory is a file
    mem.add({"call": "tool-2", "start": 2.0})
    assert mem.count() == 1


def test_a_failing_store_or_stage_does_not_stop_the_rest_of_the_tick(tmp_path: Path) -> None:
    """A full, read-only or locked store made every tick fail before the gate, residency and
    the end of calls (50 of 50 ticks): each stage now fails alone, counted and logged."""
    async def scenario() -> None:
        eng, clock, journal = _engine(tmp_path, budget=1024 * MiB, used=64 * MiB)
        eng.tick()
        _, fut = eng.submit(_admit_msg(0, 300 * MiB))
        assert fut.done() and "tool-0" in eng.calls
        eng.store.db.close()  # every write to the store raises now
        broken = []

        def predictor_step() -> None:
            broken.append(1)
            raise RuntimeError("a stage that always fails")

        eng.predictor.step = predictor_step  # type: ignore[method-assign]
        with open(journal, "a") as f:
            f.write(json.dumps({"call": "tool-0", "container": "c", "sandbox": "c",
                                "argv": ["pytest"], "memory_peak": 280 * MiB, "pids_peak": 1,
                                "exit_code": 0}) + "\n")
        for _ in range(3):
            clock.t += 1
            eng.tick()
        assert "tool-0" not in eng.calls  # its end was read, its charge released
        assert eng.admission.snapshot()["running"] == []
        assert len(broken) == 3 and eng.reading is not None
        assert eng.snapshot()["loop"]["stage_errors"] == {"predictor": 3}

    asyncio.run(scenario())


def test_a_call_done_before_its_journal_line_finishes_with_its_outcome(tmp_path: Path) -> None:
    """The watcher sends `done` before it writes the journal line: the call's charge goes at
    once, and its `finished` event waits for the line that says how it ended (every call was
    counted `vanished` before). A line that never comes is published as vanished later. What
    the line teaches (the sandbox's call peak and load) is learned then: learned at `done`,
    without the line, it was lost for nearly every call."""
    from execgate.daemon.engine import JOURNAL_LINE_S
    from execgate.daemon.sandboxes import Box

    async def scenario() -> None:
        eng, clock, journal = _engine(tmp_path, budget=1024 * MiB, used=64 * MiB)
        q = eng.events.subscribe()
        box = eng.sandboxes.boxes["c"] = Box("c", "/nope", "img", clock.t)
        eng.sandboxes._rescan = lambda now, calls: None  # no records here: it stays live
        eng.tick()
        for i in (1, 2):
            assert eng.submit(_admit_msg(i, 100 * MiB))[1].done()
            clock.t += 2.0
            eng.done(f"tool-{i}")
        assert eng.admission.snapshot()["running"] == []
        with open(journal, "a") as f:
            f.write(json.dumps({"call": "tool-1", "container": "c", "sandbox": "c",
                                "argv": ["pytest"], "memory_peak": 90 * MiB, "pids_peak": 1,
                                "duration": 1.0, "oom_killed": False, "exit_code": 0}) + "\n")
        eng.tick()
        clock.t += JOURNAL_LINE_S + 1
        eng.tick()
        finished = {}
        while not q.empty():
            e = q.get_nowait()
            if e["event"] == "finished":
                finished[e["call"]] = e
        assert finished["tool-1"]["exit_code"] == 0 and not finished["tool-1"]["vanished"]
        assert finished["tool-2"]["vanished"] and eng.ended == {}
        assert box.call_peak == 90 * MiB and box.call_area == 90 * MiB * 2.0, box

    asyncio.run(scenario())


def test_a_call_whose_memory_cycles_still_counts_its_growth_to_come(tmp_path: Path) -> None:
    """Growth still predicted is the peak less what the call holds now (resident + in swap),
    not less the most it held: at the trough of a call that frees and allocates again, a
    second call was admitted into the room the first took back (VM, 8.6x without swap: 1 and
    4 calls OOM-killed, two peaking together). What went to swap stays counted as held."""
    async def scenario() -> None:
        eng, _, _ = _engine(tmp_path, budget=512 * MiB, used=64 * MiB)
        tool = tmp_path / "domain" / "c" / "tool-1"
        tool.mkdir(parents=True)
        mem = tool / "memory.current"
        mem.write_text(f"{200 * MiB}\n")
        swapped = tool / "memory.swap.current"
        swapped.write_text("0\n")
        eng.tick()
        msg = {**_admit_msg(1, 200 * MiB), "cgroup": str(tool)}
        _, fut = eng.submit(msg)
        assert fut.done()
        eng.tick()
        assert eng.reading is not None and eng.reading.predicted_growth == 0
        mem.write_text(f"{20 * MiB}\n")  # the trough of its cycle: it will take 180 MiB again
        eng.tick()
        assert eng.reading.predicted_growth == 180 * MiB
        swapped.write_text(f"{180 * MiB}\n")  # in swap: held
        eng.tick()
        assert eng.reading.predicted_growth == 0

    asyncio.run(scenario())


def test_the_loop_counts_its_cpu_by_stage(tmp_path: Path) -> None:
    """Under an emulator the daemon's CPU is CPU the sandboxes' starts do not get (VM, 15x
    Poisson: 325 s of an 813 s run): the loop says which stage spends it."""
    eng, _clock, _journal = _engine(tmp_path, budget=1024 * MiB, used=64 * MiB)

    def busy() -> None:
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass

    eng.predictor.step = busy  # type: ignore[method-assign]
    for _ in range(3):
        eng.tick()
    loop = eng.snapshot()["loop"]
    stages = loop["stage_cpu_s"]
    assert set(stages) >= {"journal", "predictor", "calls", "domain", "residency"}
    assert stages["predictor"] >= 0.06 and max(stages, key=stages.get) == "predictor"
    assert sum(stages.values()) <= loop["cpu_s"] + 0.01
    assert loop["process_cpu_s"] >= loop["cpu_s"]
