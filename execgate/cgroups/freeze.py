"""Thawing what a dead daemon froze: the growth gate's cgroup.freeze fallback holds tool-call
cgroups frozen, and a daemon killed meanwhile leaves them so. Recovery (bpf/gate.recover, run
by the daemon on start and by ``python3 -m execgate.bpf.gate recover``) thaws them here."""

from __future__ import annotations

import contextlib
import fnmatch
import os

from execgate.cgroups.ids import CGROUP_ROOT


def thaw_all(root: str = CGROUP_ROOT, pattern: str = "tool-*") -> list[str]:
    """Thaws every cgroup named ``pattern`` under ``root`` whose ``cgroup.freeze`` is 1 (what a
    dead daemon's FreezeGate left behind). Returns the thawed paths."""
    thawed = []
    for dirpath, dirs, _files in os.walk(root):
        for d in dirs:
            if not fnmatch.fnmatch(d, pattern):
                continue
            path = os.path.join(dirpath, d)
            f = os.path.join(path, "cgroup.freeze")
            with contextlib.suppress(OSError):
                with open(f) as fh:
                    frozen = fh.read().strip() == "1"
                if frozen:
                    with open(f, "w") as fh:
                        fh.write("0")
                    thawed.append(path)
    return thawed
