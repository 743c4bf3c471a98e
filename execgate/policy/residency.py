"""Sandbox residency (after TenonAgent): what to do with sandboxes whose agent is elsewhere.

An agent spends a third of its time waiting on its LLM; its sandbox then runs no tool call but
keeps its memory (the framework's baseline, page cache of the last install or test run). Under
pressure that memory is what the next burst needs, so the daemon takes it back from idle
sandboxes, the longest idle first:

* Idle: no tool call runs or waits in it and it is quiet (CPU), and either its last call has
  just ended — the action boundary, as in TenonAgent: the agent now waits on its model, for
  seconds, so its sandbox gives memory back at once instead of after `idle_after_s`, which
  replayed LLM waits (<= 8.5 s) never reached — or it has been so for `idle_after_s` (a
  sandbox that never ran a call: its start-up may still be at work). When admission needs room
  (`room`), every idle sandbox is a candidate, whatever the pressure.
* YELLOW or worse: reclaim (memory.reclaim) an idle sandbox's memory down to a small floor.
  Page cache goes at once; anonymous memory into swap (compressed: zram or zswap, set up by
  install.sh), lazily faulted back by the next call. Once per idle period: what the kernel
  could not take the first time it will not take the second, so it does not thrash.
* RED: also freeze an idle sandbox's init leaf, so what it runs in the background cannot fault
  its memory back in or grow — only once its reclaim is done (freezing first would keep the
  pages it is about to need in RAM for nothing), or where there was nothing worth reclaiming.
  Never an inside agent's: its init *is* the agent, reclaimed while it waits, never frozen.
* The next tool call in a sandbox thaws it before it is admitted (so does the runtime itself,
  which needs no daemon for it), and a domain that has been green for a while thaws them all:
  freezing answers pressure, it is not a state to leave a sandbox in.

Pure and I/O-free: the daemon (daemon/idle_sandboxes.py) gathers the facts and applies the actions.
"""

from __future__ import annotations

from dataclasses import dataclass

from execgate.common.units import MiB
from execgate.policy.pressure_state import Pressure


@dataclass(frozen=True)
class ResidencyConfig:
    """[residency] in config.toml."""

    enabled: bool = True
    # A sandbox with no tool call for this long is idle (LLM waits last seconds to minutes) ...
    idle_after_s: float = 20.0
    # ... unless what runs in it (its init, a server) used more CPU than this over the last
    # second: a sandbox at work is not idle, whoever started the work.
    busy_cpu: float = 0.05
    # Yellow or worse: reclaim idle sandboxes' memory.
    reclaim: bool = True
    # Red: freeze idle sandboxes' init leaf (inside agents never).
    freeze: bool = True
    # Reclaim leaves a sandbox this much; one with less than floor + minimum is not worth a try.
    keep_bytes: int = 16 * MiB
    reclaim_min_bytes: int = 8 * MiB
    # Green for this long thaws every frozen sandbox (0: only their next tool call does).
    thaw_after_green_s: float = 10.0
    # A sandbox whose tool call has just ended is idle at once (the action boundary); false:
    # only after idle_after_s.
    reclaim_at_call_end: bool = True
    # memory.swap.max of each managed sandbox's init/ (the idle baseline), written by the runtime
    # at start (cgroups/container.py says why init/): "max", a size, 0 (never swapped), or ""
    # (not written: the container's own limit).
    swap_max: str = "max"

    def __post_init__(self) -> None:
        if self.idle_after_s < 0 or self.thaw_after_green_s < 0 or self.busy_cpu < 0:
            raise ValueError("idle_after_s, thaw_after_green_s and busy_cpu must be >= 0")
        if self.keep_bytes < 0 or self.reclaim_min_bytes < 0:
            raise ValueError("keep_bytes and reclaim_min_bytes must be >= 0")


@dataclass(frozen=True)
class SandboxView:
    """One sandbox as the policy sees it."""

    cid: str
    idle_s: float | None  # None: a tool call runs or waits in it, or it is busy
    memory: int  # memory.current of the whole sandbox
    freezable: bool  # not an inside agent
    frozen: bool
    reclaimed: bool  # already reclaimed in this idle period
    ended: bool = False  # idle since a tool call ended in it (the action boundary)
    # What memory.reclaim could take now: page cache, and anonymous memory only as far as swap
    # has room (None: all of memory above keep_bytes). Without swap room, asking the kernel for
    # anonymous memory is a long futile scan that holds every other reclaim and freeze back.
    reclaimable: int | None = None

    def reclaim_amount(self, keep_bytes: int) -> int:
        """Bytes to ask memory.reclaim for: down to the floor, no more than it can give."""
        above = max(self.memory - keep_bytes, 0)
        return above if self.reclaimable is None else min(above, max(self.reclaimable, 0))


@dataclass(frozen=True)
class Action:
    kind: str  # "reclaim" | "freeze" | "thaw"
    cid: str
    amount: int = 0  # bytes, for reclaim


def idle_enough(cfg: ResidencyConfig, idle_s: float | None, ended: bool,
                room: bool = False) -> bool:
    """Whether a sandbox idle for ``idle_s`` (None: a call runs or waits, or it is busy) may
    give memory back: at the action boundary (``ended``), after idle_after_s, or whenever
    admission asks for room."""
    if idle_s is None:
        return False
    return room or idle_s >= cfg.idle_after_s or (cfg.reclaim_at_call_end and ended)


def plan(cfg: ResidencyConfig, state: Pressure, green_for_s: float, need: int,
         boxes: list[SandboxView], reclaiming: bool, room: int = 0) -> list[Action]:
    """This period's actions. ``need``: bytes that would bring the domain back to green (and
    room for what waits); ``reclaiming``: a reclaim is still in flight (one at a time: each can
    take a while); ``room``: bytes admission asked idle sandboxes for (make_room), acted on
    whatever the pressure."""
    if not cfg.enabled:
        return [Action("thaw", b.cid) for b in boxes if b.frozen]
    actions: list[Action] = []
    if state == Pressure.GREEN:
        if cfg.thaw_after_green_s and green_for_s >= cfg.thaw_after_green_s:
            actions = [Action("thaw", b.cid) for b in boxes if b.frozen]
        if room <= 0:
            return actions
    # idle_s None (most sandboxes, busy) is never idle enough: skipped without the call
    idle = sorted((b for b in boxes if b.idle_s is not None
                   and idle_enough(cfg, b.idle_s, b.ended, room > 0)),
                  key=lambda b: -(b.idle_s or 0.0))
    if state == Pressure.RED and cfg.freeze:
        actions += [Action("freeze", b.cid) for b in idle if b.freezable and not b.frozen
                    and (not cfg.reclaim or _reclaim_done(cfg, b, reclaiming))]
    if cfg.reclaim and not reclaiming and need + room > 0:
        for b in idle:
            if not b.reclaimed and _worth(cfg, b):
                actions.append(Action("reclaim", b.cid, b.reclaim_amount(cfg.keep_bytes)))
                break
    return actions


def _worth(cfg: ResidencyConfig, b: SandboxView) -> bool:
    return b.reclaim_amount(cfg.keep_bytes) >= cfg.reclaim_min_bytes


def _reclaim_done(cfg: ResidencyConfig, b: SandboxView, reclaiming: bool) -> bool:
    """Freeze only after the reclaim (not while one is in flight), or where none is worth it."""
    return (b.reclaimed and not reclaiming) or (not b.reclaimed and not _worth(cfg, b))
