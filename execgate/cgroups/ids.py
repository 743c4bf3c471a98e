"""Cgroup ids as BPF sees them, and the cgroups they name.

A cgroup2 directory's inode number is the id ``bpf_get_current_cgroup_id()`` returns, so the
growth gate keys its deny map by it and the probes report it; these helpers go from paths to
ids and back. No BPF here: the freeze fallback and the probes need them without a loader.
"""

from __future__ import annotations

import contextlib
import os
from typing import Union

CGROUP_ROOT = "/sys/fs/cgroup"

CgroupRef = Union[int, str, "os.PathLike[str]"]


def cgroup_path(cg: str | os.PathLike[str], root: str = CGROUP_ROOT) -> str:
    """An absolute cgroup directory; relative paths are taken under ``root``."""
    p = os.fspath(cg)
    return p if os.path.isabs(p) else os.path.join(root, p.lstrip("/"))


def cgroup_id(cg: CgroupRef, root: str = CGROUP_ROOT) -> int:
    """The cgroup id BPF sees (``cgroup->kn->id``, what ``bpf_get_current_cgroup_id()`` returns):
    on cgroup2 on 64-bit kernels it is the inode number of the cgroup's directory."""
    if isinstance(cg, bool):
        raise TypeError("a cgroup is an id or a path, not a bool")
    if isinstance(cg, int):
        if cg <= 0:
            raise ValueError(f"invalid cgroup id {cg}")
        return cg
    return os.stat(cgroup_path(cg, root)).st_ino


def own_cgroup(root: str = CGROUP_ROOT, pid: int | str = "self") -> str | None:
    """The cgroup2 directory of a process (default: this one)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    # "0::/a/b" is relative to the cgroup2 mount (cgroup_path keeps absolutes)
                    return os.path.normpath(os.path.join(root, line[3:].strip().lstrip("/")))
    except OSError:
        pass
    return None


def protected_ids(root: str = CGROUP_ROOT) -> set[int]:
    """Ids of this process's cgroup and all its ancestors, root included: denying any of them
    would hold the gate's own process (and the root would hold everything)."""
    ids: set[int] = set()
    root = os.path.normpath(root)
    with contextlib.suppress(OSError):
        ids.add(os.stat(root).st_ino)
    cg = own_cgroup(root)
    while cg and os.path.normpath(cg).startswith(root):
        with contextlib.suppress(OSError):
            ids.add(os.stat(cg).st_ino)
        if os.path.normpath(cg) == root:
            break
        cg = os.path.dirname(os.path.normpath(cg))
    return ids


def find_cgroup(cid: int, root: str = CGROUP_ROOT) -> str | None:
    """The cgroup directory with id ``cid`` (a walk of the hierarchy; None if gone)."""
    for dirpath, _dirs, _files in os.walk(root):
        with contextlib.suppress(OSError):
            if os.stat(dirpath).st_ino == cid:
                return dirpath
    return None
