"""The journal and its rotated files, as readers see them.

The daemon alone rotates (daemon/retention.py): `calls.jsonl` becomes `calls.jsonl.1`, `.1`
becomes `.2` and so on, the oldest beyond `keep` removed. Writers only ever append to the
current file, so a reader that wants more than the newest lines reads the rotated ones too,
oldest first. Not imported by the runtime.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from execgate.common import records


def rotated(path: str) -> list[str]:
    """The rotated files of journal `path` that exist, oldest first (`.N` ... `.1`)."""
    directory, name = os.path.split(path)
    pattern = re.compile(re.escape(name) + r"\.([1-9][0-9]{0,5})")
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return []
    found = [(int(m.group(1)), n) for n in names if (m := pattern.fullmatch(n))]
    return [os.path.join(directory, n) for _, n in sorted(found, reverse=True)]


def inode(path: str) -> int | None:
    """The file's inode (what a rotation keeps and a rename does not change), None if none."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def files(path: str) -> list[str]:
    """Every file of the journal, oldest first: the rotated ones, then the current one."""
    return rotated(path) + ([path] if os.path.exists(path) else [])


def tail(path: str, n: int) -> list[dict[str, Any]]:
    """The last n entries across the journal's files, oldest first."""
    out: list[dict[str, Any]] = []
    for name in reversed(files(path)):
        if len(out) >= n:
            break
        try:
            out = records.tail_journal(name, n - len(out)) + out
        except OSError:  # rotated away between the listing and the read
            continue
    return out


def entries(path: str) -> Iterator[dict[str, Any]]:
    """Every entry of the journal's files, oldest first, a line at a time."""
    for name in files(path):
        try:
            yield from records.read_journal(name)
        except OSError:
            continue
