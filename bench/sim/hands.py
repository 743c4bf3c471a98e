"""execgated's decisions in simulated time: the daemon's policy objects, driven by the simulator.

The daemon (execgate/daemon/engine.py, growth_gate.py, idle_sandboxes.py) is the policy's
hands on a real kernel: it samples cgroups, feeds `assess_pressure`, `Admission`,
`GrowthController` and `residency.plan`, and applies what they decide. This module is a second
pair of hands for the same brain, on the simulator's memory model (bench/sim/memory.py): the same
policy objects, built from the same Settings (`execgate.daemon.settings.load` of the config the
bench writes for the scheme), on an injected clock. Nothing here decides; what it does is the
wiring, kept as close to the daemon's as the simulation allows:

* pressure: `available` = budget - memory.current of the slice; predicted growth from
  `Admission.predicted_growth` over the running calls' current bytes (engine._assess);
* admission: `submit` on the exec's arrival, `step` right after it, after every release and every
  period (engine._step), with the idle room (daemon/idle_room.IdleRoom itself, on
  bench/sim/room.py's figures: idle sandboxes' reclaimable bytes, active ones' cold bytes when
  [headroom] count_cold, discounted by the swap-out bandwidth); what its admissions borrowed and
  the first in line's deficit are asked of residency (make_room); the estimator learns each
  finished call's peak and average (engine._observe: an OOM-killed call with oom_killed=True);
* growth gate: one `Sample` per running call per period, the state by `gate_state`, `GREEN`
  when the gate is off (growth_gate.GrowthGate.update); a denied call's memory stops growing;
  the last-resort victim is killed (cgroup.kill: the call fails with 137);
* residency: `plan` with the sandboxes' idle times, the action boundary (`ended`: a sandbox
  whose call ended since the last residency period, idle at once), what memory.reclaim could
  take (`reclaimable`), the room admission asked for, and `need` as the daemon computes it
  (idle_sandboxes.Residency._need + the queued calls' demand); it runs while not green, while
  something is frozen, or while room is asked; a reclaim pushes the sandbox's
  memory to swap at the modelled bandwidth (nothing without swap), freezing changes no bytes.

Two small pieces of that wiring are re-stated here rather than imported, because in the daemon
they are methods of classes that own cgroup I/O: Residency._need (one line) and the
Sample-building loop of GrowthGate.update. Moving them into execgate/policy (a pure
`residency.need(reading, cfg)` and a `growth.sample_of(...)`) would let both hands share them.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.sim.memory import Domain, SimBox, SimCall
from bench.sim.room import SimResidency
from bench.sim.views import BoxViews
from execgate.common.config import Config
from execgate.common.hints import parse_size
from execgate.daemon import settings as daemon_settings
from execgate.policy import pressure as pressure_mod
from execgate.policy.admission import Admission, Decision
from execgate.policy.estimate import CallInfo, HistoryEstimator, Outcome
from execgate.policy.growth import GrowthController, Sample
from execgate.policy.pressure import PressureReading, assess_pressure
from execgate.policy.pressure_state import Pressure
from execgate.policy.residency import SandboxView, plan

try:  # issue 15 §1; absent from older revisions (--policy-rev)
    from execgate.policy import sandbox_admission as _sa
    from execgate.policy.headroom import LiveSandbox
except ImportError:  # pragma: no cover - depends on the revision
    _sa = None  # type: ignore[assignment]
try:  # issue 15 §3: the idle room offered to call admission
    from execgate.daemon.idle_room import IdleRoom
except ImportError:  # pragma: no cover - depends on the revision
    IdleRoom = None  # type: ignore[assignment,misc]
try:  # and the time to peak it learns from finished calls
    from execgate.policy.headroom import time_to_peak
except ImportError:  # pragma: no cover - depends on the revision
    time_to_peak = None  # type: ignore[assignment]
try:  # swap room counted as available until the domain thrashes (b05fd4f)
    from execgate.policy.swap_credit import SwapCredit, swap_room
except ImportError:  # pragma: no cover - depends on the revision
    SwapCredit = None  # type: ignore[assignment,misc]
    swap_room = None  # type: ignore[assignment]
try:  # regions capped in bytes (3 Dec)
    from execgate.policy.pressure import region_limits
except ImportError:  # pragma: no cover - depends on the revision
    def region_limits(config: Any, budget: int) -> tuple[int, int]:
        red = int(budget * config.red_fraction)
        return red, red + int(budget * config.yellow_fraction)

# What the revision's policy takes (--policy-rev runs older ones): the action boundary and
# reclaimable bytes in residency's views, the room asked of plan, the idle room of a step.
_VIEW_FIELDS = {f.name for f in dataclasses.fields(SandboxView)}
_PLAN_ROOM = "room" in inspect.signature(plan).parameters
_STEP_ROOM = "idle_room" in inspect.signature(Admission.step).parameters
_LIVE_COLD = _sa is not None and "cold_bytes" in {f.name for f in dataclasses.fields(LiveSandbox)}
_LIVE_SWAP = _sa is not None and "swap_bytes" in {f.name for f in dataclasses.fields(LiveSandbox)}
_SNAP_SWAP = _sa is not None and "swap_free_bytes" in {
    f.name for f in dataclasses.fields(_sa.DomainSnapshot)}
_SNAP_CREDIT = _sa is not None and "swap_credit_bytes" in {
    f.name for f in dataclasses.fields(_sa.DomainSnapshot)}
_ASSESS = inspect.signature(assess_pressure).parameters
_PSI = "psi_some_avg10" in _ASSESS
_CREDIT = "swap_credit" in _ASSESS and SwapCredit is not None
_STARTS_ONLY = ({"waiting": False} if _sa is not None and "waiting" in inspect.signature(
    _sa.SandboxAdmission.step).parameters else {})
_CALL_RAN = _sa is not None and hasattr(_sa.SandboxAdmission, "call_ran")
_VICTIM_SWAP = "swap_free" in inspect.signature(GrowthController.last_resort_victim).parameters
# The bench's creates are Docker's, with no deadline (a revision that cannot say bounds all).
DOCKER = ({"caller_deadline": False} if _sa is not None and "caller_deadline" in {
    f.name for f in dataclasses.fields(_sa.SandboxRequest)} else {})
_HELD = hasattr(pressure_mod, "held_bytes")  # growth to come from what a call holds now
_FINISHED_LOAD = _sa is not None and "call_load_bytes" in inspect.signature(
    _sa.SandboxAdmission.finished).parameters
_FINISHED_START = _sa is not None and "start_bytes" in inspect.signature(
    _sa.SandboxAdmission.finished).parameters


def _learns_leftovers() -> bool:
    """Whether the revision's daemon learns a sandbox's baseline with what its calls left
    behind (daemon/sandboxes.py from 5 Dec: Box.measured_at), or its init alone (before)."""
    try:
        from execgate.daemon.sandboxes import Box
    except ImportError:  # a revision without sandbox admission: nothing is learned
        return True
    return "measured_at" in {f.name for f in dataclasses.fields(Box)}


_LEFTOVERS = _learns_leftovers()


def _waiting_step() -> Callable[[], Any] | None:
    """The revision daemon's rule for when waiting creates are decided (daemon/sandboxes.py
    WaitingStep, 6 Dec); None before: every period."""
    try:
        from execgate.daemon import sandboxes
    except ImportError:  # a revision without sandbox admission
        return None
    return getattr(sandboxes, "WaitingStep", None)


_WAITING_STEP = _waiting_step()


def settings_from_config(cfg: Mapping[str, Any]) -> tuple[daemon_settings.Settings, list[str]]:
    """The daemon's Settings from a config.toml-shaped dict (what bench_config returns)."""
    tables = {k: dict(v) for k, v in cfg.items() if isinstance(v, dict)}
    return daemon_settings.load(Config(tables=tables))


def declared_bytes(hint: str | None) -> int | None:
    """memory:<size> of an AGENT_RESOURCE_HINT (the only item the bench's hints carry)."""
    if not hint:
        return None
    for item in hint.split(","):
        key, _, value = item.strip().partition(":")
        if key == "memory" and value:
            try:
                return parse_size(value)
            except ValueError:
                return None
    return None


@dataclass
class HandStats:
    """What the policy did, for the report (the VM's journal keeps the same figures)."""

    admitted: int = 0
    forced: int = 0
    waits: list[float] = field(default_factory=list)
    held_calls: set[str] = field(default_factory=set)
    last_resort_kills: int = 0
    reclaims: int = 0
    reclaimed_bytes: int = 0  # asked of memory.reclaim
    reclaims_at_call_end: int = 0  # of a sandbox idle for less than idle_after_s (`ended`)
    reclaims_on_room: int = 0  # while admission asked for room (make_room)
    sandbox_room_asks: int = 0  # creates admitted on pushable bytes that asked for them
    freezes: int = 0
    states: dict[str, float] = field(default_factory=lambda: {"green": 0.0, "yellow": 0.0,
                                                              "red": 0.0})
    swap_credit_s: float = 0.0  # time some swap room counted as available (swap_credit.py)
    swap_credit_max: int = 0
    thrashing_s: float = 0.0  # time the credit was off for the domain's refaults


class ExecgateHands:
    """One execgated on one simulated domain."""

    def __init__(self, settings: daemon_settings.Settings, domain: Domain,
                 clock: Callable[[], float], residency_period_s: float = 1.0,
                 immediate: bool = True, sandbox_admission: Any = None) -> None:
        self.settings = settings
        self.domain = domain
        self.clock = clock
        self.estimator = HistoryEstimator(settings.estimate)
        self.admission = Admission(settings.admission, estimator=self.estimator, clock=clock)
        params = inspect.signature(GrowthController).parameters
        kw: dict[str, Any] = {"pressure": settings.pressure} if "pressure" in params else {}
        self.growth = GrowthController(settings.growth, clock, **kw)
        # (a policy revision before green_period_s sampled every period)
        self._wants_samples = getattr(self.growth, "wants_samples", None)
        self.gate_on = settings.daemon.gate != "off"
        # growth_gate._oom: a held call's tasks at this oom_score_adj, their own back on
        # release (None: a policy revision from before it)
        self.held_adj: int | None = getattr(settings.growth, "held_oom_score_adj", None)
        self._own_adj: dict[str, int] = {}
        self.residency = settings.residency
        self.residency_period_s = residency_period_s
        # The daemon steps admission at once on every submit and release (engine._step);
        # immediate=False defers those steps to the next period (at most tick_s later), which
        # a 1,000-sandbox run needs: each step sorts the whole queue.
        self.immediate = immediate
        self.calls: dict[str, CallInfo] = {}  # submitted, not yet released
        self.running: dict[str, SimCall] = {}  # admitted and started
        self.cpu: dict[str, int] = {}
        self.frozen: set[str] = set()
        self.reclaimed: set[str] = set()  # reclaimed in their current idle period
        self.reading: PressureReading | None = None
        self.green_since = clock()
        self.next_residency = 0.0
        self.stats = HandStats()
        # Sandbox admission (policy/sandbox_admission.py), when the scheme has it: creates wait
        # in the runtime until it says start (daemon/sandboxes.py: active sandboxes' cold bytes
        # when count_cold; a create admitted on pushable bytes asks residency for them).
        self.sandboxes = sandbox_admission
        self.box_waiting: dict[str, int | None] = {}  # queued creates: their first call's peak
        # Admitted creates whose docker run is still going: the daemon has their record (runc
        # create ran) long before the simulated run ends, so they are live, empty, to it.
        self.in_flight: dict[str, int] = {}  # -> next-call peak
        self.next_peak: dict[str, int] = {}  # live sandbox -> predicted peak of its queued call
        self.box_peaks: dict[str, int] = {}  # live sandbox -> largest call peak so far
        # live sandbox -> (started, its calls' peak x duration so far): its call load
        self.box_load: dict[str, tuple[float, float]] = {}
        self.sandbox_waits: list[float] = []
        self.sandbox_fail_open = 0
        # daemon/sandboxes.py: waiting creates decided when due (None: every period)
        self.decide = _WAITING_STEP() if _WAITING_STEP is not None else None
        self._box_calls: dict[str, int] = {}  # sandbox -> its submitted, unreleased calls
        # The policy's views of the sandboxes, rebuilt only where they changed (views.py).
        self._live_views = (BoxViews(domain, self._live_view) if sandbox_admission is not None
                            else None)
        self._residency_views = BoxViews(domain, self._residency_view)
        # Residency's action boundary (idle_sandboxes.Box.active/ended): touched by a call's
        # submit or end since the last residency period; idle since a call ended in it.
        self.active: set[str] = set()
        self.ended: set[str] = set()
        self.waiting: set[str] = set()  # calls submitted, not yet admitted (engine.pending)
        # engine.LiveCall.rise: (time, bytes) where a running call grew 5 % since the last
        self.rise: dict[str, list[tuple[float, int]]] = {}
        self.res = SimResidency(settings.residency, domain, clock, lambda: self._box_calls,
                                self.reclaimed)
        headroom = getattr(settings, "headroom", None)
        self.count_cold = bool(headroom is not None and headroom.count_cold and _LIVE_COLD)
        self.swap_out_configured = float(getattr(headroom, "swap_out_bytes_per_s", 0.0))
        self.idle_room = (IdleRoom(headroom, self.res, clock)  # type: ignore[arg-type]
                          if IdleRoom is not None and headroom is not None and _STEP_ROOM
                          else None)
        # engine.py: the swap room counted while refaults stay low; `reading` (admission, the
        # gate and residency, as in the engine) has it, `physical` (kept for the summary and
        # the tests) does not
        self.swap_credit = SwapCredit(headroom) if _CREDIT and headroom is not None else None
        self.credit = 0
        self.physical: PressureReading | None = None

    def _mark(self, box_id: str) -> None:
        """What the views show of a sandbox changed here (a call queued or gone, frozen, ...)."""
        self._residency_views.mark(box_id)
        if self._live_views is not None:
            self._live_views.mark(box_id)

    def _live_view(self, b: SimBox, now: float) -> tuple[Any, bool]:
        """Sandbox admission's view: idle (gives back what it can) unless a call waits or runs."""
        peak = self.next_peak.get(b.id)
        idle = peak is None and b.call is None
        resident = int(self.domain.charged(b))  # the daemon's memory.current less calls
        # daemon/sandboxes.py: the queued call's peak, else the largest seen in it, else the
        # configured default
        peak = peak or self.box_peaks.get(b.id) or self.sandboxes.config.default_call_peak_bytes
        kept = self.res.swap_kept()  # admission counts what a push frees (zswap: less)
        kw: dict[str, int] = {}  # the fields this revision's LiveSandbox has
        if not idle:
            if self.count_cold:
                kw["cold_bytes"], swap = self.res.cold_parts(b, kept=kept)
                if _LIVE_SWAP:
                    kw["swap_bytes"] = swap
            return LiveSandbox(b.id, resident, 0, None, peak or 0, **kw), idle
        reclaim, swap = self.res.reclaimable_parts(b, kept=kept)
        if _LIVE_SWAP:
            kw["swap_bytes"] = swap
        return LiveSandbox(b.id, resident, reclaim, now - b.last_active, peak or 0, **kw), idle

    def _residency_view(self, b: SimBox, now: float) -> tuple[SandboxView, bool]:
        """Residency's view: idle unless a call of it is submitted and not yet released."""
        idle = b.id not in self._box_calls
        kw: dict[str, Any] = {}
        if "ended" in _VIEW_FIELDS:
            kw["ended"] = b.id in self.ended
        if "reclaimable" in _VIEW_FIELDS:
            kw["reclaimable"] = self.res.reclaimable_bytes(b) if idle else 0
        return SandboxView(b.id, now - b.last_active if idle else None, int(self.domain.charged(b)),
                           True, b.id in self.frozen, b.id in self.reclaimed, **kw), idle

    # -- sandbox creates -----------------------------------------------------------------------

    def create(self, box_id: str, first_call_peak: int | None) -> list[str]:
        """A managed create asks to start; returns the creates that may go on now."""
        if self.sandboxes is None:
            return [box_id]
        self.sandboxes.submit(_sa.SandboxRequest(box_id, "bench", first_call_peak, **DOCKER))
        self.box_waiting[box_id] = first_call_peak
        if self.decide is not None:
            self.decide.asked += 1
        return self.step_sandboxes()

    def step_sandboxes(self) -> list[str]:
        if self.sandboxes is None or not self.box_waiting:
            return []
        if self.decide is not None and not self.decide.due(self.clock(), self.running):
            return []
        assert self._live_views is not None
        live = self._live_views.read(self.clock())
        if self.in_flight:
            boxes = self.domain.boxes
            launched = getattr(self.sandboxes, "launched", None)  # max_launching, 6 Dec
            for bid in [b for b in self.in_flight if b in boxes]:
                del self.in_flight[bid]
                if launched is not None:  # its runtime's start has run (daemon: prepared)
                    launched(bid)
            live = [*live, *(LiveSandbox(bid, 0, 0, None, peak)
                             for bid, peak in self.in_flight.items())]
        running = [int(max(c.charge, self.calls[cid].declared_bytes or 0))
                   for cid, c in self.running.items() if cid in self.calls]
        margin = self.reading.safety_margin if self.reading is not None else 0
        pushes = self.residency.enabled and self.residency.reclaim
        swap: tuple[int, float] | tuple[()] = ()
        if _SNAP_SWAP:  # daemon/sandboxes.py: swap's free room and bandwidth, while it pushes
            rate = (self.res.swap_out_bytes_per_s(self.swap_out_configured)
                    * (1.0 - self.res.swap_kept()))
            swap = (int(min(self.res.swap_room(), 1 << 62)) if pushes else 0, rate)
        # The swap room call admission counts: calls run on it (sandbox_admission.py).
        credit = ({"swap_credit_bytes": self.reading.swap_credit}
                  if _SNAP_CREDIT and self.reading is not None else {})
        snap = _sa.DomainSnapshot(self.domain.budget, margin, live, running, 0, *swap, **credit)
        if pushes:  # the daemon renews the standing ask while a create waits
            self.res.make_room(self.res.room_wanted())
        pushable: int | None = None  # summed for a start only: most steps start nothing
        go = []
        for d in self.sandboxes.step(snap, **_STARTS_ONLY):  # the starts: all it acts on
            if d.start:
                if pushable is None:
                    pushable = sum(s.pushable_bytes for s in live)
                # Admitted on what idle sandboxes can give back or swap absorbs: have them
                # give it (daemon/sandboxes.py step()).
                to_swap = getattr(d, "absorbed_bytes", 0) + getattr(d, "on_swap_bytes", 0)
                deficit = d.need_bytes + to_swap + pushable - d.room_bytes
                if d.verdict is _sa.Verdict.ADMITTED and (pushable or to_swap) and deficit > 0:
                    self.res.make_room(max(self.res.room_wanted(), deficit))
                    self.stats.sandbox_room_asks += 1
                self.in_flight[d.sandbox_id] = (self.box_waiting.get(d.sandbox_id)
                                                or self.sandboxes.config.default_call_peak_bytes)
                self.box_waiting.pop(d.sandbox_id, None)
                self.sandbox_waits.append(d.waited_s)
                self.sandbox_fail_open += d.verdict is _sa.Verdict.FAIL_OPEN
                self.box_load[d.sandbox_id] = (self.clock(), 0.0)
                go.append(d.sandbox_id)
        return go

    def box_gone(self, box: SimBox) -> None:
        """The sandbox was removed: the policy learns its baseline as the daemon measures it
        (daemon/sandboxes.py: what it held outside calls at its largest, its init and what its
        calls left in /dev/shm; before 5 Dec the init alone)."""
        self.active.discard(box.id)
        self.ended.discard(box.id)
        self.frozen.discard(box.id)
        self.reclaimed.discard(box.id)
        self.in_flight.pop(box.id, None)
        if self.sandboxes is None:
            return
        started, area = self.box_load.pop(box.id, (None, 0.0))
        life = None if started is None else self.clock() - started
        kw = {"call_load_bytes": int(area / life) if life and life > 0 else None} \
            if _FINISHED_LOAD else {}
        if _FINISHED_START:  # what it held before its first call: its init
            kw["start_bytes"] = box.baseline
        self.sandboxes.finished(box.id, "bench", box.baseline + box.retained * _LEFTOVERS,
                                self.box_peaks.pop(box.id, None), **kw)
        self.next_peak.pop(box.id, None)

    # -- the runtime's requests ----------------------------------------------------------------

    def submit(self, call_id: str, sandbox: str, argv: list[str],
               declared: int | None) -> list[Decision]:
        info = CallInfo(call_id, sandbox, argv, declared_bytes=declared)
        self.calls[call_id] = info
        self.waiting.add(call_id)
        self._box_calls[sandbox] = self._box_calls.get(sandbox, 0) + 1
        self._touch(sandbox)
        ticket = self.admission.submit(info)
        if self.sandboxes is not None:
            self.sandboxes.settled(sandbox)  # its first call: it holds its baseline now
            self.next_peak[sandbox] = ticket.demand.peak_bytes
        self.frozen.discard(sandbox)  # the runtime thaws a sandbox before its call
        self.reclaimed.discard(sandbox)  # active again: a new idle period starts after it
        return self.step() if self.immediate else []

    def started(self, call: SimCall) -> None:
        self.running[call.id] = call
        self.cpu[call.id] = 0

    def finished(self, call_id: str, call: SimCall | None, oom_killed: bool) -> list[Decision]:
        """The call ended (or was cancelled before it ran): learn from it, free its charge."""
        info = self.calls.pop(call_id, None)
        self.running.pop(call_id, None)
        self.cpu.pop(call_id, None)
        self._own_adj.pop(call_id, None)
        rise = self.rise.pop(call_id, None)
        learns = self.idle_room is not None and hasattr(self.idle_room, "peak_times")
        if rise and call is not None and learns and time_to_peak is not None:
            peak = int(call.shown_peak)
            self.idle_room.peak_times.observe(time_to_peak(rise, rise[0][0], peak), peak)
        self.waiting.discard(call_id)
        if info is None:
            return []
        left = self._box_calls.pop(info.sandbox) - 1
        if left:
            self._box_calls[info.sandbox] = left
        self._touch(info.sandbox)
        if self.sandboxes is not None:
            self.next_peak.pop(info.sandbox, None)
            if call is not None:
                self.box_peaks[info.sandbox] = max(self.box_peaks.get(info.sandbox, 0),
                                                   int(call.shown_peak))
                load = self.box_load.get(info.sandbox)
                if load is not None:  # the daemon's: peak x (end - admission)
                    ran = max(call.last - call.started, 0.0)
                    self.box_load[info.sandbox] = (load[0], load[1] + call.shown_peak * ran)
                    if _CALL_RAN:
                        self.sandboxes.call_ran(info.sandbox, call.shown_peak * ran)
        if call is not None and call.shown_peak > 0:  # the watcher's memory.peak
            run = max(call.last - call.started, 1e-6)
            self.estimator.observe(info, Outcome(peak_bytes=int(call.shown_peak),
                                                 avg_bytes=int(call.area / run),
                                                 duration_s=run, oom_killed=oom_killed))
        self.admission.release(call_id)
        return self.step() if self.immediate else []

    # -- the control period --------------------------------------------------------------------

    def _growths(self) -> tuple[int, int]:
        """engine._assess: growth still predicted (all, undeclared) from what a call holds now,
        resident and in swap (`held_bytes`; before it, the most it held at a sample); once per
        step, for both of its readings."""
        usage = {cid: int(c.level if _HELD else c.shown_peak if _CREDIT else c.charge)
                 for cid, c in self.running.items()}
        both = getattr(self.admission, "predicted_growths", None)  # older revisions: 2 passes
        if both is not None:
            return both(usage)
        return self.admission.predicted_growth(usage), self.admission.predicted_growth(usage, True)

    def _assess(self, growths: tuple[int, int], credit: int = 0) -> PressureReading:
        """engine._assess: the predicted growths, the PSI, the swap credit."""
        available = int(self.domain.budget - self.domain.usage())
        kw: dict[str, Any] = {"psi_some_avg10": self.domain.psi_some_avg10} if _PSI else {}
        if credit:
            kw["swap_credit"] = credit
        return assess_pressure(self.settings.pressure, available, self.domain.budget,
                               predicted_growth=growths[0], undeclared_growth=growths[1], **kw)

    def swap_free(self) -> int:
        """The domain's SwapFree within swap.max (0 without swap)."""
        return int(min(self.res.swap_room(), 1 << 62))

    def _swap_credit(self, physical: PressureReading) -> int:
        """engine._swap_credit: the swap room that counts as available now."""
        if self.swap_credit is None or swap_room is None:
            return 0
        free = self.swap_free()
        kept = self.res.swap_kept() if free else 0.0
        return self.swap_credit.credit(self.clock(), swap_room(free, kept,
                                                               physical.safety_margin))

    def _touch(self, box_id: str) -> None:
        """A call starts or ends in the sandbox (idle_sandboxes.Residency.touch)."""
        self.active.add(box_id)
        self.ended.discard(box_id)
        self.reclaimed.discard(box_id)  # a new idle period starts after it
        self._mark(box_id)

    def step(self) -> list[Decision]:
        """engine._step: admission with the idle room, then what it borrowed asked of
        residency."""
        growths = self._growths()
        self.physical = self._assess(growths)
        # engine._step: while swap counts, the kernel pushes out what calls need; the idle
        # room serves only while it does not
        self.credit = self._swap_credit(self.physical)
        self.reading = self._assess(growths, self.credit) if self.credit else self.physical
        offer = self.idle_room.offer(self._needs_idle_room()) \
            if self.idle_room is not None and not self.credit else 0
        if self.idle_room is None:
            decisions = self.admission.step(self.reading)
        else:
            decisions = self.admission.step(self.reading, offer)
            first = self.admission.first_in_line
            self.idle_room.settle(self.admission.borrowed_bytes,
                                  first.deficit_bytes if first else 0)
        for d in decisions:
            self.waiting.discard(d.call_id)
            self.stats.admitted += 1
            self.stats.forced += d.forced
            self.stats.waits.append(d.waited_s)
        return decisions

    def _needs_idle_room(self) -> bool:
        """Admission.needs_idle_room, where the policy has it. Before it did, the engine
        asked the same of queued_bytes (5534de3), and whenever calls waited without it."""
        needs = getattr(self.admission, "needs_idle_room", None)
        if needs is not None:
            return bool(needs(self.reading))
        if not self.waiting:
            return False
        queued = getattr(self.admission, "queued_bytes", None)
        return queued is None or bool(self.reading.state) or \
            queued() > self.reading.effective_headroom

    def tick(self, dt: float) -> tuple[list[Decision], list[str]]:
        """One period: admission, the growth gate, residency. Returns the admissions and the
        calls the last resort kills."""
        now = self.clock()
        if self.swap_credit is not None:  # engine._sample_domain: the period's refaults
            self.swap_credit.observe(now, int(self.domain.refault_bytes), self.domain.budget)
        decisions = self.step()
        reading, physical = self.reading, self.physical
        assert reading is not None and physical is not None
        self.stats.states[str(physical.state)] += dt
        if self.credit:
            self.stats.swap_credit_s += dt
            self.stats.swap_credit_max = max(self.stats.swap_credit_max, self.credit)
        if self.swap_credit is not None and self.swap_credit.thrashing(now):
            self.stats.thrashing_s += dt
        kills: list[str] = []
        pressure = reading.gate_state if self.gate_on else Pressure.GREEN
        # growth_gate.update: at green, calls are sampled only every green_period_s
        sampled = self._wants_samples is None or self._wants_samples(pressure)
        if self.running:
            samples = []
            cpu, rises, calls = self.cpu, self.rise, self.calls
            faults = max(int(dt * 1e5), 1)  # page faults cost a growing call CPU
            for cid, c in self.running.items():
                if not c.held:
                    cpu[cid] += faults
                rise = rises.get(cid)
                if rise is None:
                    rise = rises[cid] = []
                if c.charge > (rise[-1][1] if rise else 0) * 1.05 and len(rise) < 256:
                    rise.append((now, int(c.charge)))
                # growth_gate.update: memory.current + memory.swap.current
                if sampled:
                    samples.append(Sample(cid, int(c.charge + c.swapped), cpu[cid],
                                          calls[cid].declared_bytes, c.started))
        if self.running and sampled:
            # growth_gate.update gets available + the credit, for the gate and the last resort
            available = int(self.domain.budget - self.domain.usage()) + self.credit
            gd = self.growth.update(samples, pressure, available, self.domain.budget)
            for cid, allow in gd.allow.items():
                call = self.running[cid]
                if call.held and allow:
                    call.held = False
                    call.oom_score_adj = self._own_adj.pop(cid, call.oom_score_adj)
                elif not allow and not call.held:
                    call.held = True
                    self.stats.held_calls.add(cid)
                    if self.held_adj is not None and self.held_adj < call.oom_score_adj:
                        self._own_adj[cid] = call.oom_score_adj
                        call.oom_score_adj = self.held_adj
            if self.gate_on:
                kw = {"swap_free": self.swap_free()} if _VICTIM_SWAP else {}
                victim = self.growth.last_resort_victim(samples, available, **kw)
                if victim is not None:
                    kills.append(victim.call_id)
                    self.stats.last_resort_kills += 1
        elif sampled:  # the AIMD slot budget follows pressure even with nothing running
            self.growth.update([], pressure,
                               int(self.domain.budget - self.domain.usage()) + self.credit,
                               self.domain.budget)
        # residency on the same reading (engine._step_residency, aa0537a: by resident memory
        # alone it pushed out 400-500 MiB in a VM run where the kernel swapped what calls needed)
        if reading.state == Pressure.GREEN:
            self.green_since = min(self.green_since, now)
        else:
            self.green_since = now
        if now >= self.next_residency and (reading.state != Pressure.GREEN or self.frozen
                                           or self.res.room_wanted()):
            self.next_residency = now + self.residency_period_s
            self._residency(reading, now)
        return decisions, kills

    def _residency(self, reading: PressureReading, now: float) -> None:
        cfg = self.residency
        for bid in list(self.active):  # idle_sandboxes.Residency.step: the action boundary
            if bid not in self._box_calls:
                self.active.discard(bid)
                if bid in self.domain.boxes:
                    self.ended.add(bid)
                    self._mark(bid)
        views = self._residency_views.read(now)
        reclaiming = bool(self.domain.reclaiming)
        yellow = region_limits(self.settings.pressure, reading.budget)[1]
        need = max(yellow - reading.effective_headroom, 0) if reading.state else 0
        need += self.admission.queued_bytes()
        room = self.res.room_wanted()
        kw = {"room": room} if _PLAN_ROOM else {}
        for a in plan(cfg, reading.state, now - self.green_since, need, views, reclaiming, **kw):
            self._mark(a.cid)
            if a.kind == "freeze":
                self.frozen.add(a.cid)
                self.stats.freezes += 1
            elif a.kind == "thaw":
                self.frozen.discard(a.cid)
            elif a.kind == "reclaim":
                self.domain.reclaim(a.cid, a.amount)
                self.reclaimed.add(a.cid)
                self.res.reclaimed_bytes(a.amount)
                self.stats.reclaims += 1
                self.stats.reclaimed_bytes += a.amount
                box = self.domain.boxes.get(a.cid)
                if (a.cid in self.ended and box is not None
                        and now - box.last_active < cfg.idle_after_s):
                    self.stats.reclaims_at_call_end += 1
                self.stats.reclaims_on_room += room > 0

    def summary(self) -> dict[str, Any]:
        s = dataclasses.asdict(self.stats)
        if self.sandboxes is not None:
            w = self.sandbox_waits
            s["sandbox_wait_max_s"] = max(w, default=0.0)
            s["sandbox_wait_mean_s"] = sum(w) / len(w) if w else 0.0
            s["sandbox_fail_open"] = self.sandbox_fail_open
        s["held_calls"] = len(self.stats.held_calls)
        if self.idle_room is not None:
            s["idle_room"] = dict(self.idle_room.stats)
        s["room_asks"] = self.res.asks
        waits = s.pop("waits")
        s["admission_wait_max_s"] = max(waits, default=0.0)
        s["admission_wait_mean_s"] = sum(waits) / len(waits) if waits else 0.0
        return s
