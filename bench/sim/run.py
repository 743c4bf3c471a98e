"""One scheme on one load, in simulated time: the replay's run loop without Docker or sleeping.

Mirrors bench/runner.py's Replayer step for step, so the simulator and the VM replay the same
thing: a task waits for the scheme's runner-side gate (`bench.schemes.make_gate`, `admit_fifo`:
eager's open gate, static-K's slots, reserve's reservations), then each attempt is

    docker run (cost) -> sandbox init holds the baseline -> per step: LLM wait, or
    docker exec: setup (cost) -> [execgate: queued in Admission until admitted] -> the process
    (its trace curve; the growth gate may hold it) -> teardown (cost)
    -> docker rm (cost), then a retry from scratch if the attempt failed (metrics.should_retry).

A call OOM-killed fails its attempt with 137 ("oom"); a sandbox whose init was the victim fails
at its running/queued call, or at its next exec ("sandbox-oom"). Tasks are generators that yield
what they wait for; one heap of wake-ups, plus a control period (`tick`, the daemon's 100 ms)
while anything runs or waits, at which the memory model enforces the limit and execgated's hands
decide. Idle stretches are skipped. Metrics come from `bench.metrics.summarize`, as the VM's.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.metrics import RETRY_LIMIT, AttemptRecord, percentile, should_retry, summarize
from bench.schemes import Scheme, admit_fifo, make_gate
from bench.sim.cost import CostModel, fixed
from bench.sim.hands import ExecgateHands, declared_bytes, settings_from_config
from bench.sim.memory import Domain, MemoryConfig, SimBox, SimCall
from bench.sim.schemes import sandbox_admission
from bench.trace import LlmWait, Task, memload_argv, profiled_peak
from bench.workload import hint_for

OOM_EXIT = 137
DEFAULT_OOM_ADJ = 500  # execgate's tool_oom_score_adj default

# What a task waits for: ("sleep", seconds), ("op", (name, work)), ("admission", None),
# ("process", SimCall). An op is a control-plane operation (run, exec, rm) of `work` units: it
# progresses at 1/cost(n) per second while n, the live sandboxes, changes under it.
Wait = tuple[str, Any]


@dataclass
class SimSettings:
    """Knobs of the simulation that are not the workload's or the scheme's."""

    cost: CostModel = field(default_factory=fixed)
    cost_by_runtime: dict[str, CostModel] = field(default_factory=dict)  # wins over `cost`
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    tick_s: float = 0.1  # the daemon's sample period, and the memory model's
    retry_limit: int = RETRY_LIMIT
    residency_period_s: float = 1.0
    sample_every_s: float = 0.15  # memory samples kept for the metrics (the VM's 150 ms)
    immediate_steps: bool = True  # admission stepped on every submit/release, as the daemon
    sandbox_period_s: float = 0.0  # sandbox admission stepped at most this often (0: each tick)
    hot_calls: bool = False  # calls read every page they hold each tick (bench --hot-calls)
    # None: every operation costs its fit. A seed: each costs its fit times a lognormal draw
    # (mean 1, sigma = the fit's RMSE over its mean), one sample of the VM's own spread. Where
    # most attempts die, tasks done turns on seconds; identical costs fail attempts in lockstep.
    cost_seed: int | None = None


@dataclass(eq=False)
class _TaskState:
    task: Task
    arrival: float
    demand: int
    started: float | None = None
    finished: float | None = None
    ok: bool = False
    attempts: list[dict[str, Any]] = field(default_factory=list)
    gen: Generator[Wait, Any, None] | None = None
    token: int = 0  # stale wake-ups carry an older token
    box: SimBox | None = None
    waiting: str = ""  # "", "sleep", "admission", "process"
    call: SimCall | None = None
    call_id: str | None = None
    argv: list[str] = field(default_factory=list)  # the queued call's, for the estimator
    declared: int | None = None
    op: tuple[str, float, float] | None = None  # (name, work left, as of when)


class Simulation:
    """One scheme on one set of tasks; `run()` returns a record shaped like the runner's."""

    def __init__(self, scheme: Scheme, tasks: Sequence[Task], arrivals: Sequence[float],
                 budget: int, settings: SimSettings | None = None,
                 config: Mapping[str, Any] | None = None) -> None:
        self.scheme = scheme
        self.budget = budget
        self.s = settings or SimSettings()
        self.cost = self.s.cost_by_runtime.get(scheme.runtime, self.s.cost)
        self.states = [_TaskState(t, a, profiled_peak(t))
                       for t, a in zip(tasks, arrivals, strict=True)]
        self.by_id = {st.task.id: st for st in self.states}
        self.gate = make_gate(scheme, budget)
        self.domain = Domain(budget, self.s.memory,
                             call_cgroups=scheme.runtime == "execgate")
        self.now = 0.0
        self.heap: list[tuple[float, int, int, _TaskState, Any]] = []
        self.seq = 0
        self.live = 0  # attempts between their admitted create and their docker rm (the fit's n)
        self.queue: deque[tuple[str, int]] = deque()
        self.calls: list[dict[str, Any]] = []
        self.samples: list[tuple[float, float]] = []
        self.n_calls = 0
        cfg = dict(config or {})
        self.oom_adj = int(cfg.get("tool_oom_score_adj", DEFAULT_OOM_ADJ)) \
            if scheme.runtime == "execgate" else 0
        self.hands: ExecgateHands | None = None
        self.settings_errors: list[str] = []
        if scheme.daemon:
            settings, self.settings_errors = settings_from_config(cfg)
            mem_scale = float(tasks[0].metadata.get("mem_scale", 1.0)) if tasks else 1.0
            clock = lambda: self.now  # noqa: E731 - the policy's injected clock
            self.hands = ExecgateHands(settings, self.domain, clock, self.s.residency_period_s,
                                       self.s.immediate_steps,
                                       sandbox_admission(scheme, cfg, mem_scale, clock))
        self.waiters: dict[str, _TaskState] = {}  # call id -> task waiting in admission
        self.in_op: set[_TaskState] = set()
        self.creates: dict[str, _TaskState] = {}  # box id -> task whose create waits
        self.next_sandbox_step = 0.0
        self.rng = random.Random(self.s.cost_seed) if self.s.cost_seed is not None else None

    # -- scheduling ----------------------------------------------------------------------------

    def _wake(self, st: _TaskState, at: float, value: Any = None) -> None:
        st.token += 1
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, st.token, st, value))

    def _resume(self, st: _TaskState, value: Any) -> None:
        assert st.gen is not None
        try:
            kind, arg = st.gen.send(value)
        except StopIteration:
            return
        st.waiting = kind
        if kind == "sleep":
            self._wake(st, self.now + max(arg, 0.0))
        elif kind == "op":
            name, work = arg
            work *= self._draw(name)
            st.op = (name, work, self.now)
            self.in_op.add(st)
            self._wake(st, self.now + work * getattr(self.cost, name)(self.live), "op")
        elif kind == "admission":
            st.token += 1  # woken by a decision, not a timer
            assert self.hands is not None and st.call_id is not None and st.box is not None
            self.waiters[st.call_id] = st
            self._decided(self.hands.submit(st.call_id, st.box.id, st.argv, st.declared))
        elif kind == "create":
            st.token += 1  # woken by sandbox admission
            assert self.hands is not None
            self.creates[arg[0]] = st
            self._started(self.hands.create(*arg))
        elif kind == "process":
            call: SimCall = arg
            st.call = call
            self.domain.start_call(call)
            if self.hands is not None:
                self.hands.started(call)
            self._wake(st, call.end_at(), "end")

    def _draw(self, op: str) -> float:
        """An operation's cost factor: 1, or a draw around its fit (`SimSettings.cost_seed`)."""
        fit = getattr(self.cost, op)
        if self.rng is None or fit.mean_y <= 0 or fit.rmse <= 0:
            return 1.0
        sigma = fit.rmse / fit.mean_y
        return math.exp(self.rng.gauss(-sigma * sigma / 2, sigma))

    def _set_live(self, delta: int) -> None:
        """n changes: every operation in flight re-plans its end at the new rate."""
        old, self.live = self.live, self.live + delta
        for st in sorted(self.in_op, key=lambda s: s.task.id):  # a set: addresses order it
            assert st.op is not None
            name, left, since = st.op
            f = getattr(self.cost, name)
            c_old, c_new = f(old), f(self.live)
            if c_old == c_new:
                continue
            left = max(left - (self.now - since) / c_old, 0.0) if c_old > 0 else 0.0
            st.op = (name, left, self.now)
            self._wake(st, self.now + left * c_new, "op")

    def _started(self, box_ids: Sequence[str]) -> None:
        for bid in box_ids:
            st = self.creates.pop(bid, None)
            if st is not None:
                self._wake(st, self.now, "created")

    def _decided(self, decisions: Sequence[Any]) -> None:
        for d in decisions:
            st = self.waiters.pop(d.call_id, None)
            if st is not None:
                self._wake(st, self.now, "admitted")

    # -- a task --------------------------------------------------------------------------------

    def _task(self, st: _TaskState) -> Generator[Wait, Any, None]:
        for n in range(1, self.s.retry_limit + 2):
            rec = yield from self._attempt(st, n)
            st.attempts.append(rec)
            record = _record(rec)
            if rec["ok"]:
                st.ok = True
                break
            if not should_retry(record, self.s.retry_limit):
                break
        st.finished = self.now
        self.gate.release(st.task.id)
        self._admit_tasks()

    def _attempt(self, st: _TaskState, n: int) -> Generator[Wait, Any, dict[str, Any]]:
        task = st.task
        cost = self.cost
        rec: dict[str, Any] = {"task_id": task.id, "attempt": n, "start": self.now, "ok": False,
                               "oom_kills": 0, "calls_done": 0,
                               "calls_total": len(task.tool_calls), "reason": "", "exit": None}
        box_id = f"{task.id}#{n}"
        if self.hands is not None and self.hands.sandboxes is not None:
            # The runtime's create asks before runc's, knowing no call's peak: the bench's hints
            # come with each exec, none with docker run (the daemon predicts from history).
            yield ("create", (box_id, None))
        rec["sandbox_start_s"] = self.now  # as the bench's: when the create went to runc
        self._set_live(+1)  # a held create costs the control plane nothing (bench/sim/cost.py)
        yield ("op", ("run", 1.0))
        box = SimBox(box_id, task.baseline_bytes, last_active=self.now)
        st.box = box
        self.domain.add_box(box)
        idx = 0
        for step in task.steps:
            if isinstance(step, LlmWait):
                yield ("sleep", step.duration_s)
                continue
            idx += 1
            start = self.now
            overhead = 1.0 - cost.exec_during  # of the exec's cost: setup and teardown
            yield ("op", ("exec", cost.exec_before * overhead))
            rc = 0
            call = None
            if not box.alive:
                rc = 126
            elif self.hands is not None:
                self.n_calls += 1
                st.call_id = f"{box.id}/{idx}"
                st.argv = memload_argv(step)
                st.declared = declared_bytes(hint_for(step)) if self.scheme.hints else None
                got = yield ("admission", None)
                if got != "admitted":
                    rc = 126
            if rc == 0:
                slower = cost.exec_during * cost.exec(self.live)  # the process's own share
                call = SimCall(st.call_id or f"{box.id}/{idx}", box, step.memory,
                               step.duration_s + slower, self.oom_adj, started=self.now,
                               last=self.now, hot=self.s.hot_calls)
                box.last_active = self.now
                got = yield ("process", call)
                st.call = None
                box.last_active = self.now
                if got == "end":
                    self.domain.end_call(call)
                else:
                    rc = OOM_EXIT if got == "oom" else 126
                if self.hands is not None:
                    self._decided(self.hands.finished(call.id, call, rc == OOM_EXIT))
            yield ("op", ("exec", (1.0 - cost.exec_before) * overhead))
            self.calls.append({"task": task.id, "attempt": n, "call": idx, "start": start,
                               "end": self.now, "duration_s": step.duration_s, "exit": rc,
                               "peak_bytes": step.memory.peak_bytes, "category": step.category,
                               "swap_wait_s": call.lag if call is not None else 0.0})
            if rc == 0:
                rec["calls_done"] = idx
                continue
            oom = rc == OOM_EXIT or not box.alive
            rec.update(end=self.now, exit=rc, oom_kills=int(oom),
                       reason="oom" if rc == OOM_EXIT else "sandbox-oom" if oom else f"exit {rc}")
            break
        else:
            rec.update(end=self.now, ok=True)
        yield ("op", ("rm", 1.0))
        self._set_live(-1)
        if self.hands is not None:
            self.hands.box_gone(box)
        self.domain.remove_box(box.id)
        st.box = None
        return rec

    # -- kills ---------------------------------------------------------------------------------

    def _box_task(self, box_id: str) -> _TaskState | None:
        return self.by_id.get(box_id.rpartition("#")[0])

    def _kill_call(self, st: _TaskState, how: str) -> None:
        """The running call died (OOM kill of it or of its init, or the last resort)."""
        if st.waiting == "process" and st.call is not None:
            self._wake(st, self.now, how)

    def _on_kills(self, kills: Sequence[Any]) -> None:
        for k in kills:
            st = self._box_task(k.box)
            if st is None:
                continue
            if k.call is not None:
                self._kill_call(st, "oom")
                continue
            # The init died: the sandbox and everything in it.
            if st.waiting == "process":
                self._kill_call(st, "dead")
            elif st.waiting == "admission" and st.call_id in self.waiters:
                del self.waiters[st.call_id]
                assert self.hands is not None
                self._decided(self.hands.finished(st.call_id, None, False))
                self._wake(st, self.now, "dead")

    # -- the run -------------------------------------------------------------------------------

    def _admit_tasks(self) -> None:
        for tid in admit_fifo(self.queue, self.gate):
            st = self.by_id[tid]
            st.started = self.now
            st.gen = self._task(st)
            self._resume(st, None)

    def _busy(self) -> bool:
        return bool(self.domain.running or self.waiters or self.domain.reclaiming
                    or self.creates)

    def _tick(self, dt: float) -> None:
        now = self.now
        self.domain.advance(now, dt)
        self.domain.step_reclaim(dt)
        self._on_kills(self.domain.enforce(now, dt))
        if self.hands is not None:
            decisions, victims = self.hands.tick(dt)
            self._decided(decisions)
            if now >= self.next_sandbox_step:
                self.next_sandbox_step = now + self.s.sandbox_period_s
                self._started(self.hands.step_sandboxes())
            for cid in victims:
                call = self.domain.running.get(cid)
                if call is not None:
                    self.domain.end_call(call, leaves=False)
                    st = self._box_task(call.box.id)
                    if st is not None:
                        self._kill_call(st, "oom")
        self.domain.end_period(dt)
        if not self.samples or now - self.samples[-1][0] >= self.s.sample_every_s - 1e-9:
            self.samples.append((now, self.domain.usage()))

    def run(self) -> dict[str, Any]:
        order = sorted(self.states, key=lambda s: s.arrival)
        pending = deque(order)
        dt = self.s.tick_s
        k = 0
        while pending or self.heap or self._busy():
            t_tick = k * dt
            t_arrival = pending[0].arrival if pending else math.inf
            t_event = self.heap[0][0] if self.heap else math.inf
            if not self._busy() and min(t_arrival, t_event) > t_tick:
                nxt = min(t_arrival, t_event)
                k = max(k, math.floor(nxt / dt))
                t_tick = k * dt
            # Everything due before this period's sample, in time order.
            while True:
                t_arrival = pending[0].arrival if pending else math.inf
                t_event = self.heap[0][0] if self.heap else math.inf
                if min(t_arrival, t_event) > t_tick:
                    break
                if t_arrival <= t_event:
                    st = pending.popleft()
                    self.now = max(self.now, st.arrival)
                    self.queue.append((st.task.id, st.demand))
                    self._admit_tasks()
                    continue
                at, _, token, st, value = heapq.heappop(self.heap)
                if token != st.token:
                    continue
                self.now = max(self.now, at)
                if st.op is not None:
                    self.in_op.discard(st)
                    st.op = None
                if value == "end" and st.call is not None and st.call.held:
                    self._wake(st, self.now + dt, "end")  # memload ends once let go
                    continue
                if value == "end" and st.call is not None and st.call.end_at() > self.now + 1e-9:
                    self._wake(st, st.call.end_at(), "end")  # it waited on swap-in meanwhile
                    continue
                self._resume(st, value)
            self.now = max(self.now, t_tick)
            self._tick(dt)
            k += 1
        return self._result()

    def _result(self) -> dict[str, Any]:
        records = [_record(a) for st in self.states for a in st.attempts]
        tasks = [st.task for st in self.states]
        speed = float(tasks[0].metadata.get("speed", 1.0)) if tasks else 1.0
        metrics = summarize(records, self.samples, self.budget, tasks, speed=speed)
        done = [st for st in self.states if st.ok]
        e2e = [max(a["end"] for a in st.attempts) - st.arrival for st in done]
        metrics.update({
            "latency_arrival_p50_s": percentile(e2e, 50),
            "latency_arrival_p95_s": percentile(e2e, 95),
            "kernel_oom_kills": len(self.domain.kills),
            "init_oom_kills": sum(k.call is None for k in self.domain.kills),
            "tool_calls": len(self.calls),
            "swap_out_bytes": self.domain.swap_out_bytes,
            "refault_bytes": int(self.domain.refault_bytes),
            "stall_s": self.domain.stall_s,
        })
        metrics.pop("concurrency_timeline", None)
        out: dict[str, Any] = {"scheme": self.scheme.name, "family": self.scheme.family,
                               "k": self.scheme.k, "metrics": metrics,
                               "attempts": [a for st in self.states for a in st.attempts]}
        if self.hands is not None:
            out["daemon"] = self.hands.summary()
            out["settings_errors"] = self.settings_errors
        return out


def _record(a: Mapping[str, Any]) -> AttemptRecord:
    return AttemptRecord(a["task_id"], a["attempt"], a["start"], max(a["end"], a["start"]),
                         a["ok"], a["oom_kills"])


def simulate(scheme: Scheme, tasks: Sequence[Task], arrivals: Sequence[float], budget: int,
             settings: SimSettings | None = None,
             config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run one scheme on one load (arrivals in the replay's wall seconds)."""
    return Simulation(scheme, tasks, arrivals, budget, settings, config).run()
