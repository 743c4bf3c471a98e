"""The growth gate's controller (TenonAgent §3.5, Algorithm 1): how fast running calls may grow.

Memory a tool call has already allocated cannot be taken back by throttling, but its *next*
allocations can be delayed by not giving its tasks CPU (sched_ext parks the tasks of cgroups
marked deny; cgroup.freeze is the fallback). Every period (100 ms) the daemon samples each live
tool-call cgroup and asks this controller which calls may run until the next period.

Pure and I/O-free on purpose: the clock and the samples are injected, so the whole algorithm is
replayable from a recorded trace and testable without cgroups, BPF or sleeps.

Per call c the controller keeps an EWMA ĝ_c of the footprint's growth rate (bytes/s) over *valid*
intervals only, derives a state and a projected demand d_c = max(ĝ_c, 0) · (horizon + hold, the
time it has been held) — capped, for a call still below its declared peak, at what is left of
its declaration — and then, from one snapshot of all calls, the headroom H and the pressure
state Q (the daemon passes the state by usage alone: the growth it predicted for admitted calls
is room admission set aside for them, not pressure to pace them by):

Only undeclared growth is paced (issue 15 §4): a call below its declared peak
(AGENT_RESOURCE_HINT memory) is never held — its growth up to that peak is what admission set
aside for it, and holding it would only make a victim of it — and its remaining declaration is
reserved from H before any undeclared grower is checked. Past its declaration it is paced like
an undeclared call (that growth was set aside by nobody).

* GREEN: every live call runs.
* YELLOW: zero-demand calls (Resident, Cooling) run; at most ``b`` growing calls run, and their
  demand must fit in H. ``b`` follows AIMD: +1 per 5 s of continuous green, halved once per
  observed pressure increase.
* RED: zero-demand calls run; at most one growing call runs as a headroom-checked probe.

Growing calls get the slots every period first-fit, in priority order: running calls first,
oldest first (a paused call keeps its memory, so swapping growers only adds footprint; the
newest, least-progressed calls wait), then waiting ones, overdue (denied ≥ D_max) first. A call
denied less than D_min ago stays denied. A held call's demand includes its backlog (rate times
hold): clock-paced work catches up in a burst when released. In green everything runs, D_min
included: there is nothing to protect.

States and transitions (the base state is a pure function of ĝ; only the pause is sticky):

* no valid sample yet: rate is taken as d_boot / horizon (16 MiB/s by default) -> Growing;
* with the bcc probes, an interval in which the footprint grew also yields the rate at which the
  call faulted pages in; it is a floor under ĝ for the projection (the EWMA needs periods to
  catch up with a burst's onset, the fault counters see it in the first one);
* ĝ > +threshold -> Growing; |ĝ| ≤ threshold -> Resident; ĝ < -threshold -> Cooling;
* Growing --denied--> PausedGrowing. Samples taken while denied are invalid (a parked call gets no
  CPU; what little it gets, entering the freezer or finishing a slice, says nothing about its
  growth), so ĝ is frozen: it stays PausedGrowing until allowed (-> Growing, then re-classified
  by new valid samples). So are the samples of its first ``catchup_s`` after re-admission: a
  clock-paced call catches up in a burst that is its backlog, not its rate.

Safety: sched_ext ejects the whole scheduler if a runnable task waits longer than its watchdog
timeout (at most 30 s), so a call continuously denied for ``max_hold_s`` is forced to run for at
least one period whatever the pressure (the *hold cap*).
"""

from __future__ import annotations

import enum
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from execgate.common.units import MiB
from execgate.policy.frozen import frozen
from execgate.policy.pressure import PressureConfig, effective_margin
from execgate.policy.pressure_state import Pressure

# The kernel's ceiling on the sched_ext watchdog timeout (SCX_WATCHDOG_MAX_TIMEOUT = 30 s): the
# hold cap must stay below it or a parked task gets the scheduler ejected.
SCX_WATCHDOG_MAX_S = 30.0

Clock = Callable[[], float]


@dataclass(frozen=True)
class GrowthConfig:
    """Every tunable of the growth gate (TenonAgent Table 5 defaults)."""

    # The sampling period ewma_alpha is meant for; the controller measures real intervals and
    # weighs each by its length against this.
    period_s: float = 0.1
    # EWMA weight of the newest valid growth sample, for an interval of period_s; a longer
    # interval weighs as that many periods in a row (1 - (1 - alpha)^(dt / period_s)).
    ewma_alpha: float = 0.35
    # At green the gate holds nothing, so it samples running calls only this often, to keep
    # their ĝ current for when pressure rises; at yellow and red, every period. A sample reads
    # two cgroup files per call: under an emulator those reads took 45 % of the daemon's loop
    # at 1× (22 of 49 s). 0: every period.
    green_period_s: float = 0.5
    # |ĝ| at or below this is noise (page cache, allocator slack): Resident, not Growing/Cooling.
    growth_threshold_bps: float = 4 * MiB
    # Demand is projected this far ahead: d = max(ĝ, 0) · horizon.
    horizon_s: float = 1.0
    # Demand assumed before the first valid sample (a new call is presumed to grow).
    boot_demand_bytes: int = 16 * MiB
    # AIMD on b, the yellow slot count (`slots`: `budget` is the domain's bytes).
    slots_initial: int = 1
    slots_max: int = 4
    slots_increase_after_s: float = 5.0
    # D_min: a call denied less than this ago stays denied (anti-flapping).
    min_deny_s: float = 1.0
    # D_max: a call denied at least this long is overdue and is checked first.
    overdue_after_s: float = 3.0
    # After a deny -> allow flip, samples for this long measure the call catching up on its
    # backlog (clock-paced work bursts), not its growth rate: they are not folded into ĝ. The
    # backlog was reserved in its demand when it was re-admitted.
    catchup_s: float = 0.5
    # Hold cap: a call continuously denied this long is forced to run for a period.
    max_hold_s: float = 20.0
    # Last resort (ToolSched §3.4): red for this long with the domain's available memory (no
    # safety margin taken off) below critical and still falling -> kill one.
    last_resort_after_s: float = 2.0
    critical_headroom_bytes: int = 64 * MiB
    # Run time floor in (U - D) / T, so a call that just started doesn't get an infinite score.
    min_run_time_s: float = 0.1
    # Summaries of vanished calls kept until finished() collects them (bounded: never leak).
    finished_buffer: int = 1024
    # oom_score_adj of a held call's tasks while it is held (restored when released). The
    # kernel scores rss + adj/1000 x the OOMing cgroup's limit, so the held call is never
    # preferred over a running call (tool_oom_score_adj 500) only with a gap of 1000: at 0 a
    # held call of 198 MiB was killed beside a running 40 MiB one in a 256 MiB domain (VM).
    # A held call is stopped: it only ever shares an OOM with something that runs.
    held_oom_score_adj: int = -500
    # A call the sched_ext gate has parked this long is frozen instead (cgroup.freeze), and its
    # tasks go back to the fair class. A parked task stays runnable on its CPU's runqueue: the
    # kernel then never counts that CPU idle (idle_cpu() reads nr_running), so neither
    # newly-idle nor nohz balancing moves fair work there, and wakeups pass it by. In the VM
    # two busy host loops stacked on one CPU got half a CPU each for as long as a call was
    # parked on the other. The gate stops a call within a slice; the freezer keeps it stopped
    # off every runqueue. Shorter: held calls cost their CPU less; longer: fewer freezes.
    max_park_s: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.ewma_alpha <= 1.0:
            raise ValueError("ewma_alpha must be in (0, 1]")
        if self.growth_threshold_bps < 0:
            raise ValueError("growth_threshold_bps must be >= 0")
        if self.horizon_s <= 0 or self.period_s <= 0 or self.min_run_time_s <= 0:
            raise ValueError("horizon_s, period_s and min_run_time_s must be > 0")
        if self.green_period_s < 0:
            raise ValueError("green_period_s must be >= 0")
        if self.boot_demand_bytes < 0:
            raise ValueError("boot_demand_bytes must be >= 0")
        if not 1 <= self.slots_initial <= self.slots_max:
            raise ValueError("need 1 <= slots_initial <= slots_max")
        if self.slots_increase_after_s <= 0:
            raise ValueError("slots_increase_after_s must be > 0")
        if not 0 <= self.min_deny_s <= self.overdue_after_s <= self.max_hold_s:
            raise ValueError("need 0 <= min_deny_s <= overdue_after_s <= max_hold_s")
        if self.catchup_s < 0:
            raise ValueError("catchup_s must be >= 0")
        if not 0 < self.max_hold_s < SCX_WATCHDOG_MAX_S:
            raise ValueError(f"max_hold_s must be in (0, {SCX_WATCHDOG_MAX_S}) s")
        if self.last_resort_after_s < 0 or self.critical_headroom_bytes < 0:
            raise ValueError("last_resort_after_s and critical_headroom_bytes must be >= 0")
        if self.finished_buffer < 0:
            raise ValueError("finished_buffer must be >= 0")
        if not -1000 <= self.held_oom_score_adj <= 1000:
            raise ValueError("held_oom_score_adj must be in [-1000, 1000]")
        if not 0 < self.max_park_s <= self.max_hold_s:
            raise ValueError("need 0 < max_park_s <= max_hold_s")


class CallState(enum.StrEnum):
    GROWING = "growing"
    RESIDENT = "resident"
    COOLING = "cooling"
    PAUSED_GROWING = "paused_growing"


# Tie-break among calls checked in the same group: the ones that don't grow go first.
_STATE_RANK = {CallState.RESIDENT: 0, CallState.COOLING: 1, CallState.GROWING: 2}


class Reason(enum.StrEnum):
    """Why a call was allowed or denied this period (for logs, metrics and feedback)."""

    GREEN = "green"  # no pressure: everything runs
    ZERO_DEMAND = "zero_demand"  # Resident/Cooling: not growing, never held
    DECLARED = "declared"  # below its declared peak: admission set its growth aside
    ADMITTED = "admitted"  # yellow: within the b slots and the headroom
    PROBE = "probe"  # red: the single headroom-checked probe
    HOLD_CAP = "hold_cap"  # forced: denied for max_hold_s (sched_ext watchdog safety)
    MIN_DENY = "min_deny"  # denied less than D_min ago (anti-flapping)
    NO_SLOT = "no_slot"  # the b slots (yellow) or the probe (red) are taken
    NO_HEADROOM = "no_headroom"  # its demand doesn't fit in what is left of H


@dataclass(frozen=True)
class Sample:
    """One period's reading of one tool-call cgroup.

    ``memory_bytes`` is the footprint (memory.current + memory.swap.current), ``cpu_usec`` is
    cpu.stat usage_usec. ``started_at`` and ``sampled_at`` are on the controller's clock;
    ``sampled_at`` defaults to the time of the update() that receives the sample.
    ``fault_bytes`` is the cgroup's cumulative page faults times the page size, when the bcc
    probes count them (None without probes).
    """

    call_id: str
    memory_bytes: int
    cpu_usec: int
    declared_bytes: int | None = None
    started_at: float = 0.0
    sampled_at: float | None = None
    fault_bytes: int | None = None


@dataclass(frozen=True)
class CallDecision:
    """The decision for one call, with what it was based on."""

    call_id: str
    allow: bool
    reason: Reason
    state: CallState
    growth_bps: float | None  # ĝ; None until the first valid sample
    demand_bytes: int  # d over the horizon (d_boot until the first valid sample)
    burst_bps: float  # fault rate of the last valid interval in which it grew (0: none seen)
    overdue: bool  # checked first because denied >= D_max
    forced: bool  # allowed by the hold cap, whatever the pressure
    denied_for_s: float  # length of the current denial episode before this decision
    held_s: float  # total time held so far


@dataclass(frozen=True)
class GateDecision:
    """One period's output: a permission for every live call, from one snapshot."""

    at: float
    pressure: Pressure
    headroom_bytes: int
    slots: int  # b, the yellow slot count (reported in every state)
    slot_limit: int | None  # growing calls allowed this period; None = unlimited (green)
    allow: dict[str, bool]
    calls: dict[str, CallDecision]
    order: tuple[str, ...] = ()  # the order in which eligible calls were checked
    vanished: tuple[str, ...] = ()  # gone since last period: collect them with finished()

    @property
    def denied(self) -> frozenset[str]:
        return frozenset(cid for cid, ok in self.allow.items() if not ok)

    @property
    def forced(self) -> frozenset[str]:
        return frozenset(cid for cid, d in self.calls.items() if d.forced)


@dataclass(frozen=True)
class CallSummary:
    """What the gate did to one call over its life, returned once when it is finished."""

    call_id: str
    started_at: float
    ended_at: float
    held_s: float
    episodes: int  # number of denial episodes
    longest_hold_s: float
    forced_allows: int
    valid_samples: int
    invalid_samples: int
    last_state: CallState
    last_growth_bps: float | None

    @property
    def run_time_s(self) -> float:
        return max(self.ended_at - self.started_at, 0.0)

    def feedback(self) -> str:
        """The agent-facing line: lets it tell a slow tool from a held one."""
        return f"held {self.held_s:.1f} of {self.run_time_s:.1f} s"


@dataclass(frozen=True)
class Victim:
    """The last-resort pick, with the numbers that made it the pick (for the kill log)."""

    call_id: str
    excess_bytes: int  # U - D
    run_time_s: float  # T (floored)
    score: float  # (U - D) / T, bytes/s


@dataclass(slots=True)
class _Call:
    call_id: str
    started_at: float
    last_seen: float
    last_memory: int
    last_cpu: int
    last_sampled: float
    growth: float | None = None
    last_faults: int | None = None
    burst: float = 0.0  # fault-rate evidence of the last valid interval (bytes/s; 0 = none)
    valid_samples: int = 0
    invalid_samples: int = 0
    # The published permission. New cgroups are not in the deny map, so they start allowed.
    allowed: bool = True
    perm_changed: bool = False  # the last decision flipped the permission
    deny_since: float | None = None
    readmitted_at: float | None = None  # last deny -> allow flip
    decided_at: float | None = None
    held_s: float = 0.0
    episodes: int = 0
    longest_hold_s: float = 0.0
    forced_allows: int = 0
    state: CallState = CallState.GROWING
    demand: int = 0


def _within_declaration(demand: int, s: Sample) -> int:
    """A call below its declared peak cannot need more than the rest of its declaration: the
    projection (rate x (horizon + hold)) is capped there, so a fast ramp or a long hold does not
    make a call that is about to level off look like it needs the whole domain. A call at or
    above its declaration (it under-declared) keeps the uncapped projection."""
    declared = s.declared_bytes
    if declared is None or declared <= 0 or s.memory_bytes >= declared:
        return demand
    return min(demand, declared - s.memory_bytes)


def within_declaration(s: Sample) -> bool:
    """A declared call still below its declared peak: its growth is admission's, never held."""
    return bool(s.declared_bytes and s.declared_bytes > 0 and s.memory_bytes < s.declared_bytes)


def _burst_rate(grown: int, faults_before: int | None, faults_now: int | None,
                dt: float) -> float:
    """Fault evidence of one valid interval (bytes/s): how fast the call touched new pages, when
    its footprint grew. Faults count what was allocated *between* the two samples, including
    memory the endpoints miss (freed again, or still arriving); an interval whose footprint did
    not grow is churn (re-faulted cache, freed and re-used buffers) and says nothing."""
    if grown <= 0 or faults_before is None or faults_now is None or dt <= 0:
        return 0.0
    return max(faults_now - faults_before, 0) / dt


def headroom(mem_available: int, pressure: PressureConfig, budget: int | None = None) -> int:
    """H = max(MemAvailable - S, 0), S the safety margin admission keeps too (effective_margin:
    one knob, [pressure] safety_margin_*, so the gate and admission see the same headroom)."""
    return max(mem_available - effective_margin(pressure, budget), 0)


def pick_last_resort_victim(
    samples: Iterable[Sample],
    *,
    now: float,
    red_for_s: float,
    headroom_bytes: int,
    config: GrowthConfig | None = None,
    budget_bytes: int | None = None,
    swap_free_bytes: int | None = None,
    sharing: int | None = None,
) -> Victim | None:
    """ToolSched §3.4: the tool call to kill when the host is about to OOM, or None.

    Only when red has persisted ``last_resort_after_s``, ``headroom_bytes`` (what is left to
    allocate) is below the critical level and so is swap (``swap_free_bytes``; None: unknown,
    taken as none): while swap has room the kernel pushes memory out instead of killing. The
    victim has the largest V = (U - D) / T: usage above its declared demand per second of run
    time, i.e. the call that overran its declaration fastest. D is trusted only up to the call's
    share of the domain (``budget_bytes`` over ``sharing`` calls, by default the candidates;
    held calls count too, as their memory stays): a huge declaration must not move the kill
    onto a neighbour (issue 21). Callers pass running tool calls only — never the
    container's init, the agent, or a call the gate holds. Calls within their (credible)
    declaration (U - D <= 0) never qualify.
    """
    cfg = config or GrowthConfig()
    if red_for_s < cfg.last_resort_after_s or headroom_bytes >= cfg.critical_headroom_bytes:
        return None
    if swap_free_bytes is not None and swap_free_bytes >= cfg.critical_headroom_bytes:
        return None
    candidates = list(samples)
    n = max(sharing or 0, len(candidates))
    share = None if not budget_bytes or not n else budget_bytes // n
    best: Victim | None = None
    for s in candidates:
        declared = s.declared_bytes or 0
        if share is not None:
            declared = min(declared, share)
        excess = s.memory_bytes - declared
        if excess <= 0:
            continue
        run = max(now - s.started_at, cfg.min_run_time_s)
        cand = Victim(s.call_id, excess, run, excess / run)
        if best is None or (-cand.score, -cand.excess_bytes, cand.call_id) < (
            -best.score,
            -best.excess_bytes,
            best.call_id,
        ):
            best = cand
    return best


class GrowthController:
    """TenonAgent Algorithm 1. Call update() once per period with a sample of every live call.

    ``pressure`` is the daemon's pressure config, for its safety margin S only (see headroom)."""

    def __init__(self, config: GrowthConfig | None = None, clock: Clock = time.monotonic,
                 pressure: PressureConfig | None = None):
        self.config = config or GrowthConfig()
        self.pressure = pressure or PressureConfig()
        self._clock = clock
        self._calls: dict[str, _Call] = {}
        self._done: OrderedDict[str, CallSummary] = OrderedDict()
        self._slots = self.config.slots_initial
        self._pressure: Pressure | None = None
        self._green_since: float | None = None
        self._red_since: float | None = None
        self._last_update: float | None = None
        self._available: tuple[int | None, int | None] = (None, None)  # previous, latest
        self._domain_budget: int | None = None

    @property
    def slots(self) -> int:
        """b, the yellow slot count (AIMD)."""
        return self._slots

    # -- the period -------------------------------------------------------------------------

    def wants_samples(self, pressure: Pressure) -> bool:
        """Whether this period needs fresh samples: always but at green, and at green once per
        green_period_s (config; to the nearest period). The first green period after yellow or
        red always runs: it releases what was held."""
        last, cfg = self._last_update, self.config
        return (pressure != Pressure.GREEN or self._pressure != Pressure.GREEN or last is None
                or self._clock() - last >= cfg.green_period_s - cfg.period_s / 2)

    def update(
        self,
        samples: Iterable[Sample],
        pressure: Pressure,
        mem_available: int,
        budget: int | None = None,
    ) -> GateDecision:
        """Decide allow/deny for every sampled call; calls missing from ``samples`` are gone.

        ``mem_available`` is what the domain can still allocate, ``budget`` its size (when known:
        it bounds the safety margin S, see pressure.effective_margin).
        """
        now = self._clock()
        self._available = (self._available[1], mem_available)
        self._domain_budget = budget
        batch: dict[str, Sample] = {}
        for s in samples:
            if s.call_id in batch:
                raise ValueError(f"duplicate sample for {s.call_id}")
            batch[s.call_id] = s

        self._observe_pressure(pressure, now)
        vanished = tuple(sorted(cid for cid in self._calls if cid not in batch))
        for cid in vanished:
            c = self._calls.pop(cid)
            self._stash(self._summary(c, ended_at=c.last_seen))

        denied_for: dict[str, float] = {}
        for cid, s in batch.items():
            c = self._calls.get(cid)
            if c is None:
                c = self._calls[cid] = self._new_call(s, now)
            else:
                self._observe_sample(c, s, now)
            held = denied_for[cid] = 0.0 if c.allowed else self._accrue_hold(c, now)
            c.state, c.demand = self._classify(c.growth, held, c.burst)
            c.demand = _within_declaration(c.demand, s)

        H = headroom(mem_available, self.pressure, budget)
        if pressure == Pressure.GREEN:
            slot_limit = None
            verdicts = {cid: (True, Reason.GREEN) for cid in batch}
            order: tuple[str, ...] = ()
            overdue: set[str] = set()
        else:
            slot_limit = self._slots if pressure == Pressure.YELLOW else 1
            verdicts, order, overdue = self._gate(batch, denied_for, pressure, H, slot_limit, now)

        calls: dict[str, CallDecision] = {}
        allow: dict[str, bool] = {}
        for cid in batch:
            c = self._calls[cid]
            ok, reason = verdicts[cid]
            allow[cid] = ok
            self._commit(c, ok, reason, now)
            calls[cid] = frozen(  # its __init__ costs, one per call per period
                CallDecision,
                call_id=cid,
                allow=ok,
                reason=reason,
                state=c.state,
                growth_bps=c.growth,
                demand_bytes=c.demand,
                burst_bps=c.burst,
                overdue=cid in overdue,
                forced=reason == Reason.HOLD_CAP,
                denied_for_s=denied_for[cid],
                held_s=c.held_s,
            )
        self._last_update = now
        return GateDecision(
            at=now,
            pressure=pressure,
            headroom_bytes=H,
            slots=self._slots,
            slot_limit=slot_limit,
            allow=allow,
            calls=calls,
            order=order,
            vanished=vanished,
        )

    def _observe_pressure(self, pressure: Pressure, now: float) -> None:
        """AIMD on b: multiplicative decrease per pressure *increase*, additive per green span."""
        cfg = self.config
        prev = self._pressure
        if prev is not None and pressure > prev:
            # Once per observed increase (green->red counts once), not per period spent high.
            self._slots = max(1, self._slots // 2)
        if pressure == Pressure.GREEN:
            if self._green_since is None:
                self._green_since = now
            while now - self._green_since >= cfg.slots_increase_after_s:
                self._slots = min(cfg.slots_max, self._slots + 1)
                self._green_since += cfg.slots_increase_after_s
        else:
            self._green_since = None
        if pressure == Pressure.RED:
            if self._red_since is None:
                self._red_since = now
        else:
            self._red_since = None
        self._pressure = pressure

    def _new_call(self, s: Sample, now: float) -> _Call:
        t = now if s.sampled_at is None else s.sampled_at
        return _Call(
            call_id=s.call_id,
            started_at=s.started_at,
            last_seen=now,
            last_memory=s.memory_bytes,
            last_cpu=s.cpu_usec,
            last_sampled=t,
            last_faults=s.fault_bytes,
        )

    def _observe_sample(self, c: _Call, s: Sample, now: float) -> None:
        """Fold the interval since the previous sample into ĝ, if it says anything about growth.

        An interval in which the permission flipped mixes run and park, one spent denied or
        without CPU time says nothing about how fast the call grows when it runs, and one
        starting within catchup_s of a re-admission measures the catch-up burst; all would drag
        ĝ away from the call's own rate, so they are skipped.
        """
        t = now if s.sampled_at is None else s.sampled_at
        dt = t - c.last_sampled
        catching_up = (c.readmitted_at is not None
                       and c.last_sampled < c.readmitted_at + self.config.catchup_s)
        if (c.allowed and not c.perm_changed and not catching_up and s.cpu_usec > c.last_cpu
                and dt > 0):
            grown = s.memory_bytes - c.last_memory
            g = grown / dt
            a = 1.0 - (1.0 - self.config.ewma_alpha) ** (dt / self.config.period_s)
            # Seeded with the first observation: starting from 0 would hide a fast grower.
            c.growth = g if c.growth is None else a * g + (1.0 - a) * c.growth
            c.burst = _burst_rate(grown, c.last_faults, s.fault_bytes, dt)
            c.valid_samples += 1
        else:
            c.invalid_samples += 1
        c.last_memory, c.last_cpu, c.last_sampled = s.memory_bytes, s.cpu_usec, t
        c.last_faults = s.fault_bytes
        c.last_seen = now

    def _accrue_hold(self, c: _Call, now: float) -> float:
        """Charge the time held since the last decision; returns the current episode's length."""
        if c.allowed or c.deny_since is None:
            return 0.0
        if c.decided_at is not None:
            c.held_s += max(now - c.decided_at, 0.0)
            c.decided_at = now
        episode = max(now - c.deny_since, 0.0)
        c.longest_hold_s = max(c.longest_hold_s, episode)
        return episode

    def _classify(self, growth: float | None, held_for: float = 0.0,
                  burst: float = 0.0) -> tuple[CallState, int]:
        """State and projected demand. A call held for ``held_for`` seconds projects over the
        horizon *plus* its hold: work paced by the clock (timers, input that kept arriving)
        catches up in one burst when released, so re-admitting it needs room for the backlog.
        ``burst`` (fault evidence, see _burst_rate) is a floor under the rate: the EWMA needs
        several periods to catch up with a burst's onset, the fault counters see it at once."""
        cfg = self.config
        if growth is None:
            rate = max(cfg.boot_demand_bytes / cfg.horizon_s, burst)
            demand = math.ceil(rate * (cfg.horizon_s + held_for))
        else:
            rate = max(growth, burst) if burst > 0 else growth
            demand = math.ceil(max(rate, 0.0) * (cfg.horizon_s + held_for))
        if rate > cfg.growth_threshold_bps:
            return CallState.GROWING, demand
        if rate < -cfg.growth_threshold_bps:
            return CallState.COOLING, demand
        return CallState.RESIDENT, demand

    def _gate(
        self,
        batch: dict[str, Sample],
        denied_for: dict[str, float],
        pressure: Pressure,
        H: int,
        slot_limit: int,
        now: float,
    ) -> tuple[dict[str, tuple[bool, Reason]], tuple[str, ...], set[str]]:
        """Yellow/red: declared calls, forced calls, then anti-flap holds, then eligible calls in
        priority order.

        Zero-demand calls are unconditional, so their (small, ≤ threshold · horizon) demand is
        reserved from H before any growing call is checked; growing calls then get the slots
        and the rest of H first-fit in order: running calls (oldest first), then overdue
        waiting ones, then the other waiting ones (Resident, Cooling, Growing, then smaller
        demand, older, id). A running grower keeps its slot while it fits: memory a paused call
        holds is not given back, so swapping one grower for another only adds the newcomer's
        footprint to the paused one's; the newest/least-progressed calls wait, and the hold
        cap bounds how long.
        """
        cfg = self.config
        verdicts: dict[str, tuple[bool, Reason]] = {}
        remaining = H
        slots = 0
        eligible: list[tuple[tuple[int, int, int, float, str], _Call]] = []
        overdue: set[str] = set()
        for cid in sorted(batch):
            c = self._calls[cid]
            growing = c.state == CallState.GROWING
            if within_declaration(batch[cid]):  # its growth is admission's: reserved, not held
                verdicts[cid] = (True, Reason.DECLARED)
                remaining -= c.demand
                continue
            if c.allowed:
                eligible.append(((0, _STATE_RANK[c.state], 0, c.started_at, cid), c))
                continue
            held = denied_for[cid]
            if held >= cfg.max_hold_s:
                verdicts[cid] = (True, Reason.HOLD_CAP)
                remaining -= c.demand
                if growing:
                    slots += 1
                continue
            if held < cfg.min_deny_s:
                verdicts[cid] = (False, Reason.MIN_DENY)
                continue
            if held >= cfg.overdue_after_s:
                overdue.add(cid)
            group = 1 if cid in overdue else 2
            eligible.append(((group, _STATE_RANK[c.state], c.demand, c.started_at, cid), c))
        eligible.sort(key=lambda kc: kc[0])

        for _, c in eligible:
            if c.state != CallState.GROWING:
                verdicts[c.call_id] = (True, Reason.ZERO_DEMAND)
                remaining -= c.demand
        admit = Reason.ADMITTED if pressure == Pressure.YELLOW else Reason.PROBE
        for _, c in eligible:
            if c.state != CallState.GROWING:
                continue
            if slots >= slot_limit:
                verdicts[c.call_id] = (False, Reason.NO_SLOT)
            elif c.demand > remaining:
                verdicts[c.call_id] = (False, Reason.NO_HEADROOM)
            else:
                verdicts[c.call_id] = (True, admit)
                slots += 1
                remaining -= c.demand
        return verdicts, tuple(c.call_id for _, c in eligible), overdue

    def _commit(self, c: _Call, ok: bool, reason: Reason, now: float) -> None:
        """Publish the decision into the call's record: episodes, forced count, paused state."""
        c.perm_changed = ok != c.allowed
        if not ok and c.allowed:
            c.deny_since = now
            c.episodes += 1
        elif ok and not c.allowed:
            c.deny_since = None
            c.readmitted_at = now
        if reason == Reason.HOLD_CAP:
            c.forced_allows += 1
        c.allowed = ok
        c.decided_at = now
        if not ok and c.state == CallState.GROWING:
            c.state = CallState.PAUSED_GROWING

    # -- lifecycle and introspection ---------------------------------------------------------

    def finished(self, call_id: str) -> CallSummary | None:
        """Forget a call and return its summary, once; None if unknown or already returned.

        For a live call the hold is charged up to now (the caller says it ends now); for one that
        already vanished from the samples, up to the last period it was seen in.
        """
        c = self._calls.pop(call_id, None)
        if c is not None:
            now = self._clock()
            self._accrue_hold(c, now)
            return self._summary(c, ended_at=now)
        return self._done.pop(call_id, None)

    def _stash(self, summary: CallSummary) -> None:
        if self.config.finished_buffer == 0:
            return
        self._done[summary.call_id] = summary
        while len(self._done) > self.config.finished_buffer:
            self._done.popitem(last=False)

    @staticmethod
    def _summary(c: _Call, ended_at: float) -> CallSummary:
        return CallSummary(
            call_id=c.call_id,
            started_at=c.started_at,
            ended_at=ended_at,
            held_s=c.held_s,
            episodes=c.episodes,
            longest_hold_s=c.longest_hold_s,
            forced_allows=c.forced_allows,
            valid_samples=c.valid_samples,
            invalid_samples=c.invalid_samples,
            last_state=c.state,
            last_growth_bps=c.growth,
        )

    def last_resort_victim(self, samples: Iterable[Sample], mem_available: int,
                           swap_free: int | None = None) -> Victim | None:
        """pick_last_resort_victim() with the red streak this controller has observed, only
        when nothing else helps: what the domain can still allocate (before the safety margin:
        S is the gate's slack, not the kernel's) is critical *and* still shrank over the
        last period although the gate holds growth, and swap is full or absent. A domain that
        is full but stable is the gate working, not an OOM about to happen. Only calls the
        last decision let run are candidates: a held call is never the one killed.
        """
        now = self._clock()
        red_for = 0.0 if self._red_since is None else now - self._red_since
        prev, _ = self._available
        if prev is not None and mem_available >= prev:
            return None
        samples = list(samples)
        running = [s for s in samples if s.call_id not in self._calls
                   or self._calls[s.call_id].allowed]
        return pick_last_resort_victim(
            running,
            now=now,
            red_for_s=red_for,
            headroom_bytes=mem_available,
            config=self.config,
            budget_bytes=self._domain_budget,
            swap_free_bytes=swap_free,
            sharing=len(samples),  # the held calls share the budget too
        )

    def snapshot(self) -> dict[str, object]:
        """JSON-ready state for execgatectl and metrics (as of the last update)."""
        at = self._last_update
        calls: dict[str, object] = {}
        for cid, c in sorted(self._calls.items()):
            episode = 0.0 if c.allowed or c.deny_since is None or at is None else at - c.deny_since
            calls[cid] = {
                "state": str(c.state),
                "allowed": c.allowed,
                "growth_bps": c.growth,
                "demand_bytes": c.demand,
                "burst_bps": c.burst,
                "denied_for_s": episode,
                "held_s": c.held_s,
                "episodes": c.episodes,
                "longest_hold_s": c.longest_hold_s,
                "forced_allows": c.forced_allows,
                "valid_samples": c.valid_samples,
                "invalid_samples": c.invalid_samples,
                "started_at": c.started_at,
            }
        return {
            "at": at,
            "pressure": None if self._pressure is None else str(self._pressure),
            "slots": self._slots,
            "green_since": self._green_since,
            "red_since": self._red_since,
            "calls": calls,
            "finished_pending": list(self._done),
        }
