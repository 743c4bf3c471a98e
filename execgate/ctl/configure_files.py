"""How `execgatectl configure|unconfigure` changes an engine's files: all planned and checked
before the first write, and undone exactly.

Two kinds of file. A file execgate merges into (Docker's daemon.json, containerd's config.toml)
is backed up before each change (FILE.execgate-backup-TIME) and its original kept beside it the
first time (FILE.execgate-orig.json): unconfigure puts those very bytes back (or removes a file
that was not there) when nobody edited the file since, and otherwise takes out only execgate's
part. A drop-in execgate owns whole starts with OWNED_MARK; a file at its path without it is
someone else's and refused. Stdlib only: install.sh runs this before the package is installed.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shutil
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

OWNED_MARK = "# Written by execgatectl configure"
ADDED_MARK = "# added by execgatectl configure"


class InvalidConfig(ValueError):
    """An engine file execgate cannot read or must not touch: nothing was changed."""


@dataclass
class Options:
    name: str = "execgate"
    path: str = "/usr/local/bin/execgate"
    set_as_default: bool = False
    config: str | None = None


@dataclass
class Edit:
    path: str
    text: str | None  # the file's new content; None: no file
    owned: bool       # a drop-in written whole, else a file merged into
    mode: int = 0o644  # a new file's (an existing one keeps its own)
    # What a merged file means (its parse): the original comes back whole only when it means
    # what taking out only ours leaves (another runtime registered since must stay).
    meaning: Callable[[str | None], object] | None = None


@dataclass
class Plan:
    engine: str
    undo: bool
    restart: str
    edits: list[Edit] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidConfig(f"cannot read {path}: {e}") from e


def parse_toml(path: str, text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InvalidConfig(f"{path} is not valid TOML ({e}); fix it or move it away") from e


def on_host(path: str, binary: str, search: str | None = None) -> bool:
    """Whether this host has the engine: its config file or the directory it goes in, or its
    binary on the PATH (`search`, default $PATH and the usual bin and sbin directories)."""
    if os.path.exists(path) or os.path.isdir(os.path.dirname(path) or "."):
        return True
    if search is None:
        search = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
    return shutil.which(binary, path=search) is not None


def drop_in_plan(engine: str, restart: str, path: str, undo: bool,
                 content: Callable[[], str]) -> Plan:
    """A plan for an engine configured by one drop-in execgate owns whole."""
    p = Plan(engine, undo, restart)
    p.edits.append(Edit(path, None if undo else content(), owned=True))
    return p


def is_owned(text: str | None) -> bool:
    return text is not None and text.startswith(OWNED_MARK)


def owned_header(engine: str, why: str = "") -> str:
    """The first lines of a drop-in: whose it is and how it goes away."""
    lines = [f"{OWNED_MARK} {engine}; `execgatectl unconfigure {engine}` removes it."]
    lines += [f"# {line}" for line in why.splitlines()]
    return "\n".join(lines) + "\n"


def _orig_path(path: str) -> str:
    return path + ".execgate-orig.json"


def _sha(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


def _load_orig(path: str) -> dict[str, object] | None:
    try:
        with open(_orig_path(path)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class Change:
    edit: Edit
    now: str | None
    new: str | None
    restored: bool  # the original bytes put back whole


def resolve(plan: Plan) -> list[Change]:
    """Every file the plan changes; raises InvalidConfig, before anything is written, for a
    drop-in path holding someone else's file."""
    out = []
    for e in plan.edits:
        now = read(e.path)
        new, restored = e.text, False
        if e.owned and now is not None and not is_owned(now):
            if plan.undo:
                plan.notes.append(f"{e.path} is not execgate's (no '{OWNED_MARK}' line): kept")
                continue
            raise InvalidConfig(f"{e.path} exists and was not written by execgatectl; "
                                "move it away or pass --config another path")
        if plan.undo and not e.owned:
            orig = _load_orig(e.path)
            if orig is not None and "existed" in orig and orig.get("written") == _sha(now):
                text = orig.get("text") if orig.get("existed") else None
                text = text if isinstance(text, str) else None
                if e.meaning is None or e.meaning(text) == e.meaning(new):
                    new, restored = text, True
        if new != now:
            out.append(Change(e, now, new, restored))
    return out


def _write(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.execgate-tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    if os.path.exists(path):
        shutil.copymode(path, tmp)
    else:
        os.chmod(tmp, mode)
    os.rename(tmp, path)


def _backup(path: str) -> str:
    stamp = time.strftime("%Y%m%d%H%M%S")
    backup, n = f"{path}.execgate-backup-{stamp}", 1
    while os.path.exists(backup):
        backup, n = f"{path}.execgate-backup-{stamp}.{n}", n + 1
    shutil.copy2(path, backup)
    return backup


def apply(plan: Plan, dry_run: bool = False) -> list[str]:
    """Carry the plan out (or, dry, show it); the report's lines. Raises InvalidConfig first."""
    changes = resolve(plan)
    report = list(plan.notes)
    for c in changes:
        e, now, new = c.edit, c.now, c.new
        if dry_run:
            verb = "would remove" if new is None else "would write"
            report.append(f"{verb} {e.path}:")
            report.extend(line.rstrip("\n") for line in difflib.unified_diff(
                (now or "").splitlines(True), (new or "").splitlines(True),
                fromfile=e.path if now is not None else "/dev/null",
                tofile=e.path if new is not None else "/dev/null"))
            continue
        backup = _backup(e.path) if now is not None and not e.owned else None
        if not e.owned and not plan.undo:
            orig = _load_orig(e.path)
            if orig is None:
                orig = {"existed": now is not None, "text": now}
            elif orig.get("written") != _sha(now):
                orig = {}  # edited since execgate wrote it: unconfigure takes out only ours
            orig["written"] = _sha(new)
            _write(_orig_path(e.path), json.dumps(orig), 0o600)  # may hold credentials
        if new is None:
            os.unlink(e.path)
        else:
            _write(e.path, new, e.mode)
        if not e.owned and plan.undo:
            _unlink(_orig_path(e.path))
        what = "restored as it was" if c.restored else "removed" if new is None else "wrote"
        report.append(f"{what} {e.path}" + (f" (backup: {backup})" if backup else ""))
    if plan.undo and not dry_run:
        for e in plan.edits:  # nothing left of ours: an original kept for it is moot
            if not e.owned and not any(c.edit is e for c in changes):
                _unlink(_orig_path(e.path))
    if not changes:
        report.append(f"{plan.engine}: nothing to change")
    elif not dry_run:
        report.append(f"{plan.engine}: {plan.restart}")
    return report


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
