"""The compiled front (runtime/front.c) as install.sh leaves it: the installed execgate, which
hands a passthrough to runc and a managed non-TTY exec to the daemon without starting Python,
and the rest of Python's work to execgate-py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

from conftest import (
    CONFIG,
    STATE_DIR,
    Containers,
    container_cgroup,
    daemon_up,
    daemon_view,
    docker,
    journal_for,
    on_terminal,
    systemctl,
    tool_cgroups,
    wait_for,
)

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


@contextlib.contextmanager
def _no_python() -> Iterator[None]:
    """execgate-py cannot start: whatever works meanwhile needed no Python."""
    py = os.path.join(PREFIX, "execgate-py")
    mode = os.stat(py).st_mode
    os.chmod(py, 0o644)
    try:
        yield
    finally:
        os.chmod(py, mode)


def test_a_sandbox_and_its_calls_need_no_python(containers: Containers) -> None:
    """With the daemon up, a container's create (sandbox admission, its record) and start (its
    layout), each non-TTY exec (placed, journaled, its cgroup removed), its kill and delete go
    through the daemon, with no Python; a TTY call is the Python runtime's (its relay)."""
    _settle()
    before = daemon_view()
    with _no_python():
        cid = containers.run()
        out = docker("exec", cid, "cat", "/proc/self/cgroup").stdout
    record = os.path.join(STATE_DIR, "containers", cid + ".json")
    with open(record) as f:
        rec = json.load(f)
    assert rec["managed"] is True and rec["prepared"] is True, rec
    now = daemon_view()
    assert now["lifecycle"]["create"] == before["lifecycle"]["create"] + 1
    assert now["lifecycle"]["start"] == before["lifecycle"]["start"] + 1
    assert out.startswith(b"0::/tool-"), out
    call = out.decode().strip().rsplit("/", 1)[-1]
    assert now["exec"]["placed"] == before["exec"]["placed"] + 1
    wait_for(lambda: any(e["call"] == call for e in journal_for(cid)), what="its journal line")
    (entry,) = [e for e in journal_for(cid) if e["call"] == call]
    assert entry["exit_code"] == 0 and entry["managed"] is True
    wait_for(lambda: call not in tool_cgroups(container_cgroup(cid)), what="its cgroup gone")
    rc, text = on_terminal(["docker", "exec", "-t", cid, "cat", "/proc/self/cgroup"])
    assert rc == 0 and b"0::/tool-" in text, text
    assert daemon_view()["exec"]["placed"] == before["exec"]["placed"] + 1
    with _no_python():
        docker("rm", "-f", cid)
    assert not os.path.exists(record)
    after = daemon_view()["lifecycle"]
    assert after["delete"] >= before["lifecycle"]["delete"] + 1
    assert after["kill"] >= before["lifecycle"]["kill"] + 1


def test_a_call_the_daemon_placed_is_journaled_after_the_daemon_dies(
        containers: Containers) -> None:
    """kill -9 while a placed call runs: the call goes on, and the restarted daemon follows it
    to its journal line (the mark on its cgroup). What a daemon killed at a worse instant
    leaves goes with no line: a cgroup marked done (its line was in), and one marked but never
    run in whose front has gone (it fell back to Python, which placed the call elsewhere)."""
    cid = containers.run()
    _settle()
    cg = container_cgroup(cid)
    t0 = time.monotonic()
    docker("exec", "-d", cid, "sleep", "60")  # outlives a slow restart on a loaded host
    wait_for(lambda: daemon_view()["exec"]["following"] >= 1, what="the call followed")
    (call,) = tool_cgroups(cg)
    left = {"tool-00000000d0e0": b"done", "tool-00000000e0e0": json.dumps({
        "call": "tool-00000000e0e0", "container": cid, "sandbox": cid, "argv": ["never"],
        "cgroup": os.path.join(cg, "tool-00000000e0e0"),
        "runtime": {"pid": 1, "started_ns": 1}}).encode()}  # pid 1 started at boot, not 1 ns
    for name, value in left.items():
        os.mkdir(os.path.join(cg, name))
        os.setxattr(os.path.join(cg, name), "trusted.execgate.placed", value)
    systemctl("kill", "-s", "KILL", "execgated")
    wait_for(daemon_up, timeout=120, what="execgated to be restarted")
    assert call in tool_cgroups(cg)  # still running
    wait_for(lambda: not set(left) & set(tool_cgroups(cg)), what="the cgroups left removed")
    wait_for(lambda: any(e["call"] == call for e in journal_for(cid)), timeout=120,
             what="its journal line")
    assert time.monotonic() - t0 >= 55  # not before it ended
    wait_for(lambda: call not in tool_cgroups(cg), what="its cgroup gone")
    assert [e["call"] for e in journal_for(cid)] == [call]


def test_after_a_config_change_and_a_restart_the_next_sandbox_needs_no_python(
        containers: Containers) -> None:
    """The daemon writes the front's copy of the config when it starts: before, the runtime
    wrote it only for a call made once the file was 2 s old, so the creates right after a
    change (the bench's five at once) each started Python."""
    shutil.copy(CONFIG, CONFIG + ".orig")
    try:
        with open(CONFIG, "a") as f:
            f.write("\n# edited by test_front\n")
        systemctl("restart", "execgated")
        wait_for(daemon_up, timeout=120, what="execgated to come up")
        before = daemon_view()["lifecycle"]
        with _no_python():
            cid = containers.run()
        assert daemon_view()["lifecycle"]["create"] == before["create"] + 1
        assert docker("exec", cid, "true").returncode == 0
    finally:
        shutil.move(CONFIG + ".orig", CONFIG)
        systemctl("restart", "execgated")
        wait_for(daemon_up, timeout=120, what="execgated to come up")
