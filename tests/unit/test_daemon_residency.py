"""The daemon's residency hands on a fake cgroupfs: freeze and thaw init/, reclaim in a worker,
thaw on the next call, on a green domain, at stop and after a crash."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from execgate.common import records
from execgate.common.config import Config
from execgate.common.units import MiB
from execgate.daemon import settings
from execgate.daemon.engine import Engine
from execgate.daemon.events import EventBus
from execgate.daemon.idle_sandboxes import Residency
from execgate.policy.pressure import PressureConfig, assess_pressure
from execgate.policy.residency import ResidencyConfig

BUDGET = 1024 * MiB


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def sandbox(tmp: Path, cid: str, inside: bool = False, mem: int = 200 * MiB,
            created: float = 0.0) -> Path:
    cg = tmp / "cg" / cid
    (cg / "init").mkdir(parents=True)
    (cg / "init" / "cgroup.freeze").write_text("0\n")
    (cg / "memory.current").write_text(f"{mem}\n")
    (cg / "memory.stat").write_text(f"anon 0\nfile {mem}\n")  # page cache: all reclaimable
    (cg / "memory.reclaim").write_text("")
    rec = {"id": cid, "managed": True, "cgroup": str(cg), "sandbox": cid, "created": created}
    if inside:
        rec["annotations"] = {"execgate.agent": "inside"}
    records.save_container(str(tmp / "state"), rec)
    return cg


def _drain(q: asyncio.Queue) -> list[dict]:
    out = []
    while not q.empty():
        out.append(q.get_nowait())
    return out


def frozen(cg: Path) -> bool:
    return (cg / "init" / "cgroup.freeze").read_text().strip() == "1"


def reading(available: int):
    return assess_pressure(PressureConfig(), available, BUDGET)


def step(res: Residency, available: int, *busy: str) -> None:
    """One control period: the domain has `available` bytes; calls run in `busy`."""
    res.step(reading(available), busy=lambda: busy, queued_bytes=lambda: 0)


def settle(res: Residency, available: int, *busy: str, rounds: int = 4) -> None:
    """Control periods until residency has nothing left in flight (reclaims one at a time)."""
    for _ in range(rounds):
        step(res, available, *busy)
        if res.worker is not None:
            res.worker.join(timeout=5)


def residency(tmp: Path, clock: Clock, **cfg: object) -> tuple[Residency, EventBus]:
    events = EventBus()
    return Residency(ResidencyConfig(**cfg), PressureConfig(), str(tmp / "state"), False,
                     events, clock), events


def test_red_reclaims_then_freezes_idle_sandboxes_and_a_call_thaws_its_own(
        tmp_path: Path) -> None:
    clock = Clock()
    a, b, agent = (sandbox(tmp_path, "a"), sandbox(tmp_path, "b"),
                   sandbox(tmp_path, "agent", inside=True))
    res, events = residency(tmp_path, clock, idle_after_s=20.0, reclaim_at_call_end=False)
    seen = events.subscribe()
    res.touch("b")  # b ran a call just now
    clock.t += 30
    res.touch("b")
    step(res, 40 * MiB)
    # The longest idle gives its memory back first; nothing is frozen before its reclaim is done.
    assert not frozen(a) and not frozen(b) and not frozen(agent)
    res.worker.join(timeout=5)
    assert (a / "memory.reclaim").read_text() == str(184 * MiB)  # down to the floor
    assert _drain(seen) == []  # the reclaim is told by the loop's next step, in its thread
    step(res, 40 * MiB)
    assert frozen(a) and not frozen(b) and not frozen(agent)
    told = _drain(seen)
    assert [(e["action"], e["container"]) for e in told] == [("reclaimed", "a"), ("frozen", "a")]
    assert told[0]["reclaimed"] == 0  # the fake's memory.current does not move
    assert told[0]["seconds"] >= 0  # how long it took: the bandwidth, from the events alone
    res.worker.join(timeout=5)  # then the inside agent: reclaimed, never frozen
    assert (agent / "memory.reclaim").read_text() == str(184 * MiB)
    step(res, 40 * MiB)
    assert not frozen(agent) and res.snapshot()["sandboxes"]["a"]["frozen"]
    res.touch("a")  # a tool call arrives in a: thawed before it is admitted
    assert not frozen(a)
    # b idle long enough now: reclaimed, then frozen; the runtime thawing it (failing open) is
    # noticed, and it is refrozen (reclaimed already in this idle period: not again)
    clock.t += 30
    settle(res, 40 * MiB, "agent")  # a (idle again) and b: each reclaimed, then frozen
    assert frozen(a) and frozen(b) and (b / "memory.reclaim").read_text() == str(184 * MiB)
    n = res.stats["frozen"]
    (b / "init" / "cgroup.freeze").write_text("0\n")
    (b / "memory.reclaim").write_text("")
    settle(res, 40 * MiB, "agent")
    assert frozen(b) and res.stats["frozen"] == n + 1
    assert (b / "memory.reclaim").read_text() == ""  # once per idle period


def test_a_call_ending_under_yellow_reclaims_its_sandbox_at_once_and_once(
        tmp_path: Path) -> None:
    """The action boundary: no idle_after_s wait, only the quiet check's second."""
    clock = Clock()
    a = sandbox(tmp_path, "a")
    (a / "cpu.stat").write_text("usage_usec 5000000\n")
    res, _ = residency(tmp_path, clock, idle_after_s=600.0)
    res.touch("a")  # a call is submitted ...
    step(res, 328 * MiB, "a")  # ... and runs, under yellow
    assert res.worker is None
    res.touch("a")  # it ends
    clock.t += 0.1
    step(res, 328 * MiB)  # its sandbox is idle now; one CPU sample so far
    assert res.worker is None and res.boxes["a"].ended
    clock.t += 1.0
    step(res, 328 * MiB)  # quiet for a second: reclaimed, 1.1 s after its call, not 600 s
    res.worker.join(timeout=5)
    assert (a / "memory.reclaim").read_text() == str(184 * MiB)
    (a / "memory.reclaim").write_text("")
    for _ in range(5):
        clock.t += 1.0
        step(res, 328 * MiB)
    assert (a / "memory.reclaim").read_text() == ""  # not again in this idle period
    res.touch("a")  # the next call, and its end: a new idle period
    step(res, 328 * MiB, "a")
    res.touch("a")
    for _ in range(3):
        clock.t += 1.0
        step(res, 328 * MiB)
    res.worker.join(timeout=5)
    assert (a / "memory.reclaim").read_text() == str(184 * MiB)
    # a sandbox whose call ended while the domain was green is reclaimed once it turns yellow
    b = sandbox(tmp_path, "b")
    clock.t += 3
    step(res, BUDGET)
    res.touch("b")
    step(res, BUDGET)
    clock.t += 1
    step(res, 328 * MiB)
    res.worker.join(timeout=5)
    assert (b / "memory.reclaim").read_text() == str(184 * MiB)


def test_make_room_reclaims_idle_sandboxes_while_green_and_says_what_they_can_give(
        tmp_path: Path, monkeypatch: object) -> None:
    from execgate.daemon import idle_sandboxes

    monkeypatch.setattr(idle_sandboxes.meminfo, "read", lambda: {"SwapFree": 1 << 30})
    clock = Clock()
    a, busy = sandbox(tmp_path, "a"), sandbox(tmp_path, "busy")
    for cg in (a, busy):
        (cg / "memory.stat").write_text(f"anon {150 * MiB}\nfile {50 * MiB}\n")
    (a / "init" / "memory.swap.max").write_text(f"{100 * MiB}\n")  # swap_max: 100 MiB
    (a / "init" / "memory.swap.current").write_text(f"{40 * MiB}\n")
    res, _ = residency(tmp_path, clock, idle_after_s=600.0)
    step(res, BUDGET, "busy")  # green: nothing to do
    # file 50 + anon as far as swap has room (100 - 40 = 60): 110 MiB; a running sandbox: 0
    res.make_room(64 * MiB)
    assert res.pushable() == 110 * MiB
    assert res.reclaimable_bytes("busy") == 0
    step(res, BUDGET, "busy")  # a first CPU sample (none here: quiet at once)
    res.worker.join(timeout=5)
    assert (a / "memory.reclaim").read_text() == str(110 * MiB)  # what can leave, no more
    assert (busy / "memory.reclaim").read_text() == ""
    res.make_room(64 * MiB)
    assert res.pushable() == 0  # reclaimed in this idle period: nothing more to give
    # an ask that is not renewed lapses
    c = sandbox(tmp_path, "c")
    clock.t += 10
    step(res, BUDGET, "busy")
    assert res.worker is None or not res.worker.is_alive()
    assert (c / "memory.reclaim").read_text() == ""


def test_a_sandboxs_swap_limit_is_read_every_30_s_not_every_look(
        tmp_path: Path, monkeypatch: object) -> None:
    """memory.swap.max changes when someone writes it, not when memory moves: read twice a
    second per sandbox, it was a tenth of residency's CPU at the 15x burst (VM profile). A
    call's start makes its memory files be read afresh, not its limits; a limit not there
    is looked for again at the next look. A sandbox gone: its kept descriptors are
    closed."""
    from execgate.daemon import idle_sandboxes
    from execgate.daemon.looks import LIMIT_LOOK_S

    monkeypatch.setattr(idle_sandboxes.meminfo, "read", lambda: {"SwapFree": 1 << 30})
    clock = Clock()
    a = sandbox(tmp_path, "a")
    (a / "memory.stat").write_text(f"anon {150 * MiB}\nfile {50 * MiB}\n")
    (a / "init" / "memory.swap.max").write_text(f"{100 * MiB}\n")
    res, _ = residency(tmp_path, clock, idle_after_s=600.0)
    reads: list[str] = []
    real_read = res.files.read

    def counted(cg: str, name: str, absent_for_good: bool = False) -> bytes | None:
        reads.append(name)
        return real_read(cg, name, absent_for_good)

    monkeypatch.setattr(res.files, "read", counted)
    assert res.pushable() == 150 * MiB  # file 50 + anon within swap.max 100
    for _ in range(5):
        clock.t += 1.5
        res.touch("a")
        res.touch("a")  # a call ran and ended: memory read afresh
        assert res.pushable() == 150 * MiB
    assert reads.count("memory.stat") == 6
    # init's once; the sandbox's own has none (no limit written there): looked for each time
    assert reads.count("memory.swap.max") == 1 + 6
    (a / "init" / "memory.swap.max").write_text(f"{10 * MiB}\n")
    clock.t += LIMIT_LOOK_S
    assert res.pushable() == 60 * MiB and reads.count("memory.swap.max") == 9
    assert len(res.files) > 0
    records.remove_container(str(tmp_path / "state"), "a")
    clock.t += 10
    res.pushable()  # its record gone: forgotten, and its descriptors closed
    assert res.boxes == {} and len(res.files) == 0


def test_a_container_restarted_in_a_new_cgroup_is_followed_there(tmp_path: Path) -> None:
    """Its record names a new cgroup (a restart under another path): residency measures and
    freezes that one, not the old path, which is gone."""
    clock = Clock()
    old = sandbox(tmp_path, "a")
    res, _ = residency(tmp_path, clock, idle_after_s=20.0, reclaim_at_call_end=False)
    res.pushable()  # the records read
    assert res.boxes["a"].cgroup == str(old)
    new = tmp_path / "cg" / "a-2"
    (new / "init").mkdir(parents=True)
    (new / "init" / "cgroup.freeze").write_text("0\n")
    (new / "memory.current").write_text(f"{200 * MiB}\n")
    (new / "memory.stat").write_text(f"anon 0\nfile {200 * MiB}\n")
    (new / "memory.reclaim").write_text("")
    rec = records.load_container(str(tmp_path / "state"), "a")
    records.save_container(str(tmp_path / "state"), {**rec, "cgroup": str(new)})
    clock.t += 30
    settle(res, 40 * MiB)
    assert res.boxes["a"].cgroup == str(new)
    assert (new / "memory.reclaim").read_text() != "" and frozen(new)
    assert (old / "memory.reclaim").read_text() == "" and not frozen(old)


def test_busy_sandboxes_are_never_idle_and_yellow_does_not_freeze(tmp_path: Path) -> None:
    clock = Clock()
    a = sandbox(tmp_path, "a")
    res, _ = residency(tmp_path, clock, idle_after_s=20.0)
    clock.t += 60
    step(res, 40 * MiB, "a")
    assert not frozen(a) and res.worker is None
    clock.t += 60
    step(res, 328 * MiB)  # yellow
    assert not frozen(a)
    res.worker.join(timeout=5)
    assert (a / "memory.reclaim").read_text() == str(184 * MiB)


def test_green_thaws_after_a_while_and_stop_and_recover_thaw(tmp_path: Path) -> None:
    clock = Clock()
    a = sandbox(tmp_path, "a")
    res, _ = residency(tmp_path, clock, idle_after_s=0.0, thaw_after_green_s=10.0, reclaim=False)
    step(res, 40 * MiB)
    assert frozen(a)
    step(res, BUDGET)
    assert frozen(a)
    clock.t += 11
    step(res, BUDGET)
    assert not frozen(a)
    step(res, 40 * MiB)
    assert frozen(a)
    res.stop()
    assert not frozen(a)
    (a / "init" / "cgroup.freeze").write_text("1\n")  # a daemon crashed with a frozen
    fresh, _ = residency(tmp_path, clock)
    assert fresh.recover() == 1 and not frozen(a)


def test_engine_thaws_a_sandbox_when_its_call_is_submitted(tmp_path: Path) -> None:
    a = sandbox(tmp_path, "a")
    dom = tmp_path / "domain"
    dom.mkdir()
    (dom / "memory.max").write_text(f"{BUDGET}\n")
    (dom / "memory.current").write_text(f"{BUDGET - 40 * MiB}\n")
    cfg = Config(state_dir=str(tmp_path / "state"), journal=str(tmp_path / "calls.jsonl"),
                 tables={"daemon": {"domain": str(dom), "store": str(tmp_path / "h.sqlite")},
                         "residency": {"idle_after_s": 0.0, "reclaim": False}})
    s, errors = settings.load(cfg)
    assert errors == []

    async def scenario() -> None:
        eng = Engine(cfg, s, Clock())
        eng.tick()
        assert frozen(a) and eng.snapshot()["residency"]["frozen"] == 1
        eng.submit({"call": "tool-1", "container": "a", "sandbox": "a", "cgroup": str(a / "t"),
                    "argv": ["true"], "hint": None})
        assert not frozen(a)
        eng.residency.stop()

    asyncio.run(scenario())


def test_a_sandbox_at_work_or_just_started_is_not_idle(tmp_path: Path) -> None:
    clock = Clock()
    busy = sandbox(tmp_path, "busy")
    new = sandbox(tmp_path, "new", created=time.time() + 40)  # started 40 s after the daemon
    res, _ = residency(tmp_path, clock, idle_after_s=20.0, reclaim=False)
    usec = 0

    def run(cpu_s: float) -> None:
        nonlocal usec
        usec += int(cpu_s * 1e6)
        (busy / "cpu.stat").write_text(f"usage_usec {usec}\nuser_usec 0\n")

    run(0)
    clock.t += 50
    step(res, 40 * MiB)  # a first CPU sample: not known
    assert not frozen(busy) and not frozen(new)
    for _ in range(3):  # its init allocates: half a CPU, second after second
        clock.t += 1.0
        run(0.5)
        step(res, 40 * MiB)
        assert not frozen(busy)
    for _ in range(2):  # done: quiet for a second, but active a moment ago
        clock.t += 1.0
        run(0.001)
        step(res, 40 * MiB)
    assert not frozen(busy)
    clock.t += 20.0
    run(0.001)
    step(res, 40 * MiB)
    assert frozen(busy)  # quiet and without a call for idle_after_s
    assert frozen(new)  # 20 s after it started


def test_a_sandbox_removed_before_its_record_is_dropped_not_warned_about_each_period(
        tmp_path: Path, caplog: object) -> None:
    """The VM's fleet runs logged `cannot freeze ...: No such file or directory` ten times a
    second for a container whose cgroup was gone and whose record was not yet."""
    import logging
    import shutil

    clock = Clock()
    gone = sandbox(tmp_path, "gone")
    res, _events = residency(tmp_path, clock, idle_after_s=0.5, reclaim_at_call_end=False,
                             reclaim=False)
    clock.t += 1
    res._rescan(force=True)  # residency knows it, idle
    assert "gone" in res.boxes
    clock.t += 0.5  # before the next rescan (RESCAN_S): the record is still there
    shutil.rmtree(gone)  # docker rm: the cgroup first, the record after
    with caplog.at_level(logging.WARNING, logger="execgated"):  # type: ignore[attr-defined]
        for _ in range(5):
            step(res, 40 * MiB)  # red: it would be frozen
    assert "gone" not in res.boxes
    assert "cannot freeze" not in caplog.text  # type: ignore[attr-defined]


def test_idle_sandboxes_share_the_free_swap_in_what_they_can_give(
        tmp_path: Path, monkeypatch: object) -> None:
    """Each sandbox's figure counts its anonymous memory as far as the host's free swap has
    room; what they can give together is bounded by that room once (issue 15, 15x)."""
    from execgate.daemon import idle_sandboxes

    monkeypatch.setattr(idle_sandboxes.meminfo, "read", lambda: {"SwapFree": 120 * MiB})
    clock = Clock()
    for cid in ("a", "b"):
        cg = sandbox(tmp_path, cid)
        (cg / "memory.stat").write_text(f"anon {100 * MiB}\nfile {10 * MiB}\n")
    res, _ = residency(tmp_path, clock, idle_after_s=600.0, keep_bytes=0)
    step(res, BUDGET)
    assert res.pushable() == (10 + 10 + 120) * MiB  # together: the swap's 120 MiB once
    assert res.reclaimable_bytes("a") == res.reclaimable_bytes("b") == 110 * MiB  # each alone


def test_an_idle_sandboxs_memory_stat_is_read_once_a_second_however_often_it_is_asked(
        tmp_path: Path, monkeypatch: object) -> None:
    """While a create waited, every period asked each sandbox what it could give three times
    (idle room, sandbox admission, residency), each a memory.stat read: under TCG 148 s of an
    869-second run's daemon CPU. Once a second is enough for an idle sandbox; a call starting
    in it, or its reclaim, makes the next ask read afresh."""
    from execgate.daemon import idle_sandboxes

    monkeypatch.setattr(idle_sandboxes.meminfo, "read", lambda: {"SwapFree": 1 << 30})
    reads: list[str] = []
    clock = Clock()
    cg = sandbox(tmp_path, "a")
    (cg / "memory.stat").write_text(f"anon {100 * MiB}\nfile {10 * MiB}\n")
    res, _ = residency(tmp_path, clock, idle_after_s=600.0, keep_bytes=0)
    real_read = res.files.read

    def counted(cg: str, name: str, absent_for_good: bool = False) -> bytes | None:
        if name == "memory.stat":
            reads.append(cg)
        return real_read(cg, name, absent_for_good)

    monkeypatch.setattr(res.files, "read", counted)
    step(res, BUDGET)
    for _ in range(10):  # ten periods of 100 ms, three asks each
        clock.t += 0.1
        assert res.pushable() == res.reclaimable_bytes("a") == 110 * MiB
        res.pushable()
    assert len(reads) == 1
    (cg / "memory.stat").write_text(f"anon {300 * MiB}\nfile {10 * MiB}\n")
    (cg / "memory.current").write_text(f"{400 * MiB}\n")
    clock.t += 0.2  # a second after the first look: read again
    assert res.reclaimable_bytes("a") == 310 * MiB and len(reads) == 2
    res.touch("a")  # a call starts: busy, nothing to give
    assert res.reclaimable_bytes("a", busy=set()) == 310 * MiB and len(reads) == 3
    (cg / "memory.stat").write_text(f"anon {20 * MiB}\nfile {10 * MiB}\n")
    res.touch("a")  # and ends: what it left is read at the next ask, not a second later
    assert res.reclaimable_bytes("a", busy=set()) == 30 * MiB and len(reads) == 4
