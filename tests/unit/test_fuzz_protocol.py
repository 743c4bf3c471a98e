"""Fuzz: protocol frames as the daemon reads them (issue 21, item 6).

Any frame body decodes to a map or raises ProtocolError (never TypeError or worse); any map
the daemon's dispatcher gets, admit requests above all (every field mutated to any type),
gets an answer, never an exception, and leaves no charge behind once its conversation ends.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import fuzzing
import msgpack
from test_daemon_engine import _engine

from execgate.common import protocol, records
from execgate.common.units import MiB
from execgate.daemon.main import Daemon
from execgate.daemon.server import Server


def _body(r: random.Random) -> bytes:
    roll = r.random()
    if roll < 0.25:
        return r.randbytes(r.randrange(1, 40))
    if roll < 0.5:  # a map header and random bytes: list and map keys, truncations
        return bytes([0x80 | r.randrange(1, 16)]) + r.randbytes(r.randrange(1, 30))
    if roll < 0.55:
        return b"\x91" * fuzzing.depth(r) + b"\xc0"
    try:
        body = msgpack.packb(fuzzing.value(r), use_bin_type=r.random() < 0.5)
    except OverflowError:  # an integer msgpack cannot hold (JSON can)
        body = r.randbytes(9)
    if r.random() < 0.2:
        cut = r.randrange(len(body) + 1)
        body = body[:cut] + r.randbytes(r.randrange(3))
    return body


def test_any_frame_decodes_to_a_map_or_a_protocol_error() -> None:
    r = fuzzing.rng("protocol-frames")
    maps = 0
    for i in range(fuzzing.N):
        body = _body(r)
        try:
            with fuzzing.reported(i, body, protocol.ProtocolError):
                msg = protocol.decode_body(body)
        except protocol.ProtocolError:
            continue
        assert isinstance(msg, dict)
        maps += 1
    assert maps > 0


class _Conn:
    """A runtime that reads every frame and hangs up once it has waited a moment; or that
    is gone (a broken pipe) by the time a frame is sent, one time in `gone`."""

    def __init__(self, r: random.Random, gone: int = 20) -> None:
        self.sent: list[dict[str, Any]] = []
        self.r, self.gone = r, gone

    async def send(self, msg: dict[str, Any]) -> None:
        protocol.encode(msg)  # what the daemon sends must encode
        if self.r.randrange(self.gone) == 0:
            raise BrokenPipeError("the runtime is gone")
        self.sent.append(msg)

    async def closed(self) -> None:
        await asyncio.sleep(0)


def _admit(r: random.Random, i: int, good: dict[str, Any]) -> dict[str, Any]:
    msg = dict(good, call=f"tool-{i:012x}", cgroup=f"{good['cgroup']}/tool-{i:012x}")
    for key in list(msg):
        roll = r.random()
        if roll < 0.08:
            del msg[key]
        elif roll < 0.25:
            msg[key] = fuzzing.value(r)
    if r.random() < 0.3:
        msg["hint"] = {k: fuzzing.value(r) if r.random() < 0.5 else v
                       for k, v in {"memory_bytes": r.choice((1, 100 * MiB, 2**60, 2**62,
                                                              r.randrange(1, 2**60))),
                                    "priority": "high", "memory_class": "low"}.items()}
    if r.random() < 0.2:
        msg["progress_s"] = fuzzing.scalar(r)
    if r.random() < 0.1:
        msg[fuzzing.text(r, 2)] = fuzzing.value(r)
    return msg


def test_no_request_raises_past_the_dispatcher_or_leaks_a_charge(tmp_path: Path) -> None:
    async def scenario() -> None:
        engine, _clock, _journal = _engine(tmp_path, budget=1024 * MiB, used=64 * MiB)
        box = tmp_path / "domain" / "box"
        box.mkdir()
        records.save_container(engine.cfg.state_dir, {"id": "box", "managed": True,
                                                      "sandbox": "box", "cgroup": str(box)})
        daemon = Daemon(engine.cfg, engine)
        server = Server(str(tmp_path / "s.sock"), daemon.handlers, {0})
        good = {"v": 1, "op": "admit", "container": "box", "sandbox": "box",
                "cgroup": str(box), "argv": ["pytest", "-q"], "hint": None}
        r = fuzzing.rng("protocol-admit")
        admitted = 0
        ops = ("admit", "admit", "admit", "done", "ping", "start_sandbox", "nope")
        for i in range(fuzzing.N):
            msg = _admit(r, i, good)
            if r.random() < 0.15:
                msg["op"] = r.choice((*ops, fuzzing.value(r)))
            if r.random() < 0.03:
                msg["v"] = fuzzing.scalar(r)
            conn = _Conn(r)
            with fuzzing.reported(i, msg):
                answer = await server._dispatch(msg, conn)  # type: ignore[arg-type]
            frames = conn.sent + ([answer] if answer is not None else [])
            assert all(f.get("v") == 1 for f in frames), (i, msg, frames)
            assert not any(f.get("ok") is False and "Error:" in str(f.get("error"))
                           for f in frames), (i, msg, frames)  # a sentence, no exception
            if any(f.get("admitted") for f in conn.sent) and msg.get("op") == "admit":
                admitted += 1
                engine.done(msg["call"])  # its watcher, once it ended
            if msg.get("op") == "start_sandbox" and isinstance(msg.get("sandbox"), str):
                engine.sandboxes.cancel(msg["sandbox"])
        await asyncio.sleep(0)
        view = engine.admission.snapshot()
        assert view["queued"] == [] and view["running"] == [], view
        assert engine.pending == {} and engine.calls == {}
        assert admitted > fuzzing.N // 20, admitted
        engine.store.close()
        engine.files.close()
        engine.domain.files.close()

    asyncio.run(scenario())
