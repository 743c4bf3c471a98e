"""The compiled front (runtime/front.c) as install.sh leaves it: the installed execgate, which
hands a passthrough to runc without starting Python, and Python's work to execgate-py."""

from __future__ import annotations

import os
import subprocess
import time

from conftest import CONFIG, STATE_DIR, Containers, docker

PREFIX = "/opt/execgate/bin"
EXECGATE = "/usr/local/bin/execgate"


def _settle() -> None:
    """Wait until the config is old enough for the Python runtime to resolve it for the front
    (config.SETTLE_NS), then make one call that lets it."""
    st = os.stat(CONFIG)
    wait = max(st.st_mtime, st.st_ctime) + 2.5 - time.time()
    if wait > 0:
        time.sleep(wait)
    subprocess.run([EXECGATE, "--version"], check=True, capture_output=True, timeout=60)


def test_passthrough_needs_no_python(containers: Containers) -> None:
    with open(os.path.realpath(EXECGATE), "rb") as f:
        assert f.read(4) == b"\x7fELF", "install.sh did not build the front (see its log)"
    with open(os.path.join(PREFIX, "execgate-py"), "rb") as f:
        assert b"execgate.runtime" in f.read(512)
    cid = containers.run()
    _settle()
    assert os.path.exists(os.path.join(STATE_DIR, "front.conf"))
    py = os.path.join(PREFIX, "execgate-py")
    mode = os.stat(py).st_mode
    os.chmod(py, 0o644)  # Python cannot start: whatever works now went straight to runc
    try:
        version = subprocess.run([EXECGATE, "--version"], capture_output=True, text=True,
                                 timeout=60)
        state = subprocess.run([EXECGATE, "--root", "/run/execgate-test-none", "state", "nope"],
                               capture_output=True, text=True, timeout=60)
        ps = docker("top", cid).stdout.decode()
    finally:
        os.chmod(py, mode)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("execgate version ") and "runc version" in version.stdout
    assert state.returncode != 0 and state.stderr  # runc's own answer
    assert "execgate-py" not in state.stderr, state.stderr
    assert "sleep" in ps
    # A call with work to do (an exec in a managed container) went to Python.
    assert docker("exec", cid, "cat", "/proc/self/cgroup").stdout.startswith(b"0::/tool-")
