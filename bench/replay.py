#!/usr/bin/env python3
"""Trace-replay benchmark: the same agent tasks, on the same arrival schedule, under each scheme.

Each task gets its own sandbox (`docker run -d --runtime R --cgroup-parent SLICE`) when it
starts; LLM waits are sleeps here; tool calls are `docker exec [-e AGENT_RESOURCE_HINT=…] CID
memload …`, sequential within a task and concurrent across tasks. The slice's memory.max is the
memory budget; a call OOM-killed at its boundary (exit 137) restarts the task from scratch in a
fresh sandbox, up to metrics.RETRY_LIMIT retries, and the retries count in its latency.

    python3 -m bench.replay run --schemes eager,static,execgate --tasks 8 --seed 1 --speed 20 \\
        --mem-scale 8 --budget 768m --out DIR
    python3 -m bench.replay sweep --tasks 12 --oversub 2,4,8.6 --out DIR
    python3 -m bench.replay demo --out DIR        # a few minutes: eager vs execgate
    python3 -m bench.replay plan --tasks 8 ...     # what a run would replay (no Docker)

Needs root, Docker on cgroup v2 with execgate installed (runtime `execgate`, execgated under
systemd) and an image with /bin/memload (tests/vm/guest-run.sh builds execgate-test:latest).
It edits /etc/execgate/config.toml and restarts execgated per scheme, and restores both at exit.
Writes DIR/results.json (raw), DIR/report.md and DIR/replayed.jsonl; plots come from
`bench/report.py DIR/results.json` on a host with matplotlib. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import report
from bench.generate import generate
from bench.metrics import RETRY_LIMIT, AttemptRecord, percentile, should_retry, summarize
from bench.schemes import (
    ARRIVALS,
    DEFAULT_SCHEMES,
    DEFAULT_STATIC_K,
    MiB,
    Scheme,
    Workload,
    admit_fifo,
    arrival_schedule,
    bench_config,
    budget_for_oversubscription,
    eager_peak_estimate,
    exec_argv,
    hint_for,
    make_gate,
    oversubscription,
    parse_schemes,
    prepare,
    sandbox_command,
    slice_path,
    toml_dumps,
)
from bench.trace import LlmWait, Task, ToolCall, load_tasks, profiled_peak, save_tasks
from execgate.common.hints import parse_size

RESULTS_FORMAT = "execgate-bench-results/1"
LABEL = "bench"
CONFIG = "/etc/execgate/config.toml"
OOM_EXIT = 137


class BenchError(RuntimeError):
    """The host is not in a state the benchmark can run on (message says what to fix)."""


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class Log:
    """Progress on stdout (one line per task event / scheme), mirrored to DIR/progress.log."""

    def __init__(self, path: Path | None, quiet: bool = False) -> None:
        self.quiet = quiet
        self.lock = threading.Lock()
        self.file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115

    def __call__(self, line: str, *, event: bool = False) -> None:
        with self.lock:
            if self.file:
                self.file.write(line + "\n")
                self.file.flush()
            if not (event and self.quiet):
                print(line, flush=True)

    def close(self) -> None:
        if self.file:
            self.file.close()


# ---------------------------------------------------------------------------------------------
# Host side effects: Docker, the slice, execgate's config and daemon


def _run(argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return subprocess.CompletedProcess(list(argv), 124, out, f"timed out after {timeout}s")
    except FileNotFoundError as e:
        return subprocess.CompletedProcess(list(argv), 127, "", str(e))


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _write(path: str, value: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(value)
        return True
    except OSError:
        return False


def _oom_kill_count(cgroup: str) -> int:
    """memory.events' oom_kill (hierarchical: every OOM kill inside the slice)."""
    for line in (_read(os.path.join(cgroup, "memory.events")) or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


class Host:
    """Owns everything the benchmark changes on the host, and puts it back in `restore()`."""

    def __init__(self, slice_name: str, image: str, config_path: str, log: Log) -> None:
        self.slice = slice_name
        self.cgroup = slice_path(slice_name)
        self.image = image
        self.config_path = config_path
        self.log = log
        self.original_config: bytes | None = None
        self.daemon_was_active: bool | None = None
        self.anchor: str | None = None
        self.restored = False

    # -- checks --------------------------------------------------------------------------------

    def check(self, schemes: Sequence[Scheme]) -> None:
        if os.geteuid() != 0:
            raise BenchError("must run as root (it writes the slice's memory.max and the config)")
        if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            raise BenchError("needs cgroup v2 at /sys/fs/cgroup")
        p = _run(["docker", "info", "--format", "{{json .Runtimes}}"], timeout=60)
        if p.returncode:
            raise BenchError(f"docker is not usable: {p.stderr.strip()}")
        runtimes = set(json.loads(p.stdout or "{}"))
        missing = {s.runtime for s in schemes} - runtimes
        if missing:
            raise BenchError(f"docker runtime(s) {', '.join(sorted(missing))} not registered "
                             "(install execgate with install.sh)")
        if _run(["docker", "image", "inspect", self.image], timeout=60).returncode:
            raise BenchError(f"image {self.image} not found (it needs /bin/memload)")
        if any(s.daemon or s.runtime == "execgate" for s in schemes):
            if not os.path.exists(self.config_path):
                raise BenchError(f"{self.config_path} not found")
            if _run(["systemctl", "cat", "execgated"], timeout=30).returncode:
                raise BenchError("execgated is not a systemd unit on this host")

    # -- config and daemon ---------------------------------------------------------------------

    def save_state(self) -> None:
        try:
            with open(self.config_path, "rb") as f:
                self.original_config = f.read()
        except FileNotFoundError:
            self.original_config = None
        p = _run(["systemctl", "is-active", "execgated"], timeout=30)
        self.daemon_was_active = p.stdout.strip() == "active"

    @property
    def state_dir(self) -> str:
        """execgate's state directory (its per-container records live there)."""
        v = self.original_toml().get("state_dir")
        return v if isinstance(v, str) and v else "/run/execgate"

    def execgate_record(self, cid: str) -> dict[str, Any] | None:
        """execgate's record of a container: did it get per-exec cgroups, and if not, why."""
        try:
            with open(os.path.join(self.state_dir, "containers", cid + ".json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def original_toml(self) -> dict[str, Any]:
        if not self.original_config:
            return {}
        try:
            return tomllib.loads(self.original_config.decode())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise BenchError(f"{self.config_path} is not valid TOML ({e}); fix it first") from e

    def write_config(self, data: dict[str, Any]) -> None:
        text = toml_dumps(data)
        tomllib.loads(text)  # never leave a config the runtime cannot read
        tmp = self.config_path + ".bench-tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("# written by bench/replay.py for one scheme; restored when it exits\n" + text)
        os.replace(tmp, self.config_path)

    def daemon(self, run: bool, domain: str | None = None, timeout: float = 120) -> str:
        """Stop execgated, or (re)start it and wait until it answers; returns its domain."""
        if not run:
            _run(["systemctl", "stop", "execgated"], timeout=120)
            return ""
        p = _run(["systemctl", "restart", "execgated"], timeout=180)
        if p.returncode:
            raise BenchError(f"systemctl restart execgated failed: {p.stderr.strip()}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = _run(["execgatectl", "status", "--json"], timeout=60)
            if s.returncode == 0:
                try:
                    snap = json.loads(s.stdout)
                except json.JSONDecodeError:
                    snap = {}
                if str(snap.get("source", "")).startswith("execgated pid"):
                    got = str((snap.get("daemon") or {}).get("domain", ""))
                    if domain and got != f"cgroup {domain}":
                        self.log(f"warning: execgated reports domain {got!r}, not {domain}")
                    return got
            time.sleep(0.5)
        raise BenchError("execgated did not answer after restart (journalctl -u execgated)")

    # -- the slice -----------------------------------------------------------------------------

    def docker(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return _run(["docker", *args], timeout=timeout)

    def exec(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """One tool call's `docker exec` (a seam: tests replace the host)."""
        return _run(argv, timeout=timeout)

    def cleanup_containers(self) -> None:
        p = self.docker("ps", "-aq", "--filter", f"label={LABEL}")
        ids = p.stdout.split()
        if ids:
            self.docker("rm", "-f", *ids, timeout=300)

    def open_slice(self, budget: int) -> None:
        """An idle anchor container keeps the slice alive between sandboxes; then the budget."""
        p = self.docker("run", "-d", "--runtime", "runc", "--cgroup-parent", self.slice,
                        "--label", f"{LABEL}=anchor", self.image, "sleep", "inf")
        if p.returncode:
            raise BenchError(f"cannot start a container in {self.slice}: {p.stderr.strip()}")
        self.anchor = p.stdout.strip()
        if not os.path.isdir(self.cgroup):
            raise BenchError(f"{self.cgroup} did not appear (is Docker's cgroup driver systemd?)")
        self.set_budget(budget)

    def set_budget(self, budget: int) -> None:
        if not _write(os.path.join(self.cgroup, "memory.max"), str(budget)):
            raise BenchError(f"cannot write {self.cgroup}/memory.max")
        # No swap: pages beyond the budget are an OOM kill, as in the published measurements.
        _write(os.path.join(self.cgroup, "memory.swap.max"), "0")

    def budget_ok(self, budget: int) -> bool:
        return _read(os.path.join(self.cgroup, "memory.max")) == str(budget)

    def memory_current(self) -> int | None:
        v = _read(os.path.join(self.cgroup, "memory.current"))
        return int(v) if v and v.isdigit() else None

    def close_slice(self) -> None:
        self.cleanup_containers()
        self.anchor = None

    # -- restore ---------------------------------------------------------------------------------

    def restore(self) -> None:
        if self.restored:
            return
        self.restored = True
        self.cleanup_containers()
        if self.original_config is not None:
            tmp = self.config_path + ".bench-tmp"
            with open(tmp, "wb") as f:
                f.write(self.original_config)
            os.replace(tmp, self.config_path)
        if self.daemon_was_active is True:
            _run(["systemctl", "restart", "execgated"], timeout=180)
        elif self.daemon_was_active is False:
            _run(["systemctl", "stop", "execgated"], timeout=120)


# ---------------------------------------------------------------------------------------------
# One scheme on one set of tasks


@dataclass
class RunSettings:
    """Knobs of the replay that are not the workload's."""

    sample_s: float = 0.15  # memory sampling period
    exec_timeout_s: float = 900.0  # a docker exec that hangs longer fails its attempt
    admission_wait_s: float | None = None  # daemon's max_admission_wait_s (None: as configured)
    scale_daemon: bool = True  # scale the daemon's byte tunables with --mem-scale
    retry_limit: int = RETRY_LIMIT


@dataclass
class _TaskState:
    task: Task
    arrival: float  # wall seconds after t0
    demand: int
    started: float | None = None
    finished: float | None = None
    ok: bool = False
    attempts: list[dict[str, Any]] = field(default_factory=list)


class Replayer:
    """Replays prepared tasks under one scheme; `run()` returns the raw record of the run."""

    def __init__(self, host: Host, scheme: Scheme, tasks: Sequence[Task],
                 arrivals_wall: Sequence[float], budget: int, settings: RunSettings,
                 log: Log) -> None:
        self.host = host
        self.scheme = scheme
        self.budget = budget
        self.settings = settings
        self.log = log
        self.states = {t.id: _TaskState(t, a, profiled_peak(t))
                       for t, a in zip(tasks, arrivals_wall, strict=True)}
        self.gate = make_gate(scheme, budget)
        self.cond = threading.Condition()
        self.abort = threading.Event()
        self.t0 = 0.0
        self.running = 0
        self.inflight = 0
        self.queued = 0
        self.calls: list[dict[str, Any]] = []
        self.samples: list[tuple[float, int, int, int, int]] = []
        self.notes: list[str] = []
        self.containers: list[str] = []
        self.unmanaged: dict[str, str] = {}  # execgate sandboxes left as plain runc, and why

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _event(self, text: str) -> None:
        self.log(f"[{self.scheme.name:<16} {self.now():7.1f}s] {text}", event=True)

    # -- sampling --------------------------------------------------------------------------------

    def _sampler(self, stop: threading.Event) -> None:
        last_check = 0.0
        while True:
            cur = self.host.memory_current()
            t = self.now()
            if cur is not None:
                self.samples.append((round(t, 3), cur, self.running, self.inflight, self.queued))
            if t - last_check > 1.0:  # systemd may re-apply the slice's properties
                last_check = t
                if not self.host.budget_ok(self.budget):
                    self.host.set_budget(self.budget)
                    self.notes.append(f"memory.max of the slice was reset at {t:.1f}s; rewritten")
            if stop.wait(self.settings.sample_s):
                return

    # -- tasks -------------------------------------------------------------------------------------

    def _sandbox(self, task: Task) -> tuple[str | None, str]:
        p = self.host.docker(
            "run", "-d", "--runtime", self.scheme.runtime, "--cgroup-parent", self.host.slice,
            "--label", f"{LABEL}={self.scheme.name}", "--shm-size", str(max(self.budget, 64 * MiB)),
            self.host.image, *sandbox_command(task), timeout=300)
        cid = p.stdout.strip()
        if cid:
            with self.cond:
                self.containers.append(cid)
        if p.returncode or not cid:
            if cid:
                self.host.docker("rm", "-f", cid)
            return None, (p.stderr.strip() or f"docker run exit {p.returncode}")[-300:]
        if self.scheme.runtime == "execgate":
            # execgate fails open: a sandbox it could not prepare runs as plain runc, which
            # would silently turn this scheme into eager. Record it; the report says so.
            rec = self.host.execgate_record(cid)
            if not rec or not (rec.get("managed") and rec.get("prepared")):
                reason = (rec or {}).get("reason") or ("no record" if not rec else "not prepared")
                with self.cond:
                    self.unmanaged[cid] = str(reason)
                self._event(f"{task.id}: sandbox {cid[:12]} NOT managed by execgate ({reason})")
        return cid, ""

    def _sandbox_oom_killed(self, cid: str) -> bool:
        """Whether the sandbox itself died of an OOM kill (its init was the victim)."""
        p = self.host.docker("inspect", "-f", "{{.State.Running}} {{.State.OOMKilled}}", cid)
        return p.returncode == 0 and p.stdout.split() == ["false", "true"]

    def _call(self, cid: str, st: _TaskState, attempt: int, idx: int, call: ToolCall) -> int:
        argv = exec_argv(cid, call, self.scheme.hints)
        with self.cond:
            self.inflight += 1
        start = self.now()
        p = self.host.exec(argv, timeout=self.settings.exec_timeout_s)
        end = self.now()
        with self.cond:
            self.inflight -= 1
            self.calls.append({
                "task": st.task.id, "attempt": attempt, "call": idx, "start": round(start, 3),
                "end": round(end, 3), "duration_s": call.duration_s, "exit": p.returncode,
                "peak_bytes": call.memory.peak_bytes, "category": call.category,
                "hint": hint_for(call) if self.scheme.hints else None,
                "stderr": p.stderr.strip()[-200:] if p.returncode else "",
            })
        return p.returncode

    def _attempt(self, st: _TaskState, n: int) -> dict[str, Any]:
        task = st.task
        start = self.now()
        n_calls = len(task.tool_calls)
        cid, err = self._sandbox(task)
        rec: dict[str, Any] = {"task_id": task.id, "attempt": n, "start": round(start, 3),
                               "ok": False, "oom_kills": 0, "calls_done": 0,
                               "calls_total": n_calls, "reason": "", "exit": None}
        if cid is None:
            rec.update(end=round(self.now(), 3), reason="sandbox", detail=err)
            return rec
        if self.scheme.runtime == "execgate":
            rec["sandbox_managed"] = cid not in self.unmanaged
        try:
            idx = 0
            for step in task.steps:
                if self.abort.is_set():
                    rec.update(end=round(self.now(), 3), reason="aborted")
                    return rec
                if isinstance(step, LlmWait):
                    self.abort.wait(step.duration_s)
                    continue
                idx += 1
                rc = self._call(cid, st, n, idx, step)
                if rc == 0:
                    rec["calls_done"] = idx
                    continue
                end = round(self.now(), 3)
                oom = rc == OOM_EXIT
                reason = "oom" if oom else f"exit {rc}"
                if not oom and self._sandbox_oom_killed(cid):
                    oom, reason = True, "sandbox-oom"
                rec.update(end=end, exit=rc, oom_kills=int(oom), reason=reason)
                return rec
            rec.update(end=round(self.now(), 3), ok=True)
            return rec
        finally:
            self.host.docker("rm", "-f", cid, timeout=300)

    def _task(self, st: _TaskState) -> None:
        try:
            for n in range(1, self.settings.retry_limit + 2):
                rec = self._attempt(st, n)
                st.attempts.append(rec)
                record = _record(rec)
                if rec["ok"]:
                    st.ok = True
                    self._event(f"{st.task.id} done in {rec['end'] - st.arrival:.1f}s "
                                f"({n} attempt{'s' * (n > 1)})")
                    break
                what = (f"{st.task.id} #{n} failed at call {rec['calls_done'] + 1}/"
                        f"{rec['calls_total']}: {rec['reason']}")
                if self.abort.is_set() or not should_retry(record, self.settings.retry_limit):
                    self._event(what + " -> gave up")
                    break
                self._event(what + " -> retry from the start")
        except Exception as e:  # noqa: BLE001 - a broken task must not hang the whole run
            self.notes.append(f"{st.task.id}: runner error {e!r}")
            self._event(f"{st.task.id} runner error {e!r}")
        finally:
            with self.cond:
                st.finished = self.now()
                self.gate.release(st.task.id)
                self.running -= 1
                self.cond.notify_all()

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        order = sorted(self.states.values(), key=lambda s: s.arrival)
        pending = deque(order)
        queue: deque[tuple[str, int]] = deque()
        threads: list[threading.Thread] = []
        stop = threading.Event()
        self.t0 = time.monotonic()
        sampler = threading.Thread(target=self._sampler, args=(stop,), daemon=True)
        sampler.start()
        try:
            with self.cond:
                while pending or queue or self.running:
                    if self.abort.is_set() and not self.running:
                        break
                    now = self.now()
                    while pending and pending[0].arrival <= now and not self.abort.is_set():
                        st = pending.popleft()
                        queue.append((st.task.id, st.demand))
                    for tid in admit_fifo(queue, self.gate) if not self.abort.is_set() else []:
                        st = self.states[tid]
                        st.started = self.now()
                        self.running += 1
                        wait = st.started - st.arrival
                        self._event(f"{tid} start (peak {st.demand / MiB:.0f} MiB"
                                    + (f", queued {wait:.1f}s" if wait > 0.5 else "")
                                    + f"; running {self.running}, queued {len(queue)})")
                        t = threading.Thread(target=self._task, args=(st,), daemon=True)
                        threads.append(t)
                        t.start()
                    self.queued = len(queue)
                    if self.abort.is_set():
                        pending.clear()
                        queue.clear()
                    timeout = (pending[0].arrival - self.now()) if pending else 5.0
                    self.cond.wait(max(0.01, min(timeout, 5.0)))
            for t in threads:
                t.join()
        finally:
            stop.set()
            sampler.join()
        return self._result()

    def _result(self) -> dict[str, Any]:
        records = [_record(a) for st in self.states.values() for a in st.attempts]
        tasks = [st.task for st in self.states.values()]
        speed = float(tasks[0].metadata.get("speed", 1.0)) if tasks else 1.0
        metrics = summarize(records, [(t, float(b)) for t, b, *_ in self.samples], self.budget,
                            tasks, speed=speed)
        done = [st for st in self.states.values() if st.ok]
        e2e = [max(a["end"] for a in st.attempts) - st.arrival for st in done]
        queued = [st.started - st.arrival for st in self.states.values() if st.started is not None]
        delays = [c["end"] - c["start"] - c["duration_s"] for c in self.calls if c["exit"] == 0]
        metrics.update({
            # Latency from arrival (summarize's starts at the first attempt, which hides the
            # queueing of static-K and reserve).
            "latency_arrival_p50_s": percentile(e2e, 50),
            "latency_arrival_p95_s": percentile(e2e, 95),
            "latency_arrival_p50_trace_s": percentile(e2e, 50) * speed,
            "latency_arrival_p95_trace_s": percentile(e2e, 95) * speed,
            "queue_wait_p50_s": percentile(queued, 50),
            "queue_wait_max_s": max(queued, default=math.nan),
            "tool_calls": len(self.calls),
            "call_delay_p50_s": percentile(delays, 50),
            "call_delay_p95_s": percentile(delays, 95),
            "sandboxes": len(self.containers),
            "sandboxes_unmanaged": len(self.unmanaged),
        })
        if self.unmanaged:
            reasons = sorted(set(self.unmanaged.values()))
            self.notes.append(
                f"{len(self.unmanaged)} of {len(self.containers)} sandboxes were not managed by "
                f"execgate (their calls ran as with plain runc): {'; '.join(reasons)[:500]}")
        return {
            "scheme": self.scheme.name,
            "family": self.scheme.family,
            "k": self.scheme.k,
            "scheme_def": self.scheme.to_dict(),
            "metrics": metrics,
            "tasks": [{"id": st.task.id, "arrival_s": round(st.arrival, 3),
                       "start_s": None if st.started is None else round(st.started, 3),
                       "end_s": None if st.finished is None else round(st.finished, 3),
                       "ok": st.ok, "attempts": len(st.attempts),
                       "profiled_peak_bytes": st.demand, "tool_calls": len(st.task.tool_calls),
                       "trace_duration_s": st.task.duration_s}
                      for st in self.states.values()],
            "attempts": [a for st in self.states.values() for a in st.attempts],
            "calls": sorted(self.calls, key=lambda c: c["start"]),
            "samples": {"columns": ["t", "memory_bytes", "running_tasks", "inflight_calls",
                                    "queued_tasks"], "rows": self.samples},
            "notes": self.notes,
        }


def _record(a: dict[str, Any]) -> AttemptRecord:
    return AttemptRecord(a["task_id"], a["attempt"], a["start"], max(a["end"], a["start"]),
                         a["ok"], a["oom_kills"])


def _journal_stats(path: str, offset: int, containers: set[str]) -> dict[str, Any]:
    """Admission waits and OOM kills of this run's calls, from execgate's journal."""
    waits: list[float] = []
    entries = managed = oom = 0
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("container") not in containers:
                    continue
                entries += 1
                managed += bool(e.get("managed"))
                oom += bool(e.get("oom_killed"))
                if isinstance(e.get("waited_s"), int | float):
                    waits.append(float(e["waited_s"]))
    except OSError:
        return {}
    return {"journal_calls": entries, "journal_calls_admitted": managed,
            "journal_oom_killed": oom,
            "admission_wait_p50_s": percentile(waits, 50),
            "admission_wait_p95_s": percentile(waits, 95),
            "admission_wait_max_s": max(waits, default=math.nan)}


def _journal_path(cfg: dict[str, Any]) -> str:
    j = cfg.get("journal")
    return j if isinstance(j, str) and j else "/var/lib/execgate/calls.jsonl"


def run_scheme(host: Host, scheme: Scheme, tasks: Sequence[Task], arrivals_wall: Sequence[float],
               budget: int, workload: Workload, settings: RunSettings, log: Log,
               abort: threading.Event) -> dict[str, Any]:
    """Set the host up for `scheme`, replay, tear down; returns the run's raw record."""
    original = host.original_toml()
    host.cleanup_containers()
    cfg = bench_config(original, scheme, domain=host.cgroup, mem_scale=workload.mem_scale,
                       admission_wait_s=settings.admission_wait_s,
                       scale_daemon=settings.scale_daemon)
    uses_execgate = scheme.runtime == "execgate" or scheme.daemon
    if uses_execgate:
        host.write_config(cfg)
    t_setup = time.monotonic()
    host.open_slice(budget)
    try:
        # The daemon runs only for the schemes that have it (no stray CPU for the others).
        domain = host.daemon(scheme.daemon, host.cgroup)
        journal = _journal_path(original)
        try:
            offset = os.path.getsize(journal)
        except OSError:
            offset = 0
        oom_before = _oom_kill_count(host.cgroup)
        log(f"== {scheme.name}: {scheme.description}; budget {budget / MiB:.0f} MiB, "
            f"{len(tasks)} tasks (setup {time.monotonic() - t_setup:.0f}s)")
        rep = Replayer(host, scheme, tasks, arrivals_wall, budget, settings, log)
        rep.abort = abort
        result = rep.run()
        result["metrics"]["kernel_oom_kills"] = _oom_kill_count(host.cgroup) - oom_before
        result["metrics"].update(_journal_stats(journal, offset, set(rep.containers)))
        result["daemon_domain"] = domain
        result["config"] = cfg if uses_execgate else None
    finally:
        host.close_slice()
    m = result["metrics"]
    log(f"== {scheme.name}: {m['tasks_completed']}/{m['tasks_total']} tasks, makespan "
        f"{m['makespan_s']:.1f}s ({m['makespan_trace_s']:.0f}s trace), P50 "
        f"{m['latency_arrival_p50_s']:.1f}s, OOM kills {m['oom_kills']}, failed attempts "
        f"{m['failed_attempts']}/{m['attempts']}, peak mem {m['mem_peak_util']:.0%}"
        + (f"; WARNING: {m['sandboxes_unmanaged']} sandboxes unmanaged"
           if m.get("sandboxes_unmanaged") else ""))
    return result


# ---------------------------------------------------------------------------------------------
# Points, sweeps and the CLI


@dataclass(frozen=True)
class Point:
    """One offered load: tasks (already prepared) and a budget."""

    label: str
    tasks: tuple[Task, ...]
    budget: int
    arrivals_trace: tuple[float, ...]

    def describe(self, speed: float) -> dict[str, Any]:
        return {"label": self.label, "n_tasks": len(self.tasks), "budget_bytes": self.budget,
                "oversubscription": oversubscription(self.tasks, self.budget),
                "arrivals_trace_s": list(self.arrivals_trace),
                "arrivals_wall_s": [a / speed for a in self.arrivals_trace],
                "max_task_peak_bytes": max((profiled_peak(t) for t in self.tasks), default=0)}


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _workload(args: argparse.Namespace) -> Workload:
    return Workload(speed=args.speed, mem_scale=args.mem_scale, cpu_scale=args.cpu_scale,
                    fold_bytes=int(args.fold_mib * MiB), max_calls=args.max_calls or None,
                    idle_scale=args.idle_scale)


def _source_tasks(args: argparse.Namespace, n: int) -> list[Task]:
    if args.trace:
        tasks = load_tasks(args.trace)
        if n > len(tasks):
            raise BenchError(f"{args.trace} has {len(tasks)} tasks, {n} asked")
        return tasks[:n]
    return generate(n, args.seed)


def build_points(args: argparse.Namespace) -> list[Point]:
    """The loads to measure: --task-counts x --budgets, or --oversub ratios at --tasks."""
    w = _workload(args)
    seed = args.seed
    counts = _ints(args.task_counts) if getattr(args, "task_counts", None) else [args.tasks]
    points: list[Point] = []
    for n in counts:
        tasks = tuple(prepare(_source_tasks(args, n), w))
        arrivals = tuple(arrival_schedule(n, seed, args.arrival, args.mean_gap))
        biggest = max((profiled_peak(t) for t in tasks), default=MiB)
        if getattr(args, "oversub", None):
            for ratio in _floats(args.oversub):
                b = budget_for_oversubscription(tasks, ratio, floor_bytes=int(biggest * 1.1))
                got = oversubscription(tasks, b)
                name = f"{n} tasks, x{ratio:g}"
                if got < ratio * 0.98:  # the budget cannot go below the largest task
                    name += f" (capped at x{got:.2f}: largest task {biggest / MiB:.0f} MiB)"
                points.append(Point(name, tasks, b, arrivals))
        else:
            budgets = [parse_size(b) for b in args.budgets.split(",")] if getattr(
                args, "budgets", None) else [parse_size(args.budget)]
            for b in budgets:
                points.append(Point(f"{n} tasks, {b / MiB:.0f} MiB", tasks, b, arrivals))
    return sorted(points, key=lambda p: oversubscription(p.tasks, p.budget))


def _plan(points: Sequence[Point], schemes: Sequence[Scheme], w: Workload) -> None:
    print(f"schemes: {', '.join(s.name for s in schemes)}")
    print(f"workload: speed {w.speed:g}x, memory /{w.mem_scale:g}, cpu x{w.cpu_scale:g}, "
          f"fold < {w.fold_bytes / MiB:g} MiB, max calls {w.max_calls or 'all'}, "
          f"idle x{w.idle_scale:g}")
    for p in points:
        wall = [a / w.speed for a in p.arrivals_trace]
        est = eager_peak_estimate(p.tasks, wall)
        calls = sum(len(t.tool_calls) for t in p.tasks)
        print(f"\n{p.label}: budget {p.budget / MiB:.0f} MiB, oversubscription "
              f"{oversubscription(p.tasks, p.budget):.2f}x, {calls} tool calls, eager would "
              f"peak at {est / MiB:.0f} MiB ({est / p.budget:.0%} of the budget, no overheads)")
        for t, a in zip(p.tasks, wall, strict=True):
            print(f"  {t.id}  arrives {a:6.1f}s  {t.duration_s:6.1f}s  {len(t.tool_calls):3d} calls"
                  f"  peak {profiled_peak(t) / MiB:6.1f} MiB  baseline "
                  f"{t.baseline_bytes / MiB:5.1f} MiB")


def execute(args: argparse.Namespace, points: Sequence[Point], command: str) -> dict[str, Any]:
    """Run every scheme on every point; results are saved after each run."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    w = _workload(args)
    max_n = max(len(p.tasks) for p in points)
    schemes = parse_schemes(args.schemes, _ints(args.static_k), max_n)
    settings = RunSettings(sample_s=args.sample_ms / 1000, admission_wait_s=args.admission_wait,
                           scale_daemon=not args.no_scale_daemon)
    log = Log(out / "progress.log", quiet=args.quiet)
    host = Host(args.slice, args.image, args.config, log)
    host.check(schemes)
    save_tasks(max(points, key=lambda p: len(p.tasks)).tasks, out / "replayed.jsonl")
    results: dict[str, Any] = {
        "format": RESULTS_FORMAT, "command": command, "created": _now_iso(),
        "host": {"kernel": platform.release(), "cpus": os.cpu_count(),
                 "python": platform.python_version()},
        "params": {"seed": args.seed, "trace": args.trace, "arrival": args.arrival,
                   "mean_gap_trace_s": args.mean_gap, "slice": args.slice, "image": args.image,
                   "schemes": [s.name for s in schemes], "retry_limit": RETRY_LIMIT,
                   "workload": w.to_dict(), "settings": settings.__dict__.copy()},
        "points": [p.describe(w.speed) for p in points],
        "runs": [],
    }
    abort = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log(f"signal {signum}: stopping after the running calls, then restoring the host")
        abort.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    host.save_state()
    t_start = time.monotonic()
    only = set(_ints(args.points)) if getattr(args, "points", None) else None
    try:
        for i, p in enumerate(points):
            if only is not None and i + 1 not in only:
                continue
            log(f"### point {i + 1}/{len(points)}: {p.label} (budget {p.budget / MiB:.0f} MiB, "
                f"oversubscription {oversubscription(p.tasks, p.budget):.2f}x)")
            wall = [a / w.speed for a in p.arrivals_trace]
            for s in schemes:
                if s.k is not None and s.k > len(p.tasks):
                    continue
                if abort.is_set():
                    break
                r = run_scheme(host, s, p.tasks, wall, p.budget, w, settings, log, abort)
                r["point"] = i
                results["runs"].append(r)
                results["elapsed_s"] = time.monotonic() - t_start
                _save(out / "results.json", results)
    finally:
        host.restore()
        for s, h in old.items():
            signal.signal(s, h)
        results["elapsed_s"] = time.monotonic() - t_start
        results["aborted"] = abort.is_set()
        _save(out / "results.json", results)
        md = report.markdown(results)
        (out / "report.md").write_text(md, encoding="utf-8")
        log.close()
    print()
    # The demo's reader gets the compact table (report.md has the full one).
    print(report.text_table(results) if args.command == "demo" else md)
    return results


def _save(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=_json_default), encoding="utf-8")
    os.replace(tmp, path)


def _json_default(o: Any) -> Any:
    if isinstance(o, tuple | set):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


# The demo: a burst of five sandboxes into a 384 MiB slice. Five generated tasks (seed 13), memory
# /6, each cut to its three heaviest tool calls with the think time between them shrunk 20x, then
# replayed 2x faster: 15 calls of 1-20 s, sum of task peaks 1.7x the budget, and eager would need
# 153 % of it if nothing were slowed down (`plan` with these values shows it). Under TCG a call's
# admission wait is bounded at 300 s (the default 30 s is ~10x more in emulated time).
DEMO = {"tasks": 5, "seed": 13, "speed": 2.0, "mem_scale": 6.0, "cpu_scale": 0.0,
        "fold_mib": 0.0, "max_calls": 3, "idle_scale": 0.05, "budget": "384m",
        "arrival": "burst", "mean_gap": 0.0, "schemes": "eager,execgate", "admission_wait": 300.0}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bench/replay.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, demo: bool = False) -> None:
        d = DEMO if demo else {}
        g = p.add_argument_group("workload")
        g.add_argument("--tasks", type=int, default=d.get("tasks", 8), help="tasks per point")
        g.add_argument("--seed", default=str(d.get("seed", 1)),
                       help="traces and arrivals (same seed, same run)")
        g.add_argument("--trace", help="replay this JSONL (bench/TRACE_FORMAT.md) instead of "
                                       "generating")
        g.add_argument("--speed", type=float, default=d.get("speed", 20.0),
                       help="time compression (default %(default)s)")
        g.add_argument("--mem-scale", type=float, default=d.get("mem_scale", 8.0),
                       help="divide all bytes by this (default %(default)s)")
        g.add_argument("--cpu-scale", type=float, default=d.get("cpu_scale", 0.25),
                       help="multiply memload's CPU share (default %(default)s)")
        g.add_argument("--fold-mib", type=float, default=d.get("fold_mib", 0.0),
                       help="replay calls peaking below this (scaled MiB) as idle time")
        g.add_argument("--max-calls", type=int, default=d.get("max_calls", 0),
                       help="keep only each task's N heaviest calls (0: all)")
        g.add_argument("--idle-scale", type=float, default=d.get("idle_scale", 1.0),
                       help="multiply idle time (LLM waits, folded calls) by this")
        g.add_argument("--arrival", choices=ARRIVALS, default=d.get("arrival", "poisson"))
        g.add_argument("--mean-gap", type=float, default=d.get("mean_gap", 30.0),
                       help="mean gap between arrivals, trace seconds (default %(default)s)")
        g.add_argument("--budget", default=d.get("budget", "768m"),
                       help="memory budget = the slice's memory.max (default %(default)s)")
        s = p.add_argument_group("schemes and host")
        s.add_argument("--schemes", default=d.get("schemes", DEFAULT_SCHEMES),
                       help="comma-separated (default %(default)s); static = sweep --static-k")
        s.add_argument("--static-k", default=",".join(map(str, DEFAULT_STATIC_K)))
        s.add_argument("--admission-wait", type=float, default=d.get("admission_wait"),
                       help="execgated's max_admission_wait_s during the run (default: as "
                            "configured)")
        s.add_argument("--no-scale-daemon", action="store_true",
                       help="don't divide execgated's byte tunables by --mem-scale")
        s.add_argument("--slice", default="egbench.slice")
        s.add_argument("--image", default=os.environ.get("EXECGATE_BENCH_IMAGE",
                                                         "execgate-test:latest"))
        s.add_argument("--config", default=CONFIG)
        s.add_argument("--sample-ms", type=float, default=150.0)
        s.add_argument("--quiet", action="store_true", help="one line per scheme only")
        if p.prog.split()[-1] != "plan":
            s.add_argument("--out", help="results directory (required unless --dry-run)")
            s.add_argument("--dry-run", action="store_true",
                           help="print what would be replayed and exit (no Docker)")

    common(sub.add_parser("run", help="one load, every scheme"))
    sw = sub.add_parser("sweep", help="several loads (task counts x budgets, or oversubscription)")
    common(sw)
    sw.add_argument("--task-counts", help="e.g. 4,8,16 (instead of --tasks)")
    sw.add_argument("--budgets", help="e.g. 1g,768m,512m (instead of --budget)")
    sw.add_argument("--oversub", help="e.g. 2,4,8.6: budget = sum of task peaks / ratio")
    sw.add_argument("--points", help="run only these loads (1-based, in oversubscription "
                    "order), e.g. to finish a sweep in another boot: every load is still "
                    "described, so bench/report.py merges the parts")
    common(sub.add_parser("demo", help="a few minutes: a burst on a small budget, eager vs "
                                       "execgate"), demo=True)
    pl = sub.add_parser("plan", help="print what would be replayed (no Docker)")
    common(pl)
    pl.add_argument("--task-counts")
    pl.add_argument("--budgets")
    pl.add_argument("--oversub")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    dry = args.command == "plan" or args.dry_run
    if not dry and not args.out:
        ap.error("--out is required")
    args.seed = int(args.seed) if args.seed.lstrip("-").isdigit() else args.seed
    try:
        points = build_points(args)
        if dry:
            n = max(len(p.tasks) for p in points)
            _plan(points, parse_schemes(args.schemes, _ints(args.static_k), n), _workload(args))
            return 0
        cmd = "bench/replay.py " + " ".join(sys.argv[1:] if argv is None else argv)
        results = execute(args, points, cmd)
    except (BenchError, ValueError) as e:
        print(f"replay: {e}", file=sys.stderr)
        return 2
    return 1 if results.get("aborted") else 0


if __name__ == "__main__":
    sys.exit(main())
