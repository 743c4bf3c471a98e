"""The global memory-pressure state Q(t) of a workload domain (TenonAgent §3.2).

Pure and I/O-free: the daemon samples the domain every control period (100 ms) and hands the
numbers to `assess_pressure`; the result feeds admission (TenonAgent §3.4) and the growth gate.

The state is derived from *usable headroom* H = max(available + swap credit − S, 0), where the
swap credit is the swap room that counts as memory while the domain does not thrash
(`swap_credit.py`) and the safety margin S
keeps the kernel's own reclaim room out of the schedulable pool; S is at most
`safety_margin_fraction` (1/8) of the budget, so a small cgroup domain is not mostly margin.
`effective_margin` computes S for admission and the growth gate alike (one knob, one headroom).
The budget is cut into regions:
red while H ≤ red_fraction · budget, yellow while H ≤ (red_fraction + yellow_fraction) · budget,
green above, each region at most its bytes (`red_max_bytes`, `yellow_max_bytes`: 1 GiB). A
reading at exactly a boundary takes the worse state (red wins ties), which also makes an empty
domain (budget 0, H 0) red rather than green.

Usage alone reacts late: calls already admitted keep growing toward their predicted peaks. So the
state is evaluated a second time on the *effective headroom* H − predicted_growth and the worse of
the two is kept; the domain turns yellow before usage alone shows it (TenonAgent §3.2). That
early warning is for admission. The growth gate paces running calls by `gate_state`, which counts
only the growth predicted for calls *without* a declaration: a declared call's growth up to its
declared peak is room admission set aside for it, not pressure to hold it by, while an
undeclared call's predicted peak is a guess the gate stays careful about.

PSI is an optional, off-by-default corroborating signal: `some avg10` above a threshold raises the
state to at least yellow (or red). It is off by default because avg10 lags by seconds and is not
available on every host; byte headroom is the primary signal. There is deliberately no
hysteresis: each reading is a pure function of its sample, and its `reason` says why.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from execgate.common.units import GiB, KiB, MiB
from execgate.policy.pressure_state import Pressure


@dataclass(frozen=True)
class PressureConfig:
    """Tunables of the pressure state (config.toml fills them; defaults from TenonAgent §3.2)."""

    # S: bytes of available memory never counted as headroom (kernel reclaim room, page cache).
    safety_margin_bytes: int = 256 * MiB
    # ... but at most this fraction of the domain's budget: 256 MiB is host-sized and would keep
    # two thirds of a 384 MiB cgroup domain idle. The growth gate takes the same S
    # (effective_margin), so admission and the gate see the same headroom.
    safety_margin_fraction: float = 0.125
    # Size of the red region, as a fraction of the budget: red while H ≤ this · budget.
    red_fraction: float = 0.125
    # Size of the yellow region above red: yellow while H ≤ (red + yellow) · budget.
    yellow_fraction: float = 0.125
    # ... each region at most this many bytes: a fraction sized for a small domain is idle
    # memory on a large one (8 GiB of a 64 GiB host held back as "red": one probe at a time).
    # The regions absorb what running calls grow beyond their predictions before the daemon
    # reacts, which does not grow with the host (None, in code: no cap).
    red_max_bytes: int | None = 1 * GiB
    yellow_max_bytes: int | None = 1 * GiB
    # PSI memory `some avg10` (percent) above which the state is at least yellow / red.
    # None disables the rule (the default; see the module docstring).
    psi_yellow_some_avg10: float | None = None
    psi_red_some_avg10: float | None = None

    def __post_init__(self) -> None:
        if self.safety_margin_bytes < 0:
            raise ValueError("safety_margin_bytes must be >= 0")
        if not 0 <= self.safety_margin_fraction <= 1:
            raise ValueError("safety_margin_fraction must be in [0, 1]")
        if self.red_fraction < 0 or self.yellow_fraction < 0:
            raise ValueError("red_fraction and yellow_fraction must be >= 0")
        if self.red_fraction + self.yellow_fraction > 1:
            raise ValueError("red_fraction + yellow_fraction must be <= 1")
        if min(self.red_max_bytes or 0, self.yellow_max_bytes or 0) < 0:
            raise ValueError("red_max_bytes and yellow_max_bytes must be >= 0")


@dataclass(frozen=True)
class PressureReading:
    """One explainable evaluation of Q(t); admission reads state, budget and headroom from it."""

    state: Pressure
    # H = max(available + swap_credit − S, 0).
    headroom: int
    # max(H − predicted_growth, 0): what is left once admitted calls reach their predicted peaks.
    effective_headroom: int
    # Human-readable cause of `state` (for logs and `execgatectl status`).
    reason: str
    # The domain's total bytes and the margin S, so admission can derive its logical budget.
    budget: int
    safety_margin: int
    # The raw inputs, kept for explanation.
    available: int = 0
    predicted_growth: int = 0
    psi_some_avg10: float | None = None
    # H at or below this is red (`region_limits`): yellow admission keeps it free.
    red_limit: int = 0
    # The state the growth gate paces by (see `gate_state`); None = `state`.
    by_gate: Pressure | None = None
    # Swap room counted as available (policy/swap_credit.py): in headroom and logical budget.
    swap_credit: int = 0

    @property
    def gate_state(self) -> Pressure:
        """Q(t) on headroom minus the growth predicted for undeclared calls only (PSI included).
        The growth still predicted for declared calls is room admission already set aside for
        them: it stops *new* admissions early, but must not hold the very calls it was set aside
        for (the gate caps their demand at what is left of their declaration instead)."""
        return self.state if self.by_gate is None else self.by_gate

    @property
    def logical_budget(self) -> int:
        """budget − S: what admission may hand out as logical charges (TenonAgent §3.4),
        plus the swap room that counts as memory (cold pages the kernel swaps out itself)."""
        return max(self.budget - self.safety_margin, 0) + max(self.swap_credit, 0)


def fmt_bytes(n: float) -> str:
    """Short human form for reasons: 512 MiB, 1.5 GiB, 300 B."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            value = n / size
            text = f"{value:.0f}" if value == int(value) else f"{value:.1f}"
            return f"{sign}{text} {unit}"
    return f"{sign}{n:.0f} B"


def _region(headroom: int, red_limit: int, yellow_limit: int) -> Pressure:
    # Boundaries belong to the worse state: red wins ties.
    if headroom <= red_limit:
        return Pressure.RED
    if headroom <= yellow_limit:
        return Pressure.YELLOW
    return Pressure.GREEN


def assess_pressure(
    config: PressureConfig,
    available: int,
    budget: int,
    *,
    predicted_growth: int = 0,
    undeclared_growth: int = 0,
    psi_some_avg10: float | None = None,
    swap_credit: int = 0,
) -> PressureReading:
    """Classify one sample of the domain into green / yellow / red (TenonAgent §3.2).

    available: free bytes of the domain (MemAvailable, or a parent cgroup's max − current; may be
    negative when the parent is over its limit). budget: the domain's total bytes.
    predicted_growth: bytes the already-admitted calls are still predicted to grow by (see
    `predicted_remaining_growth`); undeclared_growth: the part of it predicted for calls without a
    declaration (for `gate_state`). psi_some_avg10: PSI memory `some avg10`, if known.
    swap_credit: bytes of swap room that count as available (`swap_credit.SwapCredit`).
    """
    if budget < 0:
        raise ValueError("budget must be >= 0")
    margin = effective_margin(config, budget)
    growth = max(predicted_growth, 0)
    credit = max(swap_credit, 0)
    headroom = max(available + credit - margin, 0)
    effective = max(headroom - growth, 0)
    red_limit, yellow_limit = region_limits(config, budget)

    by_usage = _region(headroom, red_limit, yellow_limit)
    by_gate = _region(max(headroom - max(undeclared_growth, 0), 0), red_limit, yellow_limit)
    by_growth = _region(effective, red_limit, yellow_limit)
    state = max(by_usage, by_growth)
    limit = red_limit if state is Pressure.RED else yellow_limit
    if by_growth > by_usage:
        reason = (
            f"{state}: effective headroom {fmt_bytes(effective)} (headroom {fmt_bytes(headroom)}"
            f" - predicted growth {fmt_bytes(growth)}) <= {state} limit {fmt_bytes(limit)}"
        )
    elif state is Pressure.GREEN:
        reason = (
            f"green: effective headroom {fmt_bytes(effective)} > yellow limit "
            f"{fmt_bytes(yellow_limit)}"
        )
    else:
        reason = f"{state}: headroom {fmt_bytes(headroom)} <= {state} limit {fmt_bytes(limit)}"

    if credit:
        reason += f" (swap counts {fmt_bytes(credit)})"
    if psi_some_avg10 is not None:
        for threshold, psi_state in (
            (config.psi_red_some_avg10, Pressure.RED),
            (config.psi_yellow_some_avg10, Pressure.YELLOW),
        ):
            if threshold is not None and psi_some_avg10 > threshold:
                by_gate = max(by_gate, psi_state)
                if psi_state > state:
                    state = psi_state
                    reason = (
                        f"{state}: PSI some avg10 {psi_some_avg10:g} > {threshold:g} "
                        f"(headroom {fmt_bytes(headroom)}, effective {fmt_bytes(effective)})"
                    )
                break

    return PressureReading(
        state=state,
        headroom=headroom,
        effective_headroom=effective,
        reason=reason,
        budget=budget,
        safety_margin=margin,
        available=available,
        predicted_growth=growth,
        psi_some_avg10=psi_some_avg10,
        red_limit=red_limit,
        by_gate=by_gate,
        swap_credit=credit,
    )


def region_limits(config: PressureConfig, budget: int) -> tuple[int, int]:
    """(red limit, yellow limit): H at or below the first is red, at or below the second
    yellow. Each region is its fraction of the budget, capped at its bytes."""
    red = _capped(int(max(budget, 0) * config.red_fraction), config.red_max_bytes)
    yellow = _capped(int(max(budget, 0) * config.yellow_fraction), config.yellow_max_bytes)
    return red, red + yellow


def _capped(nbytes: int, cap: int | None) -> int:
    return nbytes if cap is None else min(nbytes, cap)


def effective_margin(config: PressureConfig, budget: int | None) -> int:
    """S = min(safety_margin_bytes, safety_margin_fraction · budget): the margin in a domain of
    this size. The one place S is computed: admission (through `assess_pressure`) and the growth
    gate (`GrowthController`) both take it from here, so they never see different headroom. An
    unknown budget (None) leaves the bytes uncapped."""
    if budget is None:
        return config.safety_margin_bytes
    return min(config.safety_margin_bytes, int(max(budget, 0) * config.safety_margin_fraction))


def held_bytes(resident: int, swapped: int) -> int:
    """What a running call holds of its predicted peak now: its resident bytes plus those it has
    in swap, the `current` of predicted_remaining_growth. Not the most it held at a sample: a
    call whose memory cycles (allocate, free, allocate again) looked done growing at its trough,
    and a second call was admitted into the room the first was about to take again (VM, 8.6x
    without swap: 1 and 4 calls OOM-killed, two peaking together). Its pages in swap stay
    counted: going to swap is not room to grow back into."""
    return max(resident, 0) + max(swapped, 0)


def predicted_remaining_growth(calls: Iterable[tuple[int, int]]) -> int:
    """Sum of max(predicted_peak − current, 0) over (predicted_peak, current) pairs of admitted
    calls (current: `held_bytes`): the growth still to come that makes Q(t) turn yellow early
    (TenonAgent §3.2)."""
    return sum(max(peak - current, 0) for peak, current in calls)
