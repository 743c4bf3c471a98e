"""The `lifecycle` op: a container's create, start, kill and delete for the compiled front, so no
Python starts for them either (cgroups/sandbox.py does the work, as for the Python runtime).

The front sends the runc argv. The daemon does what comes before runc and answers how runc
runs. A create first waits for its sandbox's admission here (`queued` at once, as the
`start_sandbox` op answers; policy/sandbox_admission.py). With `run: "exec"` the front
becomes runc (kill: thaw what execgate froze, release the held calls of a stopping signal).
With `run: "child"` the front runs runc as its child and sends `{status}` when it has exited
(its exit code, -N for a signal). The daemon then does what comes after and answers `{ok}`:
create records the container, start prepares the layout, delete cleans up. A daemon that dies
while it prepares leaves the container frozen with its record unprepared: `execgated
--recover` thaws such a container (daemon/recover.py). A front that hangs up before `status`
leaves things as a Python runtime killed at that point would: the container runs as with
plain runc.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from execgate.cgroups import sandbox
from execgate.common import protocol, records
from execgate.common.config import Config
from execgate.oci import cli

from .exec_op import front_request_error
from .server import Conn

log = logging.getLogger("execgated.lifecycle")

STATUS_WAIT_S = 600.0  # runc start/delete take seconds; a front silent this long is gone


class LifecycleOp:
    def __init__(self, cfg: Callable[[], Config],
                 sandbox_wait: Callable[[dict[str, Any], Conn], Awaitable[Any | None]],
                 release: Callable[[str], int],
                 publish: Callable[..., None] | None = None,
                 create_failed: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg  # the daemon's current config
        self.sandbox_wait = sandbox_wait  # a create's sandbox admission (daemon/main.py)
        # An admitted create whose runc create failed: sandbox admission forgets it at once
        # (it would hold one of max_launching's places until settle_s).
        self.create_failed = create_failed
        self.release = release  # the growth gate lets a stopping container's calls go
        self.publish = publish  # the event bus: each op's time, ours and runc's
        self.done = {"create": 0, "start": 0, "kill": 0, "delete": 0}  # for status

    def snapshot(self) -> dict[str, int]:
        return dict(self.done)

    async def handle(self, msg: dict[str, Any], conn: Conn) -> dict[str, Any] | None:
        cfg = self.cfg()
        error = front_request_error("lifecycle", msg, cfg)
        if error:
            return protocol.reply(False, error=error)
        inv = cli.parse(list(msg["argv"]))
        flags = inv.command_flags()
        if inv.command not in self.done or not flags.positionals:
            return protocol.reply(False, error="lifecycle takes runc create, start, kill or "
                                               "delete of a container")
        cid = flags.positionals[0]
        t = _Timing()
        if inv.command == "create":
            return await self._create(cfg, inv, cid, conn, t)
        rec = None  # start's prepare reads it itself
        if inv.command != "start":
            rec = await asyncio.to_thread(records.load_container, cfg.state_dir, cid)
        if inv.command == "kill":
            if rec:
                await asyncio.to_thread(sandbox.thaw_ours, rec)
                if rec.get("managed") and sandbox.stops(flags.positionals[1:2]):
                    self.release(cid)
            self._done("kill", cid, t)
            return protocol.reply(True, run="exec")
        if inv.command == "delete" and rec and flags.is_set("force"):
            await asyncio.to_thread(sandbox.thaw_ours, rec)  # runc kills it: nothing may delay
        status = await self._run_child(conn, t)
        if status is None:
            return None  # hung up, or no runc status: runc may not have run
        if status == 0:
            try:
                if inv.command == "start":
                    await asyncio.to_thread(sandbox.prepare, cfg, cid, log)
                elif rec:
                    await asyncio.to_thread(sandbox.clean_up, cfg.state_dir, rec)
            except Exception as e:  # noqa: BLE001 - runc has run: the front exits as it did
                log.warning("%s %s: %s: %s", inv.command, cid[:12], type(e).__name__, e)
        self._done(inv.command, cid, t)
        return protocol.reply(True)

    async def _create(self, cfg: Config, inv: cli.Invocation, cid: str, conn: Conn,
                      t: _Timing) -> dict[str, Any] | None:
        """Sandbox admission before runc create, the record after (runtime/create.py's)."""
        flags = inv.command_flags()
        bundle, pid_file = flags.get("bundle"), flags.get("pid-file")
        if not bundle or not os.path.isabs(bundle) or (pid_file and not os.path.isabs(pid_file)):
            return protocol.reply(False, error="create: relative to the runtime's directory")
        spec, spec_error = await asyncio.to_thread(_bundle, bundle)
        start: dict[str, Any] | None = None
        if spec is not None and sandbox.admits_sandboxes(cfg):
            start = await self._admit_sandbox(cid, spec, conn)
            if start is None:
                return None  # the front hung up while it waited: nothing is created
            t.waited_s = float(start["waited_s"])
        status = await self._run_child(conn, t)
        if status == 0:
            await asyncio.to_thread(sandbox.created, cfg.state_dir, cid, spec, spec_error,
                                    pid_file, start, log)
        elif status is not None and start is not None and self.create_failed is not None:
            self.create_failed(cid)
        if status is None:
            return None
        self._done("create", cid, t)
        return protocol.reply(True)

    async def _admit_sandbox(self, cid: str, spec: Any, conn: Conn) -> dict[str, Any] | None:
        """The start_sandbox wait (daemon/main.py's), in this conversation: how it went, for
        the record; None when the front hung up meanwhile."""
        t0 = time.monotonic()
        msg = sandbox.start_request(cid, spec)
        d = await self.sandbox_wait(msg, conn)
        if d is None:
            return None
        verdict = str(d.verdict)
        if verdict != "admitted":
            log.warning("create %s: %s", cid[:12], d.reason)
        return {"admitted": True, "verdict": verdict,
                "waited_s": round(time.monotonic() - t0, 3), "image": msg["image"]}

    def _done(self, op: str, cid: str, t: _Timing) -> None:
        """An op that ran to its answer: counted, and where its time went on the event bus (one
        the front gave up on says nothing)."""
        self.done[op] += 1
        if self.publish is not None:
            self.publish("lifecycle", op=op, container=cid, **t.parts())

    async def _run_child(self, conn: Conn, t: _Timing) -> int | None:
        """runc runs as the front's child: its exit status, once the front says; None when
        it hung up first (runc may not have run)."""
        await conn.send(protocol.reply(True, run="child"))
        t0 = time.monotonic()
        try:
            frame = await asyncio.wait_for(conn.recv(), STATUS_WAIT_S)
        except (TimeoutError, protocol.ProtocolError, ConnectionError, EOFError,
                RuntimeError) as e:
            log.warning("lifecycle: no runc status from the front: %s", e)
            return None
        finally:
            t.runc_s = time.monotonic() - t0
        status = frame.get("status") if frame else None
        if isinstance(status, bool) or not isinstance(status, int):
            return None
        return status


class _Timing:
    """Where one op's time went: runc's (the front's child, from `run` to its status), the
    sandbox admission's wait (create), and the rest, ours. Under load ours is the daemon's
    share of a container's start (VM, 15x: starts 2.4-2.9x runc's, admission waits ~0.2 s)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.runc_s = 0.0
        self.waited_s = 0.0

    def parts(self) -> dict[str, float]:
        ours = time.monotonic() - self.t0 - self.runc_s - self.waited_s
        return {"runc_s": round(self.runc_s, 3), "waited_s": round(self.waited_s, 3),
                "daemon_s": round(max(0.0, ours), 3)}


def _bundle(path: str) -> tuple[Any, Exception | None]:
    from execgate.oci import bundle as bundle_mod

    try:
        return bundle_mod.load(path), None
    except Exception as e:  # noqa: BLE001 - runc reports a bad bundle its own way
        return None, e

