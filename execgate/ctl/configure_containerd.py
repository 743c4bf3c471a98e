"""containerd: a runc-v2-shim runtime whose `BinaryName` is execgate, as a drop-in imported by
config.toml (for the CRI plugin: a Kubernetes RuntimeClass's handler names it).

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.execgate]     # version = 2 (1.x)
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.execgate.options]
        BinaryName = "/usr/local/bin/execgate"

Version 3 (containerd 2.x) names the plugin "io.containerd.cri.v1.runtime". The entry starts as
a copy of the default runtime's (runc's `SystemdCgroup` and the like carry over). containerd 2.x
merges an import into the config key by key, so its drop-in holds the entry alone; containerd
1.x replaces a plugin's whole section with an import's, so a version-2 drop-in carries the CRI
section as the other files define it, plus the entry (configure again after editing those).
The drop-in goes into the directory of the first `DIR/*.toml` in config.toml's `imports`; when
there is none, one line `imports = ["<config dir>/conf.d/*.toml"]` is put at the top of
config.toml (or config.toml is made with it). `imports` naming no such directory is refused.
"""

from __future__ import annotations

import copy
import glob
import os
import re
import subprocess
import tomllib
from typing import Any

from . import configure_toml
from .configure_files import (
    ADDED_MARK,
    Edit,
    InvalidConfig,
    Options,
    Plan,
    is_owned,
    on_host,
    owned_header,
    read,
)
from .configure_files import parse_toml as parse

DEFAULT_CONFIG = "/etc/containerd/config.toml"
DROP_IN = "99-{name}.toml"  # in the imported directory
CRI = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
SHIM = "io.containerd.runc.v2"
RESTART = ("restart it: systemctl restart containerd (running containers keep running: their "
           "shims hold them)")


def installed_version() -> int:
    """The config version this host's containerd writes: 3 from containerd 2.0, else 2."""
    try:
        out = subprocess.run(["containerd", "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 2
    m = re.search(r"\sv?(\d+)\.\d+", out)
    return 3 if m and int(m.group(1)) >= 2 else 2


def _imports(main: str, doc: dict[str, Any]) -> list[str]:
    imports = doc.get("imports", [])
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        raise InvalidConfig(f"{main}: \"imports\" must be a list of paths")
    base = os.path.dirname(os.path.abspath(main))
    return [i if os.path.isabs(i) else os.path.join(base, i) for i in imports]


def _drop_in_dir(main: str, doc: dict[str, Any]) -> tuple[str, bool]:
    """Where the drop-in goes, and whether config.toml must import it."""
    imports = _imports(main, doc)
    for i in imports:
        if i.endswith("/*.toml") and "*" not in i[:-len("/*.toml")]:
            return i[:-len("/*.toml")], False
    if imports:
        raise InvalidConfig(f"{main} imports {imports}, no directory of drop-ins (DIR/*.toml): "
                            "add one to \"imports\", then configure again")
    return os.path.join(os.path.dirname(os.path.abspath(main)), "conf.d"), True


def _sources(main: str, doc: dict[str, Any], ours: str) -> list[dict[str, Any]]:
    """config.toml and what it imports, in containerd's order, ours left out."""
    docs, seen, pending = [], {ours}, [(main, doc)]
    while pending:
        path, d = pending.pop(0)
        if path in seen:
            continue
        seen.add(path)
        docs.append(d)
        for i in _imports(path, d):
            for f in sorted(glob.glob(i)) if "*" in i else [i]:
                if f not in seen and os.path.isfile(f):
                    pending.append((f, parse(f, read(f))))
    return docs


def _merge(into: dict[str, Any], d: dict[str, Any]) -> None:
    for k, v in d.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


def _cri_section(docs: list[dict[str, Any]], plugin: str, version: int) -> dict[str, Any]:
    """The CRI plugin's section as containerd sees it: 1.x takes the last file's whole, 2.x
    merges them."""
    section: dict[str, Any] = {}
    for d in docs:
        s = (d.get("plugins") or {}).get(plugin)
        if isinstance(s, dict):
            if version >= 3:
                _merge(section, s)
            else:
                section = copy.deepcopy(s)
    return section


def _entry(section: dict[str, Any], o: Options) -> dict[str, Any]:
    runtimes = (section.get("containerd") or {}).get("runtimes") or {}
    default = (section.get("containerd") or {}).get("default_runtime_name") or "runc"
    base = runtimes.get("runc" if default == o.name else default)
    entry: dict[str, Any] = {"runtime_type": SHIM, "options": {}}
    if isinstance(base, dict) and base.get("runtime_type", SHIM) == SHIM:
        entry = copy.deepcopy(base)
        entry["runtime_type"] = SHIM
        entry["options"] = dict(entry.get("options") or {})
    entry["options"]["BinaryName"] = o.path
    return entry


def _drop_in(main: str, doc: dict[str, Any], version: int, ours: str, o: Options) -> str:
    plugin = CRI[version]
    section = _cri_section(_sources(main, doc, ours), plugin, version)
    entry = _entry(section, o)
    # A CRI section that defines runtimes replaces containerd's built-in map (runc in it) when
    # decoded: a default runc the files leave to that map is written out, as it was.
    defined = section.get("containerd") or {}
    keep_runc = (defined.get("default_runtime_name") or "runc") == "runc" and \
        "runc" not in (defined.get("runtimes") or {})
    if version >= 3:
        section = {}
    ctd = section.setdefault("containerd", {})
    runtimes = ctd.setdefault("runtimes", {})
    if keep_runc:
        runtimes["runc"] = {"runtime_type": SHIM}
    runtimes[o.name] = entry
    if o.set_as_default:
        ctd["default_runtime_name"] = o.name
    why = ("containerd 1.x replaces a plugin's whole section with an import's: this file\n"
           f"holds the CRI section of {main} (and its other imports) as it was, plus\n"
           "execgate's runtime; after editing that section, configure containerd again.\n"
           if version < 3 else "")
    text = owned_header("containerd", why) + configure_toml.dump(
        {"version": version, "plugins": {plugin: section}})
    tomllib.loads(text)  # what we write must read back
    return text


def _with_import(text: str | None, directory: str, version: int) -> str:
    line = f"imports = [{configure_toml.value(directory + '/*.toml')}]  {ADDED_MARK}\n"
    if text is None:
        return f"version = {version}  {ADDED_MARK}\n{line}"
    return line + text  # a top-level key is valid at the very top of any TOML document


def _without_import(text: str) -> str:
    return "".join(line for line in text.splitlines(True) if not line.rstrip().endswith(ADDED_MARK))


def plan(o: Options, undo: bool) -> Plan:
    main = o.config or DEFAULT_CONFIG
    text = read(main)
    doc = parse(main, text)
    p = Plan("containerd", undo, RESTART)
    if undo:
        dirs = [i[:-len("/*.toml")] for i in _imports(main, doc) if i.endswith("/*.toml")]
        for d in dirs or [os.path.join(os.path.dirname(os.path.abspath(main)), "conf.d")]:
            p.edits.append(Edit(os.path.join(d, DROP_IN.format(name=o.name)), None, owned=True))
        others = [f for d in dirs for f in glob.glob(os.path.join(d, "*.toml"))
                  if f != os.path.join(d, DROP_IN.format(name=o.name)) and is_owned(read(f))]
        if text is not None and ADDED_MARK in text and not others:  # another name's still needs it
            p.edits.append(Edit(main, _without_import(text), owned=False,
                                meaning=lambda t: parse(main, t)))
        return p
    version = doc.get("version", 1) if text is not None else installed_version()
    if version not in CRI:
        raise InvalidConfig(f"{main}: config version {version!r} (version 2 and 3 are known); "
                            "migrate it with `containerd config migrate`")
    directory, needs_import = _drop_in_dir(main, doc)
    ours = os.path.join(directory, DROP_IN.format(name=o.name))
    # A version-2 drop-in copies the CRI section (registry credentials too): config.toml's mode.
    mode = os.stat(main).st_mode & 0o777 if text is not None and version < 3 else 0o644
    p.edits.append(Edit(ours, _drop_in(main, doc, version, ours, o), owned=True, mode=mode))
    if needs_import:
        new = _with_import(text, directory, version)
        parse(main, new)
        p.edits.append(Edit(main, new, owned=False))
    return p


def present(config: str | None = None) -> bool:
    return on_host(config or DEFAULT_CONFIG, "containerd")
