"""Register execgate in Docker's /etc/docker/daemon.json without disturbing anything else.

Run by install.sh as a plain script (stdlib only, before the package is importable):
    daemon_json.py check  FILE
    daemon_json.py add    FILE NAME PATH   (merges runtimes.NAME = {"path": PATH}; backs up)
    daemon_json.py remove FILE NAME PATH   (removes it only if it still points at PATH, and
                                            "default-runtime": NAME with it)
    daemon_json.py present FILE            (exit 0 when this host has Docker: FILE, its
                                            directory or dockerd on PATH; else 1)
Exit 0 on success, 3 when FILE is not valid JSON (nothing is written), 1 on other errors.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import Any


class InvalidConfig(ValueError):
    pass


def load(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    if not text.strip():
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
    """Remove our entry, and a "default-runtime" naming it (the README says to set one):
    Docker refuses to start with a default runtime that is not defined."""
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


def docker_present(path: str, search: str | None = None) -> bool:
    """Whether this host has Docker to register with: its daemon.json or the directory it goes
    in, or a dockerd on the PATH (`search`, default $PATH and the sbin directories)."""
    if os.path.exists(path) or os.path.isdir(os.path.dirname(path) or "."):
        return True
    if search is None:
        search = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"
    return shutil.which("dockerd", path=search) is not None


def save(path: str, data: dict[str, Any]) -> str | None:
    """Write atomically, keeping a timestamped backup of the previous file; returns it."""
    backup = None
    if os.path.exists(path):
        backup = f"{path}.execgate-backup-{time.strftime('%Y%m%d%H%M%S')}"
        shutil.copy2(path, backup)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.execgate-tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    if os.path.exists(path):
        shutil.copymode(path, tmp)
    os.rename(tmp, path)
    return backup


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("check", "add", "remove", "present") or \
            (argv[0] in ("add", "remove") and len(argv) != 4):
        print(__doc__, file=sys.stderr)
        return 1
    cmd, path = argv[0], argv[1]
    if cmd == "present":
        return 0 if docker_present(path) else 1
    try:
        data = load(path)
    except InvalidConfig as e:
        print(f"daemon.json: {e}", file=sys.stderr)
        return 3
    if cmd == "check":
        return 0
    name, runtime = argv[2], argv[3]
    default = data.get("default-runtime") == name
    changed = add_runtime(data, name, runtime) if cmd == "add" else \
        remove_runtime(data, name, runtime)
    if changed:
        backup = save(path, data)
        print(f"daemon.json: {cmd} runtime {name!r}"
              + (" and the \"default-runtime\" naming it" if cmd == "remove" and default else "")
              + (f" (backup: {backup})" if backup else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
