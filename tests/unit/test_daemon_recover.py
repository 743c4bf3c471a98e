"""`execgated --recover` (the unit's ExecStopPost): a dead daemon's frozen sandboxes thawed,
without a store, a journal or a socket (issue 21, item 9), on a temp-dir cgroupfs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from execgate.common import records
from execgate.daemon.recover import thaw_sandboxes


def _box(tmp: Path, cid: str, frozen: bool, managed: bool = True) -> Path:
    cg = tmp / "cg" / cid
    (cg / "init").mkdir(parents=True)
    (cg / "init" / "cgroup.freeze").write_text("1\n" if frozen else "0\n")
    records.save_container(str(tmp / "state"), {"id": cid, "managed": managed,
                                                 "cgroup": str(cg), "sandbox": cid})
    return cg / "init" / "cgroup.freeze"


def test_frozen_managed_sandboxes_are_thawed_and_nothing_else_is_touched(tmp_path: Path) -> None:
    a, b = _box(tmp_path, "a", True), _box(tmp_path, "b", False)
    other = _box(tmp_path, "other", True, managed=False)
    gone = _box(tmp_path, "gone", True)
    (gone.parent / "cgroup.freeze").unlink()
    gone.parent.rmdir()  # its cgroup went before its record: skipped, the rest still thawed
    assert thaw_sandboxes(str(tmp_path / "state")) == 1
    assert a.read_text().strip() == "0" and b.read_text().strip() == "0"
    assert other.read_text().strip() == "1"  # not execgate's



def test_a_container_left_frozen_mid_start_is_thawed_a_paused_one_is_not(
        tmp_path: Path) -> None:
    """A daemon that died while it prepared a start (the lifecycle op) left the container's own
    cgroup frozen, its record unprepared; a prepared container frozen is the engine's pause."""
    state = str(tmp_path / "state")
    for cid, prepared in (("mid", False), ("paused", True)):
        _box(tmp_path, cid, False)
        (tmp_path / "cg" / cid / "cgroup.freeze").write_text("1\n")
        rec = records.load_container(state, cid)
        assert rec is not None
        records.save_container(state, {**rec, "prepared": prepared})
    assert thaw_sandboxes(state) == 1
    assert (tmp_path / "cg" / "mid" / "cgroup.freeze").read_text().strip() == "0"
    assert (tmp_path / "cg" / "paused" / "cgroup.freeze").read_text().strip() == "1"


def test_the_command_recovers_and_exits_with_a_broken_store_and_no_socket(tmp_path: Path) -> None:
    frozen = _box(tmp_path, "a", True)
    (tmp_path / "h.sqlite").write_bytes(b"not a database" * 64)  # never opened by --recover
    conf = tmp_path / "config.toml"
    conf.write_text(f'state_dir = "{tmp_path / "state"}"\nsocket = "{tmp_path / "none.sock"}"\n'
                    f'[daemon]\nstore = "{tmp_path / "h.sqlite"}"\n')
    out = subprocess.run([sys.executable, "-m", "execgate.daemon.main", "--config", str(conf),
                          "--recover"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "recover: thawed 1 sandboxes" in out.stderr, out.stderr
    assert frozen.read_text().strip() == "0"
    assert (tmp_path / "h.sqlite").read_bytes().startswith(b"not a database")
