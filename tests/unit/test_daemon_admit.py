"""The daemon's admit op end to end: its real socket server, handlers and engine, on a temp
domain (memory.max/memory.current files), spoken to over the socket as the runtime does.

The frames are built here with msgpack (4-byte big-endian length, one map; docs/protocol.md),
not with the daemon's own protocol module, so the wire format itself is under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from test_daemon_cgfiles import _cgroup
from test_daemon_engine import Clock, _engine

from execgate.common import protocol, records
from execgate.common.units import MiB
from execgate.daemon.engine import Engine
from execgate.daemon.main import Daemon
from execgate.daemon.server import Conn, Server

FRAME = 2.0  # seconds a test waits for a frame the daemon owes it


class Peer:
    """One client connection, framing by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, path: str) -> Peer:
        return cls(*await asyncio.open_unix_connection(path))

    async def send(self, msg: Any) -> None:
        body = msgpack.packb(msg, use_bin_type=True)
        self.writer.write(struct.pack(">I", len(body)) + body)
        await self.writer.drain()

    async def recv(self, timeout: float = FRAME) -> dict[str, Any]:
        header = await asyncio.wait_for(self.reader.readexactly(4), timeout)
        (n,) = struct.unpack(">I", header)
        body = await asyncio.wait_for(self.reader.readexactly(n), timeout)
        return msgpack.unpackb(body, raw=False)

    async def ask(self, msg: Any) -> dict[str, Any]:
        await self.send(msg)
        return await self.recv()

    async def at_eof(self) -> bool:
        """Whether the daemon ended the conversation (it closes after an admit's last frame)."""
        return await asyncio.wait_for(self.reader.read(1), FRAME) == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


class Running:
    def __init__(self, path: str, engine: Engine, clock: Clock, tmp: Path) -> None:
        self.path, self.engine, self.clock, self.tmp = path, engine, clock, tmp
        self.daemon: Daemon | None = None  # set by daemon()
        # The managed container "box", its cgroup inside the domain, as `create` records it.
        self.box = tmp / "domain" / "box"
        self.box.mkdir(exist_ok=True)
        records.save_container(engine.cfg.state_dir, {"id": "box", "sandbox": "box",
                                                      "managed": True, "cgroup": str(self.box)})

    def admit_msg(self, i: int, mem: int, **extra: Any) -> dict[str, Any]:
        """An admit request as the runtime sends it, for a call whose cgroup exists."""
        name = f"tool-{i:012x}"
        cg = self.box / name
        if not cg.exists():
            _cgroup(self.box, name, current=4096)
        return {"v": 1, "op": "admit", "call": name, "container": "box", "sandbox": "box",
                "cgroup": str(cg), "argv": ["pytest", "-q"], "hint": {"memory_bytes": mem},
                **extra}

    async def admit(self, msg: dict[str, Any]) -> tuple[Peer, dict[str, Any]]:
        """Send an admit; the open connection and the daemon's first frame."""
        peer = await Peer.connect(self.path)
        return peer, await peer.ask(msg)

    async def running(self, i: int, mem: int) -> dict[str, Any]:
        """A call admitted at once and left running; its request."""
        msg = self.admit_msg(i, mem)
        peer, _ = await self.admit(msg)
        assert (await peer.recv())["admitted"] is True
        await peer.close()
        return msg

    async def admission(self) -> dict[str, list[str]]:
        """The calls queued and running, as `execgatectl status` asks the daemon for them."""
        peer = await Peer.connect(self.path)
        try:
            answer = await peer.ask({"v": 1, "op": "status", "recent": 0})
        finally:
            await peer.close()
        view = answer["status"]["daemon"]["admission"]
        return {k: [c["call_id"] for c in view[k]] for k in ("queued", "running")}

    async def done(self, call: str) -> dict[str, Any]:
        peer = await Peer.connect(self.path)
        try:
            return await peer.ask({"v": 1, "op": "done", "call": call})
        finally:
            await peer.close()


@contextlib.asynccontextmanager
async def daemon(tmp: Path, budget: int = 1024 * MiB, used: int = 64 * MiB
                 ) -> AsyncIterator[Running]:
    """The daemon's server and control loop as `execgated` runs them (no probes, no inside
    agents: neither takes part in admission), on a temp socket."""
    engine, clock, _journal = _engine(tmp, budget=budget, used=used)
    d = Daemon(engine.cfg, engine)
    server = Server(str(tmp / "run" / "execgated.sock"), d.handlers, allowed_uids={os.getuid()})
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.create_task(d.control_loop(stop))
    running = Running(server.path, engine, clock, tmp)
    running.daemon = d
    try:
        yield running
    finally:
        stop.set()
        engine.wake.set()
        await asyncio.wait_for(loop, FRAME)
        await server.close()
        engine.store.close()
        engine.files.close()  # the descriptors kept on the calls' and the domain's files
        engine.domain.files.close()


def test_a_call_that_fits_is_admitted_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            msg = d.admit_msg(1, 100 * MiB)
            peer, first = await d.admit(msg)
            assert first["v"] == 1 and first["ok"] is True and first["queued"] is True
            assert first["peak"] == 100 * MiB and first["max_wait_s"] > 0
            second = await peer.recv()
            assert second["v"] == 1 and second["ok"] is True and second["admitted"] is True
            assert second["waited_s"] == 0.0 and second["forced"] is False
            assert await peer.at_eof()
            await peer.close()
            assert await d.admission() == {"queued": [], "running": [msg["call"]]}
            answer = await d.done(msg["call"])
            assert answer["ok"] is True and answer["v"] == 1
            assert await d.admission() == {"queued": [], "running": []}

    asyncio.run(scenario())


def test_a_call_that_does_not_fit_waits_until_a_done_frees_room(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with daemon(tmp_path, budget=1024 * MiB, used=64 * MiB) as d:
            big = await d.running(1, 600 * MiB)

            waiting = d.admit_msg(2, 600 * MiB)
            peer, queued = await d.admit(waiting)
            assert queued["ok"] is True and queued["queued"] is True
            with pytest.raises(TimeoutError):  # 1.2 GiB cannot run in 1 GiB: no answer yet
                await peer.recv(timeout=0.5)
            assert await d.admission() == {"queued": [waiting["call"]], "running": [big["call"]]}

            d.clock.t += 5.0
            assert (await d.done(big["call"]))["ok"] is True
            admitted = await peer.recv()
            assert admitted["ok"] is True and admitted["admitted"] is True
            assert admitted["waited_s"] == 5.0 and admitted["forced"] is False
            assert await peer.at_eof()
            await peer.close()
            assert await d.admission() == {"queued": [], "running": [waiting["call"]]}

    asyncio.run(scenario())


def test_an_overdue_call_is_never_forced_beside_a_running_one_and_hears_why(
        tmp_path: Path) -> None:
    """Past max_wait_s the second call is first in line, not forced into the full domain; a
    runtime that asked (progress_s) gets a `waiting` frame with the reason every period."""
    async def scenario() -> None:
        async with daemon(tmp_path, budget=1024 * MiB, used=64 * MiB) as d:
            big = await d.running(1, 600 * MiB)

            peer, queued = await d.admit(d.admit_msg(2, 600 * MiB, progress_s=0.2))
            assert queued["progress_s"] == 1.0  # clamped to [1, 60] s
            assert queued["max_queued_s"] == d.engine.settings.admission.max_queued_s
            frame = await peer.recv()
            assert frame["ok"] is True and frame["waiting"] is True
            d.clock.t += 31.0  # past max_wait_s (30 s)
            for _ in range(2):
                frame = await peer.recv()
                assert frame.get("waiting") is True, frame  # never forced in
            assert frame["waited_s"] == 31.0
            assert frame["reason"].startswith("first in line, needs ")
            assert (await d.done(big["call"]))["ok"] is True
            admitted = await peer.recv()
            assert admitted["admitted"] is True and admitted["forced"] is True
            assert admitted["overheld"] is False and "fits headroom" in admitted["reason"]
            await peer.close()

    asyncio.run(scenario())


def test_a_runtime_that_hangs_up_while_waiting_is_cancelled(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with daemon(tmp_path, budget=512 * MiB, used=500 * MiB) as d:  # no room at all
            msg = d.admit_msg(1, 100 * MiB)
            peer, queued = await d.admit(msg)
            assert queued["queued"] is True
            assert await d.admission() == {"queued": [msg["call"]], "running": []}
            await peer.close()
            for _ in range(100):
                if await d.admission() == {"queued": [], "running": []}:
                    break
                await asyncio.sleep(0.01)
            assert await d.admission() == {"queued": [], "running": []}

    asyncio.run(scenario())


def test_bad_requests_get_a_clear_error_and_the_daemon_keeps_serving(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            good = d.admit_msg(1, 100 * MiB)
            peer = await Peer.connect(d.path)
            for key, bad in (("call", None), ("call", 5), ("sandbox", ""), ("cgroup", ["x"])):
                msg = {k: v for k, v in good.items() if k != key}
                if bad is not None:
                    msg[key] = bad
                answer = await peer.ask(msg)
                assert answer == {"v": 1, "ok": False, "error": f"admit needs a string {key!r}"}
            for key, bad in (("hint", "mem=1g"), ("argv", 5)):  # these fail in the engine
                answer = await peer.ask({**good, key: bad})
                assert answer["v"] == 1 and answer["ok"] is False and answer["error"]
            answer = await peer.ask({"v": 1, "op": "frobnicate"})
            assert answer["ok"] is False and answer["error"] == "unknown op 'frobnicate'"
            answer = await peer.ask({"v": 1, "op": "done", "call": 7})
            assert answer["ok"] is False and "'call'" in answer["error"]
            # Nothing of those reached the engine, and the same connection still serves.
            assert await d.admission() == {"queued": [], "running": []}
            assert (await peer.ask({"v": 1, "op": "ping"}))["pid"] == os.getpid()

            # A second admit of a call already admitted is refused, the first one kept.
            admitted, _ = await d.admit(good)
            assert (await admitted.recv())["admitted"] is True
            again = await peer.ask(good)
            assert again["ok"] is False and "already submitted" in again["error"]
            assert await d.admission() == {"queued": [], "running": [good["call"]]}
            await admitted.close()

            # A frame that is no map ends that client only, with a clear error.
            await peer.send(["not", "a", "map"])
            answer = await peer.recv()
            assert answer["ok"] is False and answer["error"] == "a frame must hold a map"
            assert await peer.at_eof()
            await peer.close()
            other = await Peer.connect(d.path)
            assert (await other.ask({"v": 1, "op": "ping"}))["ok"] is True
            await other.close()

    asyncio.run(scenario())


def test_the_protocol_version_is_checked_before_the_op_runs(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            peer = await Peer.connect(d.path)
            for version in (2, None, "1"):
                msg = d.admit_msg(1, 100 * MiB)
                if version is None:
                    del msg["v"]
                else:
                    msg["v"] = version
                answer = await peer.ask(msg)
                assert answer["v"] == 1 and answer["ok"] is False
                assert "unsupported protocol version" in answer["error"]
                assert "v1" in answer["error"]
            assert await d.admission() == {"queued": [], "running": []}
            first = await peer.ask(d.admit_msg(1, 100 * MiB))
            assert first["ok"] is True and first["queued"] is True
            await peer.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(("key", "bad"), [
    ("container", 5), ("argv", "pytest -q"), ("argv", 5), ("hint", "mem=1g"),
    ("hint", {"memory_bytes": True}), ("progress_s", "10"),
], ids=["container-int", "argv-str", "argv-int", "hint-str", "hint-bool-bytes", "progress-str"])
def test_a_wrongly_typed_field_is_refused_by_name(tmp_path: Path, key: str, bad: Any) -> None:
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            peer, answer = await d.admit({**d.admit_msg(1, 100 * MiB), key: bad})
            await peer.close()
            assert answer["ok"] is False and repr(key) in answer["error"]
            assert await d.admission() == {"queued": [], "running": []}

    asyncio.run(scenario())


# -- a hostile peer (issue 21, item 6) -----------------------------------------------------------


@contextlib.asynccontextmanager
async def bare_server(tmp: Path, **limits: Any) -> AsyncIterator[str]:
    """The socket server alone, with a ping handler and the given limits; its path."""
    async def ping(msg: dict[str, Any], conn: Any) -> dict[str, Any]:
        return {"v": 1, "ok": True}

    server = Server(str(tmp / "s.sock"), {"ping": ping}, allowed_uids={os.getuid()}, **limits)
    await server.start()
    try:
        yield server.path
    finally:
        await server.close()


def test_an_idle_or_trickling_connection_is_closed_not_kept(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with bare_server(tmp_path, frame_timeout_s=0.3) as path:
            idle = await Peer.connect(path)
            assert await idle.at_eof()  # nothing sent: closed after 0.3 s, not kept
            await idle.close()

            trickle = await Peer.connect(path)
            body = msgpack.packb({"v": 1, "op": "ping"})
            frame = struct.pack(">I", len(body)) + body
            t0 = asyncio.get_running_loop().time()

            async def drip() -> None:  # one byte every 50 ms: each read is quick, the frame not
                with contextlib.suppress(ConnectionError):
                    for byte in frame:
                        trickle.writer.write(bytes([byte]))
                        await trickle.writer.drain()
                        await asyncio.sleep(0.05)

            dripping = asyncio.ensure_future(drip())
            got = b""
            with contextlib.suppress(ConnectionError):
                got = await asyncio.wait_for(trickle.reader.read(), FRAME)
            took = asyncio.get_running_loop().time() - t0
            dripping.cancel()
            assert got == b"" and took < 0.05 * len(frame)  # closed at 0.3 s, never answered
            with contextlib.suppress(ConnectionError):
                await trickle.close()

            quick = await Peer.connect(path)  # and a peer that speaks serves as ever
            assert (await quick.ask({"v": 1, "op": "ping"}))["ok"] is True
            await quick.close()

    asyncio.run(scenario())


def test_a_peer_that_hung_up_mid_conversation_is_a_drop_not_a_daemon_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Under load a front gives up on the daemon's first frame (daemon_timeout_ms) and goes to
    Python: the handler's next send fails. The journal said `ERROR op exec failed` with a
    traceback each time (VM, 15x), as for a bug of ours; it is a warning, once."""
    async def gone(msg: dict[str, Any], conn: Any) -> dict[str, Any] | None:
        raise ConnectionResetError("Connection lost")

    async def scenario() -> None:
        server = Server(str(tmp_path / "s.sock"), {"gone": gone}, allowed_uids={os.getuid()})
        await server.start()
        try:
            peer = await Peer.connect(server.path)
            peer.writer.write(protocol.encode({"v": 1, "op": "gone"}))
            await peer.writer.drain()
            assert await peer.at_eof()
            await peer.close()
        finally:
            await server.close()

    with caplog.at_level("INFO", logger="execgated"):
        asyncio.run(scenario())
    assert [r.levelname for r in caplog.records] == ["WARNING"], caplog.text
    assert "client dropped" in caplog.text and "Traceback" not in caplog.text


@pytest.mark.parametrize(("frame", "error"), [
    (struct.pack(">I", 16 << 20) + b"\x00" * 8192, f"request of {16 << 20} bytes exceeds 4096"),
    (struct.pack(">I", 4) + b"\x81\x91\x01\x02",  # {[1]: 2}: no dict holds it
     "undecodable frame: a map key must be a string or number (unhashable type: 'list')"),
], ids=["larger than the cap", "a list for a key"])
def test_a_frame_the_daemon_will_not_read_gets_a_clear_error(tmp_path: Path, frame: bytes,
                                                            error: str) -> None:
    """A request over the cap is refused from its header, before its body is buffered."""
    async def scenario() -> None:
        async with bare_server(tmp_path, max_request=4096) as path:
            peer = await Peer.connect(path)
            peer.writer.write(frame)
            await peer.writer.drain()
            answer = await peer.recv()
            assert answer == {"v": 1, "ok": False, "error": error}
            assert await peer.at_eof()
            await peer.close()

    asyncio.run(scenario())


def test_a_bad_field_read_after_submit_leaks_no_charge(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            peer, answer = await d.admit(d.admit_msg(1, 100 * MiB, progress_s=float("nan")))
            assert answer["ok"] is False and "'progress_s'" in answer["error"]
            await peer.close()
            await asyncio.sleep(0.05)
            assert await d.admission() == {"queued": [], "running": []}

    asyncio.run(scenario())


def test_a_runtime_gone_before_it_hears_admitted_leaks_no_charge(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever ends an admit before `admitted` reached the runtime ends its call."""
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            sent = 0
            real = Conn.send

            async def send(self: Conn, msg: dict[str, Any]) -> None:
                nonlocal sent
                sent += 1
                if msg.get("admitted"):
                    raise BrokenPipeError("runtime gone")
                await real(self, msg)

            monkeypatch.setattr(Conn, "send", send)
            peer, first = await d.admit(d.admit_msg(1, 100 * MiB))
            assert first["queued"] is True
            assert await peer.at_eof()
            await peer.close()
            assert sent == 2
            assert await d.admission() == {"queued": [], "running": []}

    asyncio.run(scenario())


@pytest.mark.parametrize("case", ["host cgroup", "no container", "unknown container",
                                  "unmanaged container", "another container", "not a tool",
                                  "dot-dot", "outside the domain"])
def test_an_admit_for_a_cgroup_the_daemon_does_not_manage_is_refused(
        tmp_path: Path, case: str) -> None:
    """The daemon may later freeze or cgroup.kill an admitted call's cgroup: only a tool
    cgroup of a managed container inside the domain is taken."""
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            state = d.engine.cfg.state_dir
            records.save_container(state, {"id": "plain", "managed": False,
                                           "cgroup": str(tmp_path / "domain" / "plain")})
            records.save_container(state, {"id": "other", "managed": True,
                                           "cgroup": str(tmp_path / "domain" / "other")})
            records.save_container(state, {"id": "far", "managed": True,
                                           "cgroup": str(tmp_path / "elsewhere")})
            msg = d.admit_msg(1, 100 * MiB)
            name = msg["call"]
            msg.update({
                "host cgroup": {"cgroup": "/sys/fs/cgroup/system.slice"},
                "no container": {"container": ""},
                "unknown container": {"container": "nope"},
                "unmanaged container": {"container": "plain",
                                        "cgroup": str(tmp_path / "domain" / "plain" / name)},
                "another container": {"cgroup": str(tmp_path / "domain" / "other" / name)},
                "not a tool": {"cgroup": str(d.box / "init")},
                "dot-dot": {"cgroup": str(d.box / name / ".." / ".." / "other" / name)},
                "outside the domain": {"container": "far",
                                       "cgroup": str(tmp_path / "elsewhere" / name)},
            }[case])
            peer, answer = await d.admit(msg)
            await peer.close()
            assert answer["ok"] is False, answer
            key = "'container'" if "container" in case and case != "another container" \
                else "'cgroup'"
            assert key in answer["error"], answer["error"]
            assert await d.admission() == {"queued": [], "running": []}

    asyncio.run(scenario())


def test_a_root_peer_inside_a_sandbox_is_refused(tmp_path: Path) -> None:
    """A container that shares /run reaches the socket as uid 0: the daemon asks where the
    peer runs (SO_PEERCRED's pid) and refuses it by name; the server goes on serving."""
    async def scenario() -> None:
        asked: list[int] = []

        def refuse(pid: int) -> str | None:
            asked.append(pid)
            return "the peer runs inside sandbox 'box'" if len(asked) == 1 else None

        async with bare_server(tmp_path, refuse_peer=refuse) as path:
            peer = await Peer.connect(path)
            answer = await peer.recv()
            assert answer == {"v": 1, "ok": False,
                              "error": "permission denied: the peer runs inside sandbox 'box'"}
            assert await peer.at_eof()
            await peer.close()
            other = await Peer.connect(path)
            assert (await other.ask({"v": 1, "op": "ping"}))["ok"] is True
            await other.close()
            assert asked == [os.getpid(), os.getpid()]

    asyncio.run(scenario())


@pytest.mark.parametrize(("where", "refused"), [
    ("domain/box/init", "box"), ("domain/box/init/agent/sub", "box"),
    ("domain/box/tool-0123456789ab", "box"), ("system.slice/containerd.service", None),
    ("domain/box", None), ("domain/plain/init", None), ("init.scope", None), (None, None),
])
def test_where_a_peer_runs_decides_whether_it_is_refused(
        tmp_path: Path, where: str | None, refused: str | None) -> None:
    """Only a process in a managed container's init/ or tool-*/ is refused; a peer whose
    cgroup cannot be read (gone, no cgroup v2) is served: the runtime is never blocked."""
    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            records.save_container(d.engine.cfg.state_dir, {
                "id": "plain", "managed": False, "cgroup": str(tmp_path / "domain" / "plain")})
            dmn = Daemon(d.engine.cfg, d.engine)

            def cgroup_of(pid: int) -> str:
                if where is None:
                    raise LookupError(f"pid {pid} has no cgroup v2 membership")
                return str(tmp_path / where)

            why = dmn.refuse_peer(1234, cgroup_of)
            assert why == (None if refused is None else f"the peer runs inside sandbox '{refused}'")

    asyncio.run(scenario())
