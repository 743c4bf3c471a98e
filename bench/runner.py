"""The replay benchmark's run loop: one scheme on one set of tasks, on a prepared host.

`Replayer` starts each task's sandbox on its arrival (or when the scheme's gate admits it),
sleeps its LLM waits, runs its tool calls as `docker exec … memload …` one after another, and
restarts a task OOM-killed at the slice's boundary from scratch in a fresh sandbox (up to
metrics.RETRY_LIMIT retries). `run_scheme` sets the host up for the scheme around it (config,
daemon, slice) and adds what the kernel and execgate's journal saw.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench import cpu_ledger, decisions, host_state, kills
from bench import swap as swap_mod
from bench.host import Host, Log, oom_kill_count
from bench.metrics import RETRY_LIMIT, AttemptRecord, percentile, should_retry, summarize
from bench.schemes import (
    Scheme,
    admit_fifo,
    bench_config,
    call_env,
    make_gate,
    sandbox_command,
)
from bench.trace import (
    TIMINGS_ENV,
    LlmWait,
    Task,
    ToolCall,
    memload_argv,
    memload_timings,
    profiled_peak,
)
from bench.workload import Workload, hint_for
from execgate.common.units import MiB

OOM_EXIT = 137
RM_RETRY_S = 5.0  # between two `docker rm -f` of a container dockerd has not let go yet
TAG = "[execgate]"  # the runtime's and daemon's lines on a call's stderr (calls.feedback.TAG)


def keep_stderr(text: str, tail: int = 200) -> str:
    """A failed call's stderr for the results: every `[execgate]` line whole (the daemon's word
    on why it waited or died), then the last `tail` characters of the rest."""
    lines = text.strip().splitlines()
    ours = [ln for ln in lines if TAG in ln]
    rest = "\n".join(ln for ln in lines if TAG not in ln)[-tail:]
    return "\n".join([*ours, rest] if rest else ours)


# The slice's cumulative counters (memory.stat's refaults, PSI's stall) are read this often, not
# every sample: at 1x under TCG the VM is saturated, and every CPU-second the bench spends is
# taken from the schemes it measures (docs/replay/light-load-96b11e1).
COUNTERS_EVERY_S = 1.0


@dataclass
class RunSettings:
    """Knobs of the replay that are not the workload's."""

    sample_s: float = 0.15  # memory sampling period
    exec_timeout_s: float = 900.0  # a docker exec that hangs longer fails its attempt
    # A docker run that takes longer fails its attempt. A hang guard, not a policy: under TCG
    # with 16 sandboxes a start took 400-490 s (a sandbox admission wait included), and at 300 s
    # the bench's own timeout, not the scheme, lost 5 attempts; at 15x with 27, 900 s lost 2.
    # Docker's own client waits without a deadline.
    run_timeout_s: float = 1800.0
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
                 log: Log, fill_ratio: float | None = None, hot_calls: bool = False) -> None:
        self.host = host
        self.fill_ratio = fill_ratio
        self.hot_calls = hot_calls
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
        self.t0_epoch = 0.0  # time.time() at t0: the journal's and events' clock
        self.running = 0
        self.inflight = 0
        self.queued = 0
        self.calls: list[dict[str, Any]] = []
        self.samples: list[tuple[float, int, int, int, int, int, int, float]] = []
        self.notes: list[str] = []
        self.containers: list[str] = []
        self.unmanaged: dict[str, str] = {}  # execgate sandboxes left as plain runc, and why
        self.boxes: dict[str, dict[str, Any]] = {}  # container -> task, attempt, init_pid
        self.zram_peak: dict[str, int] | None = None  # zram's mm_stat when it held the most

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _event(self, text: str) -> None:
        self.log(f"[{self.scheme.name:<16} {self.now():7.1f}s] {text}", event=True)

    # -- sampling --------------------------------------------------------------------------------

    def _sampler(self, stop: threading.Event) -> None:
        last_check = 0.0
        mc: dict[str, float] | None = None
        mc_at = float("-inf")
        while True:
            cur = self.host.memory_current()
            t = self.now()
            if cur is not None:
                if t - mc_at >= COUNTERS_EVERY_S or mc is None:
                    mc, mc_at = self.host.memory_counters(), t
                self.samples.append((round(t, 3), cur, self.running, self.inflight, self.queued,
                                     self.host.swap_current() or 0, int(mc["refault_bytes"]),
                                     round(mc["stall_s"], 3)))
            z = self.host.swap_stats()
            if z and (self.zram_peak is None or z["orig_bytes"] > self.zram_peak["orig_bytes"]):
                self.zram_peak = z
            if t - last_check > 1.0:  # systemd may re-apply the slice's properties
                last_check = t
                if not self.host.budget_ok(self.budget):
                    self.host.set_budget(self.budget)
                    self.notes.append(f"memory.max of the slice was reset at {t:.1f}s; rewritten")
            if stop.wait(self.settings.sample_s):
                return

    # -- tasks -------------------------------------------------------------------------------------

    def _sandbox(self, task: Task, attempt: int) -> tuple[str | None, str]:
        p = self.host.run_sandbox(
            self.scheme.runtime, self.scheme.name,
            sandbox_command(task, fill_ratio=self.fill_ratio), max(self.budget, 64 * MiB),
            timeout=self.settings.run_timeout_s)
        # The id comes once the container is created, before it starts: a run the bench timed
        # out still names the container dockerd goes on starting.
        cid = p.stdout.strip()
        if cid:
            with self.cond:
                self.containers.append(cid)
                self.boxes[cid] = {"task": task.id, "attempt": attempt,
                                   "init_pid": self.host.init_pid(cid)}
        if p.returncode or not cid:
            if cid:
                self._remove(cid)
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

    def _call(self, cid: str, st: _TaskState, attempt: int, idx: int, call: ToolCall) -> int:
        cmd = memload_argv(call, fill_ratio=self.fill_ratio, hot=self.hot_calls)
        with self.cond:
            self.inflight += 1
        start = self.now()
        p = self.host.exec_call(cid, cmd, [*call_env(call, self.scheme.hints), TIMINGS_ENV],
                                timeout=self.settings.exec_timeout_s)
        end = self.now()
        timings, stderr = memload_timings(p.stderr or "")
        with self.cond:
            self.inflight -= 1
            self.calls.append({
                "task": st.task.id, "attempt": attempt, "call": idx, "container": cid,
                "start": round(start, 3),
                "end": round(end, 3), "duration_s": call.duration_s, "exit": p.returncode,
                "peak_bytes": call.memory.peak_bytes, "category": call.category,
                "hint": hint_for(call) if self.scheme.hints else None,
                # memload's own span on the same clock: the exec's overhead is the rest
                "ran": {k: round(v - self.t0, 3) for k, v in timings.items()} if timings else None,
                "stderr": keep_stderr(stderr) if p.returncode else "",
            })
        return p.returncode

    def _attempt(self, st: _TaskState, n: int) -> dict[str, Any]:
        task = st.task
        start = self.now()
        n_calls = len(task.tool_calls)
        cid, err = self._sandbox(task, n)
        rec: dict[str, Any] = {"task_id": task.id, "attempt": n, "start": round(start, 3),
                               "ok": False, "oom_kills": 0, "calls_done": 0,
                               "calls_total": n_calls, "reason": "", "exit": None,
                               "container": cid,
                               # docker run's time: a sandbox admission's hold shows here
                               "sandbox_start_s": round(self.now() - start, 3)}
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
                if not oom and self.host.oom_killed(cid):
                    oom, reason = True, "sandbox-oom"
                rec.update(end=end, exit=rc, oom_kills=int(oom), reason=reason)
                return rec
            rec.update(end=round(self.now(), 3), ok=True)
            return rec
        finally:
            self._remove(cid)

    def _remove(self, cid: str) -> None:
        """`docker rm -f` until it takes. dockerd removes a container whose start is still
        going on (moby lets it finish) only after it: at 15x under TCG a start held in sandbox
        admission outlasted a 180 s rm, and the sandbox went on holding memory beside its
        task's retry until the run's end."""
        deadline = time.monotonic() + self.settings.run_timeout_s
        while not self.host.remove(cid, timeout=300):
            if time.monotonic() > deadline or not self.host.exists(cid):
                return  # gone already (another rm took it), or not worth the run's time
            self.abort.wait(RM_RETRY_S)

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
        self.t0_epoch = time.time()
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
        # The exec's own overhead around memload (runtime, admission wait, engine): before it
        # started and after it ended.
        ran = [c for c in self.calls if c.get("ran")]
        lead = [c["ran"]["start"] - c["start"] for c in ran]
        tail = [c["end"] - c["ran"]["end"] for c in ran]
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
            "exec_lead_p50_s": percentile(lead, 50),
            "exec_lead_p95_s": percentile(lead, 95),
            "exec_tail_p50_s": percentile(tail, 50),
            "exec_tail_p95_s": percentile(tail, 95),
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
                                    "queued_tasks", "swap_bytes", "refault_bytes", "stall_s"],
                        "rows": self.samples},
            "sandboxes": self.boxes,
            "t0_epoch": self.t0_epoch,
            "notes": self.notes,
        }


def _record(a: dict[str, Any]) -> AttemptRecord:
    return AttemptRecord(a["task_id"], a["attempt"], a["start"], max(a["end"], a["start"]),
                         a["ok"], a["oom_kills"])


def loop_delta(before: dict[str, Any], after: dict[str, Any] | None) -> dict[str, Any] | None:
    """What execgated's loop spent over a run: its counters' differences (None when the daemon
    did not answer at the end, or restarted: a counter went down)."""
    if not after:
        return None
    out: dict[str, Any] = {}
    for key in ("iterations", "wall_s", "cpu_s", "process_cpu_s"):
        if isinstance(after.get(key), (int, float)) and isinstance(before.get(key), (int, float)):
            out[key] = round(after[key] - before[key], 3)
    for split in ("stage_cpu_s", "threads_cpu_s", "periods", "sandbox_steps"):  # the loop's
        # by stage, the process's by thread, the loop's waits by kind, sandbox admission's steps
        if split not in after:
            continue  # (an older daemon's)
        was = before.get(split) or {}
        out[split] = {k: round(v - was.get(k, 0), 3) for k, v in (after[split] or {}).items()}
    if any(isinstance(v, (int, float)) and v < 0 for v in out.values()):
        return None
    return out


def _journal_path(cfg: dict[str, Any]) -> str:
    j = cfg.get("journal")
    return j if isinstance(j, str) and j else "/var/lib/execgate/calls.jsonl"


def run_scheme(host: Host, scheme: Scheme, tasks: Sequence[Task], arrivals_wall: Sequence[float],
               budget: int, workload: Workload, settings: RunSettings, log: Log,
               abort: threading.Event, swap: bool = False,
               events_path: str | None = None) -> dict[str, Any]:
    """Set the host up for `scheme`, replay, tear down; returns the run's raw record. `swap`:
    whether the sandboxes may swap (the slice's memory.swap.max); `events_path`: where the
    daemon's event stream is kept while it runs."""
    original = host.original_toml()
    host.cleanup_containers()
    cfg = bench_config(original, scheme, domain=host.cgroup, mem_scale=workload.mem_scale,
                       admission_wait_s=settings.admission_wait_s,
                       scale_daemon=settings.scale_daemon, swap=swap)
    uses_execgate = scheme.runtime == "execgate" or scheme.daemon
    if uses_execgate:
        host.write_config(cfg)
    t_setup = time.monotonic()
    host.swap_limit = swap_mod.slice_limit(swap)
    host.open_slice(budget)
    try:
        # The daemon runs only for the schemes that have it (no stray CPU for the others).
        domain = host.daemon(scheme.daemon, host.cgroup)
        journal = _journal_path(original)
        try:
            offset = os.path.getsize(journal)
        except OSError:
            offset = 0
        oom_before = oom_kill_count(host.cgroup)
        klog = host.kernel_log()
        kseq = klog[-1][0] if klog else -1
        zram_before = host.swap_stats()
        if scheme.daemon and events_path:
            host.start_events(events_path)
        log(f"== {scheme.name}: {scheme.description}; budget {budget / MiB:.0f} MiB, "
            f"swap {'on' if swap else 'off'}, {len(tasks)} tasks "
            f"(setup {time.monotonic() - t_setup:.0f}s)")
        rep = Replayer(host, scheme, tasks, arrivals_wall, budget, settings, log,
                       fill_ratio=workload.fill_ratio, hot_calls=workload.hot_calls)
        rep.abort = abort
        counters = host.memory_counters()
        ledger_before = cpu_ledger.snapshot()
        state_before = host_state.snapshot()
        cpu_before = host.daemon_cpu_s() if scheme.daemon else None
        loop_before = host.daemon_loop() if scheme.daemon else None
        try:
            result = rep.run()
        finally:
            host.stop_events()
        ledger = cpu_ledger.delta(ledger_before, cpu_ledger.snapshot())
        result["host_state"] = host_state.delta(state_before, host_state.snapshot())
        result["cpu_ledger"] = ledger  # CPU s by cgroup over the run, and the host's idle
        result["cpu_parties"] = cpu_ledger.parties(
            ledger, os.path.relpath(host.cgroup, cpu_ledger.ROOT))
        cpu_after = host.daemon_cpu_s() if cpu_before is not None else None
        if cpu_before is not None and cpu_after is not None:
            # execgated's own CPU over the run (memory.reclaim's compression included): under
            # TCG every core-second of it is one the engine's starts and the calls did not get.
            result["metrics"]["daemon_cpu_s"] = round(cpu_after - cpu_before, 1)
        if loop_before is not None:
            result["daemon_loop"] = loop_delta(loop_before, host.daemon_loop())
        # The slice's swap traffic, refaults and stall over the run, named as the simulator's.
        result["metrics"].update({k: v - counters[k] for k, v in host.memory_counters().items()})
        result["swap"] = {"on": swap, "slice_swap_max": host.swap_limit,
                          "zram_before": zram_before, "zram_peak": rep.zram_peak,
                          "zram_after": host.swap_stats(),
                          "swap_peak_bytes": max((r[5] for r in rep.samples), default=0)}
        result["metrics"]["kernel_oom_kills"] = oom_kill_count(host.cgroup) - oom_before
        boxes = set(rep.containers)
        entries = decisions.of_containers(decisions.read_lines(journal, offset), boxes)
        events = decisions.of_containers(decisions.read_lines(events_path), boxes,
                                         {str(e.get("call")) for e in entries}) \
            if scheme.daemon and events_path else []
        result["metrics"].update(decisions.journal_stats(entries) if entries else {})
        by_id = decisions.annotate_calls(result["calls"], entries, events, rep.t0_epoch)
        decisions.annotate_attempts(result["attempts"], events)
        result["daemon_events"] = events
        klog = [r for r in host.kernel_log() if r[0] > kseq]
        result["kills"] = _attribute_kills(kills.parse_kills(klog), rep, by_id)
        result["host_state"]["kernel_stalls"] = ks = host_state.kernel_stalls(klog)
        stalls = {k: v for k, v in ks.items() if v and k != "blocked"}
        if stalls:
            result["notes"].append(
                f"the kernel logged stall warnings during the run ({ks}): the guest was "
                "starved, so its times are not comparable with other runs'")
        result["metrics"]["kills_init"] = sum(k["victim"] == "init" for k in result["kills"])
        result["metrics"]["kills_call"] = sum(k["victim"] == "call" for k in result["kills"])
        result["metrics"]["kills_unattributed"] = sum(k["victim"] == "unattributed"
                                                      for k in result["kills"])
        result["daemon_domain"] = domain
        result["config"] = cfg if uses_execgate else None
    finally:
        host.close_slice()
    m = result["metrics"]
    log(f"== {scheme.name}: {m['tasks_completed']}/{m['tasks_total']} tasks, makespan "
        f"{m['makespan_s']:.1f}s ({m['makespan_trace_s']:.0f}s trace), P50 "
        f"{m['latency_arrival_p50_s']:.1f}s, OOM kills {m['oom_kills']} (kernel: "
        f"{m['kills_init']} inits, {m['kills_call']} calls), failed attempts "
        f"{m['failed_attempts']}/{m['attempts']}, peak mem {m['mem_peak_util']:.0%}"
        + (f", swap peak {result['swap']['swap_peak_bytes'] / MiB:.0f} MiB" if swap else "")
        + (f"; WARNING: {m['sandboxes_unmanaged']} sandboxes unmanaged"
           if m.get("sandboxes_unmanaged") else "")
        + (f"; WARNING: kernel stall warnings {stalls} (a starved guest: times are not "
           "comparable)" if stalls else ""))
    return result


def _attribute_kills(found: list[dict[str, Any]], rep: Replayer,
                     by_id: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each kernel OOM kill with its task, attempt and call; a call killed under runc (in the
    sandbox's own cgroup) is the one of its attempt that exited 137."""
    out = []
    for k in found:
        a = kills.attribute(k, rep.boxes, by_id)
        if a["victim"] == "call" and a.get("call") is None and a.get("container"):
            died = [c for c in rep.calls if c["container"] == a["container"]
                    and c["exit"] == OOM_EXIT]
            if died:
                a["call"] = died[-1]["call"]
        out.append(a)
    return out
