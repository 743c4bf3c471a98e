"""A `start` killed while it prepares the container (frozen meanwhile) leaves it thawed (issue
21, item 10): a real start process on a cgroupfs faked in a temp dir (cgroup.events never says
frozen, so prepare waits there), killed with SIGKILL as the shim's timeout would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from execgate.common import records

REPO = str(Path(__file__).resolve().parents[2])

DRIVER = """
import sys
from execgate.common.config import Config
from execgate.oci import cli
from execgate.oci.runclog import RuncLog
from execgate.runtime import start
from execgate.runtime.context import Context
state_dir, log = sys.argv[1:3]
ctx = Context(inv=cli.parse(["start", "box"]), config=Config(state_dir=state_dir),
              log=RuncLog(log, "json"), runc="/bin/true")
from execgate.cgroups import sandbox
sandbox.prepare(ctx.config, "box", ctx.log, start._thaw_guard)
"""


def _box(tmp_path: Path, frozen: str = "0", name: str = "cg") -> tuple[Path, Path]:
    cg = tmp_path / name
    cg.mkdir()
    (cg / "cgroup.freeze").write_text(frozen + "\n")
    (cg / "cgroup.events").write_text("populated 1\nfrozen 0\n")  # never frozen: prepare waits
    (cg / "cgroup.procs").write_text("")
    state = tmp_path / f"state-{name}"
    records.save_container(str(state), {"id": "box", "managed": True, "prepared": False,
                                        "cgroup": str(cg)})
    return cg, state


def _start(tmp_path: Path, state: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(state), str(tmp_path / "log")],
                            env=dict(os.environ, PYTHONPATH=REPO))


def _wait(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_a_start_killed_mid_prepare_leaves_the_container_thawed(tmp_path: Path) -> None:
    cg, state = _box(tmp_path)
    proc = _start(tmp_path, state)
    try:
        assert _wait(lambda: (cg / "cgroup.freeze").read_text().strip() == "1"), "never froze"
        time.sleep(0.2)
        assert proc.poll() is None  # still waiting for the freeze to settle
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(5) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _wait(lambda: (cg / "cgroup.freeze").read_text().strip() == "0", 5), \
        "the container stayed frozen"


def test_a_start_that_finishes_leaves_no_guard_and_a_paused_container_paused(
        tmp_path: Path) -> None:
    cg, state = _box(tmp_path, frozen="1")  # docker paused it: prepare leaves it so
    (cg / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    proc = _start(tmp_path, state)
    assert proc.wait(20) == 0
    assert (cg / "cgroup.freeze").read_text().strip() == "1"
    cg2, state2 = _box(tmp_path, name="cg2")
    (cg2 / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    proc = _start(tmp_path, state2)
    assert proc.wait(20) == 0
    assert (cg2 / "cgroup.freeze").read_text().strip() == "0"  # prepare's own thaw
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "from execgate.runtime import start" not in ps  # the guard is gone too
