"""The runtime as an engine meets it where it runs runc as a child (create, start, delete):
signals forwarded and runc's exit passed on as it was, runc-level errors exiting as runc's do
(255 for exec), --preserve-fds reaching runc (issue 21, item 11). Real processes: the Python
runtime (runtime/main.py) and a shell script as runc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from execgate.oci import runc

REPO = str(Path(__file__).resolve().parents[2])


def _runtime(tmp_path: Path, script: str) -> tuple[list[str], dict[str, str]]:
    """The argv prefix and environment of the Python runtime with `script` as its runc."""
    fake = tmp_path / "fake-runc"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    conf = tmp_path / "config.toml"
    conf.write_text(f'runtime = "{fake}"\nstate_dir = "{tmp_path / "state"}"\n')
    env = {k: v for k, v in os.environ.items() if k != runc.LOOP_MARKER}
    env.update(EXECGATE_CONFIG=str(conf), PYTHONPATH=REPO)
    code = (f"from execgate.common import config; config.CACHE_PATH = {str(tmp_path / 'c')!r}\n"
            "from execgate.runtime.main import main; main()")
    return [sys.executable, "-c", code, "--root", str(tmp_path / "root")], env


def _wait_file(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_reaches_runc_and_its_exit_status_is_ours(tmp_path: Path, sig: int) -> None:
    ready, got = tmp_path / "ready", tmp_path / "got"
    argv, env = _runtime(tmp_path, f"trap 'echo $$ > {got}; exit 7' TERM INT\n"
                                   f"touch {ready}\nwhile :; do sleep 0.05; done\n")
    proc = subprocess.Popen([*argv, "start", "box"], env=env)
    try:
        _wait_file(ready)
        proc.send_signal(sig)
        assert proc.wait(10) == 7  # runc's own exit, not ours
    finally:
        if proc.poll() is None:
            proc.kill()
    assert got.exists(), "runc never got the signal"


def test_a_runc_killed_by_a_signal_leaves_us_killed_by_it(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    argv, env = _runtime(tmp_path, f"touch {ready}\nexec sleep 30\n")
    proc = subprocess.Popen([*argv, "delete", "box"], env=env)
    try:
        _wait_file(ready)
        time.sleep(0.1)  # sh has exec'd sleep
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_runc_killed_outright_leaves_us_killed_as_well(tmp_path: Path) -> None:
    argv, env = _runtime(tmp_path, "kill -KILL $$\n")  # SIGKILL: no handler may be set
    p = subprocess.run([*argv, "start", "box"], env=env, timeout=20)
    assert p.returncode == -signal.SIGKILL


@pytest.mark.parametrize(("command", "code"), [("exec", 255), ("state", 1), ("start", 1)])
def test_a_runc_level_error_exits_as_runcs_does(tmp_path: Path, command: str, code: int) -> None:
    argv, env = _runtime(tmp_path, "exit 0\n")
    env[runc.LOOP_MARKER] = "1"  # execgate calling itself: our error, not runc's
    args = ["--process", "p.json", "box"] if command == "exec" else ["box"]
    p = subprocess.run([*argv, command, *args], env=env, capture_output=True, text=True,
                       timeout=20)
    assert p.returncode == code and "called by itself" in p.stderr


@pytest.mark.parametrize("command", ["create", "exec", "run"])
def test_preserved_fds_reach_runc_and_nothing_else_does(tmp_path: Path, command: str) -> None:
    out = tmp_path / "fds"
    argv, env = _runtime(tmp_path, f"ls -l /proc/$$/fd > {out}\n")  # sh's fds, seen by ls
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("a")
    b.write_text("b")
    extra = ["--process", str(tmp_path / "p.json")] if command == "exec" else \
        ["--bundle", str(tmp_path)]
    # The engine's side: fds 3 and 4 open, then the runtime (sh sets them up, not this process).
    p = subprocess.run(["sh", "-c", 'exec 3<"$1" 4<"$2"; shift 2; exec "$@"', "sh", str(a),
                        str(b), *argv, command, "--preserve-fds", "2", *extra, "box"], env=env,
                       timeout=20, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    fds = dict(line.split()[-3::2] for line in out.read_text().splitlines() if "->" in line)
    assert fds.get("3") == str(a) and fds.get("4") == str(b), fds
    # Nothing of ours besides: dash keeps its own (the script, a saved stdout) at 10 and up.
    assert all(int(fd) < 5 or int(fd) >= 10 for fd in fds), fds


@pytest.mark.parametrize(("force", "seen"), [(True, "0 0"), (False, "1 1")])
def test_delete_force_thaws_what_execgate_froze_before_runc_kills(
        tmp_path: Path, force: bool, seen: str) -> None:
    """runc delete --force kills the container: a call frozen by the gate's fallback, or init/
    frozen while idle, must not sit on the SIGKILL (a paused container's own freeze is the
    engine's and stays)."""
    from execgate.common import records

    cg = tmp_path / "cg"
    for leaf in ("init", "tool-0123456789ab"):
        (cg / leaf).mkdir(parents=True)
        (cg / leaf / "cgroup.freeze").write_text("1\n")
    (cg / "cgroup.freeze").write_text("1\n")  # docker pause
    records.save_container(str(tmp_path / "state"), {"id": "box", "managed": True,
                                                     "prepared": True, "cgroup": str(cg)})
    out = tmp_path / "seen"
    argv, env = _runtime(tmp_path, f"cat {cg}/init/cgroup.freeze {cg}/tool-*/cgroup.freeze"
                                   f" | tr '\\n' ' ' > {out}\nexit 1\n")
    p = subprocess.run([*argv, "delete", *(["--force"] if force else []), "box"], env=env,
                       timeout=20, capture_output=True, text=True)
    assert p.returncode == 1, p.stderr  # runc's answer, passed on
    assert out.read_text().strip() == seen
    assert (cg / "cgroup.freeze").read_text().strip() == "1"
