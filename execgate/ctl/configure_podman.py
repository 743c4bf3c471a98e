"""Podman: execgate as an OCI runtime in a containers.conf drop-in of its own
(/etc/containers/containers.conf.d/, read after containers.conf, in name order):

    [engine]
    runtime_supports_json = ["execgate", {append=true}]
    [engine.runtimes]
    execgate = ["/usr/local/bin/execgate"]

`runtime_supports_json` is what makes Podman pass `--log FILE --log-format json` to the runtime,
so execgate's warnings reach the container's log; without it they go nowhere. Podman 5 appends
with `{append=true}`; before it an array replaces the earlier one, so the drop-in lists the
runtimes the other files (or Podman 4's defaults) name, plus ours. With --set-as-default
`[engine] runtime = "execgate"`. `podman --runtime execgate` picks it otherwise.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
from typing import Any

from .configure_crio import check_toml, drop_in, main_config
from .configure_files import Options, Plan, drop_in_plan, on_host

DEFAULT_DIR = "/etc/containers/containers.conf.d"  # the drop-in: 99-NAME.conf there
SHARED_CONFIG = "/usr/share/containers/containers.conf"
PODMAN4_JSON = ["crun", "runc", "kata", "runsc", "krun"]  # containers-common 0.5x's default
RESTART = ("nothing to restart: each podman command reads containers.conf (podman run "
           "--runtime NAME, or the default runtime)")


def podman_major() -> int | None:
    try:
        out = subprocess.run(["podman", "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"version (\d+)\.", out)
    return int(m.group(1)) if m else None


def _supports_json(path: str, name: str, major: int | None) -> list[Any]:
    if major is None or major >= 5:
        return [name, {"append": True}]
    found = PODMAN4_JSON
    others = sorted(glob.glob(os.path.join(os.path.dirname(path), "*.conf")))
    for f in [SHARED_CONFIG, main_config(path), *others]:
        if f != path:
            v = (check_toml(f).get("engine") or {}).get("runtime_supports_json")
            if isinstance(v, list):
                found = [x for x in v if isinstance(x, str)]
    return [*[x for x in found if x != name], name]


def _content(o: Options, path: str, major: int | None) -> str:
    check_toml(main_config(path))
    engine: dict[str, Any] = {"runtime_supports_json": _supports_json(
        path, o.name, podman_major() if major is None else major)}
    if o.set_as_default:
        engine["runtime"] = o.name
    engine["runtimes"] = {o.name: [o.path]}
    return drop_in("podman", {"engine": engine})


def plan(o: Options, undo: bool, major: int | None = None) -> Plan:
    path = o.config or os.path.join(DEFAULT_DIR, f"99-{o.name}.conf")
    return drop_in_plan("podman", RESTART, path, undo, lambda: _content(o, path, major))


def present(config: str | None = None) -> bool:
    return on_host(main_config(config or os.path.join(DEFAULT_DIR, "99-execgate.conf")),
                   "podman")
