"""The growth gate in the daemon: running calls' samples in, allow/deny out through an actuator.

Every control period the controller (policy/growth.py, TenonAgent Algorithm 1) gets one sample
per running call and decides which may grow; only *changes* reach the actuator — the sched_ext
scheduler's deny map, or cgroup.freeze where sched_ext is missing (bpf/gate.py). The actuator
is checked every second: an ejected scheduler falls back to freezing and is re-loaded later, and
so is execgate's own when another sched_ext scheduler held the kernel at start and then left.
A held call's tasks get `held_oom_score_adj` while held (calls/oom_score.py): a call we stopped
keeps its memory, and at the tool value it would be the kernel's first OOM victim.
Last resort (ToolSched §3.4): when red persists, swap is full or absent and the domain is about
to OOM, the daemon kills the worst offending running tool call itself (cgroup.kill), never an
agent, an init or a held call.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from execgate.bpf import scx
from execgate.bpf.scx import SCX_SYSFS
from execgate.calls import oom_score
from execgate.cgroups import v2
from execgate.common.units import MiB
from execgate.policy.growth import CallSummary, GrowthConfig, GrowthController, Sample, Victim
from execgate.policy.pressure import PressureConfig
from execgate.policy.pressure_state import Pressure

from .cgfiles import KeptFiles

log = logging.getLogger("execgated")
RELOAD_AFTER_S = 30.0
HEALTH_EVERY_S = 1.0


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")  # the probes count faults, the controller bytes


def _hpage_size() -> int:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 2 * MiB


HPAGE_SIZE = _hpage_size()


def _mib_s(bps: float | None) -> str:
    return "-" if bps is None else f"{bps / MiB:+.1f} MiB/s"


def _frozen(cg: str) -> bool:
    """The kernel's view (cgroup.events), not our intent: did freezing actually happen?"""
    return v2.read_keyed(cg, "cgroup.events").get("frozen") == 1


class Actuator(Protocol):
    kind: str

    def set(self, cg: int | str, allow: bool) -> bool: ...

    def clear(self) -> int: ...

    def attached(self) -> bool: ...

    def exit_reason(self) -> str | None: ...

    def unload(self, timeout: float = 10.0) -> bool: ...


# How long the calls of a container being stopped are never held: docker stop's grace (10 s),
# then its SIGKILL, with room for a slow engine.
SPARE_S = 30.0


@dataclass
class Tracked:
    cgroup: str
    cgroup_id: int
    allowed: bool = True
    saved_oom: dict[int, int] | None = None  # pid -> oom_score_adj before the hold; None: not
    parked_at: float | None = None  # when the sched_ext gate parked it (None: not parked)
    frozen: bool = False  # held by cgroup.freeze after max_park_s parked (the gate allows it)


class GrowthGate:
    def __init__(self, config: GrowthConfig, mode: str, clock: Callable[[], float],
                 files: KeptFiles | None = None,
                 pressure: PressureConfig | None = None, tool_oom_score_adj: int = 0) -> None:
        """pressure: the daemon's [pressure] config, whose safety margin S the controller takes
        off the headroom as admission does. tool_oom_score_adj: what the front doors gave the
        calls' tasks, restored when a held call is released."""
        self.config = config
        self.files = files if files is not None else KeptFiles()
        self.mode = mode  # auto | sched_ext | freeze | off
        self.clock = clock
        self.controller = GrowthController(config, clock, pressure)
        self.actuator: Actuator | None = None
        self.reason = "off"
        self.tracked: dict[str, Tracked] = {}
        self.done: OrderedDict[str, CallSummary] = OrderedDict()
        self.killed: dict[str, Victim] = {}
        self._next_health = 0.0
        # When the gate fell back to freezing (its scheduler ejected, or another one loaded at
        # start): sched_ext is tried again RELOAD_AFTER_S later, once no scheduler is loaded.
        self._fallback_at: float | None = None
        self.sysfs = SCX_SYSFS  # sched_ext's sysfs (a temp dir in tests)
        self.last: Any = None
        self.tool_oom_score_adj = tool_oom_score_adj
        self.proc = oom_score.PROC  # /proc (a temp dir in tests)
        self.spared: dict[str, float] = {}  # call id -> until when it is never held (spare())
        self._freezer: Any = None  # a FreezeGate for calls parked past max_park_s (made on demand)

    # -- actuator lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        if self.mode == "off":
            self.reason = "growth gate off by config"
            return
        from .actuator import recover, select_gate

        log.info("gate recovery: %s", recover())  # what a dead daemon left held
        try:
            prefer = self.mode if self.mode in ("sched_ext", "freeze") else "auto"
            self.actuator, self.reason = select_gate(
                prefer=prefer, hold_cap_s=min(self.config.max_hold_s + 2.0, 25.0),
                sysfs=self.sysfs)
        except Exception as e:  # noqa: BLE001 - no gate is better than no daemon
            self.actuator, self.reason = None, f"no actuator: {e}"
        if self.actuator is not None and self.actuator.kind == "freeze" and prefer != "freeze" \
                and self._other_scheduler():
            self._fallback_at = self.clock()  # ours once it unloads (_health)
            self.reason += "; sched_ext once it unloads"
        log.info("growth gate: %s", self.reason)

    def stop(self) -> None:
        """Release everything on the way out: nothing may stay held by a daemon that is gone."""
        for t in self.tracked.values():
            self._oom(t, True)
            self._thaw(t)
        if self.actuator is not None:
            try:
                self.actuator.clear()
                self.actuator.unload()
            except Exception as e:  # noqa: BLE001
                log.warning("gate unload: %s", e)
            self.actuator = None

    def _health(self, now: float) -> None:
        if self.actuator is None or now < self._next_health:
            return
        self._next_health = now + HEALTH_EVERY_S
        from .actuator import FreezeGate, select_gate

        if self.actuator.kind != "freeze" and not self.actuator.attached():
            why = self.actuator.exit_reason() or "detached"
            log.error("sched_ext gate ejected (%s): falling back to cgroup.freeze", why)
            try:
                self.actuator.unload()  # the dead instance's fds and pins
            except Exception as e:  # noqa: BLE001
                log.warning("unloading the ejected gate: %s", e)
            self.actuator = FreezeGate()
            self.reason = f"cgroup.freeze (sched_ext ejected: {why}; retry in {RELOAD_AFTER_S:g} s)"
            self._fallback_at = now
            for t in self.tracked.values():
                t.parked_at, t.frozen = None, False  # frozen or not, the fallback holds it now
                if not t.allowed:
                    self.actuator.set(t.cgroup, False)
        elif self._retry_due(now):
            self._fallback_at = None
            frozen = self.actuator
            try:
                gate, reason = select_gate(prefer="sched_ext", sysfs=self.sysfs)
            except Exception as e:  # noqa: BLE001
                self._fallback_at = now
                log.warning("sched_ext reload failed: %s", e)
                return
            frozen.clear()
            self.actuator, self.reason = gate, reason
            for t in self.tracked.values():
                if not t.allowed:  # by path: its tasks get SCHED_EXT
                    self.actuator.set(t.cgroup, False)
                    t.parked_at = now
            log.info("growth gate: %s", reason)

    def _retry_due(self, now: float) -> bool:
        """Freezing for RELOAD_AFTER_S since a fallback, and sched_ext free to load again."""
        return self._fallback_at is not None and now - self._fallback_at > RELOAD_AFTER_S \
            and self.mode in ("auto", "sched_ext") and scx.state(self.sysfs) == "disabled"

    def _other_scheduler(self) -> bool:
        """Another sched_ext scheduler than execgate's holds the kernel."""
        from .actuator import SCHED_NAME

        return scx.state(self.sysfs) not in ("disabled", "unsupported") and \
            scx.scheduler_name(self.sysfs) not in (None, SCHED_NAME)

    # -- the period ----------------------------------------------------------------------------

    def _oom(self, t: Tracked, allow: bool) -> None:
        """A held call's tasks get the held oom_score_adj (again: it catches tasks forked or
        raised since), a released one's their own back."""
        held = self.config.held_oom_score_adj
        if held >= self.tool_oom_score_adj:
            return  # the calls are not raised above the held value: nothing to lower
        if not allow:
            if t.saved_oom is None:
                t.saved_oom = {}
            oom_score.lower(t.cgroup, held, t.saved_oom, self.proc)
        elif t.saved_oom is not None:
            oom_score.restore(t.cgroup, held, self.tool_oom_score_adj, t.saved_oom, self.proc)
            t.saved_oom = None

    def update(self, calls: dict[str, Any], pressure: Pressure, mem_available: int,
               budget: int | None = None, swap_free: int | None = None) -> None:
        """calls: call id -> LiveCall (cgroup, last_mem, info, admitted_at) of running calls;
        mem_available and budget: the domain's (see GrowthController.update); swap_free: the
        swap it can still use (None: unknown, taken as none), for the last resort."""
        now = self.clock()
        self._health(now)
        # Without an actuator (gate = "off", or none could load) nothing is held, so the
        # controller decides as in green: no hold accrues to a call's record or its feedback,
        # and no last resort fires (it is the gate's, and needs the red streak).
        gated = pressure if self.actuator is not None else Pressure.GREEN
        if not self.controller.wants_samples(gated):
            return
        self.spared = {cid: until for cid, until in self.spared.items() if until > now}
        samples = []
        for cid, call in calls.items():
            if not call.seen or cid in self.spared:
                continue
            cpu = self.files.read_key(call.cgroup, "cpu.stat", "usage_usec")
            if cpu is None:
                continue
            swap = self.files.read_int(call.cgroup, "memory.swap.current",
                                       absent_for_good=True) or 0
            if cid not in self.tracked:
                try:
                    self.tracked[cid] = Tracked(call.cgroup, os.stat(call.cgroup).st_ino)
                except OSError:
                    continue
            samples.append(Sample(cid, call.last_mem + swap, cpu, call.info.declared_bytes,
                                  call.admitted_at, fault_bytes=self._fault_bytes(call)))
        decision = self.controller.update(samples, gated, mem_available, budget)
        self.last = decision
        if self.actuator is not None:
            for cid, allow in decision.allow.items():
                t = self.tracked.get(cid)
                if t is not None and t.allowed != allow:
                    try:
                        done = self.actuator.set(t.cgroup, allow)
                        t.allowed = allow
                    except Exception as e:  # noqa: BLE001 - a vanished cgroup, a full map
                        log.warning("gate %s %s: %s", "allow" if allow else "deny", cid, e)
                        continue
                    if allow:
                        self._thaw(t)
                    elif self.actuator.kind == "sched_ext":
                        t.parked_at = now
                    self._oom(t, allow)
                    c = decision.calls[cid]
                    log.info("gate %s %s (%s%s): %s, %s, g %s, d %.0f MiB, H %.0f MiB, "
                             "held %.1f s", "allow" if allow else "deny", cid,
                             self.actuator.kind, "" if done else ", no-op", c.reason, pressure,
                             _mib_s(c.growth_bps), c.demand_bytes / MiB,
                             decision.headroom_bytes / MiB, c.held_s)
                elif t is not None and not allow:
                    self._oom(t, False)  # still held: tasks forked or raised since
            self._freeze_long_parks(now)
        if log.isEnabledFor(logging.DEBUG) and decision.calls:
            log.debug("gate step: %s", self._describe(decision, mem_available))
        for cid in decision.vanished:
            self._forget(cid)
        victim = self.controller.last_resort_victim(samples, mem_available, swap_free)
        if victim is not None and victim.call_id not in self.killed:
            self._kill(victim)

    def _freeze_long_parks(self, now: float) -> None:
        """Calls parked max_park_s by the sched_ext gate go to cgroup.freeze (GrowthConfig says
        why): frozen first, then allowed by the gate, so a task runs only into the freezer (it
        freezes on its way back to user mode, before any instruction of its own)."""
        assert self.actuator is not None
        for cid, t in self.tracked.items():
            if t.allowed or t.frozen or t.parked_at is None \
                    or now - t.parked_at < self.config.max_park_s:
                continue
            if self._freezer is None:
                from .actuator import FreezeGate

                self._freezer = FreezeGate()
            try:
                if not self._freezer.set(t.cgroup, False):
                    continue  # gone with its call
                t.frozen = True
                self.actuator.set(t.cgroup, True)
            except Exception as e:  # noqa: BLE001 - a vanished cgroup; it stays parked
                log.warning("gate freeze %s: %s", cid, e)
                continue
            log.info("gate %s: parked %.1f s, frozen instead (off the CPU's runqueue)", cid,
                     now - t.parked_at)

    def _thaw(self, t: Tracked) -> None:
        t.parked_at = None
        if not t.frozen:
            return
        t.frozen = False
        try:
            self._freezer.set(t.cgroup, True)  # (a cgroup gone meanwhile: nothing to thaw)
        except OSError as e:
            log.warning("gate thaw %s: %s", t.cgroup, e)

    def _fault_bytes(self, call: Any) -> int | None:
        """What the call's page faults brought in, from the bcc probes' count (None without
        them). A fault that allocated a transparent huge page brought in a whole one: the
        cgroup's thp_fault_alloc says how many did, or a THP=always host would show a 96 MiB
        ramp as a few hundred faults."""
        faults = call.extra.get("faults")
        if faults is None:
            return None
        thp = self.files.read_key(call.cgroup, "memory.stat", "thp_fault_alloc") or 0
        return faults["count"] * PAGE_SIZE + thp * (HPAGE_SIZE - PAGE_SIZE)

    def _describe(self, decision: Any, mem_available: int) -> str:
        """One period in one line (debug log): pressure, b, H, then per call the verdict,
        state, ĝ, d, footprint and hold, and what the actuator holds right now."""
        parts = [f"{decision.pressure} avail {mem_available / MiB:.0f} MiB "
                 f"H {decision.headroom_bytes / MiB:.0f} MiB b {decision.slots} "
                 f"slots {decision.slot_limit}"]
        for cid, c in sorted(decision.calls.items()):
            t = self.tracked.get(cid)
            mem = v2.read_int(t.cgroup, "memory.current") if t else None
            parts.append(f"{cid} {'allow' if c.allow else 'DENY'}/{c.reason}/{c.state} "
                         f"g {_mib_s(c.growth_bps)}"
                         f"{f' faults {_mib_s(c.burst_bps)}' if c.burst_bps else ''}"
                         f" d {c.demand_bytes / MiB:.0f} "
                         f"m {(mem or 0) / MiB:.0f} held {c.held_s:.1f}"
                         f"{' frozen' if t and _frozen(t.cgroup) else ''}")
        if self.actuator is not None and self.actuator.kind == "sched_ext":
            try:
                st = self.actuator.stats()  # type: ignore[attr-defined]
                parts.append(f"scx held {st.held} parked {st.parked} released {st.released} "
                             f"capped {st.capped}")
            except Exception as e:  # noqa: BLE001 - debug output only
                parts.append(f"scx stats: {e}")
        return "; ".join(parts)

    def _kill(self, victim: Victim) -> None:
        t = self.tracked.get(victim.call_id)
        if t is None:
            return
        log.error("last resort: killing %s (%.0f MiB over its credible declared demand, "
                  "%.1f s old)",
                  victim.call_id, victim.excess_bytes / (1 << 20), victim.run_time_s)
        try:
            v2.write(t.cgroup, "cgroup.kill", "1")
            self.killed[victim.call_id] = victim
        except OSError as e:
            log.warning("kill %s: %s", victim.call_id, e)

    def spare(self, call_ids: list[str], for_s: float = SPARE_S) -> int:
        """Release these calls now and hold none of them for for_s: their container is being
        stopped (`kill`), and a held task gets no CPU to handle the signal until the hold cap.
        How many were held."""
        until = self.clock() + for_s
        released = 0
        for cid in call_ids:
            self.spared[cid] = until
            t = self.tracked.get(cid)
            if t is None or t.allowed or self.actuator is None:
                continue
            try:
                self.actuator.set(t.cgroup, True)
            except Exception as e:  # noqa: BLE001 - a vanished cgroup
                log.warning("gate allow %s: %s", cid, e)
                continue
            t.allowed = True
            self._thaw(t)
            self._oom(t, True)
            released += 1
            log.info("gate allow %s: its container is being stopped", cid)
        return released

    def _forget(self, cid: str) -> None:
        t = self.tracked.pop(cid, None)
        if t is not None:
            self.files.forget(t.cgroup)
            self._oom(t, True)  # what outlived the call gets its own value back
            self._thaw(t)
        if t is not None and not t.allowed and self.actuator is not None:
            try:
                self.actuator.set(t.cgroup_id, True)  # drop the deny entry of a gone cgroup
            except Exception:  # noqa: BLE001
                pass
        summary = self.controller.finished(cid)
        if summary is not None:
            self.done[cid] = summary
            while len(self.done) > 1024:
                self.done.popitem(last=False)

    def outcome(self, cid: str) -> dict[str, Any]:
        """What the gate did to a call, for the watcher's feedback (forgets the call)."""
        if cid in self.tracked:
            self._forget(cid)
        summary = self.done.pop(cid, None)
        victim = self.killed.pop(cid, None)
        return {
            "held_s": round(summary.held_s, 3) if summary else 0.0,
            "run_s": round(summary.run_time_s, 3) if summary else None,
            "killed_by_execgate": victim is not None,
        }

    def snapshot(self) -> dict[str, Any]:
        snap = self.controller.snapshot()
        return {"actuator": None if self.actuator is None else self.actuator.kind,
                "reason": self.reason, "slots": snap.get("slots"),
                "switch_failed": getattr(self.actuator, "switch_failed", 0),
                "held": sorted(cid for cid, t in self.tracked.items() if not t.allowed),
                "held_oom_score_adj": self.config.held_oom_score_adj,
                "spared": sorted(self.spared),
                "calls": snap.get("calls")}
