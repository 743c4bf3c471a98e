"""A tool cgroup's mark: an xattr that tells a restarted daemon what the cgroup holds.

A follower dies with its daemon; the cgroup does not. So the daemon marks each cgroup it places
a call in with the call's record (its journal form), and marks it `done` once the call's journal
line is in: its successor follows a marked call to its line, removes a `done` cgroup without a
second line, and never loses or doubles a call whatever instant the daemon died at.
Two marks, one per door: PLACED for docker exec calls the daemon places for the compiled front
(daemon/exec_op.py), INSIDE for inside agents' tool cgroups (daemon/inside/), where a cgroup
made ahead of its call is a `spare`.
"""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False  # typing's, without importing typing on the exec path
if TYPE_CHECKING:
    from typing import Any

    from execgate.calls.record import ToolCall

PLACED = "trusted.execgate.placed"
INSIDE = "trusted.execgate.inside"
SPARE, DONE = b"spare", b"done"
# A longer argv is marked as its program alone (an xattr value is at most 64 KiB; the journal
# line, written from the live record, keeps the whole argv).
MAX_ARGV_CHARS = 2048


def record(call: ToolCall, **extra: Any) -> bytes:
    """The call's record as its mark carries it: its journal form, and extra keys."""
    xcall = call.journal()
    if len(" ".join(call.argv)) > MAX_ARGV_CHARS:
        xcall["argv"] = call.argv[:1]
    return json.dumps({**xcall, **extra}, separators=(",", ":")).encode()


def put(cg: str, name: str, value: bytes) -> None:
    try:
        os.setxattr(cg, name, value)
    except OSError:
        pass  # only a restart reads it


def get(cg: str, name: str) -> bytes | None:
    try:
        return os.getxattr(cg, name)
    except OSError:
        return None


def done(cg: str, name: str = PLACED) -> None:
    """The call's journal line is in: what is left of its cgroup is only to remove it. A
    cgroup without the mark (a call the runtime's watcher follows) is left unmarked."""
    try:
        os.setxattr(cg, name, DONE, os.XATTR_REPLACE)
    except OSError:
        pass
