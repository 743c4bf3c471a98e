"""The daemon's exec op (daemon/exec_op.py): a managed call placed and followed with no runtime
Python, over the real socket server and engine on a temp domain (test_daemon_admit's).

The peer is a process of its own, as the compiled front is: the daemon takes its pidfd and its
stderr (pidfd_getfd). Here it prints the argv it was answered and exits, as runc would once a
`--detach` call has started; the call's cgroup (a temp dir: nothing runs in it) is then empty.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from test_daemon_admit import daemon

from execgate.common.config import DEFAULT_PATH
from execgate.common.units import MiB

PEER = r"""
import json, socket, struct, sys
import msgpack
path, request = sys.argv[1], json.loads(sys.argv[2])
s = socket.socket(socket.AF_UNIX)
s.connect(path)
body = msgpack.packb(request, use_bin_type=True)
s.sendall(struct.pack(">I", len(body)) + body)
frames = []
while True:
    head = b""
    while len(head) < 4:
        chunk = s.recv(4 - len(head))
        if not chunk:
            break
        head += chunk
    if len(head) < 4:
        break
    (n,) = struct.unpack(">I", head)
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    frame = msgpack.unpackb(body, raw=False)
    frames.append(frame)
    if frame.get("say"):
        sys.stderr.write(frame["say"])
    if "argv" in frame or not frame.get("ok"):
        break
print(json.dumps(frames))
"""


def _spec(tmp: Path, args: list[str], env: list[str], terminal: bool = False) -> str:
    path = tmp / "process.json"
    path.write_text(json.dumps({"args": args, "env": env, "terminal": terminal, "cwd": "/"}))
    return str(path)


async def _peer(path: str, request: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    p = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PEER, path, json.dumps(request),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(p.communicate(), 10)
    assert p.returncode == 0, err.decode()
    return json.loads(out), err.decode()


def _exec(argv_tail: list[str], config: str = DEFAULT_PATH) -> dict[str, Any]:
    return {"v": 1, "op": "exec", "config": config,
            "argv": ["--root", "/run/x", "exec", *argv_tail]}


async def _until(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_a_managed_call_is_placed_admitted_and_followed_to_its_journal_line(
        tmp_path: Path) -> None:
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            (d.box / "init").mkdir()
            spec = _spec(tmp_path, ["pytest", "-q"], ["AGENT_RESOURCE_HINT=mem=100m"])
            frames, err = await _peer(d.path, _exec(
                ["--detach", "--process", spec, "--pid-file", str(tmp_path / "pid"), "box"]))
            ack, queued, final = frames  # ack: at once, before the spec is read
            assert ack["queued"] is True and ack["progress_s"] == 10.0 and ack["max_wait_s"] > 0
            assert queued["queued"] is True and queued["peak"] == 100 * MiB
            assert final["ok"] is True and final["admitted"] is True
            i = final["argv"].index("--cgroup")
            name = final["argv"][i + 1]
            assert final["argv"][:3] == ["--root", "/run/x", "exec"]
            assert final["argv"][-1] == "box" and name.startswith("tool-")
            # The peer has exited (runc gone, nothing in the cgroup): the follower ends the
            # call, journals it and removes its cgroup.
            journal = Path(d.engine.cfg.journal)
            await _until(lambda: journal.exists() and name in journal.read_text())
            (entry,) = [json.loads(line) for line in journal.read_text().splitlines()]
            assert entry["call"] == name and entry["argv"] == ["pytest", "-q"]
            assert entry["managed"] is True
            await _until(lambda: not (d.box / name).exists())
            assert await d.admission() == {"queued": [], "running": []}
            assert d.engine.calls == {}
            assert err == ""

    asyncio.run(scenario())


def test_what_the_daemon_does_not_place_is_refused_or_passed_back(tmp_path: Path) -> None:
    """A TTY call and another config go back to the runtime (an error: the front starts
    Python); an unmanaged container's exec is answered unchanged."""
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            (d.box / "init").mkdir()
            tty = _spec(tmp_path, ["sh"], [], terminal=True)
            (_ack, frame), _ = await _peer(d.path, _exec(["--detach", "--process", tty, "box"]))
            assert frame["ok"] is False and "TTY" in frame["error"]
            (frame,), _ = await _peer(d.path, _exec(["box", "true"], config="/etc/other.toml"))
            assert frame["ok"] is False and "config" in frame["error"]
            argv = ["--detach", "--process", tty, "not-ours"]
            (_ack, frame), _ = await _peer(d.path, _exec(argv))
            assert frame["ok"] is True and frame["argv"] == _exec(argv)["argv"]
            (frame,), _ = await _peer(d.path, {"v": 1, "op": "exec", "argv": "exec box"})
            assert frame["ok"] is False and "argv" in frame["error"]
            assert d.engine.calls == {} and not [p for p in d.box.iterdir()
                                                 if p.name.startswith("tool-")]

    asyncio.run(scenario())


def test_a_bad_hint_is_told_on_the_calls_stderr_by_the_front(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            (d.box / "init").mkdir()
            spec = _spec(tmp_path, ["make"], ["AGENT_RESOURCE_HINT=mem=lots"])
            frames, err = await _peer(d.path, _exec(["--detach", "--process", spec, "box"]))
            assert frames[-1]["ok"] is True and "--cgroup" in frames[-1]["argv"]
            assert "[execgate]" in err and "lots" in err

    asyncio.run(scenario())


def test_a_peer_gone_before_its_answer_leaves_no_charge_and_no_cgroup(tmp_path: Path) -> None:
    """A call that waits for room, whose front dies: nothing placed, nothing charged."""
    async def scenario() -> None:
        async with daemon(tmp_path, budget=256 * MiB, used=64 * MiB) as d:
            (d.box / "init").mkdir()
            await d.running(1, 150 * MiB)  # holds most of the room
            spec = _spec(tmp_path, ["pytest"], ["AGENT_RESOURCE_HINT=mem=150m"])
            p = await asyncio.create_subprocess_exec(
                sys.executable, "-c", PEER, d.path,
                json.dumps(_exec(["--detach", "--process", spec, "box"])),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            for _ in range(100):
                if len((await d.admission())["queued"]) == 1:
                    break
                await asyncio.sleep(0.05)
            assert len((await d.admission())["queued"]) == 1
            p.kill()
            await p.wait()
            for _ in range(100):
                if not (await d.admission())["queued"]:
                    break
                await asyncio.sleep(0.05)
            assert await d.admission() == {"queued": [], "running": ["tool-000000000001"]}
            assert not [x for x in d.box.iterdir() if x.name.startswith("tool-")
                        and x.name != "tool-000000000001"]

    asyncio.run(scenario())



def _marked(tool: Path, argv: list[str], **extra: Any) -> None:
    """A tool cgroup as a daemon that placed a call in it left it: made, marked."""
    import pytest

    from execgate.calls import mark
    from execgate.calls.record import ToolCall

    tool.mkdir()
    call = ToolCall(tool.name, "box", "box", str(tool), argv)
    call.admitted(True, 0.5)
    call.start = 100.0
    try:
        os.setxattr(tool, mark.PLACED, json.dumps({**call.journal(), **extra}).encode())
    except OSError as e:
        pytest.skip(f"no trusted xattrs here: {e}")


def _rmdir_fakes(monkeypatch: Any) -> None:
    """rmdir as on cgroupfs, where a cgroup's files go with it: a fake's are deleted first."""
    from execgate.cgroups import v2

    real = v2.remove

    def remove(cg: str, attempts: int = 20) -> bool:
        for f in Path(cg).glob("*"):
            f.unlink()
        return real(cg, attempts)

    monkeypatch.setattr(v2, "remove", remove)


def _lines(d: Any) -> list[dict[str, Any]]:
    journal = Path(d.engine.cfg.journal)
    return [json.loads(x) for x in journal.read_text().splitlines()] if journal.exists() else []


def test_a_restarted_daemon_follows_the_calls_it_placed_to_their_journal_lines(
        tmp_path: Path) -> None:
    """The follower dies with its daemon; the call's mark (its journal form, on its cgroup)
    lets the next daemon end it: the journal line written, the cgroup removed."""
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            tool = d.box / "tool-00000000abcd"
            _marked(tool, ["make", "-j8"])
            (d.box / "tool-00000000beef").mkdir()  # not ours (no mark): left alone
            assert d.daemon is not None and d.daemon.exec.recover() == 1
            await _until(lambda: _lines(d) != [])
            (entry,) = _lines(d)
            assert entry["argv"] == ["make", "-j8"] and entry["start"] == 100.0
            await _until(lambda: not tool.exists())
            assert (d.box / "tool-00000000beef").exists()

    asyncio.run(scenario())


PEER_READS_MARK = PEER.replace("print(json.dumps(frames))", """\
import os
tool = os.path.join(sys.argv[3], frames[-1]["argv"][frames[-1]["argv"].index("--cgroup") + 1])
print(json.dumps([frames, json.loads(os.getxattr(tool, "trusted.execgate.placed"))]))""")


def test_a_call_is_marked_before_its_front_hears_and_marked_done_once_journaled(
        tmp_path: Path, monkeypatch: Any) -> None:
    """No instant at which a killed daemon loses a call or journals it twice: the front reads
    the call's mark (with its own pid, for a successor to wait on) when it gets the argv, and
    the journal line is in, the mark `done`, when the cgroup is removed."""
    from execgate.calls import mark
    from execgate.cgroups import v2

    removing: list[tuple[bool, bytes | None]] = []
    real_remove = v2.remove

    def remove(cg: str, attempts: int = 20) -> bool:
        journal = Path(cfg_journal[0])
        removing.append((journal.exists() and os.path.basename(cg) in journal.read_text(),
                         mark.get(cg, mark.PLACED)))
        return real_remove(cg, attempts)

    cfg_journal: list[str] = []
    monkeypatch.setattr(v2, "remove", remove)

    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            (d.box / "init").mkdir()
            cfg_journal.append(d.engine.cfg.journal)
            spec = _spec(tmp_path, ["pytest"], [])
            p = await asyncio.create_subprocess_exec(
                sys.executable, "-c", PEER_READS_MARK, d.path,
                json.dumps(_exec(["--detach", "--process", spec, "box"])), str(d.box),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(p.communicate(), 10)
            if b"OSError" in err and b"getxattr" in err:
                import pytest
                pytest.skip("no trusted xattrs here")
            assert p.returncode == 0, err.decode()
            frames, placed = json.loads(out)
            name = frames[-1]["argv"][frames[-1]["argv"].index("--cgroup") + 1]
            assert placed["call"] == name and placed["argv"] == ["pytest"]
            assert placed["runtime"]["pid"] == p.pid and placed["runtime"]["started_ns"] > 0
            await _until(lambda: not (d.box / name).exists())
            assert removing == [(True, mark.DONE)]
            (entry,) = _lines(d)
            assert "runtime" not in entry  # the mark's, not the journal's

    asyncio.run(scenario())


def test_a_restarted_daemon_removes_what_no_call_left_to_journal(
        tmp_path: Path, monkeypatch: Any) -> None:
    """A cgroup marked done (its line is in), and one no call ever ran in whose front is gone
    (it fell back to Python, which placed the call elsewhere): removed, no line. A call that
    ran and ended while no daemon was up: its line."""
    _rmdir_fakes(monkeypatch)

    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            _marked(d.box / "tool-000000000001", ["ended"])
            (d.box / "tool-000000000001" / "cpu.stat").write_text("usage_usec 500\n")
            _marked(d.box / "tool-000000000002", ["never"],
                    runtime={"pid": os.getpid(), "started_ns": 1})  # not this process's start
            (d.box / "tool-000000000002" / "cpu.stat").write_text("usage_usec 0\n")
            (d.box / "tool-000000000003").mkdir()
            os.setxattr(d.box / "tool-000000000003", "trusted.execgate.placed", b"done")
            assert d.daemon is not None
            d.daemon.exec.recover()
            await _until(lambda: not [t for t in d.box.iterdir() if t.name.startswith("tool-")])
            assert [e["argv"] for e in _lines(d)] == [["ended"]]

    asyncio.run(scenario())


def test_a_restarted_daemon_waits_for_the_runc_that_may_still_run_a_marked_call(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Killed right after answering the front: the call's cgroup is marked, nothing has run in
    it yet, and runc is on its way. The next daemon waits for that runc (the pid on the mark)
    rather than remove the cgroup from under it, then follows the call to its line."""
    from execgate.daemon.inside.procfs import started_ns

    _rmdir_fakes(monkeypatch)

    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            runc = await asyncio.create_subprocess_exec("sleep", "1")
            tool = d.box / "tool-000000000004"
            _marked(tool, ["late"], runtime={"pid": runc.pid, "started_ns": started_ns(runc.pid)})
            (tool / "cpu.stat").write_text("usage_usec 0\n")
            assert d.daemon is not None
            d.daemon.exec.recover()
            await asyncio.sleep(0.3)
            assert tool.exists() and _lines(d) == []  # runc has not gone: waited for
            (tool / "cpu.stat").write_text("usage_usec 800\n")  # the call ran
            await runc.wait()
            await _until(lambda: _lines(d) != [])
            assert [e["argv"] for e in _lines(d)] == [["late"]]
            await _until(lambda: not tool.exists())

    asyncio.run(scenario())
