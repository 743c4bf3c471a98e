"""Prometheus metrics of the daemon, served on [metrics] listen (off by default).

Read, never kept twice: gauges and most counters come from the engine's own state at scrape
time (the reading, the queues, residency's and the probes' counters, the loop's stats); what
the state does not keep — how long each call waited, how long each hold lasted — is observed
from the event bus (`execgatectl events`' feed), from the control loop (holds), and from the
journal lines the engine reads (calls that ran unmanaged, while the daemon was down or
silent). Names follow Prometheus' conventions: base units (bytes, seconds), `_total` for
counters. prometheus-client encodes each scrape (the text format, or OpenMetrics when the
scraper asks for it); the endpoint speaks just enough HTTP/1.0 for a scraper: GET /metrics,
then close.
Names and labels: docs/protocol.md ("Metrics").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from execgate import __version__
from execgate.cgroups import v2
from execgate.common import records

from .engine import Engine
from .exposition import Histogram, Scrape
from .reload import Reloader

log = logging.getLogger("execgated")

WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
HOLD_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 15, 20, 30)
START_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 100, 120, 300)
STATES = ("green", "yellow", "red")
REQUEST_MAX = 8192  # bytes of request line and headers read before the answer
REQUEST_TIMEOUT_S = 5.0
FAIL_OPEN_EVERY_S = 1.0  # the runtime's fail-open events are taken (counted, logged) this often


class Metrics:
    def __init__(self, engine: Engine, reloader: Reloader | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.reloader = reloader
        self.clock = clock
        self.admission_wait = Histogram(WAIT_BUCKETS)
        self.sandbox_wait = Histogram(START_BUCKETS)
        self.holds = Histogram(HOLD_BUCKETS)
        self.admitted: Counter[str] = Counter()  # by how: normal, probe, forced, overheld
        self.finished: Counter[str] = Counter()  # by outcome
        self.unmanaged = 0
        self.fail_open: Counter[str] = Counter()  # the runtime's, by kind (records.py)
        # A container's lifecycle ops for the front, by (op, part): daemon, runc, waited.
        self.lifecycle_s: Counter[tuple[str, str]] = Counter()
        self._held_since: dict[str, float] = {}
        self._fail_open_at = float("-inf")  # when the runtime's fail-open events were last taken
        self.started = time.time()

    # -- what the state does not keep ------------------------------------------------------------

    def observe(self, event: dict[str, Any]) -> None:
        """One event of the engine's bus."""
        kind = event.get("event")
        if kind == "admitted" and event.get("of") == "sandbox":
            self.sandbox_wait.observe(float(event.get("waited_s") or 0.0))
        elif kind == "admitted":
            self.admission_wait.observe(float(event.get("waited_s") or 0.0))
            how = ("overheld" if event.get("overheld") else "forced" if event.get("forced")
                   else "probe" if event.get("probe") else "normal")
            self.admitted[how] += 1
        elif kind == "finished" and event.get("call"):
            self.finished[_outcome(event)] += 1
        elif kind == "lifecycle":
            for part in ("daemon", "runc", "waited"):
                self.lifecycle_s[(str(event.get("op")), part)] += float(
                    event.get(f"{part}_s") or 0.0)

    def after_tick(self) -> None:
        """Hold episodes of the growth gate, begun and ended since the last tick; the
        runtime's fail-open events recorded since (logged here, where an operator looks)."""
        now = self.clock()
        events: list[dict[str, Any]] = []
        if now - self._fail_open_at >= FAIL_OPEN_EVERY_S:  # two file ops: under TCG 4 ms a tick
            self._fail_open_at = now
            events = records.take_fail_open(self.engine.cfg.state_dir)
        for e in events:
            kind = str(e.get("kind") or "other")
            self.fail_open[kind if kind in records.FAIL_OPEN_KINDS else "other"] += 1
            log.warning("runtime failed open (%s): container %s: %s", kind,
                        str(e.get("container") or "?")[:12], e.get("detail"))
        held = {cid for cid, t in self.engine.growth.tracked.items() if not t.allowed}
        for cid in held.difference(self._held_since):
            self._held_since[cid] = now
        for cid in set(self._held_since).difference(held):
            self.holds.observe(now - self._held_since.pop(cid))

    def journal_entries(self, entries: list[dict[str, Any]]) -> None:
        """Journal lines as the engine reads them: a call the daemon did not admit ran
        unmanaged (fail open: no daemon, or one that did not answer in time)."""
        self.unmanaged += sum(1 for e in entries if e.get("managed") is False)

    def tap_journal(self) -> None:
        """Count the journal lines the engine applies, as it applies them."""
        self.engine.journal_taps.append(self.journal_entries)

    async def follow(self) -> None:
        """Observe the event bus until cancelled."""
        q = self.engine.events.subscribe()
        try:
            while True:
                self.observe(await q.get())
        finally:
            self.engine.events.unsubscribe(q)

    def calls(self) -> dict[str, Any]:
        """The same counts for `execgatectl status` (daemon.calls, docs/protocol.md)."""
        return {"admitted": dict(self.admitted), "finished": dict(self.finished),
                "unmanaged": self.unmanaged, "fail_open": dict(self.fail_open),
                "admission_waits": {"count": self.admission_wait.count,
                                    "sum_s": round(self.admission_wait.sum, 3)},
                "holds": {"count": self.holds.count, "sum_s": round(self.holds.sum, 3)}}

    # -- a scrape --------------------------------------------------------------------------------

    def render(self, swapped: tuple[int, int] | None = None) -> Scrape:
        e = self.engine
        w = Scrape()
        w.gauge("execgate_info", "execgate's version (always 1)",
                samples=[({"version": __version__}, 1)])
        w.gauge("execgate_start_time_seconds", "When the daemon started (Unix time)",
                self.started)
        r = e.reading
        state = str(r.state) if r is not None else ""
        w.gauge("execgate_pressure_state", "The domain's pressure state (1 for the current one)",
                samples=[({"state": s}, int(state == s)) for s in STATES])
        if r is not None:
            w.gauge("execgate_budget_bytes", "The domain's memory budget", r.budget)
            w.gauge("execgate_available_bytes", "The domain's available memory", r.available)
            w.gauge("execgate_headroom_bytes", "Available memory less the safety margin S",
                    r.headroom)
            w.gauge("execgate_effective_headroom_bytes",
                    "Headroom less the growth admitted calls are still expected to make",
                    r.effective_headroom)
            w.gauge("execgate_safety_margin_bytes", "S, never counted as headroom",
                    r.safety_margin)
        w.gauge("execgate_calls_queued", "Tool calls waiting for admission", len(e.pending))
        w.gauge("execgate_calls_running", "Tool calls admitted and not yet finished",
                len(e.calls))
        w.gauge("execgate_admitted_bytes", "Admission's charge of the running calls",
                e.admission.snapshot().get("admitted_bytes") or 0)
        w.counter("execgate_calls_admitted_total", "Tool calls admitted, by how",
                  samples=[({"how": h}, self.admitted[h])
                           for h in ("normal", "probe", "forced", "overheld")])
        w.counter("execgate_calls_finished_total", "Tool calls finished, by outcome",
                  samples=[({"outcome": o}, self.finished[o])
                           for o in ("ok", "error", "oom_killed", "vanished")])
        w.counter("execgate_calls_unmanaged_total", "Tool calls that ran unmanaged (no daemon "
                  "answer in time: fail open), as read from the journal", self.unmanaged)
        w.counter("execgate_runtime_fail_open_total", "Runtime calls that ran as plain runc "
                  "because execgate could not do its part, by kind",
                  samples=[({"kind": k}, self.fail_open[k])
                           for k in (*records.FAIL_OPEN_KINDS, "other")])
        w.histogram("execgate_admission_wait_seconds", "How long admitted calls waited",
                    self.admission_wait)
        held = sum(1 for t in e.growth.tracked.values() if not t.allowed)
        w.gauge("execgate_growth_held_calls", "Running calls the growth gate holds now", held)
        w.gauge("execgate_growth_slots", "b, the growth gate's yellow slot count",
                e.growth.controller.slots)
        w.histogram("execgate_growth_hold_seconds", "How long each hold of a call lasted",
                    self.holds)
        self._sandboxes(w)
        w.counter("execgate_lifecycle_seconds_total", "Time of the front's container creates, "
                  "starts, kills and deletes: the daemon's part, runc's, and admission's wait",
                  samples=[({"op": op, "part": part}, round(v, 3))
                           for (op, part), v in sorted(self.lifecycle_s.items())])
        self._residency(w, swapped)
        probes = e.probes.snapshot()
        w.counter("execgate_oom_kills_total", "OOM kills the probes saw, by sandbox",
                  samples=[({"sandbox": box}, n) for box, n in
                           sorted((probes.get("oom_kills_by_sandbox") or {}).items())])
        loop = e.loop
        w.counter("execgate_loop_iterations_total", "Control loop iterations", loop.iterations)
        w.counter("execgate_loop_seconds_total", "Wall time spent in the control loop",
                  loop.wall_s)
        w.counter("execgate_loop_cpu_seconds_total", "CPU time spent in the control loop",
                  loop.cpu_s)
        w.gauge("execgate_loop_last_seconds", "The last iteration's wall time",
                loop.last_wall_s)
        w.gauge("execgate_loop_max_seconds", "The longest iteration's wall time",
                loop.max_wall_s)
        if self.reloader is not None:
            w.counter("execgate_config_reloads_total", "Config reloads (SIGHUP) applied",
                      self.reloader.reloads)
            w.gauge("execgate_config_restart_needed", "Changed keys waiting for a restart",
                    len(self.reloader.restart))
        return w

    def _sandboxes(self, w: Scrape) -> None:
        sa = self.engine.sandboxes.snapshot()
        totals = sa.get("totals") or {}
        w.gauge("execgate_sandboxes_live", "Live managed sandboxes in the domain",
                sa.get("live", 0))
        w.gauge("execgate_sandboxes_waiting", "Sandbox creates waiting for room",
                len(sa.get("waiting") or []))
        w.counter("execgate_sandboxes_admitted_total", "Sandbox creates let start, by verdict",
                  samples=[({"verdict": v}, totals.get(v, 0)) for v in ("admitted", "fail-open")])
        w.histogram("execgate_sandbox_admission_wait_seconds",
                    "How long sandbox creates waited to start", self.sandbox_wait)

    def _residency(self, w: Scrape, swapped: tuple[int, int] | None) -> None:
        stats = self.engine.residency.stats
        w.counter("execgate_residency_reclaims_total", "memory.reclaim runs on idle sandboxes",
                  stats.get("reclaims", 0))
        w.counter("execgate_residency_reclaimed_bytes_total",
                  "Bytes memory.reclaim took from idle sandboxes", stats.get("reclaimed_bytes", 0))
        w.counter("execgate_residency_freezes_total", "Idle sandboxes frozen under red",
                  stats.get("frozen", 0))
        w.counter("execgate_residency_thaws_total", "Frozen sandboxes thawed",
                  stats.get("thawed", 0))
        if swapped is not None:
            w.gauge("execgate_sandboxes_swap_bytes",
                    "Managed sandboxes' memory in swap (memory.swap.current, summed)", swapped[0])
            w.gauge("execgate_sandboxes_zswapped_bytes",
                    "... of which zswap holds (memory.stat zswapped, summed)", swapped[1])

    def swapped(self) -> tuple[int, int]:
        """(swap, zswapped) bytes of the managed sandboxes: cgroup files, read off the loop."""
        swap = zswapped = 0
        for rec in records.containers(self.engine.cfg.state_dir):
            cg = rec.get("cgroup")
            if not rec.get("managed") or not isinstance(cg, str) or not os.path.isdir(cg):
                continue
            swap += v2.read_int(cg, "memory.swap.current") or 0
            zswapped += v2.read_keyed(cg, "memory.stat").get("zswapped", 0)
        return swap, zswapped

    # -- the endpoint ----------------------------------------------------------------------------

    async def scrape(self, accept: str = "") -> tuple[bytes, str]:
        """The body and its Content-Type (the 0.0.4 text format, or OpenMetrics if asked)."""
        return self.render(await asyncio.to_thread(self.swapped)).encode(accept)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > REQUEST_MAX:
                raise ValueError("request too long")
            request, *headers = head.decode("latin-1").split("\r\n")
            method, path, *_ = request.split()
            accept = next((v.strip() for k, _, v in (h.partition(":") for h in headers)
                           if k.strip().lower() == "accept"), "")
            if method not in ("GET", "HEAD"):
                status, data, kind = "405 Method Not Allowed", b"GET /metrics\n", "text/plain"
            elif path.split("?", 1)[0] == "/metrics":
                data, kind = await self.scrape(accept)
                status = "200 OK"
            else:
                status, data, kind = "404 Not Found", b"GET /metrics\n", "text/plain"
            writer.write(f"HTTP/1.0 {status}\r\nContent-Type: {kind}\r\nContent-Length: "
                         f"{len(data)}\r\nConnection: close\r\n\r\n".encode())
            if method != "HEAD":
                writer.write(data)
            await writer.drain()
        except (TimeoutError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError):
            pass  # a scraper that says nothing, or nonsense, is hung up on
        except Exception:  # a scrape never takes the daemon down
            log.exception("metrics: scrape failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def serve(self, listen: str) -> asyncio.Server:
        """Listen on "host:port" or a unix socket path (mode 0660)."""
        if listen.startswith("/"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(listen)
            server = await asyncio.start_unix_server(self.handle, listen, limit=REQUEST_MAX)
            os.chmod(listen, 0o660)
        else:
            host, _, port = listen.rpartition(":")
            server = await asyncio.start_server(self.handle, host.strip("[]"), int(port),
                                                limit=REQUEST_MAX)
        log.info("metrics on %s", listen)
        return server


def _outcome(event: dict[str, Any]) -> str:
    if event.get("vanished"):
        return "vanished"
    if event.get("oom_killed"):
        return "oom_killed"
    return "ok" if event.get("exit_code") == 0 else "error"
