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

import os

PLACED = "trusted.execgate.placed"
INSIDE = "trusted.execgate.inside"
SPARE, DONE = b"spare", b"done"


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
