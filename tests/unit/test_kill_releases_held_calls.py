"""`kill` of a container whose call the growth gate holds: the call is released at once and
held no more while the container stops (issue 21, item 10: SIGTERM sat up to the 20 s hold
cap). The daemon's side over a fake cgroupfs (cgroup.freeze as the actuator); the runtime's
against a socket that records what it is sent."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import msgpack
from test_daemon_growth import Call, Clock, _cg

from execgate.common import records
from execgate.common.units import MiB
from execgate.daemon.actuator import FreezeGate
from execgate.daemon.growth_gate import GrowthGate
from execgate.policy.estimate import CallInfo
from execgate.policy.growth import GrowthConfig
from execgate.policy.pressure_state import Pressure

REPO = str(Path(__file__).resolve().parents[2])


def _held(tmp_path: Path) -> tuple[GrowthGate, dict[str, Call], Clock, list[Path]]:
    """Two calls growing under red: the gate holds one (see test_daemon_growth.py)."""
    clock = Clock()
    gg = GrowthGate(GrowthConfig(), "freeze", clock)
    gg.actuator = FreezeGate(str(tmp_path))
    dirs = [_cg(tmp_path, "tool-a"), _cg(tmp_path, "tool-b")]
    calls = {d.name: Call(CallInfo(d.name, "s", ["x"]), str(d), clock.t) for d in dirs}
    for i in range(1, 30):
        _grow(gg, calls, clock, dirs, i)
    return gg, calls, clock, dirs


def _grow(gg: GrowthGate, calls: dict[str, Call], clock: Clock, dirs: list[Path], i: int) -> None:
    clock.t += 0.1
    for d in dirs:
        calls[d.name].last_mem = i * 20 * MiB
        (d / "cpu.stat").write_text(f"usage_usec {i * 50_000}\n")
    gg.update(calls, Pressure.RED, 600 * MiB)


def _frozen(d: Path) -> bool:
    return (d / "cgroup.freeze").read_text().strip() == "1"


def test_spared_calls_are_released_and_not_held_again_until_it_expires(tmp_path: Path) -> None:
    gg, calls, clock, dirs = _held(tmp_path)
    held = [d for d in dirs if _frozen(d)]
    assert len(held) == 1
    assert gg.spare(list(calls)) == 1
    assert not any(_frozen(d) for d in dirs)
    for i in range(30, 60):  # still red, still growing: 3 s, and neither is held again
        _grow(gg, calls, clock, dirs, i)
        assert not any(_frozen(d) for d in dirs)
    assert gg.snapshot()["held"] == []
    clock.t += 30  # the container did not stop after all: gated as any call again
    for i in range(60, 90):
        _grow(gg, calls, clock, dirs, i)
    assert any(_frozen(d) for d in dirs)


class Recorder:
    """A socket that answers every frame ok and keeps what it was sent."""

    def __init__(self, path: str) -> None:
        self.got: list[dict[str, Any]] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                n = struct.unpack(">I", conn.recv(4))[0]
                self.got.append(msgpack.unpackb(conn.recv(n), raw=False))
                body = msgpack.packb({"v": 1, "ok": True, "released": 1})
                conn.sendall(struct.pack(">I", len(body)) + body)


def _kill(tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    state, sock = tmp_path / "state", str(tmp_path / "d.sock")
    cg = tmp_path / "cg"
    (cg / "init").mkdir(parents=True)
    records.save_container(str(state), {"id": "box", "managed": True, "prepared": True,
                                        "cgroup": str(cg)})
    rec = Recorder(sock)
    fake = tmp_path / "runc"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    conf = tmp_path / "config.toml"
    conf.write_text(f'runtime = "{fake}"\nstate_dir = "{state}"\nsocket = "{sock}"\n')
    env = {k: v for k, v in os.environ.items() if k != "EXECGATE_WRAPPED"}
    env.update(EXECGATE_CONFIG=str(conf), PYTHONPATH=REPO)
    code = (f"from execgate.common import config; config.CACHE_PATH = {str(tmp_path / 'c')!r}\n"
            "from execgate.runtime.main import main; main()")
    p = subprocess.run([sys.executable, "-c", code, "kill", *args], env=env, timeout=20,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rec.sock.close()
    return rec.got


def test_kill_with_a_stopping_signal_asks_the_daemon_to_release(tmp_path: Path) -> None:
    got = _kill(tmp_path, "box")  # runc's default: SIGTERM
    assert [(m["op"], m["container"]) for m in got] == [("release", "box")]


def test_kill_with_another_signal_holds_on(tmp_path: Path) -> None:
    assert _kill(tmp_path, "box", "SIGHUP") == []


def test_the_release_op_spares_the_containers_running_calls(tmp_path: Path) -> None:
    import asyncio

    from test_daemon_admit import Peer, daemon

    async def scenario() -> None:
        async with daemon(tmp_path) as d:
            mine = await d.running(1, 100 * MiB)
            peer = await Peer.connect(d.path)
            try:
                answer = await peer.ask({"v": 1, "op": "release", "container": "box"})
                assert answer["ok"] is True and answer["calls"] == 1, answer
                assert mine["call"] in d.engine.growth.spared
                status = await peer.ask({"v": 1, "op": "status", "recent": 0})
                assert status["status"]["daemon"]["growth"]["spared"] == [mine["call"]]
                answer = await peer.ask({"v": 1, "op": "release", "container": ["box"]})
                assert answer["ok"] is False and "string 'container'" in answer["error"]
            finally:
                await peer.close()

    asyncio.run(scenario())
