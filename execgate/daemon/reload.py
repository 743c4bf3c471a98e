"""SIGHUP: config.toml read again, and what can change while the daemon runs applied at once.

A value is live when the parts that use it read it at every period or request (admission's
waits and queues, pressure's fractions, residency, headroom, most estimate and growth keys);
one that built something at start (the domain, the store, the socket, the gate's actuator, the
inside agents, a window's size) needs a restart: its change is logged, and the daemon keeps
running on the old value until then. A key the new file gets wrong keeps its running value,
and a file that does not parse changes nothing. The decision (`plan`) is pure; `apply` hands
the settings to the engine's parts, through the config attributes they read.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from execgate.common import config as config_mod

from . import settings as settings_mod
from .engine import Engine
from .settings import Settings

log = logging.getLogger("execgated")

ALL = None  # every key of the table is live
# Per table, the keys a reload changes at once (the others, and tables not here, need a
# restart).
LIVE: dict[str, frozenset[str] | None] = {
    "daemon": frozenset({"sample_period_s", "idle_period_s", "calm_period_s",
                         "calm_margin_bytes", "priority_sandboxes",
                         "admission_slack_s", "vanish_grace_s"}),
    "pressure": ALL,
    "admission": ALL,
    # declared_window and history_window size the windows kept per sandbox and class
    "estimate": frozenset({"ratio_clamp", "min_history", "oom_peak_factor", "avg_fraction",
                           "light_peak_bytes", "git_peak_bytes", "other_peak_bytes",
                           "build_install_peak_bytes", "test_peak_bytes"}),
    # slots_initial is the start's; max_hold_s sizes the actuator's own hold cap, set at start
    "growth": frozenset({"period_s", "ewma_alpha", "growth_threshold_bps", "horizon_s",
                         "boot_demand_bytes", "slots_max", "slots_increase_after_s",
                         "min_deny_s", "overdue_after_s", "catchup_s", "last_resort_after_s",
                         "critical_headroom_bytes", "min_run_time_s", "finished_buffer",
                         "held_oom_score_adj", "max_park_s"}),
    "inside": frozenset(),  # the agents' sources and rules are set up at start
    "residency": ALL,
    # history_window sizes each image's window, max_images the model
    "sandbox_admission": frozenset({"enabled", "max_start_wait_s", "max_start_wait_s_no_deadline",
                                    "default_baseline_bytes", "default_call_peak_bytes",
                                    "baseline_quantile", "settle_s", "count_call_load",
                                    "reserve_growth", "learn_from_live", "calls_on_swap",
                                    "max_launching"}),
    "headroom": ALL,
    "metrics": frozenset(),  # the endpoint is bound at start
    "retention": ALL,
}
# Top-level keys the daemon took at start; the others are the runtime's, which reads the file
# at its next call anyway.
RESTART_TOP = ("socket", "state_dir", "journal", "tool_oom_score_adj", "redact_commands")


def _attr(table: str) -> str:
    """The Settings field of a config table."""
    return "sandboxes" if table == "sandbox_admission" else table


@dataclass
class Plan:
    """What a reload does: `settings` run from now on; `changed` are the live changes made,
    `restart` the changes that wait for a restart, `problems` the new file's."""

    settings: Settings
    changed: list[str] = field(default_factory=list)
    restart: list[str] = field(default_factory=list)
    problems: list[settings_mod.Problem] = field(default_factory=list)
    unread: str | None = None  # the file was not read: nothing changed


def plan(running_cfg: config_mod.Config, running: Settings, new_cfg: config_mod.Config) -> Plan:
    """The settings to run after reading new_cfg, from the running ones."""
    unread = [e for e in new_cfg.errors if e.endswith(config_mod.UNREAD)]
    if unread:
        return Plan(running, unread=unread[0])
    new, problems = settings_mod.load(new_cfg)
    refused = {(p.table, p.key) for p in problems if p.error}
    out = Plan(running, problems=problems)
    tables: dict[str, Any] = {}
    for table in settings_mod.TABLES:
        live = LIVE.get(table, frozenset())  # a table not listed: every key needs a restart
        old_part, new_part = getattr(running, _attr(table)), getattr(new, _attr(table))
        keep: dict[str, Any] = {}
        changed: list[str] = []
        for f in dataclasses.fields(old_part):
            before, after = getattr(old_part, f.name), getattr(new_part, f.name)
            if before == after:
                continue
            if (table, f.name) in refused:  # a bad value: the running one is kept
                keep[f.name] = before
            elif live is ALL or f.name in live:
                changed.append(f"[{table}] {f.name}: {before!r} -> {after!r}")
            else:
                keep[f.name] = before
                out.restart.append(f"[{table}] {f.name}")
        try:
            tables[_attr(table)] = dataclasses.replace(new_part, **keep) if keep else new_part
            out.changed += changed
        except ValueError as e:  # live values that only fit the new restart ones: all wait
            tables[_attr(table)] = old_part
            out.restart += [f"{c.split(':')[0]} (with the rest of [{table}]: {e})"
                            for c in changed]
    out.restart += [key for key in RESTART_TOP
                    if getattr(running_cfg, key) != getattr(new_cfg, key)]
    out.settings = Settings(**tables)
    return out


def apply(engine: Engine, s: Settings) -> None:
    """Hand s to every part of the engine that reads a live value, where it reads it."""
    engine.settings = s
    engine.admission.config = s.admission
    engine.estimator.config = s.estimate
    engine.growth.config = s.growth
    engine.growth.controller.config = s.growth
    engine.growth.controller.pressure = s.pressure
    engine.residency.cfg = s.residency
    engine.residency.pressure = s.pressure
    engine.sandboxes.cfg = s.sandboxes
    engine.sandboxes.policy.config = s.sandboxes
    engine.sandboxes.policy.model.config = s.sandboxes
    engine.sandboxes.headroom = s.headroom
    engine.idle_room.cfg = s.headroom
    engine.retention.cfg = s.retention


@dataclass
class Reloader:
    """The daemon's SIGHUP handler and what `status` shows of it."""

    cfg: config_mod.Config  # the config the daemon started with (its path, socket ...)
    engine: Engine
    reloads: int = 0
    reloaded_at: float | None = None
    restart: list[str] = field(default_factory=list)  # changes waiting for a restart
    last_error: str | None = None

    def __call__(self) -> Plan:
        path = self.cfg.path or config_mod.DEFAULT_PATH
        new_cfg = config_mod.load(path)
        p = plan(self.cfg, self.engine.settings, new_cfg)
        if p.unread:
            self.last_error = p.unread
            log.error("reload: %s; nothing changed", p.unread)
            return p
        for err in new_cfg.errors:
            log.error("reload: config: %s", err)
        for warning in new_cfg.warnings:
            log.warning("reload: config: %s", warning)
        for problem in p.problems:
            log.log(logging.ERROR if problem.error else logging.WARNING,
                    "reload: config: %s%s", problem, " (running value kept)" if problem.error
                    else "")
        apply(self.engine, p.settings)
        self.reloads += 1
        self.reloaded_at = time.time()
        self.restart = p.restart
        self.last_error = None
        log.info("reload of %s: %s", path, "; ".join(p.changed) or "no live change")
        if p.restart:
            log.warning("reload: needs a restart to change: %s", ", ".join(p.restart))
        self.engine.wake.set()  # a new period, a new wait: the next tick uses them
        return p

    def snapshot(self) -> dict[str, Any]:
        return {"path": self.cfg.path or config_mod.DEFAULT_PATH, "reloads": self.reloads,
                "reloaded_at": self.reloaded_at, "restart_needed": list(self.restart),
                "last_error": self.last_error}
