"""The daemon's tunables: config.toml's [daemon], [pressure], [admission], [estimate], [growth],
[inside], [residency], [sandbox_admission], [headroom], [metrics], [predictor] and [retention]
tables mapped onto the policy dataclasses, with sizes written the way hints write them ("512m").

A bad value never stops the daemon: that key keeps its default (the rest of its table is read)
and the error is logged, at the file's line. An unknown key is a warning; so is a deprecated
key (DEPRECATED): it is read under its new name while the new one is not set.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from execgate.cgroups import container
from execgate.common import config as config_mod
from execgate.common.config import Config
from execgate.common.hints import parse_size
from execgate.policy.admission import AdmissionConfig
from execgate.policy.estimate import EstimateConfig
from execgate.policy.growth import GrowthConfig
from execgate.policy.headroom import HeadroomConfig
from execgate.policy.pressure import PressureConfig
from execgate.policy.residency import ResidencyConfig
from execgate.policy.sandbox_admission import SandboxAdmissionConfig

from .predictor import PredictorConfig
from .retention import RetentionConfig

T = TypeVar("T")


@dataclass(frozen=True)
class DaemonConfig:
    # "host" (MemAvailable) or a cgroup v2 directory whose memory.max is the budget.
    domain: str = "host"
    # Overrides the domain's own size (bytes or "8g"); 0 = the domain's.
    budget_bytes: int = 0
    sample_period_s: float = 0.1
    # ... while nothing runs, waits or is under pressure (a request wakes the loop at once).
    idle_period_s: float = 0.5
    # ... while calls run at green, nothing waits, and the domain is calm: its effective
    # headroom above the yellow limit, less calm_margin_bytes, exceeds what it would add over
    # two such periods at the fastest rate it grew lately. 0 = every sample period: off by
    # default until a VM run says why 0.3 s made execgate's P50 at 1x worse, not better.
    calm_period_s: float = 0.0
    calm_margin_bytes: int = 256 << 20
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
    # bcc probes (bpf/probes.py): auto/on (true) load them in the background, off (false) never.
    probes: str = "auto"
    # OOM kills seen by the probes, one JSON line each ("" = not recorded).
    oom_record: str = "/var/lib/execgate/oom-kills.jsonl"


@dataclass(frozen=True)
class InsideConfig:
    """[inside]: agents that run inside their sandbox and spawn tool processes themselves."""

    # Whether a container without an `execgate.agent` annotation is an inside agent.
    default: bool = False
    # Which exec is a tool call: "child" (exec'd by the agent process itself) or "first-exec"
    # (the first exec below the agent, through children that only forked, e.g. subshells).
    rule: str = "child"
    # Where commands are followed: "bpf" (bpf/inside.bpf.c: the kernel keeps commands that end
    # within their first slice and wakes the daemon only for the others; rule "child" only),
    # "connector" (the proc connector: the daemon reads every fork, exec and exit), or "auto"
    # (bpf where it builds and loads, else the connector).
    source: str = "auto"
    # When a placed call stops: "queued" (only while the daemon makes it wait: a call admitted
    # at once never stops) or "always" (it joins a frozen cgroup, thawed once admitted).
    freeze: str = "queued"
    # A command is placed only once it has run this long since its exec: most commands end
    # sooner (ls, cat, git status: a few ms), cost nothing then, and cannot burst in that time.
    place_after_ms: float = 5.0
    # Programs placed at their exec, without a slice (source bpf): they grow from their first
    # milliseconds (an interpreter loading, a compiler), and would be placed anyway.
    place_at_exec: tuple[str, ...] = ("python", "python3", "pytest", "pip", "pip3", "node",
                                      "npm", "npx", "cargo", "rustc", "cc1", "cc1plus",
                                      "java", "go")
    # A program whose call's memory peak reaches this is placed at its exec from then on
    # (learned while the daemon runs; shells and wrappers never are). 0: never.
    learn_at_exec_bytes: int = 256 << 20
    # Prepared tool cgroups per container, so placement is one write to cgroup.procs.
    spares: int = 1
    # How often container records are re-read (inotify normally tells at once).
    scan_period_s: float = 0.5
    # The proc-connector socket's receive buffer (host-wide fork bursts must not overflow it).
    rcvbuf_bytes: int = 8 << 20


@dataclass(frozen=True)
class MetricsConfig:
    """[metrics]: the Prometheus endpoint (daemon/metrics.py)."""

    # Where /metrics is served: "" (off), "127.0.0.1:9477" (TCP: a host and port; a non-loopback
    # host is the operator's choice), or an absolute path (a unix socket, mode 0660).
    listen: str = ""

    def __post_init__(self) -> None:
        if self.listen and not self.listen.startswith("/"):
            host, sep, port = self.listen.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"listen {self.listen!r} is not host:port or a socket path")


@dataclass(frozen=True)
class Settings:
    daemon: DaemonConfig
    pressure: PressureConfig
    admission: AdmissionConfig
    estimate: EstimateConfig
    growth: GrowthConfig
    inside: InsideConfig = InsideConfig()
    residency: ResidencyConfig = dataclasses.field(default_factory=ResidencyConfig)
    sandboxes: SandboxAdmissionConfig = dataclasses.field(default_factory=SandboxAdmissionConfig)
    headroom: HeadroomConfig = dataclasses.field(default_factory=HeadroomConfig)
    metrics: MetricsConfig = MetricsConfig()
    predictor: PredictorConfig = dataclasses.field(default_factory=PredictorConfig)
    retention: RetentionConfig = dataclasses.field(default_factory=RetentionConfig)


# config.toml's daemon tables and the dataclass each one fills.
TABLES: dict[str, type] = {
    "daemon": DaemonConfig, "pressure": PressureConfig, "admission": AdmissionConfig,
    "estimate": EstimateConfig, "growth": GrowthConfig, "inside": InsideConfig,
    "residency": ResidencyConfig, "sandbox_admission": SandboxAdmissionConfig,
    "headroom": HeadroomConfig, "metrics": MetricsConfig, "predictor": PredictorConfig,
    "retention": RetentionConfig,
}


class Problem(str):
    """One config problem as it is logged: "[table] key: what", after "path:line: " when the
    config came from a file. `error`: a value was refused and its default kept (`execgatectl
    config check` fails); else a warning (a key nothing reads, or a deprecated one)."""

    error: bool
    table: str  # where: the table and key ("" for a whole table)
    key: str

    def __new__(cls, text: str, error: bool = True, table: str = "", key: str = "") -> Problem:
        self = super().__new__(cls, text)
        self.error, self.table, self.key = error, table, key
        return self


class Report:
    """Problems as they are met, by (table, key); located in the file once, at the end."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str, str, bool]] = []

    def error(self, table: str, key: str, text: str) -> None:
        self.found.append((table, key, text, True))

    def warn(self, table: str, key: str, text: str) -> None:
        self.found.append((table, key, text, False))

    def problems(self, path: str) -> list[Problem]:
        lines: dict[tuple[str, str], int] = {}
        if path and self.found:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = config_mod.locate(f.read())
            except OSError:
                pass
        return [Problem(f"{config_mod.where(path, lines, table, key)}: {text}" if path else text,
                        error, table, key) for table, key, text, error in self.found]


def _coerce(name: str, value: Any, default: Any, hint: str) -> Any:
    if name.endswith("_bytes") and value is not None:
        return parse_size(value)
    if name.endswith("_bytes_per_s") and isinstance(value, str):
        return float(parse_size(value))  # "256m" a second
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


def from_table(cls: type[T], table: dict[str, Any], section: str, report: Report) -> T:
    """Build cls from a TOML table, keeping the default for every key that is wrong."""
    defaults = cls()
    values: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key, value in table.items():
        f = fields.get(key)
        if f is None:
            report.warn(section, key, f"[{section}] unknown key {key!r} ignored")
            continue
        try:
            values[key] = _coerce(key, value, getattr(defaults, key), str(f.type))
        except ValueError as e:
            report.error(section, key, f"[{section}] {key}: {e}; default kept")
    try:
        return cls(**values)
    except ValueError:
        return _valid_part(cls, values, section, report)


def _valid_part(cls: type[T], values: dict[str, Any], section: str, report: Report) -> T:
    """cls from the values its own checks (__post_init__) accept, adding one key at a time
    until no more fits (so `max_hold_s = 2` waits for the `overdue_after_s = 1.5` written after
    it); each key left out keeps its default, with the check's error."""
    kept: dict[str, Any] = {}
    pending = dict(values)
    why: dict[str, str] = {}
    while pending:
        for key, value in list(pending.items()):
            try:
                cls(**kept, **{key: value})
            except ValueError as e:
                why[key] = str(e)
                continue
            kept[key] = pending.pop(key)
            break
        else:
            break
    for key in pending:
        report.error(section, key, f"[{section}] {key}: {why[key]}; default kept")
    return cls(**kept)


# Old key -> the key it became, as (table, key). A deprecated key is still read while the new one
# is not set, and reported either way.
DEPRECATED: dict[tuple[str, str], tuple[str, str]] = {
    # One safety margin S for admission and the growth gate (pressure.effective_margin).
    ("growth", "headroom_reserve_bytes"): ("pressure", "safety_margin_bytes"),
    ("growth", "headroom_reserve_fraction"): ("pressure", "safety_margin_fraction"),
    # b, the growth gate's yellow slot count, is `slots` (`budget` is the domain's bytes).
    ("growth", "budget_initial"): ("growth", "slots_initial"),
    ("growth", "budget_max"): ("growth", "slots_max"),
    ("growth", "budget_increase_after_s"): ("growth", "slots_increase_after_s"),
}


def _renamed(tables: dict[str, dict[str, Any]], report: Report) -> None:
    """Move each deprecated key in `tables` (copies, edited in place) to its new name."""
    for (old_table, old_key), (new_table, new_key) in DEPRECATED.items():
        old = tables.get(old_table)
        if not old or old_key not in old:
            continue
        value = old.pop(old_key)
        new = tables.setdefault(new_table, {})
        if new_key in new:
            report.warn(old_table, old_key, f"[{old_table}] {old_key} is deprecated and "
                        f"ignored: [{new_table}] {new_key} is set")
        else:
            new[new_key] = value
            report.warn(old_table, old_key, f"[{old_table}] {old_key} is deprecated: read as "
                        f"[{new_table}] {new_key}; rename it")


INSIDE_RULES = ("child", "first-exec")
INSIDE_FREEZE = ("queued", "always")
INSIDE_SOURCES = ("auto", "bpf", "connector")


def _inside(table: dict[str, Any], report: Report) -> InsideConfig:
    inside = from_table(InsideConfig, table, "inside", report)
    fixes: dict[str, Any] = {}

    def refuse(key: str, text: str, default: Any) -> None:
        report.error("inside", key, f"[inside] {key}: {text}")
        fixes[key] = default

    if inside.rule not in INSIDE_RULES:
        refuse("rule", f"{inside.rule!r} is not child or first-exec; child used", "child")
    if inside.source not in INSIDE_SOURCES:
        refuse("source", f"{inside.source!r} is not auto, bpf or connector; auto used", "auto")
    if inside.freeze not in INSIDE_FREEZE:
        refuse("freeze", f"{inside.freeze!r} is not queued or always; queued used", "queued")
    if not 0 <= inside.spares <= 8:
        refuse("spares", f"{inside.spares} is not 0..8; 1 used", 1)
    if not 0 <= inside.place_after_ms <= 1000:
        refuse("place_after_ms", f"{inside.place_after_ms} is not 0..1000; 5 used", 5.0)
    if not 0.05 <= inside.scan_period_s <= 60:
        refuse("scan_period_s", f"{inside.scan_period_s} is not 0.05..60; 0.5 used", 0.5)
    return dataclasses.replace(inside, **fixes) if fixes else inside


def _residency(table: dict[str, Any], report: Report) -> ResidencyConfig:
    """[residency]; swap_max is the runtime's to write (runtime/start.py), checked here too so a
    bad value is in the daemon's log at start, and kept as memory.swap.max spells it."""
    table = dict(table)
    if "swap_max" in table:
        try:
            table["swap_max"] = container.swap_max_value(table["swap_max"]) or ""
        except ValueError as e:
            report.error("residency", "swap_max",
                         f"[residency] swap_max: {e}; the runtime writes nothing")
            table["swap_max"] = ""
    return from_table(ResidencyConfig, table, "residency", report)


# [daemon]'s words and how the error spells them; the first is used for a value that is none.
DAEMON_CHOICES = {
    "gate": (("auto", "sched_ext", "freeze", "off"), "auto, sched_ext, freeze or off"),
    "probes": (("auto", "on", "off"), "true, false or auto"),
}


def _daemon(table: dict[str, Any], report: Report) -> DaemonConfig:
    table = dict(table)
    if isinstance(table.get("probes"), bool):  # probes = true|false|"auto"
        table["probes"] = "on" if table["probes"] else "off"
    daemon = from_table(DaemonConfig, table, "daemon", report)
    fixes = {}
    for key, (words, spelled) in DAEMON_CHOICES.items():
        value = getattr(daemon, key)
        if value not in words:
            report.error("daemon", key, f"[daemon] {key}: {value!r} is not {spelled}; "
                         f"{words[0]} used")
            fixes[key] = words[0]
    return dataclasses.replace(daemon, **fixes) if fixes else daemon


def load(cfg: Config) -> tuple[Settings, list[Problem]]:
    """The Settings of cfg's tables, and their problems (errors and warnings, located in
    cfg.path when it has one); never raises."""
    report = Report()
    tables = {name: dict(t) for name, t in cfg.tables.items() if isinstance(t, dict)}
    _renamed(tables, report)

    def table(name: str) -> dict[str, Any]:
        return tables.get(name) or {}

    settings = Settings(
        daemon=_daemon(table("daemon"), report),
        pressure=from_table(PressureConfig, table("pressure"), "pressure", report),
        admission=from_table(AdmissionConfig, table("admission"), "admission", report),
        estimate=from_table(EstimateConfig, table("estimate"), "estimate", report),
        growth=from_table(GrowthConfig, table("growth"), "growth", report),
        inside=_inside(table("inside"), report),
        residency=_residency(table("residency"), report),
        sandboxes=from_table(SandboxAdmissionConfig, table("sandbox_admission"),
                             "sandbox_admission", report),
        headroom=from_table(HeadroomConfig, table("headroom"), "headroom", report),
        metrics=from_table(MetricsConfig, table("metrics"), "metrics", report),
        predictor=from_table(PredictorConfig, table("predictor"), "predictor", report),
        retention=from_table(RetentionConfig, table("retention"), "retention", report),
    )
    return settings, report.problems(cfg.path)
