"""The daemon's tunables: config.toml's [daemon], [pressure], [admission] and [estimate] tables
mapped onto the policy dataclasses, with sizes written the way hints write them ("512m").

A bad value never stops the daemon: it keeps the default and the error is logged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from execgate.common.config import Config
from execgate.common.hints import parse_size
from execgate.policy.admission import AdmissionConfig
from execgate.policy.estimate import EstimateConfig
from execgate.policy.growth import GrowthConfig
from execgate.policy.pressure import PressureConfig

T = TypeVar("T")


@dataclass(frozen=True)
class DaemonConfig:
    # "host" (MemAvailable) or a cgroup v2 directory whose memory.max is the budget.
    domain: str = "host"
    # Overrides the domain's own size (bytes or "8g"); 0 = the domain's.
    budget_bytes: int = 0
    sample_period_s: float = 0.1
    # Tool-call history (training data for prediction).
    store: str = "/var/lib/execgate/history.sqlite"
    # How long the runtime waits for an admission answer beyond max_admission_wait.
    admission_slack_s: float = 5.0
    # A running call whose cgroup vanished without a journal entry is released after this.
    vanish_grace_s: float = 2.0
    # Sandboxes (container ids or sandbox annotations) allowed to declare priority:high.
    priority_sandboxes: tuple[str, ...] = ()
    # The growth gate's actuator: auto (sched_ext, else cgroup.freeze), sched_ext, freeze, off.
    gate: str = "auto"


@dataclass(frozen=True)
class Settings:
    daemon: DaemonConfig
    pressure: PressureConfig
    admission: AdmissionConfig
    estimate: EstimateConfig
    growth: GrowthConfig


def _coerce(name: str, value: Any, default: Any, hint: str) -> Any:
    if name.endswith("_bytes") and value is not None:
        return parse_size(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value
    if isinstance(default, tuple):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError("must be a list of strings")
        return tuple(value)
    if isinstance(default, float) or "float" in hint:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("must be a number")
        return float(value)
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("must be an integer")
        return value
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ValueError("must be a string")
        return value
    return value


def from_table(cls: type[T], table: dict[str, Any], section: str, errors: list[str]) -> T:
    """Build cls from a TOML table, keeping the default for every key that is wrong."""
    defaults = cls()
    values: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key, value in table.items():
        f = fields.get(key)
        if f is None:
            errors.append(f"[{section}] unknown key {key!r} ignored")
            continue
        try:
            values[key] = _coerce(key, value, getattr(defaults, key), str(f.type))
        except ValueError as e:
            errors.append(f"[{section}] {key}: {e}; default kept")
    try:
        return cls(**values)
    except ValueError as e:
        errors.append(f"[{section}] {e}; defaults used for the whole table")
        return defaults


def load(cfg: Config) -> tuple[Settings, list[str]]:
    errors: list[str] = []
    tables = cfg.tables

    def table(name: str) -> dict[str, Any]:
        return dict(tables.get(name) or {})

    settings = Settings(
        daemon=from_table(DaemonConfig, table("daemon"), "daemon", errors),
        pressure=from_table(PressureConfig, table("pressure"), "pressure", errors),
        admission=from_table(AdmissionConfig, table("admission"), "admission", errors),
        estimate=from_table(EstimateConfig, table("estimate"), "estimate", errors),
        growth=from_table(GrowthConfig, table("growth"), "growth", errors),
    )
    if settings.daemon.gate not in ("auto", "sched_ext", "freeze", "off"):
        errors.append(f"[daemon] gate: {settings.daemon.gate!r} is not auto, sched_ext, freeze "
                      "or off; auto used")
        settings = dataclasses.replace(
            settings, daemon=dataclasses.replace(settings.daemon, gate="auto"))
    return settings, errors
