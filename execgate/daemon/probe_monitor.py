"""The daemon's use of the bcc probes (bpf/probes.py): OOM kills attributed to sandboxes and
tool calls, page-fault rates of running calls.

Optional by design ([daemon] probes = auto | true | false): the probes load in a background
thread after the socket is up, and when they cannot load (no bcc, no kernel headers, no
tracepoint) the daemon logs why and runs without them. Every control period :meth:`step`

* indexes the cgroup ids of running calls (id = inode of the cgroup directory), remembered
  after the call ends so a kill seen late is still attributed;
* reads the calls' fault counters: ``LiveCall.extra["faults"]`` = {count, rate (faults/s over
  the period), peak_10ms}; the growth gate takes the count into its samples (a call whose
  footprint grows projects at least its fault rate: the EWMA lags a burst's onset, the
  counters do not);
* drains OOM kills, attributes each to (container, sandbox, call) by its cgroup path, and
  publishes an ``oom_kill`` event, keeps a count per sandbox and appends a JSON line to
  ``[daemon] oom_record`` (µs wall-clock and kernel timestamps).
"""

from __future__ import annotations

import collections
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from execgate.common import records

from .events import EventBus

log = logging.getLogger("execgated")
MODES = ("auto", "on", "off")
KEEP_CALLS = 4096  # finished calls still attributable by cgroup id


@dataclass(frozen=True)
class Owner:
    container: str | None
    sandbox: str | None
    call: str | None


def attribute(path: str | None, calls: Iterable[tuple[str, str, str, str]],
              boxes: Iterable[tuple[str, str, str]]) -> Owner:
    """A cgroup path -> its owner. calls: (call id, sandbox, container, call cgroup), checked
    first; boxes: (container id, sandbox, container cgroup) from the records, for kills of a
    call the daemon never saw or of a sandbox's own processes (init, agent: call None)."""
    if not path:
        return Owner(None, None, None)
    path = path.rstrip("/")
    for call, sandbox, container, cg in calls:
        cg = cg.rstrip("/")
        if path == cg or path.startswith(cg + "/"):
            return Owner(container, sandbox, call)
    for container, sandbox, cg in boxes:
        cg = cg.rstrip("/")
        if path == cg or path.startswith(cg + "/"):
            first = path[len(cg):].lstrip("/").split("/", 1)[0]
            return Owner(container, sandbox, first if first.startswith("tool-") else None)
    return Owner(None, None, None)


def fault_view(prev: dict[str, Any] | None, count: int, peak: int, dt: float) -> dict[str, Any]:
    """One call's fault counters for a period: the rate is over the period, 0 on first sight."""
    rate = 0.0
    if prev is not None and dt > 0:
        rate = max(count - int(prev["count"]), 0) / dt
    return {"count": count, "rate": round(rate, 1), "peak_10ms": peak}


class ProbeMonitor:
    def __init__(self, mode: str, events: EventBus, state_dir: str, record_path: str = "",
                 clock: Callable[[], float] | None = None,
                 runner_factory: Callable[..., Any] | None = None) -> None:
        import time

        self.mode = mode if mode in MODES else "auto"
        self.events = events
        self.state_dir = state_dir
        self.record_path = record_path
        self.clock = clock or time.monotonic
        self._runner_factory = runner_factory
        self.runner: Any = None
        self.ids: OrderedDict[int, tuple[str, str, str, str]] = OrderedDict()  # id -> call row
        self.call_ids: dict[str, int] = {}  # running call -> cgroup id
        self.faults: dict[str, dict[str, Any]] = {}
        self.kills_by_sandbox: collections.Counter[str] = collections.Counter()
        self.kills_total = 0
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=32)
        self._last_step: float | None = None

    def start(self) -> None:
        if self.mode == "off":
            log.info("probes off by config")
            return
        if self._runner_factory is None:
            from execgate.bpf.probes import ProbeRunner

            self._runner_factory = ProbeRunner
        self.runner = self._runner_factory(known=self._known)
        if self.mode == "on":
            self.runner.fail_level = logging.ERROR
        self.runner.start()

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()

    def _known(self, cid: int) -> str | None:
        """Called from the poll thread: a plain dict read (atomic under the GIL)."""
        row = self.ids.get(cid)
        return row[3] if row else None

    # -- every period --------------------------------------------------------------------------

    def step(self, calls: dict[str, Any]) -> None:
        """calls: the engine's running calls (LiveCall: info.sandbox, container, cgroup, extra)."""
        if self.runner is None:
            return
        try:
            self._index(calls)
            probes = self.runner.probes
            if probes is not None:
                self._read_faults(probes, calls)
            for kill in self.runner.drain():
                self._on_kill(kill.as_dict())
        except Exception:
            log.exception("probes step failed")

    def _index(self, calls: dict[str, Any]) -> None:
        for cid, call in calls.items():
            if cid in self.call_ids or not call.seen:
                continue
            try:
                gid = os.stat(call.cgroup).st_ino
            except OSError:
                continue
            self.call_ids[cid] = gid
            self.ids[gid] = (cid, call.info.sandbox, call.container, call.cgroup)
            while len(self.ids) > KEEP_CALLS:
                self.ids.popitem(last=False)
        gone = [cid for cid in self.call_ids if cid not in calls]
        for cid in gone:
            self.call_ids.pop(cid, None)
            self.faults.pop(cid, None)
        if gone and self.runner.probes is not None:
            # the counters go; the id -> call row stays for late OOM events
            self.runner.probes.forget([gid for gid, row in self.ids.items() if row[0] in gone])

    def _read_faults(self, probes: Any, calls: dict[str, Any]) -> None:
        now = self.clock()
        dt = now - self._last_step if self._last_step is not None else 0.0
        self._last_step = now
        counts = probes.faults(self.call_ids.values())
        for cid, gid in self.call_ids.items():
            f = counts.get(gid)
            view = fault_view(self.faults.get(cid), f.count if f else 0, f.peak_10ms if f else 0,
                              dt)
            self.faults[cid] = view
            call = calls.get(cid)
            if call is not None:
                call.extra["faults"] = view

    def _on_kill(self, kill: dict[str, Any]) -> None:
        boxes = [(rec["id"], rec.get("sandbox") or rec["id"], rec["cgroup"])
                 for rec in records.containers(self.state_dir) if rec.get("cgroup")]
        row = self.ids.get(kill["cgroup_id"])
        owner = (Owner(row[2], row[1], row[0]) if row else
                 attribute(kill["cgroup"], list(self.ids.values()), boxes))
        entry = {"call": owner.call, "sandbox": owner.sandbox, "container": owner.container,
                 **kill}
        self.kills_total += 1
        self.kills_by_sandbox[owner.sandbox or "(host)"] += 1
        self.recent.append(entry)
        log.warning("OOM kill: pid %d (%s) in %s -> sandbox %s call %s (anon rss %d kB)",
                    kill["pid"], kill["comm"], kill["cgroup"], owner.sandbox, owner.call,
                    kill["anon_rss_kb"])
        self.events.publish("oom_kill", **entry)
        if self.record_path:
            try:
                os.makedirs(os.path.dirname(self.record_path), exist_ok=True)
                with open(self.record_path, "a") as f:
                    f.write(json.dumps(entry, separators=(",", ":")) + "\n")
            except OSError as e:
                log.warning("oom record %s: %s", self.record_path, e)

    # -- views ---------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        st = self.runner.status if self.runner is not None else None
        return {
            "mode": self.mode,
            "state": st.state if st else "off",
            "reason": st.reason if st else "off by config",
            "load_s": None if st is None or st.load_s is None else round(st.load_s, 1),
            "features": dict(st.features) if st else {},
            "oom_kills": self.kills_total,
            "oom_kills_by_sandbox": dict(self.kills_by_sandbox),
            "recent_oom_kills": list(self.recent),
            "faults": dict(self.faults),
        }
