"""The two gates a tool call passes to be admitted (policy/admission.py holds the queues).

* Logical budget (ToolSched §3.2): the sum of admitted charges plus this call's charge stays within
  budget − S. The charge interpolates between predicted average and peak,
  M̃ = (1−α)·M̂avg + α·M̂peak with α = clamp(M_admitted / M_window, 0, 1): an idle domain packs
  calls by their average (they rarely peak together), a busy one charges peaks (no slack left to
  absorb a coincident peak). A charge is frozen when its call is admitted.
* Physical gate on Q(t) (TenonAgent §3.4): green admits; yellow admits calls whose peak fits the
  effective headroom (headroom minus the growth still predicted for admitted calls) when they are
  light (predicted peak < `yellow_peak_limit_bytes`) or their peak is a prediction backed by a
  declaration or observed history; a heavy call whose peak is only a class default (a guess)
  must also leave the red region free. (The light-only rule alone let a small domain run one
  call at a time: every admitted call's own predicted growth turns it yellow.) Red admits only
  one headroom-checked *probe* at a time, so the domain keeps making progress without a
  stampede. Headroom used by calls admitted earlier in the same step is subtracted before the
  next check.
"""

from __future__ import annotations

from execgate.policy.estimate import Demand
from execgate.policy.pressure import fmt_bytes
from execgate.policy.pressure_state import Pressure


def logical_charge(demand: Demand, admitted: int, window: int) -> int:
    """M̃ = (1−α)·avg + α·peak, α = clamp(admitted / window, 0, 1), rounded up to a byte.

    Integer arithmetic keeps it exact and deterministic (ToolSched §3.2).
    """
    avg, peak = demand.avg_bytes, demand.peak_bytes
    if window <= 0:
        return peak
    used = min(max(admitted, 0), window)
    return avg + -(-(peak - avg) * used // window)


def physical_gate(demand: Demand, state: Pressure, headroom: int, red_limit: int,
                  yellow_peak_limit: int, *, probe_free: bool, alone: bool,
                  ) -> tuple[bool, str] | None:
    """(probe, why) if Q(t) lets this call in, else None (TenonAgent §3.4).

    headroom is what is left in this step; probe_free: no red probe runs; alone: no call runs."""
    peak = demand.peak_bytes
    if state is Pressure.GREEN:
        # Green still respects current headroom: calls admitted in this step, or since the
        # last sample, have not grown yet. A call larger than all headroom goes alone.
        if peak <= headroom:
            return False, f"green: peak {fmt_bytes(peak)} fits headroom {fmt_bytes(headroom)}"
        if alone:
            return False, f"green, nothing running: peak {fmt_bytes(peak)} goes alone"
        return None
    if state is Pressure.YELLOW:
        limit = yellow_peak_limit
        if peak < limit and peak <= headroom:
            return False, (
                f"yellow: light peak {fmt_bytes(peak)} < {fmt_bytes(limit)} fits "
                f"effective headroom {fmt_bytes(headroom)}"
            )
        if peak > headroom:
            return None
        if not demand.source.startswith("class-default"):
            return False, (
                f"yellow: peak {fmt_bytes(peak)} ({demand.source}) fits effective "
                f"headroom {fmt_bytes(headroom)}"
            )
        if peak <= headroom - red_limit:
            return False, (
                f"yellow: guessed peak {fmt_bytes(peak)} fits effective headroom "
                f"{fmt_bytes(headroom)} above the red region {fmt_bytes(red_limit)}"
            )
        return None
    if probe_free and peak <= headroom:
        return True, f"red probe: peak {fmt_bytes(peak)} fits headroom {fmt_bytes(headroom)}"
    return None
