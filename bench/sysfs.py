"""Reading the kernel's small text files (cgroup, sysfs, procfs) without raising."""

from __future__ import annotations


def read(path: str) -> str | None:
    """The file's contents stripped, or None if it cannot be read (gone, no permission)."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None
