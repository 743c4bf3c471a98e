"""Which exec is a tool call: the Tracker's rule over synthetic fork/exec/exit sequences, plus
the opt-in and the end watcher against a fake cgroup.events."""

from __future__ import annotations

import threading
from pathlib import Path

from execgate.common import records
from execgate.daemon.inside import procfs
from execgate.daemon.inside.end_watcher import EndWatcher
from execgate.daemon.inside.tracker import Match, Tracker

AGENT, OTHER = 100, 900


def _tracker(rule: str = "child") -> Tracker:
    t = Tracker(rule)
    t.agents[AGENT] = "box"
    return t


def test_exec_of_an_agent_child_is_a_call() -> None:
    t = _tracker()
    t.fork(AGENT, 200, 200)
    assert t.exec(200) == Match("call", 200, AGENT, "box")
    assert t.exec(200) is None  # a second exec of the same process (sh -> memhog): same call


def test_unrelated_processes_threads_and_the_agent_itself_do_not_match() -> None:
    t = _tracker()
    t.fork(OTHER, 300, 300)
    assert t.exec(300) is None
    t.fork(AGENT, 101, AGENT)  # a thread of the agent
    assert t.pending == {}
    assert t.exec(AGENT) is None  # the agent re-exec'ing itself is never a call


def test_forked_child_that_exits_without_exec_is_forgotten() -> None:
    t = _tracker()
    t.fork(AGENT, 200, 200)
    assert t.exit(200, 200) is None
    t.fork(OTHER, 200, 200)  # the pid is reused elsewhere on the host
    assert t.exec(200) is None


def test_child_rule_ignores_grandchildren_first_exec_follows_forks() -> None:
    child = _tracker("child")
    child.fork(AGENT, 200, 200)  # a subshell ...
    child.fork(200, 201, 201)  # ... forks the real command
    assert child.exec(201) is None
    first = _tracker("first-exec")
    first.fork(AGENT, 200, 200)
    first.fork(200, 201, 201)
    assert first.exec(201) == Match("call", 201, 200, "box")
    first.fork(201, 202, 202)  # below a call: inherited by its cgroup, not a call of its own
    assert first.exec(202) is None


def test_wrapper_child_becomes_the_agent() -> None:
    t = Tracker()
    t.wrappers[1] = "box"  # docker run --init
    t.fork(1, 50, 50)
    assert t.exec(50) == Match("agent", 50, 1, "box")
    assert t.agents == {50: "box"}
    t.fork(50, 60, 60)
    assert t.exec(60) == Match("call", 60, 50, "box")


def test_agent_exit_and_forget_container() -> None:
    t = _tracker()
    t.fork(AGENT, 200, 200)
    assert t.exit(AGENT + 1, AGENT) is None  # a thread of the agent ended
    assert t.exit(AGENT, AGENT) == "box"
    t.agents[AGENT] = "box"
    t.fork(AGENT, 201, 201)
    t.forget_container("box")
    assert t.agents == {} and t.pending == {}


def test_pending_is_bounded() -> None:
    t = Tracker(max_pending=3)
    t.agents[AGENT] = "box"
    for pid in range(200, 210):
        t.fork(AGENT, pid, pid)
    assert list(t.pending) == [207, 208, 209]


def test_opt_in() -> None:
    assert records.agent_inside({"annotations": {"execgate.agent": "inside"}}, False)
    assert records.agent_inside({"annotations": {"execgate.agent": " Inside "}}, False)
    assert not records.agent_inside({"annotations": {"execgate.agent": "exec"}}, True)
    assert not records.agent_inside({"annotations": {}}, False)
    assert records.agent_inside({}, True)


def test_end_watcher_reports_an_empty_cgroup(tmp_path: Path) -> None:
    busy, idle = tmp_path / "busy", tmp_path / "idle"
    for d, state in ((busy, 1), (idle, 0)):
        d.mkdir()
        (d / "cgroup.events").write_text(f"populated {state}\nfrozen 0\n")
    got: list[str] = []
    seen = threading.Event()

    def on_empty(key: str) -> None:
        got.append(key)
        seen.set()

    w = EndWatcher(on_empty)
    try:
        assert w.watch("busy", str(busy)) and w.watch("idle", str(idle))
        assert not w.watch("gone", str(tmp_path / "nope"))
        assert seen.wait(5)
        assert got == ["idle"]
    finally:
        w.stop()


def test_proc_helpers_on_this_process() -> None:
    import os

    assert procfs.ppid(os.getpid()) == os.getppid()
    assert procfs.ppid(2**22 + 12345) is None
    mem = procfs.memory_status(os.getpid())
    assert mem["VmRSS"] > 0
    assert procfs.comm(os.getpid())


def test_exec_reported_before_the_fork_still_matches() -> None:
    # The kernel reports a fork from the parent after waking the child: on another CPU the
    # child's exec can come first.
    t = _tracker()
    assert t.exec(200, ts=1_000) is None
    assert t.fork(AGENT, 200, 200, ts=1_500) == Match("call", 200, AGENT, "box", 1_000)
    assert t.pending == {} and t.recent_exec == {}


def test_a_child_that_exited_before_its_fork_was_reported_is_not_pending() -> None:
    t = _tracker()
    t.exec(200, ts=1_000)
    assert t.exit(200, 200, ts=2_000) is None
    assert t.fork(AGENT, 200, 200, ts=3_000) is None
    assert t.pending == {}
    assert t.gone_before_fork == 1  # counted: the daemon's stats account for every command


def test_old_events_of_a_reused_pid_do_not_match() -> None:
    t = _tracker()
    t.exec(200, ts=0)  # some other process, long ago, still running
    assert t.fork(AGENT, 200, 200, ts=5 * Tracker.RACE_NS) is None  # not exec'd yet: pending
    assert 200 in t.pending
    t.exit(300, 300, ts=0)
    assert t.fork(AGENT, 300, 300, ts=5 * Tracker.RACE_NS) is None
    assert 300 in t.pending


def test_recent_tables_are_bounded() -> None:
    t = Tracker(max_recent=4)
    for pid in range(1000, 1100):
        t.exec(pid, ts=pid)
        t.exit(pid, pid, ts=pid)
    assert len(t.recent_exec) == 0 and len(t.recent_exit) == 4
