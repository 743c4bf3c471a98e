"""oci/exec_cgroup.py: the real runtime's `exec --help`, asked once per binary."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from execgate.oci import exec_cgroup

RUNTIME = """#!/bin/sh
echo asked >> "{log}"
{body}
"""


def _runtime(tmp: Path, body: str) -> tuple[str, Path]:
    log = tmp / "asked"
    path = tmp / "bin" / "runc"
    path.parent.mkdir(exist_ok=True)
    path.write_text(RUNTIME.format(log=log, body=body))
    path.chmod(0o755)
    return str(path), log


def _asked(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.parametrize(("body", "answer", "kept"), [
    ('echo "   --cgroup value  run the process in a sub-cgroup"', True, True),  # runc >= 1.1
    ('echo "   --pid-file value"; echo "   --process value"', False, True),  # runc 1.0
    ("exit 1", True, False),  # no help to read: assumed, asked again next time
    ("sleep 30", True, False),  # no answer in time: the same
])
def test_asked_once_per_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str,
                               answer: bool, kept: bool) -> None:
    monkeypatch.setattr(exec_cgroup, "TIMEOUT_S", 0.5)
    runtime, log = _runtime(tmp_path, body)
    state = str(tmp_path / "state")
    assert exec_cgroup.supported(runtime, state) is answer
    assert exec_cgroup.supported(runtime, state) is answer
    assert _asked(log) == (1 if kept else 2)


def test_an_upgraded_runtime_is_asked_again(tmp_path: Path) -> None:
    runtime, log = _runtime(tmp_path, 'echo "--pid-file value"')
    state = str(tmp_path / "state")
    assert exec_cgroup.supported(runtime, state) is False
    new, _ = _runtime(tmp_path, 'echo "--cgroup value  (1.1)"')
    st = os.stat(new)
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert exec_cgroup.supported(runtime, state) is True
    assert _asked(log) == 2


def test_a_missing_runtime_is_left_to_fail_on_its_own(tmp_path: Path) -> None:
    assert exec_cgroup.supported(str(tmp_path / "nothing"), str(tmp_path / "state")) is True
