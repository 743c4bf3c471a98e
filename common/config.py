"""execgate's configuration: /etc/execgate/config.toml over built-in defaults.

Read on every runtime call, so it stays a flat table parsed with tomllib (stdlib) and nothing
more. A broken config must never break a container: errors fall back to the defaults and are
reported by the caller.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

DEFAULT_PATH = "/etc/execgate/config.toml"


@dataclass(frozen=True)
class Config:
    # The real OCI runtime: a path or command name, or a list tried in order.
    runtime: tuple[str, ...] = ("runc", "crun")
    # Per-container records and per-call state (tmpfs: gone on reboot, like runc's own state).
    state_dir: str = "/run/execgate"
    # Append-only JSONL of finished tool calls (outcome, duration, peak memory).
    journal: str = "/var/lib/execgate/calls.jsonl"
    # execgate's own debug log; empty disables it.
    debug_log: str = ""
    # Controllers enabled for tool-call cgroups inside each container's cgroup.
    controllers: tuple[str, ...] = ("cpu", "memory", "pids")
    # Daemon socket and the runtime's budget for talking to it (fail open past it).
    socket: str = "/run/execgate/execgated.sock"
    daemon_timeout_ms: int = 200
    # oom_score_adj of every tool call (raised, never lowered): the kernel picks tool calls as
    # OOM victims before the agent and the container's init (-1000..1000; 0 leaves it alone).
    tool_oom_score_adj: int = 500
    # AgentCgroup mode: a call's declared memory becomes its cgroup's memory.high (off by
    # default: static per-call limits thrash; kept as a baseline for the benchmark).
    memory_high_from_hint: bool = False
    # Per-exec cgroups; false makes execgate a pure passthrough.
    per_exec_cgroups: bool = True
    errors: tuple[str, ...] = field(default=(), compare=False)
    # Sub-tables ([daemon], [pressure], [admission], ...) for the components that own them.
    tables: dict[str, dict[str, object]] = field(default_factory=dict, compare=False)


def _coerce(name: str, value: object, default: object) -> object:
    if isinstance(default, tuple):
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ValueError(f"{name} must be a string or a list of strings")
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false")
        return value
    if isinstance(default, int):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an integer")
        return value
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string")
    return value


def load(path: str | None = None) -> Config:
    """Load the config; problems are collected in Config.errors, never raised."""
    path = path or os.environ.get("EXECGATE_CONFIG") or DEFAULT_PATH
    try:
        with open(path, "rb") as f:
            import tomllib

            data = tomllib.load(f)
    except FileNotFoundError:
        return Config()
    except (OSError, ValueError) as e:
        return Config(errors=(f"{path}: {e}; using defaults",))
    defaults = Config()
    known = {f.name for f in fields(Config)} - {"errors", "tables"}
    values: dict[str, object] = {}
    errors: list[str] = []
    tables: dict[str, dict[str, object]] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            tables[key] = value
            continue
        if key not in known:
            errors.append(f"{path}: unknown key {key!r} ignored")
            continue
        try:
            values[key] = _coerce(key, value, getattr(defaults, key))
        except ValueError as e:
            errors.append(f"{path}: {e}; default kept")
    return Config(**values, errors=tuple(errors), tables=tables)  # type: ignore[arg-type]
