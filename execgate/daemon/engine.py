"""The daemon's control loop: pressure, admission and call bookkeeping, every 100 ms.

    runtime ──admit──▶ Admission.submit ─┐
                                         ├─ tick(): sample domain + running calls
    watcher ──journal line──▶ release ───┘          assess pressure → Admission.step
                                                    → answer waiting runtimes

Calls end when their watcher's journal line appears (the journal is written even while the
daemon is down, so nothing is lost across restarts) or, failing that, when their cgroup has
been gone for a grace period.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from execgate.calls.oom_score import raise_oom_score_adj
from execgate.cgroups import container, v2
from execgate.common import records
from execgate.common.commands import CLASS_RANK
from execgate.common.config import Config
from execgate.policy.admission import Admission, Decision
from execgate.policy.estimate import CallInfo, HistoryEstimator, Outcome
from execgate.policy.headroom import time_to_peak
from execgate.policy.pressure import (
    PressureReading,
    assess_pressure,
    effective_margin,
    held_bytes,
    region_limits,
)
from execgate.policy.swap_credit import SwapCredit, swap_room

from . import thread_cpu
from .cgfiles import KeptFiles
from .domain import Domain, DomainSample
from .events import EventBus
from .growth_gate import GrowthGate
from .idle_room import IdleRoom
from .idle_sandboxes import Residency
from .journal_follow import JournalFollower
from .journal_reader import JournalReader
from .predictor import Predictor
from .probe_monitor import ProbeMonitor
from .retention import Retention
from .sandboxes import Sandboxes
from .settings import Settings
from .store import open_store

log = logging.getLogger("execgated")

# A call's cgroup that never held a task is taken for leaked after this long (its exec failed
# and its watcher with it); the watcher's journal line ends it long before, as a rule.
NEVER_POPULATED_S = 120.0
# ... and one empty since it held a task for this long: its watcher journals within a second,
# seconds on a loaded emulated host, and removing the cgroup first loses the call's figures.
EMPTIED_S = 30.0
# A call its watcher reported done waits this long for its journal line, which says how it
# ended; past it, its `finished` event goes out as vanished (the watcher died in between).
JOURNAL_LINE_S = 120.0
# A step spends about this long at most on the journal's backlog (a chunk more at worst), so a
# backlog of a million lines never holds the event loop; the daemon steps again soon while
# the follower is behind (main.py's control loop).
JOURNAL_STEP_S = 0.02
# A calm domain (Engine._calm) is judged on how fast it grew over this window, from samples at
# least CALM_MIN_DT_S apart.
CALM_WINDOW_S = 3.0
CALM_MIN_DT_S = 0.05
RISE_STEP = 1.05  # a call's memory sample is kept for its time to peak when 5 % above the last


@dataclass
class LiveCall:
    info: CallInfo
    container: str
    cgroup: str
    admitted_at: float
    seen: bool = False  # its cgroup has existed at least once
    gone_since: float | None = None
    empty_since: float | None = None  # its cgroup exists but holds no task (a leaked one)
    events_at: float = float("-inf")  # when cgroup.events was last read
    populated: bool = False  # a task was seen in its cgroup
    mem_sum: int = 0
    mem_n: int = 0
    last_mem: int = 0
    last_swap: int = 0  # its memory.swap.current at the last sample
    peak_mem: int = 0  # the most it held at a sample
    extra: dict[str, Any] = field(default_factory=dict)
    # (time, bytes) where its memory grew by RISE_STEP or more: when it neared its peak
    rise: list[tuple[float, int]] = field(default_factory=list)

    @property
    def mem_avg(self) -> int | None:
        return self.mem_sum // self.mem_n if self.mem_n else None


@dataclass
class LoopStats:
    """What the control loop costs: iterations, and wall and CPU time spent inside tick(),
    by stage (under an emulator the daemon's CPU is CPU the sandboxes' starts do not get: the
    split says which stage to make cheaper)."""

    iterations: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0  # the loop thread's CPU time (time.thread_time) inside tick()
    last_wall_s: float = 0.0
    max_wall_s: float = 0.0
    stage_errors: dict[str, int] = field(default_factory=dict)  # failures by tick stage
    stage_cpu_s: dict[str, float] = field(default_factory=dict)  # tick CPU by stage
    periods: dict[str, int] = field(default_factory=dict)  # waits after a tick, by kind

    def add_stage(self, name: str, cpu_s: float) -> None:
        self.stage_cpu_s[name] = self.stage_cpu_s.get(name, 0.0) + cpu_s

    def add(self, wall_s: float, cpu_s: float) -> None:
        self.iterations += 1
        self.wall_s += wall_s
        self.cpu_s += cpu_s
        self.last_wall_s = wall_s
        self.max_wall_s = max(self.max_wall_s, wall_s)

    def snapshot(self) -> dict[str, Any]:
        n = self.iterations
        return {"iterations": n, "wall_s": self.wall_s, "cpu_s": self.cpu_s,
                "mean_wall_ms": 1e3 * self.wall_s / n if n else None,
                "mean_cpu_ms": 1e3 * self.cpu_s / n if n else None,
                "last_wall_ms": 1e3 * self.last_wall_s, "max_wall_ms": 1e3 * self.max_wall_s,
                "stage_errors": dict(self.stage_errors),
                "stage_cpu_s": {k: round(v, 3) for k, v in self.stage_cpu_s.items()},
                "periods": dict(self.periods),  # sample, calm, idle
                # every thread's, the loop's included: the rest is requests, reclaim, the store
                "process_cpu_s": round(time.process_time(), 3),
                "threads_cpu_s": thread_cpu.snapshot()}  # MainThread: the loop and requests


def call_info(msg: dict[str, Any], arrival: float | None = None) -> CallInfo:
    hint = msg.get("hint") or {}
    declared = hint.get("memory_bytes")
    priority = hint.get("priority") or "normal"
    return CallInfo(call_id=str(msg["call"]), sandbox=str(msg.get("sandbox") or ""),
                    argv=[str(a) for a in msg.get("argv") or []],
                    declared_bytes=declared if isinstance(declared, int) else None,
                    priority=priority if priority in ("low", "normal", "high") else "normal",
                    arrival=arrival, command_class=_command_class(msg.get("command_class")))


def _command_class(value: object) -> str | None:
    """A redacted journal line's class (calls/record.py), if it is one."""
    return value if isinstance(value, str) and value in CLASS_RANK else None


class Engine:
    def __init__(self, cfg: Config, settings: Settings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.settings = settings
        self.clock = clock
        self.domain = Domain(settings.daemon.domain, settings.daemon.budget_bytes, clock)
        self.predictor = Predictor(settings.predictor, cfg.path, clock)  # loaded at a tick
        self.estimator = HistoryEstimator(
            settings.estimate, model=self.predictor if settings.predictor.enabled else None)
        self.admission = Admission(settings.admission, self.estimator, clock)
        self.store = open_store(settings.daemon.store)
        self.journal = JournalFollower(cfg.journal, self.store)
        self.journal_reader: JournalReader | None = None  # the daemon's thread reads ahead
        self.journal_taps: list[Callable[[list[dict[str, Any]]], None]] = []  # (metrics)
        self.unlearned = 0  # journal lines with a value of the wrong type
        self.retention = Retention(settings.retention, cfg.journal, cfg.state_dir, self.store,
                                   self.journal)
        self.events = EventBus()
        self.files = KeptFiles()  # running calls' and sandboxes' cgroup files, read every period
        self.growth = GrowthGate(settings.growth, settings.daemon.gate, clock, self.files,
                                 settings.pressure, cfg.tool_oom_score_adj)
        self.calls: dict[str, LiveCall] = {}  # admitted (or adopted) and not yet finished
        self.ended: dict[str, tuple[float, LiveCall]] = {}  # done, line to come: (when, call)
        # bcc probes (OOM attribution, page faults); started by the daemon, after its socket
        self.probes = ProbeMonitor(settings.daemon.probes, self.events, cfg.state_dir,
                                   settings.daemon.oom_record, clock)
        self.pending: dict[str, tuple[dict[str, Any], asyncio.Future[Decision]]] = {}
        self.residency = Residency(settings.residency, settings.pressure, cfg.state_dir,
                                   settings.inside.default, self.events, clock, self.files)
        # Creates waiting for room (policy/sandbox_admission.py), and the domain's sandboxes.
        domain = None if settings.daemon.domain == "host" else settings.daemon.domain
        self.sandboxes = Sandboxes(settings.sandboxes, self.residency, cfg.state_dir, domain,
                                   self.events, clock, settings.headroom, self.files)
        self.idle_room = IdleRoom(settings.headroom, self.residency, clock)  # for calls
        self.swap_credit = SwapCredit(settings.headroom)
        self.credit = 0  # of this step's swap room, the bytes counted as available
        self.reading: PressureReading | None = None
        self.sample: DomainSample | None = None
        self.sampled_at = float("-inf")
        self._used: deque[tuple[float, int]] = deque()  # (when, used) within CALM_WINDOW_S
        self.wake = asyncio.Event()  # a request for the control loop: tick now
        self.loop = LoopStats()
        self.started = time.time()

    # -- start-up ------------------------------------------------------------------------------

    def warm_up(self, n: int = 4096) -> int:
        """Teach the estimator the last n calls from the store (learning survives restarts)."""
        count = 0
        try:
            for entry, avg in self.store.recent(n):
                self._observe(entry, avg)
                count += 1
        except sqlite3.Error as e:  # history is best effort: what was read serves
            log.error("store: history not read past %d calls: %s", count, e)
        return count

    def rediscover(self) -> int:
        """Adopt tool calls that are running right now (started before this daemon)."""
        self.follow_journal()  # calls that ended while we were away are not adopted
        adopted = 0
        for rec in records.containers(self.cfg.state_dir):
            cg = rec.get("cgroup")
            if not rec.get("managed") or not cg:
                continue
            for path in container.tool_cgroups(cg):
                name = os.path.basename(path)
                if name in self.calls or not v2.populated(path):
                    continue
                info = CallInfo(call_id=name, sandbox=rec.get("sandbox") or rec["id"], argv=[])
                used = v2.read_int(path, "memory.current") or 0
                for pid in v2.procs(path):  # a crash may have left a held call's value lowered
                    raise_oom_score_adj(pid, self.cfg.tool_oom_score_adj)
                self.admission.adopt(info, used)
                self.calls[name] = LiveCall(info, rec["id"], path, self.clock(), seen=True)
                adopted += 1
        return adopted

    # -- requests ------------------------------------------------------------------------------

    def submit(self, msg: dict[str, Any]) -> tuple[dict[str, Any], asyncio.Future[Decision]]:
        idle = self.period() > self.settings.daemon.sample_period_s
        msg = self._within_budget(msg)
        info = call_info(msg)
        if info.priority == "high" and info.sandbox not in self.settings.daemon.priority_sandboxes \
                and msg.get("container") not in self.settings.daemon.priority_sandboxes:
            info = CallInfo(info.call_id, info.sandbox, info.argv, info.declared_bytes, "normal")
        ticket = self.admission.submit(info)
        self.residency.touch(msg.get("container"))  # thawed before it is admitted
        self.sandboxes.call_arrived(msg.get("container"))  # at its baseline: settled
        fut: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self.pending[info.call_id] = (msg, fut)
        self.events.publish("queued", call=info.call_id, sandbox=info.sandbox,
                            queue=ticket.queue, peak=ticket.demand.peak_bytes,
                            avg=ticket.demand.avg_bytes, source=ticket.demand.source,
                            argv=list(info.argv))
        self._step()
        if idle:  # the loop waits out an idle period: from now on it ticks every sample period
            self.wake.set()
        return ({"queue": ticket.queue, "peak": ticket.demand.peak_bytes,
                 "avg": ticket.demand.avg_bytes, "source": ticket.demand.source,
                 "max_wait_s": self.settings.admission.max_admission_wait_s,
                 "max_queued_s": self.settings.admission.max_queued_s}, fut)

    def _within_budget(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The request with its declaration cut to the domain's budget: no call can use more,
        and whatever a peer declares (the runtime clamps too, to what it can see) must not
        become a charge or a predicted growth that holds every other sandbox's calls."""
        hint = msg.get("hint")
        declared = hint.get("memory_bytes") if isinstance(hint, dict) else None
        if not isinstance(declared, int):
            return msg
        if self.sample is None:
            self._sample_domain()
        budget = self.sample.budget if self.sample is not None else 0
        if budget <= 0 or declared <= budget:
            return msg
        return {**msg, "hint": {**hint, "memory_bytes": budget}}

    def waiting(self, call_id: str) -> dict[str, Any] | None:
        """How long a queued call has waited and why, for its progress frame (None: not
        queued any more)."""
        why = self.admission.explain(call_id)
        if why is None or call_id not in self.pending:
            return None
        return {"waited_s": round(why[0], 3), "reason": why[1]}

    def wait_bound_s(self) -> float:
        """How long a front door waits for admission before it runs the call unmanaged: the
        daemon's fail-open cap (max_queued_s, at least max_admission_wait_s) plus slack."""
        adm = self.settings.admission
        return max(adm.max_queued_s, adm.max_admission_wait_s) + \
            self.settings.daemon.admission_slack_s

    def submit_sandbox(self, msg: dict[str, Any]
                       ) -> tuple[dict[str, Any], asyncio.Future[Any]]:
        """A create asks to start (`start_sandbox`); decided at once when it fits."""
        answer, fut = self.sandboxes.submit(msg)
        if not fut.done():
            self._step_sandboxes()
            self.wake.set()  # from now on the loop ticks every sample period
        return answer, fut

    def done(self, call_id: str) -> dict[str, Any]:
        """The call's watcher saw it end: release it now and say what the gate did to it."""
        outcome = self.growth.outcome(call_id)
        self._finish(call_id, None, journal_to_come=True)
        return outcome

    def cancel(self, call_id: str) -> None:
        """The runtime went away before it was admitted (or after, with nothing to run)."""
        if self.pending.pop(call_id, None) is not None or call_id in self.calls:
            self.admission.cancel(call_id)
            call = self.calls.pop(call_id, None)
            if call is not None:
                self.files.forget(call.cgroup)
            self.events.publish("cancelled", call=call_id)

    # -- the loop ------------------------------------------------------------------------------

    def tick(self) -> None:
        """One control period, stage by stage: a stage that raises (a full store, a cgroup file
        gone mid-read) is logged and counted, and the others still run: the gate, residency
        and vanished calls never wait on the history (issue 21, item 9)."""
        wall = time.perf_counter()
        cpu = before = time.thread_time()
        try:
            for name, stage in self._stages:
                try:
                    stage()
                except Exception:  # noqa: BLE001 - one stage's failure is not the loop's
                    self._stage_failed(name)
                now = time.thread_time()
                self.loop.add_stage(name, now - before)
                before = now
        finally:
            self.loop.add(time.perf_counter() - wall, before - cpu)  # the last stage's end

    @property
    def _stages(self) -> tuple[tuple[str, Callable[[], None]], ...]:
        return (("journal", self.follow_journal), ("predictor", self.predictor.step),
                ("calls", self._sample_calls), ("ended", self._expire_ended),
                ("probes", lambda: self.probes.step(self.calls)),  # fault rates, OOM kills
                ("domain", self._sample_domain), ("admission", self._step),
                ("growth", self._step_growth), ("residency", self._step_residency),
                ("sandboxes", self._step_sandboxes), ("retention", self.retention.step))

    def _step_growth(self) -> None:
        if self.reading is not None and self.sample is not None:
            self.growth.update(self.calls, self.reading.gate_state,
                               self.sample.available + self.credit, self.sample.budget,
                               self.sample.swap_free)

    def _step_residency(self) -> None:
        if self.reading is not None:
            self.residency.step(self.reading, self._busy, self.admission.queued_bytes)

    def _stage_failed(self, name: str) -> None:
        n = self.loop.stage_errors[name] = self.loop.stage_errors.get(name, 0) + 1
        if n == 1 or n % 1000 == 0:  # the first, then every thousandth: a bounded log
            log.exception("control loop: stage %s failed (%d times so far)", name, n)

    def period(self) -> float:
        """The control period: 100 ms while calls wait or the domain is under pressure (the
        growth gate needs it) and while calls run unless the domain is calm; longer while idle,
        so an idle host pays for little. Requests wake the loop at once."""
        d = self.settings.daemon
        if self.pending or self.sandboxes.waiting or self.reading is None or self.reading.state:
            return d.sample_period_s
        if self.calls:
            return max(d.calm_period_s, d.sample_period_s) if self._calm() else \
                d.sample_period_s
        return max(d.idle_period_s, d.sample_period_s)

    def next_period(self) -> float:
        """period(), counted by kind for the loop's snapshot (the control loop's wait)."""
        period, d = self.period(), self.settings.daemon
        kind = "sample" if period <= d.sample_period_s else "calm" if self.calls else "idle"
        self.loop.periods[kind] = self.loop.periods.get(kind, 0) + 1
        return period

    def _calm(self) -> bool:
        """At green, calls running: whether the domain can go a longer period unsampled. The
        yellow and red regions absorb what calls grow beyond their predictions before the loop
        reacts; a calm period asks more room than that: calm_margin_bytes above the yellow
        limit, plus what the domain would add over two such periods at the fastest rate it
        grew in the last CALM_WINDOW_S. At 1x, ticks were most of the daemon's CPU."""
        d, r = self.settings.daemon, self.reading
        if d.calm_period_s <= d.sample_period_s or r is None or r.state:
            return False
        _red, yellow = region_limits(self.settings.pressure, r.budget)
        room = r.effective_headroom - yellow - d.calm_margin_bytes
        return room > 2 * d.calm_period_s * self._growth_rate()

    def _growth_rate(self) -> float:
        """The fastest the domain's usage rose between two samples in the last CALM_WINDOW_S,
        in bytes per second (0 when it only fell)."""
        return max(((u1 - u0) / (t1 - t0)
                    for (t0, u0), (t1, u1) in itertools.pairwise(self._used) if t1 > t0),
                   default=0.0)

    def _sample_domain(self) -> None:
        self.sample = self.domain.sample()
        self.sampled_at = self.clock()
        if not self._used or self.sampled_at - self._used[-1][0] >= CALM_MIN_DT_S:
            self._used.append((self.sampled_at, self.sample.used))  # (a request's resample
            # moments after a tick would make a rate of noise)
        while self._used and self._used[0][0] < self.sampled_at - CALM_WINDOW_S:
            self._used.popleft()
        self.swap_credit.observe(self.sampled_at, self.sample.refault_bytes, self.sample.budget)

    def _step_sandboxes(self) -> None:
        if self.reading is None or self.sample is None:
            return  # the first tick decides
        self.sandboxes.step(self.reading, self.sample.used, self.calls, self._busy,
                            self.residency.activity, self._queued_peaks)

    def _queued_peaks(self) -> dict[str, int]:
        """Predicted peak of the largest call waiting in each container."""
        peaks: dict[str, int] = {}
        for msg, _fut in self.pending.values():
            cid = str(msg.get("container"))
            peak = self.estimator.estimate(call_info(msg)).peak_bytes
            peaks[cid] = max(peaks.get(cid, 0), peak)
        return peaks

    def _busy(self) -> set[str]:
        """Containers with a tool call running or waiting."""
        return {c.container for c in self.calls.values()} | {
            str(msg.get("container")) for msg, _fut in self.pending.values()}

    def _assess(self, credit: int = 0) -> PressureReading:
        """Q(t) from the last domain sample, with `credit` bytes of swap room counted as
        available, and the growth still expected of admitted calls (re-assessed at every step:
        a call admitted a moment ago has not grown yet; one whose pages went to swap has not
        shrunk its demand)."""
        usage = {cid: held_bytes(c.last_mem, c.last_swap) for cid, c in self.calls.items()}
        s = self.sample
        assert s is not None
        growth, undeclared = self.admission.predicted_growths(usage)
        return assess_pressure(self.settings.pressure, s.available, s.budget,
                               predicted_growth=growth, undeclared_growth=undeclared,
                               psi_some_avg10=s.psi_some_avg10, swap_credit=credit)

    def _step(self) -> None:
        # Swap that counts as memory leaves the pushing to the kernel, which swaps out only
        # what a call needs when it needs it; residency pushing idle sandboxes out for the
        # room admission borrows compressed whole sandboxes, some woken again moments later
        # (VM, 8.6x Poisson: 317-504 MiB reclaimed). The idle room serves while it does not
        # count (no swap room, or the domain thrashes: then resident memory is what matters).
        if self.clock() - self.sampled_at > self.settings.daemon.sample_period_s:
            self._sample_domain()  # a request after an idle period: no stale headroom or swap
        self.credit = self._swap_credit()
        self.reading = self._assess(self.credit)
        offer = 0 if self.credit else \
            self.idle_room.offer(self.admission.needs_idle_room(self.reading))
        decisions = self.admission.step(self.reading, offer)
        first = self.admission.first_in_line
        self.idle_room.settle(self.admission.borrowed_bytes, first.deficit_bytes if first else 0)
        for decision in decisions:
            msg, fut = self.pending.pop(decision.call_id, (None, None))
            if msg is None or fut is None:
                continue
            info = call_info(msg)
            self.calls[decision.call_id] = LiveCall(info, str(msg.get("container")),
                                                    str(msg.get("cgroup")), self.clock(),
                                                    extra={"charge": decision.charge_bytes})
            if not fut.done():
                fut.set_result(decision)
            self.events.publish("admitted", call=decision.call_id, sandbox=info.sandbox,
                                waited_s=round(decision.waited_s, 3), forced=decision.forced,
                                probe=decision.probe, overheld=decision.overheld,
                                charge=decision.charge_bytes,
                                reason=decision.reason, state=str(self.reading.state))

    def _swap_credit(self) -> int:
        """The domain's swap room that counts as available now (policy/swap_credit.py)."""
        s = self.sample
        if s is None:
            return 0
        free = s.swap_free
        now = self.clock()
        kept = self.residency.swap_kept() if free else 0.0  # zswap's share, once a second
        margin = effective_margin(self.settings.pressure, s.budget)
        return self.swap_credit.credit(now, swap_room(free, kept, margin))

    def _sample_calls(self) -> None:
        now = self.clock()
        for cid, call in list(self.calls.items()):
            mem = self.files.read_int(call.cgroup, "memory.current")
            if mem is None:
                if call.seen or now - call.admitted_at > self.settings.daemon.vanish_grace_s:
                    call.gone_since = call.gone_since or now
                    if now - call.gone_since > self.settings.daemon.vanish_grace_s:
                        self._finish(cid, None)
                continue
            call.seen, call.gone_since = True, None
            call.mem_sum += mem
            call.mem_n += 1
            call.last_mem = mem
            call.last_swap = self.files.read_int(call.cgroup, "memory.swap.current", True) or 0
            call.peak_mem = max(call.peak_mem, mem)
            if mem > (call.rise[-1][1] if call.rise else 0) * RISE_STEP and len(call.rise) < 256:
                call.rise.append((now, mem))
            if self._leaked(call, now):
                log.warning("call %s: %s is empty with no watcher left; released", cid,
                            call.cgroup)
                self._finish(cid, None)  # the cgroup stays the watcher's (or delete's) to remove

    def _leaked(self, call: LiveCall, now: float) -> bool:
        """Whether a call's cgroup has held no task for EMPTIED_S since it held one (for
        NEVER_POPULATED_S if it never did: an exec may take seconds to land under load): its
        watcher died (or never forked) and nothing will end it, so it would keep its charge
        forever. Read once a second per call past the grace, not every period: the watcher's
        `done` is the rule, this the exception."""
        grace = self.settings.daemon.vanish_grace_s
        if now - call.admitted_at <= grace or now - call.events_at < 1.0:
            return False
        call.events_at = now
        if self.files.read_key(call.cgroup, "cgroup.events", "populated") != 0:
            call.empty_since, call.populated = None, True
            return False
        call.empty_since = call.empty_since or now
        if call.populated:
            return now - call.empty_since > max(EMPTIED_S, grace)
        return now - call.admitted_at > max(NEVER_POPULATED_S, grace)

    @property
    def journal_behind(self) -> bool:
        """Journal lines are waiting to be applied (the next step takes more)."""
        reader = self.journal_reader
        return reader.behind if reader is not None else self.journal.behind

    def journal_written(self) -> None:
        """One of the daemon's own threads wrote a journal line: read it now (any thread)."""
        if self.journal_reader is not None:
            self.journal_reader.poke()

    def follow_journal(self) -> None:
        """New journal lines, chunk by chunk, for at most about JOURNAL_STEP_S; what is left
        waits for the next step (journal_behind). With a JournalReader the chunks were read
        and parsed in its thread: here they are only applied, and their position saved."""
        deadline = time.perf_counter() + JOURNAL_STEP_S
        reader = self.journal_reader
        while True:
            position = None
            if reader is None:
                entries = self.journal.read_new()
            else:
                chunk = reader.take()
                if chunk is None:
                    return
                entries, position = chunk
            with self.store.batch():
                for entry in entries:
                    self._journaled(entry)
                if position is not None:
                    self.journal.save(position)
            for tap in self.journal_taps:
                tap(entries)
            if not self.journal_behind or time.perf_counter() >= deadline:
                return

    def _journaled(self, entry: dict[str, Any]) -> None:
        cid = entry.get("call")
        call = self.calls.get(cid) if isinstance(cid, str) else None
        avg = call.mem_avg if call else None
        try:
            self.store.add(entry, avg)
        except Exception as e:  # noqa: BLE001 - history is best effort
            log.warning("store: %s", e)
        try:
            self._observe(entry, avg)
        except (TypeError, ValueError) as e:  # a value of the wrong type: nothing to learn
            self.unlearned += 1
            if self.unlearned == 1 or self.unlearned % 1000 == 0:  # a bounded log
                log.warning("journal: call %s not learned from (%d so far): %s", cid,
                            self.unlearned, e)
        if not isinstance(cid, str):
            return
        ended = self.ended.pop(cid, None)
        if ended is not None:  # released at its watcher's `done`: now we know how it ended
            since, released = ended
            self._learn_end(released, entry, since - released.admitted_at)
            self._publish_finished(cid, released.container, entry)
        else:
            self._finish(cid, entry)

    def _observe(self, entry: dict[str, Any], avg: int | None) -> None:
        if not entry.get("pids_peak") or entry.get("memory_peak") is None:
            return  # never ran (e.g. runc failed): nothing to learn
        try:
            info = call_info(entry)
        except (KeyError, ValueError):
            return
        peak = int(entry["memory_peak"])
        self.estimator.observe(info, Outcome(peak_bytes=peak, avg_bytes=avg or peak // 2,
                                             duration_s=float(entry.get("duration") or 0),
                                             oom_killed=bool(entry.get("oom_killed"))))

    def _finish(self, cid: str, entry: dict[str, Any] | None,
                journal_to_come: bool = False) -> None:
        """Release a call. Its `finished` event says how it ended, so a call released at its
        watcher's `done` publishes it when its journal line is read (`ended`), not now."""
        call = self.calls.pop(cid, None)
        if call is None:
            return
        self.files.forget(call.cgroup)
        self.admission.release(cid)
        self.residency.touch(call.container)
        now = self.clock()
        if journal_to_come:  # what it peaked at is learned from its line
            self.ended[cid] = (now, call)
        else:
            self._learn_end(call, entry, now - call.admitted_at)
            self._publish_finished(cid, call.container, entry)

    def _learn_end(self, call: LiveCall, entry: dict[str, Any] | None, ran: float) -> None:
        """What an ended call teaches from its journal line: how long it took to peak (the
        idle room) and its peak x how long it ran (its sandbox's call load). A call released
        at its watcher's `done` learns when its line is read: learning at `done`, with no
        line yet, lost both for nearly every call."""
        peak = entry.get("memory_peak") if entry else None
        if isinstance(peak, int) and call.rise:  # how long it took to peak, for the idle room
            self.idle_room.peak_times.observe(time_to_peak(call.rise, call.rise[0][0], peak),
                                              peak)
        self.sandboxes.call_ended(call.container, peak, ran)

    def _publish_finished(self, cid: str, container: str, entry: dict[str, Any] | None) -> None:
        self.events.publish(
            "finished", call=cid, container=container,
            exit_code=entry.get("exit_code") if entry else None,
            oom_killed=bool(entry.get("oom_killed")) if entry else None,
            memory_peak=entry.get("memory_peak") if entry else None,
            duration=entry.get("duration") if entry else None,
            vanished=entry is None)

    def _expire_ended(self) -> None:
        """Calls done whose journal line never came (their watcher died after `done`)."""
        now = self.clock()
        for cid, (since, call) in list(self.ended.items()):
            if now - since > JOURNAL_LINE_S:
                del self.ended[cid]
                self._publish_finished(cid, call.container, None)

    # -- views ---------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        r = self.reading
        return {
            "domain": self.domain.describe(),
            "pressure": None if r is None else {
                "state": str(r.state), "headroom": r.headroom,
                "effective_headroom": r.effective_headroom, "budget": r.budget,
                "available": r.available, "predicted_growth": r.predicted_growth,
                "psi_some_avg10": r.psi_some_avg10, "reason": r.reason},
            "admission": self.admission.snapshot(),
            "growth": self.growth.snapshot(),
            "residency": self.residency.snapshot(),
            "idle_room": self.idle_room.snapshot(),
            "swap_credit": self.swap_credit.snapshot(self.clock()),
            "sandbox_admission": self.sandboxes.snapshot(),
            "probes": self.probes.snapshot(),
            "history_calls": self.store.count(),
            "retention": self.retention.snapshot(),
            "predictor": self.predictor.snapshot(),
            "loop": self.loop.snapshot(),
            "uptime_s": round(time.time() - self.started, 1),
        }
