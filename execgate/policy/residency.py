"""Sandbox residency (after TenonAgent): what to do with sandboxes whose agent is elsewhere.

An agent spends a third of its time waiting on its LLM; its sandbox then runs no tool call but
keeps its memory (the framework's baseline, page cache of the last install or test run). Under
pressure that memory is what the next burst needs, so the daemon takes it back from sandboxes
that have been idle for a while, the longest idle first:

* YELLOW or worse: reclaim (memory.reclaim) an idle sandbox's memory down to a small floor.
  Page cache goes at once; anonymous memory only where the host has swap. Once per idle period:
  what the kernel could not take the first time it will not take the second.
* RED: also freeze an idle sandbox's init leaf, so what it runs in the background cannot fault
  its memory back in or grow. Never an inside agent's: its init *is* the agent.
* The next tool call in a sandbox thaws it before it is admitted (so does the runtime itself,
  which needs no daemon for it), and a domain that has been green for a while thaws them all:
  freezing answers pressure, it is not a state to leave a sandbox in.

Pure and I/O-free: the daemon (daemon/idle_sandboxes.py) gathers the facts and applies the actions.
"""

from __future__ import annotations

from dataclasses import dataclass

from execgate.policy.pressure_state import Pressure

MiB = 1 << 20


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


@dataclass(frozen=True)
class Action:
    kind: str  # "reclaim" | "freeze" | "thaw"
    cid: str
    amount: int = 0  # bytes, for reclaim


def plan(cfg: ResidencyConfig, state: Pressure, green_for_s: float, need: int,
         boxes: list[SandboxView], reclaiming: bool) -> list[Action]:
    """This period's actions. ``need``: bytes that would bring the domain back to green;
    ``reclaiming``: a reclaim is still in flight (one at a time: each can take a while)."""
    if not cfg.enabled:
        return [Action("thaw", b.cid) for b in boxes if b.frozen]
    if state == Pressure.GREEN:
        if cfg.thaw_after_green_s and green_for_s >= cfg.thaw_after_green_s:
            return [Action("thaw", b.cid) for b in boxes if b.frozen]
        return []
    idle = sorted((b for b in boxes if b.idle_s is not None and b.idle_s >= cfg.idle_after_s),
                  key=lambda b: -(b.idle_s or 0.0))
    actions: list[Action] = []
    if state == Pressure.RED and cfg.freeze:
        actions += [Action("freeze", b.cid) for b in idle if b.freezable and not b.frozen]
    if cfg.reclaim and not reclaiming and need > 0:
        for b in idle:
            amount = b.memory - cfg.keep_bytes
            if not b.reclaimed and amount >= cfg.reclaim_min_bytes:
                actions.append(Action("reclaim", b.cid, amount))
                break
    return actions
