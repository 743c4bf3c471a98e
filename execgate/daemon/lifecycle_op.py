"""The `lifecycle` op: a managed container's start, kill and delete for the compiled front, so no
Python starts for them either (cgroups/sandbox.py does the work, as for the Python runtime).

The front sends the runc argv. The daemon does what comes before runc and answers how runc
runs. With `run: "exec"` the front becomes runc (kill: thaw what execgate froze, release the
held calls of a stopping signal). With `run: "child"` the front runs runc as its child and
sends `{status}` when it has exited (its exit code, -N for a signal). The daemon then does
what comes after and answers `{ok}`: start prepares the layout, delete cleans up. A daemon
that dies while it prepares leaves the container frozen with its record unprepared:
`execgated --recover` thaws such a container (daemon/recover.py). A front that hangs up
before `status` leaves things as a Python runtime killed at that point would: the container
runs as with plain runc.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

from execgate.cgroups import sandbox
from execgate.common import protocol, records
from execgate.common.config import DEFAULT_PATH, Config
from execgate.oci import cli

from .server import Conn

log = logging.getLogger("execgated.lifecycle")

STATUS_WAIT_S = 600.0  # runc start/delete take seconds; a front silent this long is gone


class LifecycleOp:
    def __init__(self, cfg: Callable[[], Config], release: Callable[[str], int]) -> None:
        self.cfg = cfg  # the daemon's current config
        self.release = release  # the growth gate lets a stopping container's calls go
        self.done = {"start": 0, "kill": 0, "delete": 0}  # for status

    def snapshot(self) -> dict[str, int]:
        return dict(self.done)

    async def handle(self, msg: dict[str, Any], conn: Conn) -> dict[str, Any] | None:
        argv = msg.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            return protocol.reply(False, error="lifecycle needs 'argv', a list of strings")
        cfg = self.cfg()
        if not isinstance(msg.get("config"), str) or \
                os.path.abspath(msg["config"]) != os.path.abspath(cfg.path or DEFAULT_PATH):
            return protocol.reply(False, error="the runtime reads another config than the "
                                               "daemon: its own runtime does this")
        inv = cli.parse(list(argv))
        flags = inv.command_flags()
        if inv.command not in self.done or not flags.positionals:
            return protocol.reply(False, error="lifecycle takes runc start, kill or delete "
                                               "of a container")
        cid = flags.positionals[0]
        rec = await asyncio.to_thread(records.load_container, cfg.state_dir, cid)
        if inv.command == "kill":
            if rec:
                await asyncio.to_thread(sandbox.thaw_ours, rec)
                if rec.get("managed") and sandbox.stops(flags.positionals[1:2]):
                    self.release(cid)
            self.done["kill"] += 1
            return protocol.reply(True, run="exec")
        if inv.command == "delete" and rec and flags.is_set("force"):
            await asyncio.to_thread(sandbox.thaw_ours, rec)  # runc kills it: nothing may delay
        await conn.send(protocol.reply(True, run="child"))
        try:
            frame = await asyncio.wait_for(conn.recv(), STATUS_WAIT_S)
        except (TimeoutError, protocol.ProtocolError, ConnectionError):
            return None
        status = frame.get("status") if frame else None
        if isinstance(status, bool) or not isinstance(status, int):
            return None  # hung up, or no runc status: runc may not have run
        if status == 0:
            try:
                if inv.command == "start":
                    await asyncio.to_thread(sandbox.prepare, cfg, cid, log)
                elif rec:
                    await asyncio.to_thread(sandbox.clean_up, cfg.state_dir, rec)
            except Exception as e:  # noqa: BLE001 - runc has run: the front exits as it did
                log.warning("%s %s: %s: %s", inv.command, cid[:12], type(e).__name__, e)
        self.done[inv.command] += 1
        return protocol.reply(True)
