"""CRI-O: execgate as a runtime handler, in a drop-in of its own under /etc/crio/crio.conf.d/
(read after crio.conf, in name order; a Kubernetes RuntimeClass's handler names it):

    [crio.runtime.runtimes.execgate]
    runtime_path = "/usr/local/bin/execgate"
    runtime_type = "oci"

and with --set-as-default `[crio.runtime] default_runtime = "execgate"`. crio.conf beside the
drop-in directory is read first: invalid TOML there is refused (CRI-O would not start anyway).
"""

from __future__ import annotations

import os
import tomllib
from typing import Any

from . import configure_toml
from .configure_files import Options, Plan, drop_in_plan, on_host, owned_header, parse_toml, read

DEFAULT_DIR = "/etc/crio/crio.conf.d"  # the drop-in: 99-NAME.conf there
RESTART = ("restart it: systemctl restart crio (running containers keep running: conmon holds "
           "them)")


def check_toml(path: str) -> dict[str, Any]:
    """A file the engine reads besides ours: refused when it is not valid TOML."""
    return parse_toml(path, read(path)) if path else {}


def main_config(drop_in: str) -> str:
    """crio.conf (or containers.conf) of a drop-in: DIR/NAME.conf.d/FILE -> DIR/NAME.conf."""
    d = os.path.dirname(drop_in)
    return d[:-len(".d")] if d.endswith(".conf.d") else ""


def drop_in(engine: str, doc: dict[str, Any], why: str = "") -> str:
    text = owned_header(engine, why) + configure_toml.dump(doc)
    tomllib.loads(text)  # what we write must read back
    return text


def _content(o: Options, path: str) -> str:
    check_toml(main_config(path))
    runtime: dict[str, Any] = {"runtimes": {o.name: {"runtime_path": o.path,
                                                     "runtime_type": "oci"}}}
    if o.set_as_default:
        runtime = {"default_runtime": o.name, **runtime}
    return drop_in("crio", {"crio": {"runtime": runtime}})


def plan(o: Options, undo: bool) -> Plan:
    path = o.config or os.path.join(DEFAULT_DIR, f"99-{o.name}.conf")
    return drop_in_plan("crio", RESTART, path, undo, lambda: _content(o, path))


def present(config: str | None = None) -> bool:
    return on_host(main_config(config or os.path.join(DEFAULT_DIR, "99-execgate.conf")), "crio")
