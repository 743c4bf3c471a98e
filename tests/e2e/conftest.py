"""Fixtures for the end-to-end suite: real Docker, real runc, real cgroup v2 (in the test VM,
or natively on a Docker host with cgroup v2 and execgate installed)."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Tests in pending/ are open work, run on request (see pending/README.md), not by the suite.
collect_ignore = ["pending"]

IMAGE = os.environ.get("EXECGATE_TEST_IMAGE", "execgate-test:latest")
RUNTIME = os.environ.get("EXECGATE_TEST_RUNTIME", "execgate")
STATE_DIR = "/run/execgate"
JOURNAL = "/var/lib/execgate/calls.jsonl"
CGROOT = "/sys/fs/cgroup"
SRC = Path(os.environ.get("EXECGATE_SRC") or Path(__file__).resolve().parents[2])
# The suite runs on the host's python3 with the checkout on its path (guest-run.sh sets
# PYTHONPATH too): the installed execgate lives in its own venv.
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))
if str(SRC) not in os.environ.get("PYTHONPATH", "").split(":"):  # and for the commands it runs
    os.environ["PYTHONPATH"] = ":".join(filter(None, (str(SRC), os.environ.get("PYTHONPATH"))))

# Re-exported for the tests (the checkout is on the path from here on).
from execgate.bpf import gate as gate  # noqa: E402


def docker(*args: str, check: bool = True, timeout: float = 120, input: bytes | None = None,
           ) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(["docker", *args], capture_output=True, timeout=timeout, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} -> {proc.returncode}\n"
                             f"stdout: {proc.stdout!r}\nstderr: {proc.stderr!r}")
    return proc


def on_terminal(argv: list[str], typed: bytes = b"", timeout: float = 120) -> tuple[int, bytes]:
    """Run a command on a real pty, as a person at a terminal would; (exit status, output)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(argv[0], argv)
    if typed:
        os.write(fd, typed)
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out


def wait_for(cond: Callable[[], Any], timeout: float = 30, interval: float = 0.1,
             what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def inspect(cid: str) -> dict[str, Any]:
    return json.loads(docker("inspect", cid).stdout)[0]


def init_pid(cid: str) -> int:
    return int(inspect(cid)["State"]["Pid"])


def cgroup_of(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return os.path.join(CGROOT, line[3:].strip().lstrip("/"))
    raise AssertionError(f"pid {pid} has no cgroup v2 line")


def container_cgroup(cid: str) -> str:
    """The container's own cgroup (the parent of init/ when execgate manages it)."""
    cg = cgroup_of(init_pid(cid))
    return os.path.dirname(cg) if os.path.basename(cg) == "init" else cg


def tool_cgroups(cg: str) -> list[str]:
    return sorted(e.name for e in os.scandir(cg) if e.is_dir() and e.name.startswith("tool-"))


def journal_entries() -> list[dict[str, Any]]:
    try:
        with open(JOURNAL) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def journal_for(cid: str) -> list[dict[str, Any]]:
    return [e for e in journal_entries() if e.get("container") == cid]


class Containers:
    """Starts containers and removes every one of them at teardown."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def run(self, *args: str, runtime: str = RUNTIME, cmd: tuple[str, ...] = ("sleep", "inf"),
            ) -> str:
        cid = docker("run", "-d", "--runtime", runtime, *args, IMAGE, *cmd).stdout.decode().strip()
        self.ids.append(cid)
        return cid

    def cleanup(self) -> None:
        if self.ids:
            docker("rm", "-f", *self.ids, check=False)


@pytest.fixture
def containers() -> Iterator[Containers]:
    c = Containers()
    yield c
    c.cleanup()


CONFIG = "/etc/execgate/config.toml"


def ctl_status() -> dict[str, Any]:
    p = subprocess.run(["execgatectl", "status", "--json"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode in (0, 3), p.stderr  # 3: the daemon did not answer (read from disk)
    return json.loads(p.stdout)


def daemon_view(timeout: float = 30) -> dict[str, Any]:
    """The daemon's own status. execgatectl waits 2 s for it and then reads what is on disk,
    which has no "daemon": a daemon busy for a moment (TCG, two VMs on one host, a test polling
    execgatectl every 50 ms) is asked again, a daemon that stays silent fails the test."""
    return wait_for(lambda: ctl_status().get("daemon"), timeout=timeout, interval=0.5,
                    what="execgated to answer execgatectl status")


def daemon_up() -> bool:
    return ctl_status()["source"].startswith("execgated pid")


def systemctl(*args: str) -> None:
    subprocess.run(["systemctl", *args], check=True, timeout=120)


@contextlib.contextmanager
def memory_domain(containers: Containers, slice_name: str, budget: int, n: int,
                  config: str) -> Iterator[list[str]]:
    """n sandboxes in one slice capped at budget, the daemon scheduling that slice with extra
    config (TOML tables); config and daemon are restored afterwards."""
    domain = os.path.join(CGROOT, slice_name)
    shutil.copy(CONFIG, CONFIG + ".orig")
    # A whole new file: TOML forbids a second [daemon] table. The test bed keeps sched_ext for
    # the tests that ask for it (each load and unload patches kernel text, which TCG can oops on).
    keys = "" if "gate =" in config else 'gate = "freeze"\n'
    keys += "" if "probes =" in config else "probes = false\n"  # as the test bed (guest-run.sh)
    # Sandbox admission holds creates in a small domain: only for the tests that configure it
    # (test_sandbox_admission.py); the others' sandboxes start as they arrive.
    tables = "" if "[sandbox_admission]" in config else "\n[sandbox_admission]\nenabled = false\n"
    with open(CONFIG, "w") as f:
        f.write(f'daemon_timeout_ms = 2000\n\n[daemon]\ndomain = "{domain}"\n{keys}{config}\n'
                f'{tables}')
    try:
        cids = [containers.run("--cgroup-parent", slice_name) for _ in range(n)]
        with open(os.path.join(domain, "memory.max"), "w") as f:
            f.write(str(budget))
        # Baselines other tests' sandboxes taught the daemon would change this test's
        # admissions: each domain starts from the configured defaults.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(STATE_DIR, "baselines.json"))
        systemctl("restart", "execgated")
        wait_for(daemon_up, timeout=120, what="execgated to come up")
        yield cids
    finally:
        shutil.move(CONFIG + ".orig", CONFIG)
        systemctl("restart", "execgated")


def oom_kills(cg: str) -> int:
    """Kernel OOM kills in a cgroup's subtree so far."""
    with open(os.path.join(cg, "memory.events")) as f:
        return int(dict(line.split() for line in f).get("oom_kill", 0))
