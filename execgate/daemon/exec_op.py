"""The `exec` op: a managed tool call the compiled front hands over, so no Python starts per call.

The front (runtime/front.c) sends a managed non-TTY `runc exec` argv. The daemon does what the
runtime's exec handler would (calls/placement.py): it reads the call, admits it in the `admit`
conversation (`queued`, `waiting` frames), makes its cgroup, and answers the argv the front
execve()s runc with. Whatever the agent is to be told before the call starts travels as `say`
text, which the front writes to the call's stderr. The peer (SO_PEERCRED) is the process that
becomes runc. Its pidfd is the follower's runtime pidfd, and its stderr (pidfd_getfd, reopened
non-blocking) is the call's. The call is then followed to its end in a thread (calls/follow.py)
instead of by a watcher process.

The call's cgroup is marked with its record (calls/mark.py) before the front hears the argv, so a
daemon that dies at any point leaves its successor what it needs: recover() follows a marked
call to its journal line, removes a cgroup marked done, and removes one no call ever ran in once
the process that was to become runc has gone (it fell back to Python: its call is elsewhere).

Every refusal is an error frame, and the front then starts the Python runtime, which decides and
fails open as before. That covers a TTY call, another config, and a failure to place the call.
A call whose placement fails before the answer is sent ends its charge with the conversation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from execgate.calls import feedback, follow, mark, placement
from execgate.calls.record import ToolCall
from execgate.cgroups import container, v2
from execgate.common import protocol, records
from execgate.common.config import DEFAULT_PATH, Config
from execgate.oci import cli
from execgate.policy.admission import Decision

from . import thread_cpu
from .inside.procfs import started_ns, take_stderr
from .server import Conn

log = logging.getLogger("execgated.exec")

Converse = Callable[..., Awaitable[dict[str, Any] | None]]


def front_request_error(op: str, msg: dict[str, Any], cfg: Config) -> str | None:
    """Why a request of the compiled front's (exec, lifecycle) is not the daemon's to serve: a
    malformed one, or one from a runtime that reads another config; None when it is."""
    argv = msg.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return f"{op} needs 'argv', a non-empty list of strings"
    if not isinstance(msg.get("config"), str):
        return f"{op} needs 'config', the runtime's config path"
    if os.path.abspath(msg["config"]) != os.path.abspath(cfg.path or DEFAULT_PATH):
        return "the runtime reads another config than the daemon: its own runtime does this"
    return None


class ExecOp:
    def __init__(self, cfg: Callable[[], Config], engine: Any, converse: Converse) -> None:
        self.cfg = cfg  # the daemon's current config (a SIGHUP may replace it)
        self.engine = engine
        self.converse = converse
        # For status: calls placed for the front, being followed now, and sent back to
        # the runtime (refused: a TTY call, another config, an error).
        self.placed = self.followers = self.refused = 0
        self._lock = threading.Lock()

    def snapshot(self) -> dict[str, int]:
        return {"placed": self.placed, "following": self.followers, "refused": self.refused}

    async def handle(self, msg: dict[str, Any], conn: Conn) -> dict[str, Any] | None:
        answer = await self._handle(msg, conn)
        if answer is not None and not answer.get("ok"):
            self.refused += 1
        return answer

    async def _handle(self, msg: dict[str, Any], conn: Conn) -> dict[str, Any] | None:
        cfg = self.cfg()
        error = front_request_error("exec", msg, cfg)
        if error:
            return protocol.reply(False, error=error)
        if conn.peer_pid is None:
            return protocol.reply(False, error="no peer pid")
        inv = cli.parse(list(msg["argv"]))
        if inv.command != "exec":
            return protocol.reply(False, error="exec takes a runc exec argv")
        # At once, before the spec is read: the front holds its first frame to the short budget
        # (daemon_timeout_ms), and reading the spec goes through a thread.
        adm = self.engine.settings.admission
        await conn.send(protocol.reply(True, queued=True, progress_s=protocol.PROGRESS_S,
                                       max_wait_s=adm.max_admission_wait_s,
                                       max_queued_s=adm.max_queued_s))
        told: list[str] = []
        p = await asyncio.to_thread(placement.plan, cfg, inv, log, told.append)
        if p is None:  # not execgate's to place: run as it is
            return protocol.reply(True, argv=inv.argv, say="".join(told))
        if p.call.tty:
            return protocol.reply(False, error="a TTY call is the runtime's (terminal relay)")
        call = p.call
        request = {**call.admit_request(), "progress_s": protocol.PROGRESS_S}

        async def admitted(d: Decision) -> None:
            call.admitted(True, round(float(d.waited_s), 3), bool(d.forced))
            say = ""
            if call.waited_s >= 2.0 and feedback.should_report_delay(call.waited_s):
                say = feedback.admission_delayed(call.waited_s)
            out, runtime_pidfd, stderr = await asyncio.to_thread(
                self._place, cfg, p, conn.peer_pid)
            try:
                await conn.send(protocol.reply(True, admitted=True, argv=out, say=say))
            except BaseException:
                self._let_go(call, runtime_pidfd, stderr)
                raise
            self.placed += 1
            self._follow(cfg, call, runtime_pidfd, p.flags.get("pid-file"), stderr)

        def waiting(frame: dict[str, Any]) -> dict[str, Any]:
            return {"say": feedback.admission_waiting(float(frame.get("waited_s") or 0.0),
                                                      str(frame.get("reason") or ""))}

        return await self.converse(request, conn, admitted, {"say": "".join(told)}, waiting)

    def recover(self) -> int:
        """After a restart: follow again the calls a previous daemon placed (marked), once the
        engine has adopted the running ones; how many. A cgroup marked done is removed."""
        cfg, n, done = self.cfg(), 0, self._done_fn()
        for rec in records.containers(cfg.state_dir):
            if not rec.get("managed") or not isinstance(rec.get("cgroup"), str):
                continue
            for tool in container.tool_cgroups(rec["cgroup"]):
                found = mark.get(tool, mark.PLACED)
                if found is None:
                    continue  # not placed by a daemon (the runtime's watcher follows it)
                if found == mark.DONE:
                    v2.remove(tool, attempts=1)  # its line is in
                    continue
                try:
                    placed = json.loads(found)
                    call = ToolCall.from_journal(placed)
                except (ValueError, TypeError, AttributeError):
                    continue
                call.cgroup, call.call, call.adopted = tool, os.path.basename(tool), True
                call.managed = call.call in self.engine.calls
                call.waited_s = call.waited_s or 0.0
                call.forced = bool(call.forced)
                call.start = call.start or call.arrival or time.time()
                runtime = _runtime_pidfd(placed.get("runtime"))
                self._thread(call, lambda c=call, r=runtime: self._follow_again(cfg, c, r, done))
                n += 1
        return n

    @staticmethod
    def _follow_again(cfg: Config, call: ToolCall, runtime_pidfd: int | None,
                      done: follow.Done) -> None:
        """A marked call to its journal line; none for a cgroup no call ever ran in."""
        pidfds: dict[int, int] = {}
        if runtime_pidfd is not None:  # runc may be about to run the call in it: wait for runc
            try:
                pidfds, _ = follow.wait_runtime(runtime_pidfd, call.cgroup,
                                                int(call.oom_score_adj or 0))
            finally:
                os.close(runtime_pidfd)
        if not v2.populated(call.cgroup) and v2.never_ran(call.cgroup):
            for fd in pidfds.values():
                os.close(fd)
            log.info("call %s: placed, never run (its front fell back): removed", call.call)
            v2.remove(call.cgroup)
            return
        follow.follow(call, pidfds, None, cfg.journal, log, None, done)

    @staticmethod
    def _place(cfg: Config, p: placement.Plan, pid: int) -> tuple[list[str], int, int | None]:
        """The call's cgroup made; the argv, the peer's pidfd and the call's stderr."""
        runtime_pidfd = os.pidfd_open(pid)  # the peer waits for our answer: it is alive
        try:
            out = placement.place(cfg, p, log)
        except BaseException:
            os.close(runtime_pidfd)
            raise
        # Marked before the front hears the argv: from then on a call may run in it.
        p.call.start = time.time()
        mark.put(p.call.cgroup, mark.PLACED, mark.record(
            p.call, runtime={"pid": pid, "started_ns": started_ns(pid)}))
        return out, runtime_pidfd, take_stderr(pid)

    @staticmethod
    def _let_go(call: ToolCall, runtime_pidfd: int, stderr: int | None) -> None:
        """The front never heard the argv: nothing runs in the cgroup made for it."""
        os.close(runtime_pidfd)
        if stderr is not None:
            os.close(stderr)
        v2.remove(call.cgroup)

    def _done_fn(self) -> Callable[[ToolCall], dict[str, Any] | None]:
        """engine.done, for a follower thread: run on the loop, whose state it is."""
        loop = asyncio.get_running_loop()

        def done(c: ToolCall) -> dict[str, Any] | None:
            async def end() -> dict[str, Any]:
                return self.engine.done(c.call)

            try:
                return asyncio.run_coroutine_threadsafe(end(), loop).result(timeout=30)
            except Exception:  # noqa: BLE001 - the loop is closing: the note goes without it
                return None

        return done

    def _thread(self, call: ToolCall, body: Callable[[], None]) -> None:
        def run() -> None:
            with self._lock:
                self.followers += 1
            try:
                body()
            except Exception:  # one call's follower, never the daemon
                log.exception("call %s: follower failed", call.call)
            finally:
                with self._lock:
                    self.followers -= 1
                self.engine.journal_written()  # its line (a follower ends with one)

        threading.Thread(target=thread_cpu.counted(run), name=f"follow-{call.call}",
                         daemon=True).start()

    def _follow(self, cfg: Config, call: ToolCall, runtime_pidfd: int, pid_file: str | None,
                stderr: int | None) -> None:
        done = self._done_fn()

        def body() -> None:
            try:
                try:
                    pidfds, _ = follow.wait_runtime(runtime_pidfd, call.cgroup,
                                                    int(call.oom_score_adj or 0))
                finally:
                    os.close(runtime_pidfd)
            except BaseException:
                if stderr is not None:  # the stream must end
                    os.close(stderr)
                raise
            follow.follow(call, pidfds, pid_file, cfg.journal, log, stderr, done)

        self._thread(call, body)


def _runtime_pidfd(runtime: Any) -> int | None:
    """A pidfd on the process a marked call's front became (runc, or Python that fell back),
    if it still runs: the same pid, started when the mark says."""
    if not isinstance(runtime, dict):
        return None
    try:
        pid, started = int(runtime["pid"]), int(runtime["started_ns"])
        fd = os.pidfd_open(pid)
    except (KeyError, TypeError, ValueError, OSError):
        return None
    if started_ns(pid) != started:  # the pid was reused (checked with the pidfd held)
        os.close(fd)
        return None
    return fd
