"""The exec handler (`runtime/exec.py`) with everything around it faked but itself.

Fakes: the kernel's cgroupfs is a temp dir laid out like a managed container (`<box>/init/`);
runc is a shell script that records the argv it is given and the call's cgroup as it finds
it; the daemon is a thread serving the wire protocol (msgpack frames, docs/protocol.md). The
handler runs in a process of its own, as on every `docker exec`: it builds a real Context,
calls `handle(ctx)` and execve()s the fake runc with the argv it returned, and the detached
watcher it leaves behind runs to its end against the temp paths (what it journals is checked).
In that process the fake cgroupfs does what the kernel's does: mkdir creates a cgroup's
interface files, rmdir removes them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from execgate.common.config import Config
from execgate.common.units import GiB, MiB
from execgate.oci import cli
from execgate.oci.runclog import RuncLog
from execgate.runtime import exec as exec_
from execgate.runtime.context import Context

TOOL = re.compile(r"tool-[0-9a-f]{12}")
REPO = str(Path(__file__).resolve().parents[2])

FAKE_RUNC = """#!/bin/sh
# runc exec, as far as the handler can tell: records its argv and the call's cgroup.
# Its help names --cgroup (oci/exec_cgroup.py asks once), unless FAKE_RUNC_HELP says otherwise.
case " $* " in *" --help "*) echo "${FAKE_RUNC_HELP:---cgroup value   a sub-cgroup}"; exit 0;;
esac
printf '%s\\n' "$@" > "$FAKE_RUNC_OUT.argv"
while [ $# -gt 0 ]; do [ "$1" = --cgroup ] && cg="$2"; shift; done
[ -n "$cg" ] && cat "$FAKE_BOX/$cg/memory.oom.group" > "$FAKE_RUNC_OUT.oom" 2>/dev/null
[ -n "$cg" ] && cat "$FAKE_BOX/$cg/memory.high" > "$FAKE_RUNC_OUT.high" 2>/dev/null
exit "$FAKE_RUNC_STATUS"
"""

# The runtime process: cgroupfs semantics for mkdir/rmdir below the fake root, then what
# runtime/main.py does for an intercepted exec: handle(ctx), then become the real runtime.
DRIVER = """
import errno, json, os, sys
root, cfg_json, log_path, runc, argv_json = sys.argv[1:6]
_mkdir, _rmdir = os.mkdir, os.rmdir
FILES = {"cgroup.procs": "", "cgroup.events": "populated 0\\nfrozen 0\\n",
         "cgroup.freeze": "0\\n", "memory.oom.group": "0\\n", "memory.high": "max\\n",
         "memory.max": "max\\n", "memory.events": "low 0\\nhigh 0\\nmax 0\\noom 0\\n"
         "oom_kill 0\\noom_group_kill 0\\n", "memory.current": "0\\n", "memory.peak": "0\\n"}
def below(path):
    return os.path.abspath(path).startswith(root + os.sep)
def mkdir(path, mode=0o777, *, dir_fd=None):
    _mkdir(path, mode, dir_fd=dir_fd)
    if below(path):
        for name, text in FILES.items():
            with open(os.path.join(path, name), "w") as f:
                f.write(text)
def rmdir(path, *, dir_fd=None):
    if below(path) and os.path.exists(os.path.join(path, "cgroup.procs")):
        with open(os.path.join(path, "cgroup.procs")) as f:
            if f.read().strip():
                raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), path)
        for name in FILES:
            try:
                os.unlink(os.path.join(path, name))
            except FileNotFoundError:
                pass
    _rmdir(path, dir_fd=dir_fd)
os.mkdir, os.rmdir = mkdir, rmdir

from execgate.common.config import Config
from execgate.oci import cli
from execgate.oci.runclog import RuncLog
from execgate.runtime import exec as exec_
from execgate.runtime.context import Context
inv = cli.parse(json.loads(argv_json))
ctx = Context(inv=inv, config=Config(**json.loads(cfg_json)), log=RuncLog(log_path, "json"),
              runc=runc)
out = exec_.handle(ctx)
os.execv(runc, [runc, *out])
"""


# -- the fake daemon -----------------------------------------------------------------------------


def _frame(msg: dict[str, Any]) -> bytes:
    body = msgpack.packb(msg, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


class FakeDaemon:
    """execgated as the runtime meets it: `admit` answers `queued`, then `admitted` (with
    `admitted`'s fields); `done` answers what the growth gate did (nothing). Silent: it reads a
    request and never answers; refuse: the first frame says no; version: what it speaks."""

    def __init__(self, path: str, silent: bool = False, refuse: str | None = None,
                 version: int = 1, waiting: list[dict[str, Any]] | None = None,
                 **admitted: Any) -> None:
        self.requests: list[dict[str, Any]] = []
        self.hang_up = threading.Event()
        daemon = self

        def answer(sock: socket.socket, **fields: Any) -> None:
            sock.sendall(_frame({"v": version, **fields}))

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                while (header := _read_exact(self.request, 4)) is not None:
                    body = _read_exact(self.request, struct.unpack(">I", header)[0])
                    if body is None:
                        return
                    msg = msgpack.unpackb(body, raw=False)
                    daemon.requests.append(msg)
                    if silent:
                        daemon.hang_up.wait(10)
                        return
                    if msg.get("op") != "admit":
                        answer(self.request, ok=True, held_s=0.0, killed_by_execgate=False)
                    elif refuse:
                        answer(self.request, ok=False, error=refuse)
                        return
                    else:
                        answer(self.request, ok=True, queued=True, queue="light",
                               max_wait_s=30.0, **({"progress_s": 10.0, "max_queued_s": 600.0}
                                                   if waiting else {}))
                        for frame in waiting or ():
                            answer(self.request, ok=True, waiting=True, **frame)
                        answer(self.request, **{"ok": True, "admitted": True, "waited_s": 0.01,
                                                "forced": False, **admitted})
                        return

        self.server = socketserver.ThreadingUnixStreamServer(path, Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,))
        self.thread.start()

    def ops(self) -> list[str]:
        return [r.get("op") for r in self.requests]

    def close(self) -> None:
        self.hang_up.set()
        self.server.shutdown()
        self.server.server_close()  # joins the connections' threads
        self.thread.join()


# -- the container, its call and the runtime process ---------------------------------------------


class Box:
    """A managed container's record and cgroup, a call's process spec, a runtime to run it."""

    def __init__(self, tmp: Path, memory_max: str = f"{GiB}", record: bool = True,
                 managed: bool = True) -> None:
        self.tmp = tmp
        self.root = tmp / "cgroup"
        self.cg = self.root / "box"
        (self.cg / "init").mkdir(parents=True)
        (self.cg / "memory.max").write_text(memory_max + "\n")
        (self.cg / "init" / "cgroup.freeze").write_text("0\n")
        self.state = tmp / "state"
        (self.state / "containers").mkdir(parents=True)
        if record:
            (self.state / "containers" / "box.json").write_text(json.dumps({
                "id": "box", "sandbox": "agent-7", "managed": managed, "prepared": managed,
                "cgroup": str(self.cg)}))
        self.socket = tmp / "run" / "execgated.sock"
        self.socket.parent.mkdir()
        self.journal = tmp / "lib" / "calls.jsonl"
        self.log = tmp / "runc.log"
        self.runc = tmp / "runc"
        self.runc.write_text(FAKE_RUNC)
        self.runc.chmod(0o755)
        self.out = tmp / "runc-out"

    def config(self, timeout_ms: int = 1000, **more: Any) -> dict[str, Any]:
        return {"state_dir": str(self.state), "journal": str(self.journal),
                "socket": str(self.socket), "daemon_timeout_ms": timeout_ms, **more}

    def process_spec(self, args: list[str], hint: str | None = None) -> str:
        env = ["PATH=/usr/bin:/bin", "HOME=/root"]
        if hint is not None:
            env.append(f"AGENT_RESOURCE_HINT={hint}")
        path = self.tmp / f"process-{len(list(self.tmp.glob('process-*')))}.json"
        path.write_text(json.dumps({"args": args, "env": env, "cwd": "/", "terminal": False}))
        return str(path)

    def argv(self, spec: str) -> list[str]:
        """What containerd hands runc for a `docker exec` (`runc exec --process FILE ID`)."""
        return ["--root", "/run/runc", "--log", str(self.log), "--log-format", "json", "exec",
                "--process", spec, "--detach", "box"]

    def context(self, argv: list[str], timeout_ms: int = 1000) -> Context:
        return Context(inv=cli.parse(argv), config=Config(**self.config(timeout_ms)),
                       log=RuncLog(str(self.log), "json"), runc=str(self.runc))

    def run(self, argv: list[str], timeout_ms: int = 1000, status: int = 3,
            help_text: str | None = None, **config: Any) -> subprocess.CompletedProcess[str]:
        """The runtime process for one exec, to its end and its watcher's."""
        env = {**os.environ, "PYTHONPATH": REPO, "FAKE_BOX": str(self.cg),
               "FAKE_RUNC_OUT": str(self.out), "FAKE_RUNC_STATUS": str(status)}
        if help_text is not None:
            env["FAKE_RUNC_HELP"] = help_text
        cfg = json.dumps(self.config(timeout_ms, **config))
        proc = subprocess.run(
            [sys.executable, "-c", DRIVER, str(self.root), cfg, str(self.log), str(self.runc),
             json.dumps(argv)],
            env=env, capture_output=True, text=True, timeout=20)
        self.wait_for_watchers()
        return proc

    def wait_for_watchers(self, timeout: float = 10.0) -> None:
        """The detached watcher is a fork of the runtime process: same command line."""
        deadline = time.monotonic() + timeout
        while left := _processes_naming(str(self.root)):
            if time.monotonic() > deadline:
                for pid in left:
                    os.kill(pid, 9)
                raise AssertionError(f"watchers {left} still running")
            time.sleep(0.01)

    def runc_argv(self) -> list[str]:
        return self.out.with_suffix(".argv").read_text().splitlines()

    def tool_name(self, argv: list[str]) -> str:
        """The call's cgroup, as runc was told it: argv spliced with `--cgroup tool-<hex>`."""
        ran = self.runc_argv()
        name = ran[ran.index("--cgroup") + 1]
        assert TOOL.fullmatch(name)
        assert ran == _spliced(argv, name)
        return name

    def warnings(self) -> list[str]:
        return [line["msg"] for line in self.log_lines() if line["level"] == "warning"]

    def journal_entries(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        return [json.loads(line) for line in self.journal.read_text().splitlines()]

    def log_lines(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def tools(self) -> list[str]:
        return sorted(p.name for p in self.cg.iterdir() if p.name.startswith("tool-"))


def _processes_naming(marker: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    out.append(int(pid))
        except OSError:
            continue
    return out


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    yield Box(tmp_path)


@pytest.fixture
def daemon(box: Box) -> Iterator[FakeDaemon]:
    d = FakeDaemon(str(box.socket))
    yield d
    d.close()


def _spliced(argv: list[str], name: str) -> list[str]:
    """argv with `--cgroup NAME` right after the subcommand, all else untouched."""
    i = argv.index("exec") + 1
    return [*argv[:i], "--cgroup", name, *argv[i:]]


# -- a managed call ------------------------------------------------------------------------------


@pytest.mark.parametrize(("hint", "declared"), [
    ("mem=512m, priority:low", 512 * MiB),
    ("memory=8g", GiB),  # never more than the container may use
    ("memory:high", GiB),
])
def test_a_managed_call_is_admitted_and_runs_in_its_own_cgroup(
        box: Box, daemon: FakeDaemon, hint: str, declared: int) -> None:
    argv = box.argv(box.process_spec(["pytest", "-x", "tests/"], hint))
    proc = box.run(argv, status=3)
    assert proc.returncode == 3, proc.stderr  # runc's status is the exec's
    assert proc.stderr == ""  # nothing to tell the agent

    name = box.tool_name(argv)
    assert box.out.with_suffix(".oom").read_text().strip() == "1"  # memory.oom.group
    assert box.out.with_suffix(".high").read_text().strip() == "max"  # not set by default

    admit, done = daemon.requests
    assert admit["v"] == 1 and admit["op"] == "admit"
    assert {k: admit[k] for k in ("call", "container", "sandbox", "cgroup", "argv")} == {
        "call": name, "container": "box", "sandbox": "agent-7",
        "cgroup": str(box.cg / name), "argv": ["pytest", "-x", "tests/"]}
    assert admit["hint"]["memory_bytes"] == declared
    assert admit["hint"]["priority"] == ("low" if "priority" in hint else "normal")
    assert done == {"v": 1, "op": "done", "call": name}  # the watcher, once the call ended

    (entry,) = box.journal_entries()
    assert entry["call"] == name and entry["managed"] is True
    assert entry["cgroup"] == str(box.cg / name) and entry["argv"] == ["pytest", "-x", "tests/"]
    assert entry["waited_s"] == 0.01 and entry["forced"] is False
    assert box.tools() == []  # the watcher removed the call's cgroup
    assert box.warnings() == []


def test_redact_commands_keeps_arguments_off_the_journal(box: Box, daemon: FakeDaemon) -> None:
    argv = box.argv(box.process_spec(["/usr/bin/pytest", "-x", "--token=hunter2"]))
    proc = box.run(argv, status=0, redact_commands=True)
    assert proc.returncode == 0, proc.stderr
    admit, _ = daemon.requests
    assert admit["argv"][-1] == "--token=hunter2"  # the daemon still predicts from it all
    (entry,) = box.journal_entries()
    assert entry["argv"] == ["pytest"] and entry["command_class"] == "test"
    assert "hunter2" not in box.journal.read_text()


def test_a_declared_size_becomes_memory_high_when_configured(box: Box,
                                                             daemon: FakeDaemon) -> None:
    argv = box.argv(box.process_spec(["cargo", "build"], "mem=300m"))
    assert box.run(argv, status=0, memory_high_from_hint=True).returncode == 0
    box.tool_name(argv)
    assert box.out.with_suffix(".high").read_text().strip() == str(300 * MiB)


def test_a_long_wait_for_admission_is_explained_to_the_agent(tmp_path: Path) -> None:
    box = Box(tmp_path)
    slow = FakeDaemon(str(box.socket), waited_s=3.5)
    try:
        argv = box.argv(box.process_spec(["pip", "install", "torch"]))
        proc = box.run(argv, status=0)
    finally:
        slow.close()
    assert proc.returncode == 0
    assert "waited 3.5" in proc.stderr and "delayed, not hung" in proc.stderr
    (entry,) = box.journal_entries()
    assert entry["call"] == box.tool_name(argv) and entry["waited_s"] == 3.5


def test_a_waiting_call_is_told_why_on_its_stderr_until_it_starts(tmp_path: Path) -> None:
    box = Box(tmp_path)
    frames = [{"waited_s": 10.0, "reason": "first in line, needs 50 MiB more free memory"},
              {"waited_s": 20.0, "reason": "first in line, needs 10 MiB more free memory"}]
    slow = FakeDaemon(str(box.socket), waiting=frames, waited_s=24.0, forced=True)
    try:
        argv = box.argv(box.process_spec(["pytest", "-q"]))
        proc = box.run(argv, status=0)
    finally:
        slow.close()
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "Waiting for memory" in line]
    assert notes == [
        "[execgate] Waiting for memory for 10 s (first in line, needs 50 MiB more free memory);"
        " it starts on its own, do not retry.",
        "[execgate] Waiting for memory for 20 s (first in line, needs 10 MiB more free memory);"
        " it starts on its own, do not retry."]
    assert "waited 24 s" in proc.stderr  # and, once it starts, how long in all
    assert slow.requests[0]["progress_s"] == 10.0  # it asked for the frames
    (entry,) = box.journal_entries()
    assert entry["managed"] is True and entry["waited_s"] == 24.0 and entry["forced"] is True


@pytest.mark.parametrize(("first", "bound"), [
    ({"max_wait_s": 30.0}, (35.0, 35.0)),  # an older daemon forces the call after max_wait_s
    # three frames may go missing: a loaded daemon is late, a dead one closes the socket
    ({"max_wait_s": 30.0, "progress_s": 10.0, "max_queued_s": 600.0}, (605.0, 35.0)),
    ({"max_wait_s": 30.0, "progress_s": 10.0, "max_queued_s": 0}, (35.0, 35.0)),
    ({"max_wait_s": "x", "progress_s": True}, (35.0, 35.0)),  # nonsense: the old bound
])
def test_the_runtime_waits_while_the_daemon_keeps_it_informed_up_to_its_cap(
        first: dict[str, Any], bound: tuple[float, float]) -> None:
    from execgate.runtime import admit

    assert admit.wait_bound(first) == bound


def test_a_malformed_hint_never_fails_the_exec_and_the_agent_is_told_once(
        box: Box, daemon: FakeDaemon) -> None:
    argv = box.argv(box.process_spec(["make", "-j8"], "memory=lots"))
    first = box.run(argv, status=0)
    assert first.returncode == 0
    assert "Ignored AGENT_RESOURCE_HINT='memory=lots'" in first.stderr
    assert "ran without a hint" in first.stderr
    name = box.tool_name(argv)
    admit = daemon.requests[0]
    assert admit["op"] == "admit" and admit["call"] == name and admit["hint"] is None
    assert any("AGENT_RESOURCE_HINT ignored" in m for m in box.warnings())

    second = box.run(box.argv(box.process_spec(["make", "-j8"], "memory=lots")), status=0)
    assert second.returncode == 0 and second.stderr == ""  # told once per sandbox and value
    assert [e["managed"] for e in box.journal_entries()] == [True, True]


# -- failing open --------------------------------------------------------------------------------


def test_a_daemon_that_does_not_answer_in_time_lets_the_call_run_unmanaged(box: Box) -> None:
    (box.cg / "init" / "cgroup.freeze").write_text("1\n")  # an idle sandbox the daemon froze
    silent = FakeDaemon(str(box.socket), silent=True)
    try:
        argv = box.argv(box.process_spec(["ls", "-l"], "mem=64m"))
        t0 = time.monotonic()
        proc = box.run(argv, timeout_ms=100, status=0)
        took = time.monotonic() - t0
    finally:
        silent.close()
    assert proc.returncode == 0, proc.stderr
    name = box.tool_name(argv)  # in its own cgroup still
    assert took < 5.0
    assert silent.ops() == ["admit"]  # and no `done` for a call the daemon never admitted
    assert any("daemon unavailable" in m and "running unmanaged" in m for m in box.warnings())
    (entry,) = box.journal_entries()
    assert entry["call"] == name and entry["managed"] is False
    assert entry["unmanaged"].startswith("daemon unavailable after 0.1"), entry  # and why
    assert (box.cg / "init" / "cgroup.freeze").read_text().strip() == "0"  # thawed for it
    assert box.tools() == []


@pytest.mark.parametrize(("peer", "logged"), [
    ({"refuse": "admission is off"}, "daemon refused: admission is off; running unmanaged"),
    ({"version": 2}, "protocol v2"),
])
def test_a_daemon_that_says_no_or_speaks_another_protocol_is_not_followed(
        tmp_path: Path, peer: dict[str, Any], logged: str) -> None:
    box = Box(tmp_path)
    other = FakeDaemon(str(box.socket), **peer)
    try:
        argv = box.argv(box.process_spec(["ls"]))
        proc = box.run(argv, status=0)
    finally:
        other.close()
    assert proc.returncode == 0, proc.stderr
    name = box.tool_name(argv)
    assert other.ops() == ["admit"]
    assert any(logged in m for m in box.warnings()), box.warnings()
    (entry,) = box.journal_entries()
    assert entry["call"] == name and entry["managed"] is False
    assert entry["unmanaged"] in logged or "protocol v2" in entry["unmanaged"], entry


def test_without_a_daemon_socket_the_call_runs_unmanaged(box: Box) -> None:
    argv = box.argv(box.process_spec(["true"]))
    assert box.run(argv, status=0).returncode == 0
    name = box.tool_name(argv)
    (entry,) = box.journal_entries()
    assert entry["call"] == name and entry["managed"] is False and entry["hint"] is None
    assert entry["unmanaged"].startswith("no daemon socket at ")
    assert box.warnings() == []  # a daemon not installed is no trouble


# -- passthrough ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["no record", "unmanaged", "not prepared", "placed by caller",
                                  "no container id"])
def test_what_is_not_ours_passes_through_untouched(tmp_path: Path, case: str) -> None:
    box = Box(tmp_path, record=case != "no record", managed=case != "unmanaged")
    if case == "not prepared":
        (box.cg / "init" / "cgroup.freeze").unlink()
        (box.cg / "init").rmdir()
    daemon = FakeDaemon(str(box.socket))
    try:
        argv = box.argv(box.process_spec(["ls"], "mem=1g"))
        if case == "placed by caller":
            argv = _spliced(argv, "mine")
        elif case == "no container id":
            argv = argv[:-1]
        assert exec_.handle(box.context(argv)) == argv
    finally:
        daemon.close()
    assert daemon.requests == []
    assert box.tools() == [] and box.journal_entries() == []
    unprepared = f"execgate: exec in box: {box.cg} lacks init/; running unmanaged"
    assert box.warnings() == ([unprepared] if case == "not prepared" else [])
    from execgate.common import records

    records.take_fail_open(str(box.state))  # aside; then read: a fail-open only if unprepared
    kinds = [e["kind"] for e in records.take_fail_open(str(box.state))]
    assert kinds == (["not-prepared"] if case == "not prepared" else [])


# -- bad process specs (issue 21, item 5) --------------------------------------------------------


@pytest.mark.parametrize("text", [
    b"[]", b'"args"', b"7", b"null", b'{"args": 5}', b'{"args": "ls -l"}',
    b'{"env": {"AGENT_RESOURCE_HINT": "mem=1g"}}', b'{"env": [1, null, ["x"]]}',
    b'{"cwd": [], "terminal": "yes"}', b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe{",
    b'{"args": ["ls"], "env": ["AGENT_RESOURCE_HINT=mem=\\u0000"]}',
    b'{"args": ["ls", "\\ud800"], "env": ["AGENT_RESOURCE_HINT=mem=1g\\udfff"]}',
])
def test_a_malformed_process_spec_never_fails_the_exec(box: Box, daemon: FakeDaemon,
                                                       text: bytes) -> None:
    spec = box.tmp / "process-bad.json"
    spec.write_bytes(text)
    argv = box.argv(str(spec))
    proc = box.run(argv, status=0)
    assert proc.returncode == 0, proc.stderr  # the handler returned: runc ran
    assert "Traceback" not in proc.stderr
    box.tool_name(argv)  # managed still, in its own cgroup
    (entry,) = box.journal_entries()
    assert entry["managed"] is True and entry["hint"] is None


def test_a_failed_handler_thaws_a_frozen_init_before_passing_through(
        box: Box, monkeypatch: pytest.MonkeyPatch) -> None:
    """main() passes through when a handler raises: not into a sandbox execgate froze."""
    from execgate.common import config as config_mod
    from execgate.oci import runc
    from execgate.runtime import main as main_mod

    (box.cg / "init" / "cgroup.freeze").write_text("1\n")  # an idle sandbox the daemon froze
    argv = box.argv(box.process_spec(["ls"], "mem=1g"))
    ran: list[list[str]] = []
    monkeypatch.setattr(config_mod, "load_cached", lambda: Config(**box.config()))
    monkeypatch.setattr(runc, "find", lambda _names: str(box.runc))
    monkeypatch.setattr(runc, "execve", lambda _path, args: ran.append(args))
    monkeypatch.setattr(sys, "argv", ["execgate", *argv])

    def bug(*_a: object, **_k: object) -> None:
        raise AttributeError("'list' object has no attribute 'get'")

    monkeypatch.setattr(exec_.placement.hint, "resolve", bug)
    main_mod.main()
    assert ran == [argv]  # passed through untouched
    assert (box.cg / "init" / "cgroup.freeze").read_text().strip() == "0"
    assert any("AttributeError" in m and "passing through" in m for m in box.warnings())
    # ... and counted where the daemon takes it (status, metrics): not only in runc's log
    from execgate.common import records

    state_dir = box.config()["state_dir"]
    assert records.take_fail_open(state_dir) == []  # set aside now, read at the next take
    (event,) = records.take_fail_open(state_dir)
    assert event["kind"] == "handler-error" and event["container"] == argv[-1]
    assert "exec: AttributeError" in event["detail"]


# -- declarations (issue 21, item 2) -------------------------------------------------------------


def test_a_declaration_never_exceeds_the_domain_or_the_host(tmp_path: Path) -> None:
    """No container limit: a declaration is cut to its domain slice's memory.max (an
    ancestor), and with none anywhere, to the host's memory."""
    from execgate.calls import hint
    from execgate.common import meminfo

    domain = tmp_path / "egbench.slice"
    box = domain / "docker-box.scope"
    box.mkdir(parents=True)
    (domain / "memory.max").write_text(f"{GiB}\n")
    (box / "memory.max").write_text("max\n")

    def declared(cg: Path, raw: str = "mem=1000000000g") -> int:
        got = hint.resolve(raw, str(cg), "box", str(tmp_path / "state"), print, None)
        assert got is not None
        return got["memory_bytes"]

    assert declared(box) == GiB
    assert declared(box, "mem=512m") == 512 * MiB  # what fits stays as declared
    (domain / "memory.max").write_text("max\n")
    assert declared(box) == meminfo.read()["MemTotal"]


def test_a_call_with_a_huge_argv_is_still_admitted(box: Box, daemon: FakeDaemon) -> None:
    """The daemon takes requests of at most 1 MiB: the admit request carries the argv's first
    64 KiB (enough to classify it), the journal all of it."""
    script = "echo " + "x" * (256 << 10)
    argv = box.argv(box.process_spec(["sh", "-c", script, *(["y" * 1000] * 1000)]))
    proc = box.run(argv, status=0)
    assert proc.returncode == 0, proc.stderr
    from execgate.daemon.server import MAX_REQUEST

    admit = daemon.requests[0]
    assert len(msgpack.packb(admit)) < MAX_REQUEST  # what execgated would refuse
    assert admit["argv"][:2] == ["sh", "-c"] and sum(map(len, admit["argv"])) <= 64 << 10
    (entry,) = box.journal_entries()
    assert entry["managed"] is True and entry["argv"][2] == script and len(entry["argv"]) == 1003


def test_a_runtime_without_exec_cgroup_runs_every_call_as_it_is(box: Box,
                                                                  daemon: FakeDaemon) -> None:
    """runc < 1.1 has no `exec --cgroup`: splicing it in would fail every exec. The runtime's
    help is read once, and the calls pass through unmanaged, with a warning (issue 21, 11)."""
    argv = box.argv(box.process_spec(["pytest"]))
    old_help = "--pid-file value   the pid file\n--process value   the process spec"
    for _ in range(2):
        proc = box.run(argv, status=0, help_text=old_help)
        assert proc.returncode == 0, proc.stderr
        assert box.runc_argv() == argv and box.tools() == [] and daemon.requests == []
    assert any("no `exec --cgroup`" in w for w in box.warnings())
    (kept,) = (box.state / "runtime-probe").iterdir()
    assert kept.read_text().split()[-1] == "0"
