"""Admission of tool calls by predicted memory demand (TenonAgent §3.4, ToolSched §3.2–3.3).

Each tool call waits here until its predicted demand fits, so an oversubscribed host makes calls
wait briefly instead of OOM-killing them. Pure and deterministic: no threads, no I/O, time comes
from the injected clock. The daemon calls `submit`, `release` and `cancel` as calls come and go and
`step` every control period (and right after submit/release) with the latest PressureReading.

A call is admitted when both gates pass (admission_gates.py): the logical budget (ToolSched
§3.2) and the physical gate on Q(t) (TenonAgent §3.4).

Queues (ToolSched §3.3): calls with predicted peak ≥ `heavy_peak_bytes` wait in the heavy queue,
the rest in the light queue; both share the budget. Light calls are tried first to keep capacity
busy, and any call that fits is admitted even when an earlier one does not (no head-of-line
blocking). To keep heavy calls from starving, the heavy queue's head (the *credit target*, chosen
when it reaches the head and kept until it leaves) accrues protected credit at β bytes/s (default:
10 % of the budget per second, so a call needing the whole budget is fully protected after 10 s,
well inside the 30 s bound). Every other call must leave min(credit, target's charge) of the
logical budget unused, so once the credit covers the target's charge, releases accumulate for it
until it fits. A target whose predicted average exceeds the whole logical budget can never fit and
reserves nothing (only the bounded wait will admit it).

Waiting is bounded, but never by forcing a call into a full host (issue 15 §3): a call queued
`max_admission_wait_s` is *overdue* and goes to the head of the line. Overdue calls are taken
oldest first under the no-force rule (`headroom.no_force`): one starts when its predicted peak fits
the effective headroom left in this step, or when nothing else runs (alone it can only hurt
itself, and it must make progress); it skips the logical budget, the credit reserve and yellow's
size rules, but in red it takes the single probe slot like any probe and waits while another
probe runs. An overdue call that may not start stops the whole step: nothing behind it is
admitted, so releases accumulate for it (`first_in_line` says how much room it lacks, for the
daemon to reclaim). Admitted overdue calls are marked `forced`. A call queued `max_queued_s`
starts whatever the state: the fail-open cap for a host whose running calls never end (a
detached server holding its charge), counted as `overheld`; set at or below the bounded wait, it
forces every overdue call in (the rule before no-force: admission out of the way).

Fairness: within a queue, calls are ordered by priority (high, normal, low), then by when their
sandbox was last served (least recently first; a sandbox with no queued or running call is
forgotten and ranks as never served), then FIFO. One agent issuing many calls therefore cannot
starve the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from execgate.common.units import GiB, MiB
from execgate.policy.admission_gates import logical_charge, physical_gate
from execgate.policy.estimate import CallInfo, Demand, Estimator
from execgate.policy.headroom import NoForce, no_force
from execgate.policy.pressure import PressureReading, fmt_bytes
from execgate.policy.pressure_state import Pressure

LIGHT_QUEUE, HEAVY_QUEUE = "light", "heavy"
_PRIORITY_RANK = {"high": 0, "normal": 1, "low": 2}


@dataclass(frozen=True)
class AdmissionConfig:
    """Tunables of admission (config.toml fills them)."""

    # M_window, the admitted bytes at which α reaches 1; None = the reading's budget.
    window_bytes: int | None = None
    # Yellow admits only calls whose predicted peak is below this.
    yellow_peak_limit_bytes: int = 256 * MiB
    # Calls with predicted peak at or above this wait in the heavy queue.
    heavy_peak_bytes: int = 1 * GiB
    # β, the heavy target's credit rate in bytes/s; None = 10 % of the budget per second.
    credit_rate_bytes_per_s: float | None = None
    # Bounded wait: a call queued this long is first in line (the no-force rule, above).
    max_admission_wait_s: float = 30.0
    # Fail-open cap: a call queued this long starts whatever the state. At or below
    # max_admission_wait_s it is the rule before no-force: every overdue call forced in.
    max_queued_s: float = 600.0

    def __post_init__(self) -> None:
        if self.window_bytes is not None and self.window_bytes < 0:
            raise ValueError("window_bytes must be >= 0")
        if self.credit_rate_bytes_per_s is not None and self.credit_rate_bytes_per_s < 0:
            raise ValueError("credit_rate_bytes_per_s must be >= 0")
        if self.max_admission_wait_s < 0:
            raise ValueError("max_admission_wait_s must be >= 0")
        if self.max_queued_s < 0:
            raise ValueError("max_queued_s must be >= 0")


@dataclass(frozen=True)
class Ticket:
    """Receipt of a submitted call: which queue it waits in and by when it will be admitted."""

    call_id: str
    queue: str  # 'light' | 'heavy'
    demand: Demand
    arrival: float
    deadline: float  # arrival + max_admission_wait_s


@dataclass(frozen=True)
class Decision:
    """One admission; `reason` explains which rule let the call in."""

    call_id: str
    admitted_at: float
    waited_s: float
    charge_bytes: int
    forced: bool
    probe: bool
    reason: str
    overheld: bool = False  # started by the max_queued_s cap, whatever the state


@dataclass(frozen=True)
class FirstInLine:
    """The overdue call that holds the line: the room it lacks, to reclaim for it."""

    call_id: str
    deficit_bytes: int
    reason: str


@dataclass
class _Entry:
    call: CallInfo
    demand: Demand
    queue: str
    arrival: float
    seq: int
    charge: int = 0
    admitted_at: float = 0.0
    forced: bool = False
    probe: bool = False


class Admission:
    """Queues tool calls and admits them by charge, pressure, credit and fairness."""

    def __init__(
        self,
        config: AdmissionConfig,
        estimator: Estimator,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.estimator = estimator
        self.clock = clock
        self._queued: dict[str, _Entry] = {}
        self._queued_bytes = 0  # their predicted peaks (queued_bytes), kept as they come and go
        self._running: dict[str, _Entry] = {}
        self._admitted_bytes = 0
        self._seq = 0
        self._stamp = 0  # counts admissions; a sandbox's last stamp orders fairness
        self._served: dict[str, int] = {}
        self._active: dict[str, int] = {}  # sandbox -> queued + running calls
        self._probe: str | None = None
        self._target: str | None = None
        self._credit = 0.0
        self._credit_at = 0.0
        self._last: PressureReading | None = None
        self._first: FirstInLine | None = None
        # Whether the queue's order (submission) is also arrival order: true unless a call came
        # with an earlier arrival than one before it. Then the overdue calls are its head and
        # a step need not sort the whole queue to find them (1,000 sandboxes' calls).
        self._fifo = True
        self._last_arrival = float("-inf")
        self.overheld = 0  # calls started by the max_queued_s cap
        self.borrowed_bytes = 0  # of the last step's idle room, what its admissions count on

    # -- public API --------------------------------------------------------------------------

    def submit(self, call: CallInfo) -> Ticket:
        """Queue a call; it is admitted by a later `step`."""
        if call.call_id in self._queued or call.call_id in self._running:
            raise ValueError(f"call {call.call_id!r} already submitted")
        now = self.clock()
        arrival = now if call.arrival is None else call.arrival
        raw = self.estimator.estimate(call)
        peak = self._within_budget(max(raw.peak_bytes, 0))
        demand = Demand(min(max(raw.avg_bytes, 0), peak), peak, raw.source)
        queue = HEAVY_QUEUE if peak >= self.config.heavy_peak_bytes else LIGHT_QUEUE
        entry = _Entry(call, demand, queue, arrival, self._seq)
        self._seq += 1
        self._queued[call.call_id] = entry
        self._queued_bytes += peak
        self._fifo = self._fifo and arrival >= self._last_arrival
        self._last_arrival = max(self._last_arrival, arrival)
        self._active[call.sandbox] = self._active.get(call.sandbox, 0) + 1
        if queue == HEAVY_QUEUE and self._target is None:
            self._retarget(now)
        return Ticket(call.call_id, queue, demand, arrival, arrival + self._max_wait)

    def adopt(self, call: CallInfo, used_bytes: int) -> None:
        """Count a call that is already running (found after a daemon restart) as admitted.

        Its charge is the larger of what it uses now and its predicted average: it was admitted
        under the old daemon, so it is not queued again, but the budget must see it.
        """
        if call.call_id in self._queued or call.call_id in self._running:
            return
        now = self.clock()
        raw = self.estimator.estimate(call)
        peak = max(self._within_budget(max(raw.peak_bytes, 0)), used_bytes)
        demand = Demand(min(max(raw.avg_bytes, used_bytes, 0), peak), peak, "adopted")
        queue = HEAVY_QUEUE if peak >= self.config.heavy_peak_bytes else LIGHT_QUEUE
        entry = _Entry(call, demand, queue, now, self._seq, charge=demand.avg_bytes,
                       admitted_at=now)
        self._seq += 1
        self._running[call.call_id] = entry
        self._admitted_bytes += entry.charge
        self._active[call.sandbox] = self._active.get(call.sandbox, 0) + 1

    def release(self, call_id: str) -> bool:
        """The call ended: free its charge (and the probe slot). A queued call is cancelled."""
        entry = self._running.pop(call_id, None)
        if entry is None:
            return self._dequeue(call_id)
        self._admitted_bytes -= entry.charge
        if self._probe == call_id:
            self._probe = None
        self._forget(entry.call.sandbox)
        return True

    def cancel(self, call_id: str) -> bool:
        """The client gave up: drop a queued call (an already admitted one is released)."""
        if call_id in self._queued:
            return self._dequeue(call_id)
        return self.release(call_id)

    def step(self, reading: PressureReading, idle_room: int = 0) -> list[Decision]:
        """Admit every queued call that may run now, in admission order.

        idle_room: bytes idle sandboxes can give back before a call admitted now peaks
        (`headroom.in_time_bytes`); calls fit in the effective headroom plus it, and
        `borrowed_bytes` then says how much of it this step's admissions count on, for the
        daemon to have reclaimed (issue 15 §3)."""
        now = self.clock()
        self._last = reading
        self._accrue(now, reading.budget)
        decisions: list[Decision] = []
        window = self._window(reading)
        start = reading.effective_headroom + max(idle_room, 0)
        headroom_left = self._step(now, reading, window, start, decisions)
        used = start - headroom_left if decisions else 0
        self.borrowed_bytes = min(max(used - reading.effective_headroom, 0), max(idle_room, 0))
        return decisions

    def _step(self, now: float, reading: PressureReading, window: int, start: int,
              decisions: list[Decision]) -> int:
        """Overdue calls first, then the rest; returns the headroom left."""
        headroom_left, blocked = self._overdue(now, reading, window, start, decisions)
        if blocked:
            return headroom_left
        logical = reading.logical_budget
        while True:
            admitted = None
            for entry in self._candidates():
                charge = logical_charge(entry.demand, self._admitted_bytes, window)
                is_target = entry.call.call_id == self._target
                reserve = 0 if is_target else self._reserve(window, logical)
                if self._admitted_bytes + charge + reserve > logical:
                    continue
                verdict = physical_gate(entry.demand, reading.state, headroom_left,
                                        reading.red_limit, self.config.yellow_peak_limit_bytes,
                                        probe_free=self._probe is None,
                                        alone=not self._running)
                if verdict is None:
                    continue
                probe, why = verdict
                reason = (
                    f"{why}; charge {fmt_bytes(charge)} fits {fmt_bytes(self._admitted_bytes)}"
                    f" admitted + {fmt_bytes(reserve)} reserved of {fmt_bytes(logical)}"
                )
                admitted = self._admit(entry, now, charge, False, probe, reason)
                headroom_left = max(headroom_left - entry.demand.peak_bytes, 0)
                break
            if admitted is None:
                break
            decisions.append(admitted)
        return headroom_left

    @property
    def first_in_line(self) -> FirstInLine | None:
        """The overdue call the last step could not start (nothing else was admitted)."""
        return self._first

    def explain(self, call_id: str) -> tuple[float, str] | None:
        """(seconds queued, why it still waits) for a queued call, as of the last step (what
        the waiting agent is told); None if it is not queued."""
        entry = self._queued.get(call_id)
        if entry is None:
            return None
        waited = max(self.clock() - entry.arrival, 0.0)
        return waited, self._why_waiting(entry)

    def _why_waiting(self, entry: _Entry) -> str:
        last, first = self._last, self._first
        if first is not None and first.call_id == entry.call.call_id:
            if first.deficit_bytes == 0:
                return "first in line, waiting for the single probe slot of a full host"
            return (f"first in line, needs {fmt_bytes(first.deficit_bytes)} more free memory"
                    f" beside {len(self._running)} running call(s)")
        if first is not None:
            return "behind a call that has waited longer"
        if last is None:
            return "not assessed yet"
        peak = entry.demand.peak_bytes
        if last.state is Pressure.RED:
            return (f"host memory is low: {fmt_bytes(last.effective_headroom)} free, "
                    f"this call may need {fmt_bytes(peak)}")
        if peak > last.effective_headroom:
            return (f"this call may need {fmt_bytes(peak)}, "
                    f"{fmt_bytes(last.effective_headroom)} is free")
        return f"memory is booked by {len(self._running)} running call(s)"

    def predicted_growth(self, usage: Mapping[str, int], undeclared_only: bool = False) -> int:
        """Growth still predicted for admitted calls, given their current bytes by call id
        (unsampled calls count from 0); feed it to assess_pressure (TenonAgent §3.2).
        undeclared_only: only calls whose demand is not from a declaration (its gate_state)."""
        return self.predicted_growths(usage)[undeclared_only]

    def predicted_growths(self, usage: Mapping[str, int]) -> tuple[int, int]:
        """(predicted_growth(usage), predicted_growth(usage, True)) in one pass over the
        running calls: assess_pressure takes both every step."""
        total = undeclared = 0
        get = usage.get
        for cid, e in self._running.items():
            d = e.demand
            grows = d.peak_bytes - get(cid, 0)  # as predicted_remaining_growth, both at once
            if grows > 0:
                total += grows
                if d.source != "declared":
                    undeclared += grows
        return total, undeclared

    def queued_bytes(self) -> int:
        """Predicted peaks of the calls still waiting: room that would let them start."""
        return self._queued_bytes

    def needs_idle_room(self, reading: PressureReading) -> bool:
        """Whether what idle sandboxes can give back could change the next step's admissions:
        calls wait and, at green, their predicted peaks do not all fit the effective headroom
        (then each fits with or without it). Measuring that room reads each idle sandbox's
        memory.stat, and every request steps: at 1x it was most of the CPU the daemon spent on
        requests (VM profile, bench/daemon_profile.py)."""
        return bool(self._queued) and (
            bool(reading.state) or self._queued_bytes > reading.effective_headroom)

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready view for `execgatectl status`: queues, running calls, charges, credit."""
        now = self.clock()
        last = self._last
        window = self._window(last) if last is not None else None
        credit = self._credit
        if self._target is not None and last is not None:
            credit = self._credit_now(now, last.budget)

        def charge_now(e: _Entry) -> int | None:
            if window is None:
                return None
            return logical_charge(e.demand, self._admitted_bytes, window)

        def demand(e: _Entry) -> dict[str, Any]:
            d = e.demand
            return {"avg_bytes": d.avg_bytes, "peak_bytes": d.peak_bytes, "source": d.source}

        return {
            "now": now,
            "state": str(last.state) if last is not None else None,
            "reason": last.reason if last is not None else None,
            "budget": last.budget if last is not None else None,
            "logical_budget": last.logical_budget if last is not None else None,
            "admitted_bytes": self._admitted_bytes,
            "alpha": self._alpha(window),
            "probe": self._probe,
            "first_in_line": None if self._first is None else {
                "call_id": self._first.call_id, "deficit_bytes": self._first.deficit_bytes,
                "reason": self._first.reason},
            "overheld": self.overheld,
            "credit": {
                "target": self._target,
                "bytes": int(credit) if self._target is not None else 0,
                "rate_bytes_per_s": self._rate(last.budget) if last is not None else None,
            },
            "queued": [
                {
                    "call_id": e.call.call_id,
                    "sandbox": e.call.sandbox,
                    "queue": e.queue,
                    "priority": e.call.priority,
                    "argv": list(e.call.argv),
                    "demand": demand(e),
                    "charge_bytes": charge_now(e),
                    "waited_s": max(now - e.arrival, 0.0),
                    "deadline": e.arrival + self._max_wait,
                }
                for e in self._candidates()
            ],
            "running": [
                {
                    "call_id": e.call.call_id,
                    "sandbox": e.call.sandbox,
                    "queue": e.queue,
                    "argv": list(e.call.argv),
                    "demand": demand(e),
                    "charge_bytes": e.charge,
                    "admitted_at": e.admitted_at,
                    "waited_s": max(e.admitted_at - e.arrival, 0.0),
                    "running_s": max(now - e.admitted_at, 0.0),
                    "forced": e.forced,
                    "probe": e.probe,
                }
                for e in self._running.values()
            ],
        }

    # -- internals ---------------------------------------------------------------------------

    @property
    def _max_wait(self) -> float:
        return self.config.max_admission_wait_s

    def _overdue(self, now: float, reading: PressureReading, window: int, start: int,
                 decisions: list[Decision]) -> tuple[int, bool]:
        """Overdue calls, oldest first, under the no-force rule; appends their admissions.
        start: the headroom to fit in (effective headroom plus idle room). Returns the
        headroom left and whether one of them holds the line (then nothing else may be
        admitted this step)."""
        self._first = None
        headroom_left = start
        max_wait, cap = self._max_wait, self.config.max_queued_s
        for entry in self._oldest_overdue(now, max_wait):
            waited = now - entry.arrival
            peak = entry.demand.peak_bytes
            charge = logical_charge(entry.demand, self._admitted_bytes, window)
            probe = False
            if waited >= cap:
                self.overheld += 1
                reason = (f"overheld: queued {waited:.1f} s >= max_queued_s {cap:g} s, "
                          f"started whatever the state ({reading.state})")
                d = self._admit(entry, now, charge, True, False, reason)
                decisions.append(replace(d, overheld=True))
                headroom_left = max(headroom_left - peak, 0)
                continue
            v = no_force(peak, headroom_left, len(self._running))
            if v.run and v.deficit_bytes == 0 and reading.state is Pressure.RED:
                # Red's single probe: an overdue call that fits takes the slot, or waits for it.
                if self._probe is not None:
                    v = NoForce(False, True, 0, f"wait over, first in line: red, probe "
                                f"{self._probe} runs; peak {fmt_bytes(peak)} fits headroom "
                                f"{fmt_bytes(headroom_left)}")
                else:
                    probe = True
            if not v.run:
                self._first = FirstInLine(entry.call.call_id, v.deficit_bytes, v.reason)
                return headroom_left, True
            reason = (f"forced: waited {waited:.1f} s >= {max_wait:g} s, {v.reason} "
                      f"({reading.state})")
            decisions.append(self._admit(entry, now, charge, True, probe, reason))
            headroom_left = max(headroom_left - peak, 0)
        return headroom_left, False

    def _within_budget(self, nbytes: int) -> int:
        """No prediction or charge exceeds the domain's budget (as last assessed): no call can
        use more, and one that claims to must not hold every other call out forever."""
        budget = self._last.budget if self._last is not None else 0
        return min(nbytes, budget) if budget > 0 else nbytes

    def _oldest_overdue(self, now: float, max_wait: float) -> Iterator[_Entry]:
        """Calls queued max_wait or longer, oldest first (arrival, then submission)."""
        if not self._fifo:
            overdue = [e for e in self._queued.values() if now - e.arrival >= max_wait]
            yield from sorted(overdue, key=lambda e: (e.arrival, e.seq))
            return
        for e in list(self._queued.values()):  # the caller admits (removes) as it goes
            if now - e.arrival < max_wait:
                return  # arrival order: every later call came later still
            yield e

    def _window(self, reading: PressureReading) -> int:
        w = self.config.window_bytes
        return reading.budget if w is None else w

    def _alpha(self, window: int | None) -> float | None:
        if window is None:
            return None
        return min(self._admitted_bytes / window, 1.0) if window > 0 else 1.0

    def _rate(self, budget: int) -> float:
        rate = self.config.credit_rate_bytes_per_s
        return budget / 10 if rate is None else rate

    def _key(self, e: _Entry) -> tuple[int, int, int]:
        return (_PRIORITY_RANK[e.call.priority], self._served.get(e.call.sandbox, 0), e.seq)

    def _candidates(self) -> Iterator[_Entry]:
        """Light queue in fairness order, then the heavy credit target, then the other heavy."""
        light = [e for e in self._queued.values() if e.queue == LIGHT_QUEUE]
        heavy = [e for e in self._queued.values() if e.queue == HEAVY_QUEUE]
        yield from sorted(light, key=self._key)
        heavy.sort(key=lambda e: (e.call.call_id != self._target, self._key(e)))
        yield from heavy

    def _admit(
        self, entry: _Entry, now: float, charge: int, forced: bool, probe: bool, reason: str
    ) -> Decision:
        cid = entry.call.call_id
        del self._queued[cid]
        self._queued_bytes -= entry.demand.peak_bytes
        charge = self._within_budget(charge)
        entry.charge, entry.admitted_at, entry.forced, entry.probe = charge, now, forced, probe
        self._running[cid] = entry
        self._admitted_bytes += charge
        if probe:
            self._probe = cid
        self._stamp += 1
        self._served[entry.call.sandbox] = self._stamp
        if cid == self._target:
            self._retarget(now)
        return Decision(cid, now, max(now - entry.arrival, 0.0), charge, forced, probe, reason)

    def _dequeue(self, call_id: str) -> bool:
        entry = self._queued.pop(call_id, None)
        if entry is None:
            return False
        self._queued_bytes -= entry.demand.peak_bytes
        if call_id == self._target:
            self._retarget(self.clock())
        self._forget(entry.call.sandbox)
        return True

    def _forget(self, sandbox: str) -> None:
        """Drop fairness state of a sandbox with nothing queued or running (bounded memory)."""
        left = self._active.get(sandbox, 0) - 1
        if left > 0:
            self._active[sandbox] = left
        else:
            self._active.pop(sandbox, None)
            self._served.pop(sandbox, None)

    def _retarget(self, now: float) -> None:
        """The next heavy head becomes the credit target, starting from zero credit."""
        heavy = [e for e in self._queued.values() if e.queue == HEAVY_QUEUE]
        self._target = min(heavy, key=self._key).call.call_id if heavy else None
        self._credit = 0.0
        self._credit_at = now

    def _credit_now(self, now: float, budget: int) -> float:
        assert self._target is not None
        cap = self._queued[self._target].demand.peak_bytes
        gained = self._rate(budget) * max(now - self._credit_at, 0.0)
        return min(self._credit + gained, float(cap))

    def _accrue(self, now: float, budget: int) -> None:
        if self._target is not None:
            self._credit = self._credit_now(now, budget)
        self._credit_at = now

    def _reserve(self, window: int, logical: int) -> int:
        """Bytes the credit target holds back from every other call (ToolSched §3.3)."""
        if self._target is None:
            return 0
        target = self._queued[self._target]
        if target.demand.avg_bytes > logical:  # can never fit: leave it to the bounded wait
            return 0
        charge = logical_charge(target.demand, self._admitted_bytes, window)
        return min(int(self._credit), charge)
