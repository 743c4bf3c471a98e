"""InsideAgents end to end on the host without cgroup v2: a fake event source, a real Engine on
a fake domain, cgroup moves recorded instead of done. Catches wiring mistakes before the VM."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from execgate.bpf import inside_probe as probe_mod
from execgate.calls import mark
from execgate.calls.record import ToolCall
from execgate.cgroups import v2
from execgate.common import records
from execgate.common.config import Config
from execgate.common.units import MiB
from execgate.daemon import settings
from execgate.daemon.engine import Engine
from execgate.daemon.inside import proc_events, procfs
from execgate.daemon.inside.agents import InsideAgents
from execgate.daemon.inside.proc_events import ProcEvent
from execgate.daemon.inside.state import Box, Call


class FakeConnector:
    instances: ClassVar[list[FakeConnector]] = []

    def __init__(self, rcvbuf_bytes: int = 0) -> None:
        self.r, self.w = os.pipe()
        self.queue: list[ProcEvent] = []
        self.filtered = True
        self.overruns = 0
        FakeConnector.instances.append(self)

    def subscribe(self) -> None:
        pass

    def fileno(self) -> int:
        return self.r

    def push(self, *events: ProcEvent) -> None:
        self.queue.extend(events)
        os.write(self.w, b"x")

    def read(self) -> list[ProcEvent]:
        os.read(self.r, 4096)
        out, self.queue = self.queue, []
        return out

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


class FakeProbe:
    """bpf/inside_probe.py's InsideProbe as the daemon sees it: agents in, events out."""

    instances: ClassVar[list[FakeProbe]] = []

    def __init__(self, slice_ns: int) -> None:
        self.slice_ns = slice_ns
        self.r, self.w = os.pipe()
        self.queue: list[probe_mod.Event] = []
        self.agents: dict[int, tuple[int, bool]] = {}
        self.adopted: list[int] = []
        self.eager: set[str] = set()
        self.closed = False
        FakeProbe.instances.append(self)

    def fileno(self) -> int:
        return self.r

    def push(self, *events: probe_mod.Event) -> None:
        self.queue.extend(events)
        os.write(self.w, b"x")

    def read(self) -> list[probe_mod.Event]:
        os.read(self.r, 4096)
        out, self.queue = self.queue, []
        return out

    def add_agent(self, tgid: int, box: int, *, wrapper: bool = False) -> None:
        self.agents[tgid] = (box, wrapper)

    def remove_agent(self, tgid: int) -> bool:
        return self.agents.pop(tgid, None) is not None

    def add_eager(self, comm: str) -> None:
        self.eager.add(comm)

    def adopt_call(self, tgid: int, parent: int, box: int) -> None:
        self.adopted.append(tgid)

    def stats(self) -> dict[str, int]:
        return {"short": 7}

    def close(self) -> None:
        self.closed = True
        os.close(self.r)
        os.close(self.w)


async def _until(cond: Any, timeout: float = 5.0) -> None:
    """Runs the loop until cond() (the probe loads on a worker thread)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def _probe_up(agents: InsideAgents) -> tuple[FakeProbe, Box]:
    """The (fake) kernel probe once it has loaded on its worker thread, and the test's box."""
    await _until(lambda: agents.probe is not None)
    return FakeProbe.instances[-1], agents.boxes["box"]


async def _call_on_probe(probe: FakeProbe, box: Box, seconds: str) -> subprocess.Popen[bytes]:
    """A `sleep SECONDS` of the agent (this process), reported by the probe once exec'd."""
    child = subprocess.Popen(["sleep", seconds])
    while Path(f"/proc/{child.pid}/cmdline").read_bytes() != f"sleep\0{seconds}\0".encode():
        await asyncio.sleep(0.001)
    probe.push(probe_mod.Event(probe_mod.EV_CALL, child.pid, os.getpid(), box.number,
                               time.monotonic_ns(), 0))
    return child


def _setup(tmp: Path, monkeypatch: pytest.MonkeyPatch, freeze: str = "queued",
           place_after_ms: float = 5.0, source: str = "connector"
           ) -> tuple[InsideAgents, Path, list[tuple[int, str]]]:
    dom = tmp / "domain"
    dom.mkdir()
    (dom / "memory.max").write_text(f"{1024 * MiB}\n")
    (dom / "memory.current").write_text(f"{64 * MiB}\n")
    cg = tmp / "box"
    (cg / "init").mkdir(parents=True)
    state = tmp / "state"
    (state / "containers").mkdir(parents=True)
    (state / "containers" / "box.json").write_text(json.dumps({
        "id": "box", "managed": True, "prepared": True, "cgroup": str(cg),
        "init_pid": os.getpid(),
        "annotations": {"execgate.agent": "inside"}}))
    cfg = Config(state_dir=str(state), journal=str(tmp / "calls.jsonl"),
                 tables={"daemon": {"domain": str(dom), "store": str(tmp / "h.sqlite"),
                                    "gate": "off"},
                         "inside": {"freeze": freeze, "place_after_ms": place_after_ms,
                                    "source": source}})
    s, errors = settings.load(cfg)
    assert errors == []
    moves: list[tuple[int, str]] = []

    def move(pid: int, path: str) -> None:
        moves.append((pid, path))
        Path(path, "cgroup.events").write_text("populated 1\n")

    monkeypatch.setattr(proc_events, "ProcConnector", FakeConnector)
    monkeypatch.setattr(probe_mod, "build", lambda: "inside.bpf.o")
    monkeypatch.setattr(probe_mod, "load", lambda obj, slice_ns: FakeProbe(slice_ns))
    monkeypatch.setattr(v2, "move", move)
    # This test process plays the agent; what it already runs (a multiprocessing forkserver
    # left by other tests) is not the agent's: only what a test spawns counts.
    pre = set(procfs.children(os.getpid()))
    real_children = procfs.children
    monkeypatch.setattr(procfs, "children", lambda pid: [c for c in real_children(pid)
                                                         if c not in pre])
    return InsideAgents(cfg, s, Engine(cfg, s)), cg, moves


def _events(agent: int, child: int, now: int = 0) -> list[ProcEvent]:
    return [ProcEvent(proc_events.PROC_EVENT_FORK, 0, now, child, child, agent, agent),
            ProcEvent(proc_events.PROC_EVENT_EXEC, 0, now, child, child)]


def test_a_child_is_placed_admitted_and_journaled(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    agents, _cg, moves = _setup(tmp_path, monkeypatch)
    # Its line is in the journal before its cgroup goes (it went first, then waited up to
    # 0.5 s for the exit event: a daemon killed meanwhile lost the call, and an e2e test that
    # read the journal once the cgroups were gone found 3 calls of 4 in CI).
    journaled_at_removal: list[bool] = []
    real_remove = v2.remove

    def remove(cg: str, attempts: int = 20) -> bool:
        journaled_at_removal.append((tmp_path / "calls.jsonl").exists())
        return real_remove(cg, attempts)

    monkeypatch.setattr(v2, "remove", remove)

    async def scenario() -> dict[str, Any]:
        agents.start()
        try:
            assert "box" in agents.boxes and agents.boxes["box"].agents == {os.getpid()}
            assert len(agents.boxes["box"].spares) == 1
            env = dict(os.environ, AGENT_RESOURCE_HINT="memory:300m")
            child = subprocess.Popen(["sleep", "0.5"], env=env, stderr=subprocess.PIPE)
            # Popen returns at close-on-exec, before the new image's environment is set up
            # (the kernel's exec event comes after that).
            while b"AGENT_RESOURCE_HINT" not in Path(f"/proc/{child.pid}/environ").read_bytes():
                await asyncio.sleep(0.001)
            conn = FakeConnector.instances[-1]
            conn.push(*_events(os.getpid(), child.pid))
            await asyncio.sleep(0.1)
            assert [p for p, _ in moves] == [child.pid]
            [call] = agents.calls.values()
            assert call.call.hint["memory_bytes"] == 300 * MiB
            assert call.call.managed and call.call.start is not None
            assert call.call.argv == ["sleep", "0.5"]
            assert call.stderr is not None  # a handle on the child's stderr pipe
            child.wait()
            conn.push(ProcEvent(proc_events.PROC_EVENT_EXIT, 0, 0, child.pid, child.pid,
                                exit_code=0))
            await asyncio.sleep(0.05)
            agents._ended(call.name)
            assert child.stderr is not None and child.stderr.read() == b""  # EOF, no feedback
            for _ in range(50):
                await asyncio.sleep(0.05)
                if (tmp_path / "calls.jsonl").exists():
                    break
            assert len(agents.boxes["box"].spares) == 1  # replenished
            return json.loads((tmp_path / "calls.jsonl").read_text())
        finally:
            agents.stop()

    entry = asyncio.run(scenario())
    assert journaled_at_removal == [True]
    assert entry["container"] == "box" and entry["exit_code"] == 0 and entry["managed"]
    assert entry["inside"]["pid"] and entry["inside"]["agent_pid"] == os.getpid()
    assert entry["hint"]["memory_bytes"] == 300 * MiB


def test_a_call_the_engine_could_not_take_runs_and_is_journaled_with_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, _cg, _moves = _setup(tmp_path, monkeypatch)

    def refuse(msg: dict[str, Any]) -> Any:
        raise RuntimeError("queue closed")

    monkeypatch.setattr(agents.engine, "submit", refuse)

    async def scenario() -> dict[str, Any]:
        agents.start()
        try:
            child = subprocess.Popen(["sleep", "0.2"], stderr=subprocess.PIPE)
            FakeConnector.instances[-1].push(*_events(os.getpid(), child.pid))
            await asyncio.sleep(0.1)
            [call] = agents.calls.values()
            assert call.call.managed is False and call.call.start is not None  # it runs
            child.wait()
            agents._ended(call.name)
            for _ in range(50):
                await asyncio.sleep(0.05)
                if (tmp_path / "calls.jsonl").exists():
                    break
            return json.loads((tmp_path / "calls.jsonl").read_text())
        finally:
            agents.stop()

    entry = asyncio.run(scenario())
    assert entry["managed"] is False
    assert entry["unmanaged"] == "not admitted (RuntimeError: queue closed)"


def test_a_call_caught_in_a_slow_exec_keeps_its_hint(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`sh -c 'memhog ...'` caught while the shell execs the tool: /proc reads neither command
    line nor environment until that exec is done, which at a full memory domain under TCG took
    longer than exec_image's in-line wait (the call was admitted without its hint, e2e
    test_admission_across_sandboxes failed in CI). It is admitted once the exec is done."""
    agents, _cg, moves = _setup(tmp_path, monkeypatch)
    real_image = procfs.exec_image
    done_at = [0.0]  # when the fake exec ends: 0.3 s after the call was placed

    def image(pid: int, within_s: float = 0.05) -> tuple[list[str], list[str]]:
        if done_at[0] == 0.0:
            done_at[0] = time.monotonic() + 0.3
        if time.monotonic() < done_at[0]:
            time.sleep(min(within_s, 0.05))
            return [], []
        return real_image(pid, within_s)

    monkeypatch.setattr(procfs, "exec_image", image)

    async def scenario() -> None:
        agents.start()
        try:
            env = dict(os.environ, AGENT_RESOURCE_HINT="memory:300m")
            child = subprocess.Popen(["sleep", "3"], env=env)
            while b"AGENT_RESOURCE_HINT" not in Path(f"/proc/{child.pid}/environ").read_bytes():
                await asyncio.sleep(0.001)
            FakeConnector.instances[-1].push(*_events(os.getpid(), child.pid))
            await asyncio.sleep(0.1)
            [call] = agents.calls.values()
            assert [p for p, _ in moves] == [child.pid] and call.call.managed is None
            await _until(lambda: call.call.managed is not None)
            assert call.call.hint["memory_bytes"] == 300 * MiB
            assert call.call.argv == ["sleep", "3"] and call.call.start is not None
            assert agents.stats["in_exec"] == 1
            child.kill()
            child.wait()
        finally:
            agents.stop()

    asyncio.run(scenario())


def _restart(agents: InsideAgents, until: Any = lambda: True, **cfg: Any) -> InsideAgents:
    """A next daemon's InsideAgents on the same state (and config, but for `cfg`), started,
    and stopped once `until()`."""
    conf = Config(**{**agents.cfg.__dict__, **cfg}) if cfg else agents.cfg
    again = InsideAgents(conf, agents.settings, Engine(conf, agents.settings))

    async def run() -> None:
        again.start()
        try:
            await _until(until)
            await asyncio.sleep(0.2)  # what it would record, it records at once
        finally:
            again.stop()

    asyncio.run(run())
    return again


def _lines(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "calls.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


async def _call_on_connector(child: subprocess.Popen[bytes]) -> None:
    """The agent's (this process's) `child`, reported by the connector once exec'd."""
    argv = "".join(f"{a}\0" for a in child.args).encode()
    while Path(f"/proc/{child.pid}/cmdline").read_bytes() != argv:
        await asyncio.sleep(0.001)
    FakeConnector.instances[-1].push(*_events(os.getpid(), child.pid))


def test_a_call_caught_in_its_exec_when_the_daemon_dies_is_recorded_by_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a call caught inside its exec waits to be described, its cgroup carries its mark
    (it carried "spare": a call that ended before the next daemon came up was removed without
    a line, and the e2e test_held_calls_run_when_the_daemon_dies found 3 calls of 4 in CI)."""
    agents, _cg, moves = _setup(tmp_path, monkeypatch)
    monkeypatch.setattr(procfs, "exec_image", lambda pid, within_s=0.05: ([], []))
    child = subprocess.Popen(["sleep", "30"])

    async def first() -> str:
        agents.start()
        try:
            await _call_on_connector(child)
            await _until(lambda: agents.stats["in_exec"] == 1)
            [call] = agents.calls.values()
            found = json.loads(mark.get(call.cgroup, mark.INSIDE) or b"null")
            assert found["call"] == call.name and found["argv"] == ["sleep"], found
            return call.cgroup
        finally:
            agents.stop()  # then its loop goes, as a killed daemon's does

    tool = asyncio.run(first())
    child.kill()
    child.wait()
    Path(tool, "cgroup.events").write_text("populated 0\n")
    _restart(agents, lambda: _lines(tmp_path) != [])
    [entry] = _lines(tmp_path)
    assert entry["call"] == os.path.basename(tool) and entry["argv"] == ["sleep"]
    assert entry["adopted"] is True and entry["inside"]["pid"] == child.pid
    assert [p for p, _ in moves] == [child.pid]


def test_a_call_left_after_its_line_is_not_recorded_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon killed between a call's line and its rmdir (or whose rmdir failed) leaves the
    cgroup marked done: the next one removes it and writes no second line."""
    agents, _cg, _moves = _setup(tmp_path, monkeypatch)
    monkeypatch.setattr(v2, "remove", lambda path, attempts=20: False)  # as if killed first
    child = subprocess.Popen(["sleep", "0.2"])

    async def first() -> str:
        agents.start()
        try:
            await _call_on_connector(child)
            await _until(lambda: len(agents.calls) == 1)
            [call] = agents.calls.values()
            child.wait()
            Path(call.cgroup, "cgroup.events").write_text("populated 0\n")
            agents._ended(call.name)
            await _until(lambda: _lines(tmp_path) != [])
            await asyncio.sleep(0.05)
            return call.cgroup
        finally:
            agents.stop()

    tool = asyncio.run(first())
    assert mark.get(tool, mark.INSIDE) == mark.DONE
    removed: list[str] = []
    monkeypatch.setattr(v2, "remove", lambda path, attempts=20: removed.append(path) or True)
    _restart(agents)
    assert len(_lines(tmp_path)) == 1 and tool in removed


def test_a_spare_a_call_ran_in_is_recorded_one_never_used_is_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed between a call's move and its mark, a daemon leaves a "spare" that a call ran
    in: its CPU says so, and the next daemon records it (a spare never used reads 0 and is
    removed). A call still running in one is adopted under the command line's redaction."""
    agents, cg, _moves = _setup(tmp_path, monkeypatch)
    child = subprocess.Popen(["sleep", "30"])
    for name, usage, procs in (("tool-ran", 1234, ""), ("tool-unused", 0, ""),
                               ("tool-running", 99, f"{child.pid}\n")):
        tool = cg / name
        tool.mkdir()
        (tool / "cpu.stat").write_text(f"usage_usec {usage}\nuser_usec 0\n")
        (tool / "cgroup.events").write_text(f"populated {int(bool(procs))}\n")
        (tool / "cgroup.procs").write_text(procs)
        (tool / "cgroup.freeze").write_text("0\n")
        mark.put(str(tool), mark.INSIDE, mark.SPARE)
    removed: list[str] = []
    monkeypatch.setattr(v2, "remove", lambda path, attempts=20: removed.append(path) or True)
    try:
        while Path(f"/proc/{child.pid}/cmdline").read_bytes() != b"sleep\x0030\x00":
            time.sleep(0.001)
        again = _restart(agents, lambda: _lines(tmp_path) != [], redact_commands=True)
        [entry] = _lines(tmp_path)
        assert entry["call"] == "tool-ran" and entry["adopted"] is True and entry["argv"] == []
        assert str(cg / "tool-unused") in removed and str(cg / "tool-ran") in removed
        assert set(again.calls) == {"tool-running"}
        found = json.loads(mark.get(str(cg / "tool-running"), mark.INSIDE) or b"null")
        assert found["argv"] == ["sleep"] and found["command_class"], found
    finally:
        child.kill()
        child.wait()


def test_a_command_started_before_the_daemon_listened_is_placed_late(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, _cg, moves = _setup(tmp_path, monkeypatch)
    early = subprocess.Popen(["sleep", "2"])  # exec'd before the daemon knows the box
    while Path(f"/proc/{early.pid}/cmdline").read_bytes() != b"sleep\x002\x00":
        time.sleep(0.001)

    async def scenario() -> None:
        agents.start()
        try:
            assert [p for p, _ in moves] == [early.pid]
            [call] = agents.calls.values()
            assert call.call.argv == ["sleep", "2"] and call.call.inside["placement_us"] > 0
        finally:
            agents.stop()
            early.kill()
            early.wait()

    asyncio.run(scenario())


def test_unrelated_and_grandchildren_are_untouched(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    agents, _cg, moves = _setup(tmp_path, monkeypatch, freeze="always")

    async def scenario() -> None:
        agents.start()
        try:
            conn = FakeConnector.instances[-1]
            conn.push(*_events(1, 4242))  # someone else's child
            conn.push(*_events(os.getpid() + 999999, 4243))
            await asyncio.sleep(0.05)
            assert moves == [] and agents.calls == {}
        finally:
            agents.stop()

    asyncio.run(scenario())


def test_a_call_that_ended_within_the_batch_costs_no_move(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    agents, _cg, moves = _setup(tmp_path, monkeypatch)

    async def scenario() -> None:
        agents.start()
        try:
            conn = FakeConnector.instances[-1]
            agent = os.getpid()
            # One batch: a child forks, execs and exits (a short command read late), and a
            # pid that is not ours exits first, which must not hide a later call.
            conn.push(ProcEvent(proc_events.PROC_EVENT_EXIT, 0, 0, 4245, 4245),
                      *_events(agent, 4244),
                      ProcEvent(proc_events.PROC_EVENT_EXIT, 0, 0, 4244, 4244, exit_code=0))
            await asyncio.sleep(0.05)
            assert moves == [] and agents.calls == {} and agents.stats["short"] == 1
        finally:
            agents.stop()

    asyncio.run(scenario())


def test_no_opt_in_no_listening(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, cg, _moves = _setup(tmp_path, monkeypatch)
    rec = tmp_path / "state" / "containers" / "box.json"
    data = json.loads(rec.read_text())
    data["annotations"] = {}
    rec.write_text(json.dumps(data))

    async def scenario() -> None:
        agents.start()
        try:
            assert agents.boxes == {} and agents.conn is None
            assert [p.name for p in cg.iterdir()] == ["init"]  # no spare cgroups either
        finally:
            agents.stop()

    asyncio.run(scenario())


def test_not_before_start_prepared_the_layout(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    agents, _cg, _moves = _setup(tmp_path, monkeypatch)
    rec = tmp_path / "state" / "containers" / "box.json"
    data = json.loads(rec.read_text())
    rec.write_text(json.dumps({**data, "prepared": False}))

    async def scenario() -> None:
        agents.start()
        try:
            assert agents.boxes == {}
            records.save_container(str(tmp_path / "state"), data)  # `start` made the layout
            await asyncio.sleep(0.1)  # inotify tells at once
            await asyncio.sleep(0.1)
            assert "box" in agents.boxes
        finally:
            agents.stop()

    asyncio.run(scenario())


def test_a_call_is_placed_only_after_its_first_slice(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """One that ends within place_after_ms costs nothing; one that outlives it is placed then,
    together with what it forked meanwhile (a move takes one process, not its children)."""
    agents, _cg, moves = _setup(tmp_path, monkeypatch, place_after_ms=300)

    async def scenario() -> None:
        agents.start()
        try:
            conn = FakeConnector.instances[-1]
            agent = os.getpid()
            conn.push(*_events(agent, 4246, time.monotonic_ns()))
            await asyncio.sleep(0.02)
            conn.push(ProcEvent(proc_events.PROC_EVENT_EXIT, 0, 0, 4246, 4246))
            await asyncio.sleep(0.25)  # events are read in batches, half a slice apart
            assert moves == [] and agents.stats["short"] == 1
            long = subprocess.Popen(["sh", "-c", "sleep 3 & wait"])
            for _ in range(200):  # the shell forks its sleep during the call's slice
                if procfs.children(long.pid):
                    break
                await asyncio.sleep(0.01)
            [grandchild] = procfs.children(long.pid)
            conn.push(*_events(agent, long.pid, time.monotonic_ns()))
            await asyncio.sleep(0.2)
            assert moves == []
            await asyncio.sleep(0.5)
            assert [p for p, _ in moves] == [long.pid, grandchild]
            assert len({cg for _, cg in moves}) == 1
            assert agents.stats["placed"] == 1 and agents._due == {}
            long.kill()
            long.wait()
        finally:
            agents.stop()

    asyncio.run(scenario())


def test_the_kernel_probe_reports_calls_and_their_ends(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """source bpf: the agent goes into the probe's map; the probe's EV_CALL places a call, its
    EV_EXIT ends it with the wait status; short commands never reach the daemon."""
    agents, _cg, moves = _setup(tmp_path, monkeypatch, source="bpf")

    async def scenario() -> dict[str, Any]:
        agents.start()
        try:
            probe, box = await _probe_up(agents)
            assert probe.agents == {os.getpid(): (box.number, False)}
            assert probe.slice_ns == 5_000_000
            assert {"python3", "pytest"} <= probe.eager  # placed at exec by default
            child = await _call_on_probe(probe, box, "0.3")
            await asyncio.sleep(0.05)
            assert [p for p, _ in moves] == [child.pid]
            [call] = agents.calls.values()
            Path(call.cgroup, "memory.peak").write_text(f"{300 * MiB}\n")
            child.wait()
            # It ran `bigprog` last (exec'd from sleep, say) and peaked at 300 MiB: from now on
            # bigprog is placed at its exec.
            probe.push(probe_mod.Event(probe_mod.EV_EXIT, child.pid, os.getpid(), box.number,
                                       time.monotonic_ns(), 3 << 8, "bigprog"))
            await asyncio.sleep(0.05)
            assert call.status == 3 << 8
            snap = agents.snapshot()
            assert snap["source"] == "bpf" and snap["short"] == 7 and snap["placed"] == 1
            agents._ended(call.name)
            for _ in range(50):
                await asyncio.sleep(0.05)
                if (tmp_path / "calls.jsonl").exists():
                    break
            await asyncio.sleep(0.05)
            assert agents.learned == {"bigprog"} and "bigprog" in probe.eager
            return json.loads((tmp_path / "calls.jsonl").read_text())
        finally:
            agents.stop()

    entry = asyncio.run(scenario())
    assert entry["exit_code"] == 3 and entry["inside"]["agent_pid"] == os.getpid()
    assert entry["memory_peak"] == 300 * MiB and entry["inside"]["at_exec"] is False


def test_a_call_whose_exit_event_comes_late_is_still_learned_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy loop can read a call's EV_EXIT well after its cgroup emptied: the program it ran
    is learned then (it used to be dropped when the exit came more than 0.5 s late)."""
    agents, _cg, moves = _setup(tmp_path, monkeypatch, source="bpf")

    async def scenario() -> None:
        agents.start()
        try:
            probe, box = await _probe_up(agents)
            child = await _call_on_probe(probe, box, "0.2")
            await _until(lambda: len(moves) == 1)
            [call] = agents.calls.values()
            Path(call.cgroup, "memory.peak").write_text(f"{300 * MiB}\n")
            child.wait()
            agents._ended(call.name)
            await _until(lambda: (tmp_path / "calls.jsonl").exists())
            await asyncio.sleep(0.3)
            assert agents.learned == set()
            probe.push(probe_mod.Event(probe_mod.EV_EXIT, child.pid, os.getpid(), box.number,
                                       time.monotonic_ns(), 0, "bigprog"))
            await _until(lambda: agents.learned == {"bigprog"})
            assert "bigprog" in probe.eager and child.pid not in agents.by_pid
        finally:
            agents.stop()

    asyncio.run(scenario())


def test_without_the_probe_auto_falls_back_to_the_connector(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, _cg, _moves = _setup(tmp_path, monkeypatch, source="auto")

    def no_probe(obj: str, slice_ns: int) -> FakeProbe:
        raise OSError(1, "bpf(cmd 5): Operation not permitted")

    monkeypatch.setattr(probe_mod, "load", no_probe)

    async def scenario() -> None:
        agents.start()
        try:
            await _until(lambda: agents.snapshot()["source"] == "connector")
            assert agents.conn is FakeConnector.instances[-1]
        finally:
            agents.stop()

    asyncio.run(scenario())


def test_shells_and_small_calls_are_never_learned(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    agents, _cg, _moves = _setup(tmp_path, monkeypatch, source="bpf")
    big, small = 300 * MiB, 10 * MiB

    def call(comm: str) -> Call:
        box = Box("box", "box", str(tmp_path), 1, None)
        c = Call(ToolCall(f"tool-{comm}", "box", "box", "", []), 1, box, None)
        c.last_comm = comm
        return c

    agents._learn(call("sh"), big)  # a shell's call: the burst was another program's
    agents._learn(call("bash"), big)
    agents._learn(call("memhog"), small)
    agents._learn(call("python3"), big)  # listed already
    agents._learn(call(""), big)
    assert agents.learned == set()
    agents._learn(call("memhog"), big)
    assert agents.learned == {"memhog"}


def _slow_load(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The probe's load blocks (on its worker thread) until the event returned is set."""
    gate = threading.Event()

    def slow_load(obj: str, slice_ns: int) -> FakeProbe:
        assert gate.wait(10)
        return FakeProbe(slice_ns)

    monkeypatch.setattr(probe_mod, "load", slow_load)
    return gate


def test_the_probe_loads_off_the_loop_and_places_what_started_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the probe took 12-17 s under TCG, on the daemon's loop: every sandbox's admission
    waited for it. Now the loop runs on while it loads, status says so, and a command the agent
    started meanwhile is placed (late) once the probe is attached."""
    from execgate.daemon.inside import sources

    agents, _cg, moves = _setup(tmp_path, monkeypatch, source="bpf")
    gate = _slow_load(monkeypatch)
    monkeypatch.setattr(sources, "PROBE_LINGER_S", 0.3)

    async def scenario() -> None:
        agents.start()
        child = None
        try:
            ticks = 0
            for _ in range(10):  # the loop is not blocked by the load
                await asyncio.sleep(0.01)
                ticks += 1
            assert ticks == 10 and agents.probe is None
            snap = agents.snapshot()
            assert snap["source"] == "loading" and not snap["listening"]
            child = subprocess.Popen(["sleep", "5"])
            while Path(f"/proc/{child.pid}/cmdline").read_bytes() != b"sleep\x005\x00":
                await asyncio.sleep(0.001)
            gate.set()
            await _until(lambda: agents.probe is not None)
            probe = FakeProbe.instances[-1]
            assert [p for p, _ in moves] == [child.pid] and probe.adopted == [child.pid]
            assert agents.snapshot()["source"] == "bpf"
            # The last opted-in container leaves: the probe lingers, then goes.
            (tmp_path / "state" / "containers" / "box.json").unlink()
            await _until(lambda: agents.boxes == {})
            assert agents.probe is probe and not probe.closed
            await _until(lambda: probe.closed, timeout=3)
            assert agents.probe is None
        finally:
            if child is not None:
                child.kill()
                child.wait()
            agents.stop()

    asyncio.run(scenario())


def test_a_stopping_daemon_closes_a_probe_still_loading(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, _cg, _moves = _setup(tmp_path, monkeypatch, source="bpf")
    gate = _slow_load(monkeypatch)

    async def scenario() -> None:
        agents.start()
        await asyncio.sleep(0.05)
        agents.stop()  # no linger when the daemon stops
        assert agents.snapshot()["source"] is None
        n = len(FakeProbe.instances)
        gate.set()
        await _until(lambda: len(FakeProbe.instances) > n)
        await _until(lambda: FakeProbe.instances[-1].closed)
        assert agents.probe is None

    asyncio.run(scenario())


def test_an_exit_before_its_call_event_places_nothing(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """inside.bpf.c's slice timer and the call's exit run on different CPUs, so EV_EXIT can
    reach the ring before its EV_CALL. Placed then, the call (a zombie by now) waited for an
    end it had already been told of, and its journal line had no exit status (VM, 1 of 200)."""
    agents, _cg, moves = _setup(tmp_path, monkeypatch, source="bpf")

    async def scenario() -> None:
        agents.start()
        try:
            probe, box = await _probe_up(agents)
            child = subprocess.Popen(["true"])  # a zombie of the agent (this process)
            while Path(f"/proc/{child.pid}/stat").read_text().split(") ")[1][0] != "Z":
                await asyncio.sleep(0.001)
            t = time.monotonic_ns()
            probe.push(probe_mod.Event(probe_mod.EV_EXIT, child.pid, os.getpid(), box.number,
                                       t, 0, "true"),
                       probe_mod.Event(probe_mod.EV_CALL, child.pid, os.getpid(), box.number,
                                       t - 6_000_000, 0, "true"))
            await asyncio.sleep(0.1)
            assert moves == [] and agents.calls == {} and agents.stats["short"] == 1
            assert agents._early_exits == {}
            child.wait()
        finally:
            agents.stop()

    asyncio.run(scenario())


def test_a_call_in_a_group_killing_container_gets_its_own_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19: with memory.oom.group = 1 on the container (Kubernetes >= 1.28) a call that
    runs it out of memory takes the agent along, so every call gets a memory.max below what the
    container has left (calls/placement.py does it for docker exec); an inside agent's calls
    did not."""
    agents, cg, _moves = _setup(tmp_path, monkeypatch)
    (cg / "memory.oom.group").write_text("1\n")
    (cg / "memory.max").write_text(f"{512 * MiB}\n")
    (cg / "memory.stat").write_text(f"anon {200 * MiB}\nfile 0\n")
    from execgate.cgroups import container

    made = container.make_tool_cgroup

    def make_tool_cgroup(parent: str, name: str) -> str:  # as the kernel lays one out
        tool = made(parent, name)
        Path(tool, "memory.max").write_text("max\n")
        return tool

    monkeypatch.setattr(container, "make_tool_cgroup", make_tool_cgroup)

    async def scenario() -> int:
        agents.start()
        child = subprocess.Popen(["sleep", "30"])
        try:
            FakeConnector.instances[-1].push(*_events(os.getpid(), child.pid))
            await _until(lambda: agents.calls)
            [call] = agents.calls.values()
            return int(Path(call.call.cgroup, "memory.max").read_text())
        finally:
            child.kill()
            child.wait()
            agents.stop()

    # 512 MiB - 200 MiB of the agent's - max(16 MiB, 5 %): the call dies before the group
    assert asyncio.run(scenario()) == 512 * MiB - 200 * MiB - 512 * MiB // 20
