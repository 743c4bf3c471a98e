"""The daemon's lifecycle op (daemon/lifecycle_op.py): a managed container's start, kill and
delete for the compiled front, over the real socket server on a temp cgroupfs, spoken to as
the front speaks (test_daemon_admit's Peer): what it does before runc, how runc is to run, and
what it does once the front says how runc ended."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from test_daemon_admit import Peer, daemon

from execgate.common import records
from execgate.common.config import DEFAULT_PATH


def _op(*argv: str) -> dict[str, Any]:
    return {"v": 1, "op": "lifecycle", "config": DEFAULT_PATH, "argv": ["--root", "/r", *argv]}


def _layout(box: Path, frozen: str = "0") -> None:
    """A container cgroup as the fake cgroupfs has it: init/ and one tool cgroup frozen."""
    for cg in (box, box / "init", box / "tool-00000000000a"):
        cg.mkdir(exist_ok=True)
        (cg / "cgroup.freeze").write_text(frozen + "\n")
        (cg / "cgroup.events").write_text(f"populated 0\nfrozen {frozen}\n")
        (cg / "cgroup.procs").write_text("")
    (box / "cgroup.controllers").write_text("memory\n")
    (box / "cgroup.subtree_control").write_text("")


def test_kill_thaws_what_execgate_froze_then_runc_runs(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            _layout(d.box, frozen="1")
            (d.box / "cgroup.freeze").write_text("1\n")  # docker pause: left alone
            peer = await Peer.connect(d.path)
            answer = await peer.ask(_op("kill", "box", "TERM"))
            assert answer["ok"] is True and answer["run"] == "exec"
            assert (d.box / "init" / "cgroup.freeze").read_text().strip() == "0"
            assert (d.box / "tool-00000000000a" / "cgroup.freeze").read_text().strip() == "0"
            assert (d.box / "cgroup.freeze").read_text().strip() == "1"
            await peer.close()

    asyncio.run(scenario())


def test_delete_cleans_up_only_once_runc_has_deleted(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            _layout(d.box)
            state = d.engine.cfg.state_dir
            for status, kept in ((1, True), (0, False)):
                peer = await Peer.connect(d.path)
                assert (await peer.ask(_op("delete", "box")))["run"] == "child"
                assert (await peer.ask({"v": 1, "status": status}))["ok"] is True
                await peer.close()
                assert (records.load_container(state, "box") is not None) == kept, status

    asyncio.run(scenario())


def test_start_prepares_the_layout_after_runc_started(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            _layout(d.box)
            (d.box / "cgroup.events").write_text("populated 1\nfrozen 1\n")  # settles at once
            state = d.engine.cfg.state_dir
            rec = records.load_container(state, "box")
            assert rec is not None
            records.save_container(state, {**rec, "prepared": False})
            peer = await Peer.connect(d.path)
            assert (await peer.ask(_op("start", "box")))["run"] == "child"
            assert (await peer.ask({"v": 1, "status": 0}))["ok"] is True
            await peer.close()
            rec = records.load_container(state, "box")
            assert rec is not None and rec["prepared"] is True, rec
            assert (d.box / "cgroup.freeze").read_text().strip() == "0"  # thawed after

    asyncio.run(scenario())


def test_a_front_gone_before_runc_ended_changes_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            _layout(d.box)
            peer = await Peer.connect(d.path)
            assert (await peer.ask(_op("delete", "box")))["run"] == "child"
            await peer.close()
            await asyncio.sleep(0.2)
            assert records.load_container(d.engine.cfg.state_dir, "box") is not None

    asyncio.run(scenario())


def test_what_is_not_a_lifecycle_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            for msg in (_op("create", "box"), _op("kill"), {**_op("kill", "box"),
                                                           "config": "/other.toml"},
                        {"v": 1, "op": "lifecycle", "argv": "kill box"}):
                peer = await Peer.connect(d.path)
                answer = await peer.ask(msg)
                assert answer["ok"] is False and answer["error"], msg
                await peer.close()

    asyncio.run(scenario())


def _bundle(tmp: Path) -> Path:
    b = tmp / "bundle"
    b.mkdir()
    (b / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "hostname": "agent-1", "process": {"args": ["/bin/agent"]},
        "annotations": {"execgate.image": "agents:1"}, "linux": {}}))
    return b


def test_create_is_admitted_then_recorded_once_runc_created_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from execgate.cgroups import v2

    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            monkeypatch.setattr(v2, "is_unified", lambda: True)
            monkeypatch.setattr(v2, "path_of_pid", lambda _pid: str(d.box))
            bundle, pid_file = _bundle(tmp_path), tmp_path / "init.pid"
            pid_file.write_text("4242")
            state = d.engine.cfg.state_dir
            for cid, status in (("failed", 1), ("new", 0)):
                peer = await Peer.connect(d.path)
                first = await peer.ask(_op("create", "--bundle", str(bundle), "--pid-file",
                                           str(pid_file), cid))
                assert first["ok"] is True and first["queued"] is True, first
                assert (await peer.recv())["run"] == "child"
                assert (await peer.ask({"v": 1, "status": status}))["ok"] is True
                await peer.close()
                # A failed create holds no place among the creates under way.
                sa = d.engine.snapshot()["sandbox_admission"]
                assert (sa["launching"], sa["create_failed"]) == (status == 0, 1), sa
            assert records.load_container(state, "failed") is None
            rec = records.load_container(state, "new")
            assert rec is not None and rec["managed"] is True and rec["init_pid"] == 4242
            assert rec["cgroup"] == str(d.box) and rec["image"] == "agents:1"
            assert rec["start"]["verdict"] == "admitted" and rec["start"]["admitted"] is True

    asyncio.run(scenario())


def test_a_create_whose_bundle_is_relative_is_left_to_the_runtime(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            peer = await Peer.connect(d.path)
            answer = await peer.ask(_op("create", "--bundle", "rel", "new"))
            assert answer["ok"] is False and "relative" in answer["error"]
            await peer.close()

    asyncio.run(scenario())


def test_the_next_frame_is_read_once_the_hangup_watch_is_stopped() -> None:
    """A create's admission watches for a hangup (conn.closed()) and then reads the front's
    status frame: a watch only cancelled still held the reader ("readexactly() called while
    another coroutine is already waiting"), and the create went unrecorded."""
    import socket
    import struct

    import msgpack

    from execgate.daemon.server import Conn, stop_watching

    async def scenario() -> None:
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=ours)
        conn = Conn(reader, writer)
        hangup = asyncio.ensure_future(conn.closed())
        await asyncio.sleep(0)  # the watch is reading
        await stop_watching(hangup)
        body = msgpack.packb({"v": 1, "status": 0})
        theirs.sendall(struct.pack(">I", len(body)) + body)
        assert await conn.recv() == {"v": 1, "status": 0}  # inline, as wait_for is on 3.12+
        writer.close()
        theirs.close()

    asyncio.run(scenario())


def test_each_op_says_where_its_time_went(tmp_path: Path) -> None:
    """runc's time (the front's child, from `run` to its status) apart from the daemon's: under
    load a start took 2.4-2.9x plain runc's with admission waits ~0.2 s (VM, 15x), and
    nothing said which side took it. An op the front gave up on says nothing."""
    from execgate.daemon.metrics import Metrics

    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            _layout(d.box)
            events = d.engine.events.subscribe()
            peer = await Peer.connect(d.path)
            assert (await peer.ask(_op("delete", "box")))["run"] == "child"
            await asyncio.sleep(0.3)  # runc runs
            assert (await peer.ask({"v": 1, "status": 0}))["ok"] is True
            await peer.close()
            gone = await Peer.connect(d.path)  # hangs up before runc's status: no timing
            assert (await gone.ask(_op("delete", "box")))["run"] == "child"
            await gone.close()
            await asyncio.sleep(0.2)
            timed = []
            while not events.empty():
                e = events.get_nowait()
                if e["event"] == "lifecycle":
                    timed.append(e)
            assert [(e["op"], e["container"]) for e in timed] == [("delete", "box")]
            assert timed[0]["runc_s"] >= 0.3 > timed[0]["daemon_s"] and timed[0]["waited_s"] == 0
            m = Metrics(d.engine)
            m.observe(timed[0])
            text = m.render().encode()[0].decode()
            assert (f'execgate_lifecycle_seconds_total{{op="delete",part="runc"}} '
                    f'{timed[0]["runc_s"]}') in text, text

    asyncio.run(scenario())
