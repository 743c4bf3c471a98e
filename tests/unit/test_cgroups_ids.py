"""cgroups/ids.py: cgroup ids as BPF sees them (the cgroup2 directory's inode)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from execgate.cgroups import ids


def test_cgroup_id(tmp_path: Path) -> None:
    (tmp_path / "a" / "tool-1").mkdir(parents=True)
    ino = os.stat(tmp_path / "a" / "tool-1").st_ino
    assert ids.cgroup_id(str(tmp_path / "a" / "tool-1")) == ino
    assert ids.cgroup_id("a/tool-1", root=str(tmp_path)) == ino
    assert ids.cgroup_id(tmp_path / "a" / "tool-1") == ino
    assert ids.cgroup_id(1234) == 1234
    with pytest.raises(TypeError):
        ids.cgroup_id(True)
    with pytest.raises(ValueError):
        ids.cgroup_id(0)
    with pytest.raises(FileNotFoundError):
        ids.cgroup_id("nope", root=str(tmp_path))


def test_protected_ids_include_the_root(tmp_path: Path) -> None:
    assert os.stat(tmp_path).st_ino in ids.protected_ids(str(tmp_path))
