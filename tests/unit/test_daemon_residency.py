"""The daemon's residency hands on a fake cgroupfs: freeze and thaw init/, reclaim in a worker,
thaw on the next call, on a green domain, at stop and after a crash."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from execgate.common import records
from execgate.common.config import Config
from execgate.daemon import settings
from execgate.daemon.engine import Engine
from execgate.daemon.events import EventBus
from execgate.daemon.idle_sandboxes import Residency
from execgate.policy.pressure import PressureConfig, assess_pressure
from execgate.policy.residency import ResidencyConfig

MiB = 1 << 20
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


def residency(tmp: Path, clock: Clock, **cfg: object) -> tuple[Residency, EventBus]:
    events = EventBus()
    return Residency(ResidencyConfig(**cfg), PressureConfig(), str(tmp / "state"), False,
                     events, clock), events


def test_red_freezes_and_reclaims_idle_sandboxes_and_a_call_thaws_its_own(tmp_path: Path) -> None:
    clock = Clock()
    a, b, agent = (sandbox(tmp_path, "a"), sandbox(tmp_path, "b"),
                   sandbox(tmp_path, "agent", inside=True))
    res, events = residency(tmp_path, clock, idle_after_s=20.0)
    seen = events.subscribe()
    res.touch("b")  # b ran a call just now
    clock.t += 30
    res.touch("b")
    step(res, 40 * MiB)
    assert frozen(a) and not frozen(b) and not frozen(agent)
    res.worker.join(timeout=5)
    assert (a / "memory.reclaim").read_text() == str(184 * MiB)  # the longest idle, to the floor
    snap = res.snapshot()
    assert snap["frozen"] == 1 and snap["reclaims"] == 1 and snap["sandboxes"]["a"]["frozen"]
    assert [e["action"] for e in _drain(seen)] == ["frozen"]  # the reclaim is not told yet ...
    step(res, 40 * MiB, "a", "b", "agent")
    told = _drain(seen)  # ... but by the loop's next step, in the loop's thread
    assert [(e["action"], e["container"], e["reclaimed"]) for e in told] == [
        ("reclaimed", "a", 0)]
    res.touch("a")  # a tool call arrives in a: thawed before it is admitted
    assert not frozen(a)
    # the runtime thawed b's init itself (it failed open): the daemon notices, and refreezes
    clock.t += 30
    step(res, 40 * MiB, "agent")
    assert frozen(a) and frozen(b) and res.stats["frozen"] == 3  # a is idle again too
    (b / "init" / "cgroup.freeze").write_text("0\n")
    step(res, 40 * MiB, "agent")
    assert frozen(b) and res.stats["frozen"] == 4


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
                         "residency": {"idle_after_s": 0.0}})
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
