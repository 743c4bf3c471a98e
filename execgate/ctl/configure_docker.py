"""Docker: execgate as a runtime in /etc/docker/daemon.json, every other key and runtime kept.

    { "runtimes": { "execgate": { "path": "/usr/local/bin/execgate" } } }

and with --set-as-default `"default-runtime": "execgate"`. Taking it out removes the entry only
while it still points at our path, and a "default-runtime" naming it with it: Docker refuses to
start with a default runtime that is not defined.
"""

from __future__ import annotations

import json
from typing import Any

from .configure_files import Edit, InvalidConfig, Options, Plan, on_host, read

DEFAULT_CONFIG = "/etc/docker/daemon.json"
RESTART = ("reload it: systemctl reload docker (SIGHUP re-reads runtimes; running containers "
           "are untouched)")


def parse(path: str, text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as e:
        raise InvalidConfig(f"{path} is not valid JSON ({e}); fix it or move it away") from e
    if not isinstance(data, dict):
        raise InvalidConfig(f"{path} must hold a JSON object")
    if not isinstance(data.get("runtimes", {}), dict):
        raise InvalidConfig(f"{path}: \"runtimes\" must be an object")
    return data


def load(path: str) -> dict[str, Any]:
    return parse(path, read(path))


def dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"


def add_runtime(data: dict[str, Any], name: str, path: str) -> bool:
    """Merge the runtime entry; True when something changed."""
    runtimes = data.setdefault("runtimes", {})
    entry = runtimes.get(name)
    if isinstance(entry, dict) and entry.get("path") == path:
        return False
    new = dict(entry) if isinstance(entry, dict) else {}
    new["path"] = path
    runtimes[name] = new
    return True


def remove_runtime(data: dict[str, Any], name: str, path: str) -> bool:
    """Remove our entry, and a "default-runtime" naming it; True when something changed."""
    runtimes = data.get("runtimes")
    if not isinstance(runtimes, dict):
        return False
    entry = runtimes.get(name)
    if not isinstance(entry, dict) or entry.get("path") != path:
        return False
    del runtimes[name]
    if not runtimes:
        del data["runtimes"]
    if data.get("default-runtime") == name:
        del data["default-runtime"]
    return True


def others(data: dict[str, Any], name: str, path: str) -> dict[str, Any]:
    """The runtimes besides ours (`name` at `path`): what an exact restore must leave be."""
    return {k: v for k, v in (data.get("runtimes") or {}).items()
            if not (k == name and isinstance(v, dict) and v.get("path") == path)}


def present(config: str | None = None, search: str | None = None) -> bool:
    """Whether this host has Docker to register with: its daemon.json or the directory it goes
    in, or a dockerd on the PATH (`search`, default $PATH and the sbin directories)."""
    return on_host(config or DEFAULT_CONFIG, "dockerd", search)


def plan(o: Options, undo: bool) -> Plan:
    path = o.config or DEFAULT_CONFIG
    text = read(path)
    data = parse(path, text)
    p = Plan("docker", undo, RESTART)
    if undo:
        default = data.get("default-runtime") == o.name
        if remove_runtime(data, o.name, o.path):
            text = dump(data)
            if default:
                p.notes.append(f"the \"default-runtime\" naming {o.name!r} goes with it")
    else:
        changed = add_runtime(data, o.name, o.path)
        if o.set_as_default and data.get("default-runtime") != o.name:
            data["default-runtime"] = o.name
            changed = True
        if changed:
            text = dump(data)
    p.edits.append(Edit(path, text, owned=False,
                        meaning=lambda t: others(parse(path, t), o.name, o.path)))
    return p
