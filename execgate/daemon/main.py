"""`execgated`: the host daemon shared by every sandbox.

It holds the memory-pressure state of its domain, admits every tool call by predicted demand
(the runtime asks before each `docker exec` runs), learns demand from finished calls, and shows
all of it to execgatectl. The runtime fails open: when this daemon is down or slow, calls run
unmanaged and the runtime logs it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from execgate.cgroups import container, v2
from execgate.common import config as config_mod
from execgate.common import hints, protocol, records
from execgate.policy.admission import Decision

from . import logs, status
from . import settings as settings_mod
from .engine import Engine
from .exec_op import ExecOp
from .inside.agents import InsideAgents
from .journal_reader import JournalReader
from .lifecycle_op import LifecycleOp
from .metrics import Metrics
from .reload import Reloader
from .sandboxes import within
from .server import Conn, Server, stop_watching

log = logging.getLogger("execgated")

CATCH_UP_PAUSE_S = 0.005  # between two steps of a journal backlog: the loop's own turn


def sd_notify(state: str) -> None:
    """Tell systemd we are ready (Type=notify) without libsystemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        s.sendall(state.encode())


def _admit_error(msg: dict[str, Any]) -> str | None:
    """What is wrong with an admit request, naming the field (docs/protocol.md), or None.

    Checked here, before the engine sees it: a bad peer gets a sentence, never a traceback's
    last line, and nothing it sends is taken for something else (a string argv split into
    characters, `true` taken as a 1-byte declaration)."""
    error = _strings_error("admit", msg, ("call", "sandbox", "cgroup"), ("container",))
    if error:
        return error
    argv = msg.get("argv", [])
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return "admit's 'argv' must be a list of strings"
    progress = msg.get("progress_s")
    if progress is not None and (isinstance(progress, bool)
                                 or not isinstance(progress, int | float)
                                 or not math.isfinite(progress)):
        return "admit's 'progress_s' must be a number"
    if msg.get("hint") is not None:
        try:
            hints.Hint.from_dict(msg["hint"])
        except ValueError as e:
            return f"admit's 'hint' is invalid: {e}"
    return None


def _admit_cgroup_error(msg: dict[str, Any], state_dir: str, domain: str) -> str | None:
    """Why the daemon must not take an admit's `cgroup` (it may freeze or `cgroup.kill` it
    later), or None: it must be a tool cgroup (`tool-*`) right below the cgroup of the managed
    container the request names, inside the domain."""
    cid = msg.get("container") or ""
    rec = records.load_container(state_dir, cid) if cid else None
    if not rec or not rec.get("managed") or not isinstance(rec.get("cgroup"), str):
        return f"admit's 'container' {hints.quote(cid)} is not a managed container"
    cg = os.path.normpath(msg["cgroup"])
    name = os.path.basename(cg)
    if os.path.dirname(cg) != os.path.normpath(rec["cgroup"]) or \
            not name.startswith(container.TOOL_PREFIX) or "\0" in cg:
        return (f"admit's 'cgroup' {hints.quote(msg['cgroup'])} is not a tool cgroup of "
                f"container {hints.quote(cid)}")
    if domain != "host" and not within(cg, domain):
        return f"admit's 'cgroup' {hints.quote(msg['cgroup'])} is outside the domain {domain}"
    return None


def _progress_s(msg: dict[str, Any]) -> float | None:
    """The period of `waiting` frames a runtime asked for (docs/protocol.md), kept within
    [1, 60] s; None when it did not ask (an older runtime reads only two frames)."""
    value = msg.get("progress_s")
    if value is None or value <= 0:
        return None
    return min(max(float(value), 1.0), 60.0)


def _start_sandbox_error(msg: dict[str, Any]) -> str | None:
    """What is wrong with a start_sandbox request, naming the field, or None."""
    if not isinstance(msg.get("caller_deadline", True), bool):
        return "start_sandbox's 'caller_deadline' must be true or false"
    return _strings_error("start_sandbox", msg, ("sandbox", "image"),
                          ("pod", "cgroups_path", "hostname"))


def _strings_error(op: str, msg: dict[str, Any], required: tuple[str, ...],
                   optional: tuple[str, ...] = ()) -> str | None:
    """The first field of op's request that is not the string it must be: required ones
    non-empty, optional ones absent or a string."""
    for key in required:
        if not isinstance(msg.get(key), str) or not msg[key]:
            return f"{op} needs a string {key!r}"
    for key in optional:
        if not isinstance(msg.get(key, ""), str):
            return f"{op}'s {key!r} must be a string"
    return None


def sandbox_of(cgroup: str, managed: Callable[[], dict[str, str]]) -> str | None:
    """The managed container a process in `cgroup` runs in, or None. Inside one, a process is
    in its `init/` or a `tool-*/` (cgroups/container.py's layout), which is how the records
    (`managed()`: container cgroup -> id) need reading only for such a path, never for the
    runtime, its watchers or execgatectl on the host."""
    path = os.path.normpath(cgroup)
    table: dict[str, str] | None = None
    while path not in ("/", ""):
        name = os.path.basename(path)
        parent = os.path.dirname(path)
        if name == container.INIT or name.startswith(container.TOOL_PREFIX):
            table = managed() if table is None else table
            if parent in table:
                return table[parent]
        path = parent
    return None


class Daemon:
    def __init__(self, cfg: config_mod.Config, engine: Engine) -> None:
        self.cfg = cfg
        self.engine = engine
        self.index = records.ContainerIndex(cfg.state_dir)
        self.inside: InsideAgents | None = None  # set once it listens
        self.reloader = Reloader(cfg, engine)  # SIGHUP
        self.metrics = Metrics(engine, self.reloader)  # served when [metrics] listen is set
        self.exec = ExecOp(lambda: self.cfg, engine, self.converse)  # the compiled front's
        # ... and the runc calls of a container's life
        self.lifecycle = LifecycleOp(lambda: self.cfg, self.sandbox_wait, self.release,
                                     engine.events.publish, engine.sandboxes.create_failed)
        self.handlers = {"ping": self.op_ping, "status": self.op_status, "admit": self.op_admit,
                         "done": self.op_done, "events": self.op_events,
                         "start_sandbox": self.op_start_sandbox, "release": self.op_release,
                         "exec": self.exec.handle, "lifecycle": self.lifecycle.handle}

    def refuse_peer(self, pid: int, cgroup_of: Callable[[int], str] = v2.path_of_pid
                    ) -> str | None:
        """Why a root peer is refused: it runs inside a managed sandbox (one that shares
        /run reaches the socket as uid 0), which must not admit, end or watch others' calls.
        A peer whose cgroup cannot be read is served (the runtime must never be blocked)."""
        try:
            cg = cgroup_of(pid)
        except (OSError, LookupError, ValueError):
            return None

        def managed() -> dict[str, str]:
            return {os.path.normpath(r["cgroup"]): str(r.get("id"))
                    for r in self.index.records()
                    if r.get("managed") and isinstance(r.get("cgroup"), str)}

        cid = sandbox_of(cg, managed)
        return None if cid is None else f"the peer runs inside sandbox {hints.quote(cid)}"

    async def op_ping(self, msg: dict[str, Any], conn: Conn) -> dict[str, Any]:
        return protocol.reply(True, pid=os.getpid(), loop=self.engine.loop.snapshot())

    async def op_status(self, msg: dict[str, Any], conn: Conn) -> dict[str, Any]:
        snap = await asyncio.to_thread(status.collect, self.cfg, int(msg.get("recent", 20)))
        snap["daemon"] = self.engine.snapshot()
        if self.inside is not None:
            snap["daemon"]["inside"] = self.inside.snapshot()
        snap["daemon"]["config"] = self.reloader.snapshot()
        snap["daemon"]["exec"] = self.exec.snapshot()
        snap["daemon"]["lifecycle"] = self.lifecycle.snapshot()
        snap["daemon"]["calls"] = self.metrics.calls()
        return protocol.reply(True, status=snap, pid=os.getpid())

    async def op_admit(self, msg: dict[str, Any], conn: Conn) -> dict[str, Any] | None:
        """Two frames: `queued` at once (the runtime knows we are alive), then `admitted`."""
        error = _admit_error(msg) or _admit_cgroup_error(
            msg, self.cfg.state_dir, self.engine.settings.daemon.domain)
        if error:
            return protocol.reply(False, error=error)

        async def admitted(d: Decision) -> None:
            await conn.send(protocol.reply(True, admitted=True, waited_s=d.waited_s,
                                           forced=d.forced, probe=d.probe,
                                           overheld=d.overheld, charge=d.charge_bytes,
                                           reason=d.reason))

        return await self.converse(msg, conn, admitted)

    async def converse(self, msg: dict[str, Any], conn: Conn,
                       admitted: Callable[[Decision], Awaitable[None]],
                       queued: dict[str, Any] | None = None,
                       waiting: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                       ) -> dict[str, Any] | None:
        """An admission conversation: `queued` at once (with `queued`'s fields), a `waiting`
        frame every progress_s the peer asked for (with what waiting() adds), and once the call
        may start, admitted(decision), which answers the peer. A conversation that ends before
        admitted() returns (the peer hung up, a handler failed) ends the call's charge."""
        call_id = msg["call"]
        try:
            ticket, fut = self.engine.submit(msg)
        except ValueError as e:
            return protocol.reply(False, error=str(e))
        told = False  # the peer heard `admitted`: from then on its follower ends the call
        hangup: asyncio.Future[None] | None = None
        try:
            progress = _progress_s(msg)
            if progress is not None:
                ticket["progress_s"] = progress
            await conn.send(protocol.reply(True, queued=True, **ticket, **(queued or {})))
            hangup = asyncio.ensure_future(conn.closed())
            while not fut.done():
                await asyncio.wait({fut, hangup}, timeout=progress,
                                   return_when=asyncio.FIRST_COMPLETED)
                if fut.done():
                    break
                if hangup.done():  # the runtime gave up or died: nothing will run
                    return None
                frame = self.engine.waiting(call_id)
                if frame is None:  # a runtime that asked is told every progress_s
                    continue
                if waiting is not None:
                    frame = {**frame, **waiting(frame)}
                await conn.send(protocol.reply(True, waiting=True, **frame))
            await admitted(fut.result())
            told = True
            return None
        except (ConnectionError, OSError):  # the runtime went away: nothing will run
            return None
        finally:
            if hangup is not None:
                hangup.cancel()
            if not fut.done():
                fut.cancel()
            if not told:  # whatever ended this conversation, its charge ends with it
                self.engine.cancel(call_id)

    async def op_start_sandbox(self, msg: dict[str, Any], conn: Conn) -> dict[str, Any] | None:
        """Two frames, as admit: `queued` at once, then `admitted` (verdict admitted or
        fail-open) when the create may go on; a create that hangs up is forgotten."""
        error = _start_sandbox_error(msg)
        if error:
            return protocol.reply(False, error=error)
        try:
            d = await self.sandbox_wait(msg, conn)
        except ValueError as e:
            return protocol.reply(False, error=str(e))
        if d is None:
            return None
        with contextlib.suppress(ConnectionError, OSError):  # gone: nothing will start
            await conn.send(protocol.reply(True, admitted=True, verdict=str(d.verdict),
                                           waited_s=d.waited_s, need=d.need_bytes,
                                           room=d.room_bytes, reason=d.reason))
        return None

    async def sandbox_wait(self, msg: dict[str, Any], conn: Conn) -> Any | None:
        """A create's sandbox admission in this conversation: `queued` at once, then the
        decision once the create may go on (it is the caller's to answer); None when the peer
        hung up meanwhile, whose wait ends with it. ValueError: a request the policy refuses."""
        ticket, fut = self.engine.submit_sandbox(msg)
        hangup: asyncio.Future[None] | None = None
        try:
            await conn.send(protocol.reply(True, queued=True, **ticket))
            hangup = asyncio.ensure_future(conn.closed())
            await asyncio.wait({fut, hangup}, return_when=asyncio.FIRST_COMPLETED)
            return fut.result() if fut.done() else None
        except (ConnectionError, OSError):  # the create went away: nothing will start
            return None
        finally:
            if hangup is not None:
                await stop_watching(hangup)  # the peer may have more to say
            if not fut.done():  # whatever ended this conversation, the wait ends with it
                self.engine.sandboxes.cancel(msg["sandbox"])
                fut.cancel()

    async def op_done(self, msg: dict[str, Any], conn: Conn) -> dict[str, Any]:
        call_id = msg.get("call")
        if not isinstance(call_id, str):
            return protocol.reply(False, error="done needs a string 'call'")
        return protocol.reply(True, **self.engine.done(call_id))

    async def op_release(self, msg: dict[str, Any], conn: Conn) -> dict[str, Any]:
        """The runtime is about to signal a container to stop (`kill`): its calls are released
        and not held for a while, so they handle the signal now, not at the hold cap."""
        cid = msg.get("container")
        if not isinstance(cid, str):
            return protocol.reply(False, error="release needs a string 'container'")
        calls = [k for k, c in self.engine.calls.items() if c.container == cid]
        return protocol.reply(True, calls=len(calls), released=self.release(cid))

    def release(self, cid: str) -> int:
        """The container's running calls let go by the growth gate and not held for a while;
        how many it held."""
        return self.engine.growth.spare([k for k, c in self.engine.calls.items()
                                         if c.container == cid])

    async def op_events(self, msg: dict[str, Any], conn: Conn) -> dict[str, Any] | None:
        q = self.engine.events.subscribe()
        hangup = asyncio.ensure_future(conn.closed())
        try:
            await conn.send(protocol.reply(True, subscribed=True))
            while not hangup.done():
                get = asyncio.ensure_future(q.get())
                await asyncio.wait({get, hangup}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    break
                await conn.send(protocol.reply(True, **get.result()))
        except (ConnectionError, OSError):
            pass
        finally:
            hangup.cancel()
            self.engine.events.unsubscribe(q)
        return None

    async def control_loop(self, stop: asyncio.Event) -> None:
        """Ticks every engine.period(); a request (engine.wake) or stop cuts a wait short."""
        wake = self.engine.wake
        while not stop.is_set():
            try:
                self.engine.tick()
                self.metrics.after_tick()
            except Exception:
                log.exception("control loop iteration failed")
            wake.clear()
            due = time.monotonic() + self.engine.next_period()
            await self.catch_up(due)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=max(due - time.monotonic(), 0))

    async def catch_up(self, end: float) -> None:
        """While the journal has a backlog, bounded steps of it until the next tick is due
        (monotonic `end`), with the requests that arrived served between them."""
        while self.engine.journal_behind and not self.engine.wake.is_set() and \
                time.monotonic() < end:
            try:
                self.engine.follow_journal()
            except Exception:  # noqa: BLE001 - the tick's journal stage logs and counts it
                return
            await asyncio.sleep(CATCH_UP_PAUSE_S)


def keep_front_fresh(path: str | None) -> None:
    """The compiled front's copy of the config, written by the daemon (config.refresh_front)
    when it starts and reloads, and again once the file has settled. Only for the file the
    runtime reads ($EXECGATE_CONFIG, else the default): a daemon run on another leaves it be."""
    runtime_path = os.environ.get("EXECGATE_CONFIG") or config_mod.DEFAULT_PATH
    if not path or os.path.abspath(path) != os.path.abspath(runtime_path):
        return
    try:
        again = config_mod.refresh_front(runtime_path)
    except Exception:  # a missed shortcut: the runtime writes it in time
        log.exception("cannot write the front's copy of the config")
        return
    if again:
        asyncio.get_running_loop().call_later(config_mod.SETTLE_NS / 1e9 + 0.1,
                                              keep_front_fresh, path)


async def run(cfg: config_mod.Config) -> None:
    settings, problems = settings_mod.load(cfg)
    for problem in problems:
        log.log(logging.ERROR if problem.error else logging.WARNING, "config: %s", problem)
    engine = Engine(cfg, settings)
    # A crash never leaves a sandbox frozen: thawed first, before the history is read (a
    # long journal backlog, a slow store) or anything else can fail.
    thawed = engine.residency.recover()
    daemon = Daemon(cfg, engine)
    daemon.metrics.tap_journal()  # before rediscover reads what ran while we were away
    learned = engine.warm_up()
    adopted = engine.rediscover()
    engine.growth.start()
    engine.journal_reader = JournalReader(engine.journal)  # reads and parses off the loop
    engine.journal_reader.start()
    log.info("domain %s; learned from %d past calls; adopted %d running calls; thawed %d "
             "idle sandboxes", engine.domain.describe(), learned, adopted, thawed)
    server = Server(cfg.socket, daemon.handlers, allowed_uids={0},
                    refuse_peer=daemon.refuse_peer)
    await server.start()
    log.info("listening on %s", cfg.socket)
    keep_front_fresh(cfg.path)  # the calls right after a config change need no Python
    followed = daemon.exec.recover()  # calls a previous daemon placed: to their journal lines
    if followed:
        log.info("following again %d calls placed before the restart", followed)
    inside = InsideAgents(cfg, settings, engine)  # tools spawned by agents inside sandboxes
    inside.start()
    daemon.inside = inside
    engine.probes.start()  # bcc compiles in a background thread; never delays the socket
    following = asyncio.ensure_future(daemon.metrics.follow())
    metrics_server = None
    if settings.metrics.listen:
        try:
            metrics_server = await daemon.metrics.serve(settings.metrics.listen)
        except OSError as e:  # metrics are never worth the daemon
            log.error("metrics: cannot listen on %s: %s; no metrics", settings.metrics.listen, e)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        stop.set()
        engine.wake.set()

    def on_hangup() -> None:
        try:
            daemon.reloader()
        except Exception:  # a reload never takes the daemon down
            log.exception("reload failed; the running settings are kept")
        keep_front_fresh(cfg.path)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    loop.add_signal_handler(signal.SIGHUP, on_hangup)
    sd_notify("READY=1")
    await daemon.control_loop(stop)
    sd_notify("STOPPING=1")
    following.cancel()
    if metrics_server is not None:
        metrics_server.close()
    inside.stop()
    engine.journal_reader.stop()
    engine.probes.stop()
    await server.close()
    engine.residency.stop()
    engine.growth.stop()
    engine.store.close()
    log.info("stopped")


def main() -> None:
    parser = argparse.ArgumentParser(prog="execgated", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="config file (default /etc/execgate/config.toml)")
    parser.add_argument("--socket", help="override the socket path")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--recover", action="store_true",
                        help="thaw and release what a dead daemon left held, then exit "
                             "(the unit's ExecStopPost)")
    args = parser.parse_args()
    logs.setup(args.verbose)
    cfg = config_mod.load(args.config)
    if args.recover:
        from .recover import recover

        log.info("recover: %s", recover(cfg))
        return
    for err in cfg.errors:
        log.error("config: %s", err)
    for warning in cfg.warnings:
        log.warning("config: %s", warning)
    if args.socket:
        cfg = config_mod.Config(**{**cfg.__dict__, "socket": args.socket})
    asyncio.run(run(cfg))


if __name__ == "__main__":
    main()
