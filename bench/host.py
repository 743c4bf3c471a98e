"""The replay benchmark's host: Docker, the slice, execgate's config and daemon, and put it back.

Everything the benchmark changes on the host goes through `Host`, so that `restore()` can undo it
(containers removed, the config restored byte for byte, execgated left running or stopped as it
was found), and so that tests can replace the host with a fake. `Log` is the run's progress.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import swap as swap_mod
from bench.docker_api import ApiError, Client
from bench.schemes import Scheme, slice_path
from bench.sysfs import read as _read
from execgate.ctl import configure_toml

LABEL = "bench"
CONFIG = "/etc/execgate/config.toml"
# How the bench drives Docker: its Engine API (one Python process), or a `docker` CLI process
# per operation, as every round before 6 Dec did (kept to compare with them).
CLIENTS = ("api", "cli")
EXEC_ERROR = 1  # the CLI's exit when dockerd refuses an exec (container gone or stopped)


class BenchError(RuntimeError):
    """The host is not in a state the benchmark can run on (message says what to fix)."""


class Log:
    """Progress on stdout (one line per task event / scheme), mirrored to DIR/progress.log."""

    def __init__(self, path: Path | None, quiet: bool = False) -> None:
        self.quiet = quiet
        self.lock = threading.Lock()
        self.file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115

    def __call__(self, line: str, *, event: bool = False) -> None:
        with self.lock:
            if self.file:
                self.file.write(line + "\n")
                self.file.flush()
            if not (event and self.quiet):
                print(line, flush=True)

    def close(self) -> None:
        if self.file:
            self.file.close()


def _run(argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return subprocess.CompletedProcess(list(argv), 124, out, f"timed out after {timeout}s")
    except FileNotFoundError as e:
        return subprocess.CompletedProcess(list(argv), 127, "", str(e))


def _write(path: str, value: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(value)
        return True
    except OSError:
        return False


def oom_kill_count(cgroup: str) -> int:
    """memory.events' oom_kill (hierarchical: every OOM kill inside the slice)."""
    for line in (_read(os.path.join(cgroup, "memory.events")) or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


def _api_failed(argv: list[str], e: ApiError, code: int,
                stdout: str = "") -> subprocess.CompletedProcess[str]:
    """An Engine API call that failed, as the CLI would have ended: 124 on a timeout (as
    `_run` says it), else `code`, with the engine's message on stderr."""
    return subprocess.CompletedProcess(argv, 124 if e.timed_out else code, stdout, e.message)


class Host:
    """Owns everything the benchmark changes on the host, and puts it back in `restore()`."""

    def __init__(self, slice_name: str, image: str, config_path: str, log: Log,
                 client: str = "api") -> None:
        if client not in CLIENTS:
            raise ValueError(f"docker client {client!r}: one of {', '.join(CLIENTS)}")
        self.client = client
        self.api = Client()
        self.slice = slice_name
        self.cgroup = slice_path(slice_name)
        self.image = image
        self.config_path = config_path
        self.log = log
        self.original_config: bytes | None = None
        self.daemon_was_active: bool | None = None
        self.anchor: str | None = None
        self.restored = False
        self.swap_limit = "0"  # the slice's memory.swap.max for the current run
        self.host_swap: swap_mod.HostSwap | None = None
        self.events_proc: subprocess.Popen[bytes] | None = None

    # -- checks --------------------------------------------------------------------------------

    def check(self, schemes: Sequence[Scheme]) -> None:
        if os.geteuid() != 0:
            raise BenchError("must run as root (it writes the slice's memory.max and the config)")
        if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            raise BenchError("needs cgroup v2 at /sys/fs/cgroup")
        p = _run(["docker", "info", "--format", "{{json .Runtimes}}"], timeout=60)
        if p.returncode:
            raise BenchError(f"docker is not usable: {p.stderr.strip()}")
        runtimes = set(json.loads(p.stdout or "{}"))
        missing = {s.runtime for s in schemes} - runtimes
        if missing:
            raise BenchError(f"docker runtime(s) {', '.join(sorted(missing))} not registered "
                             "(install execgate with install.sh)")
        if _run(["docker", "image", "inspect", self.image], timeout=60).returncode:
            raise BenchError(f"image {self.image} not found (it needs /bin/memload)")
        if any(s.daemon or s.runtime == "execgate" for s in schemes):
            if not os.path.exists(self.config_path):
                raise BenchError(f"{self.config_path} not found")
            if _run(["systemctl", "cat", "execgated"], timeout=30).returncode:
                raise BenchError("execgated is not a systemd unit on this host")

    # -- config and daemon ---------------------------------------------------------------------

    def save_state(self) -> None:
        try:
            with open(self.config_path, "rb") as f:
                self.original_config = f.read()
        except FileNotFoundError:
            self.original_config = None
        p = _run(["systemctl", "is-active", "execgated"], timeout=30)
        self.daemon_was_active = p.stdout.strip() == "active"

    @property
    def state_dir(self) -> str:
        """execgate's state directory (its per-container records live there)."""
        v = self.original_toml().get("state_dir")
        return v if isinstance(v, str) and v else "/run/execgate"

    def execgate_record(self, cid: str) -> dict[str, Any] | None:
        """execgate's record of a container: did it get per-exec cgroups, and if not, why."""
        try:
            with open(os.path.join(self.state_dir, "containers", cid + ".json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def original_toml(self) -> dict[str, Any]:
        if not self.original_config:
            return {}
        try:
            return tomllib.loads(self.original_config.decode())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise BenchError(f"{self.config_path} is not valid TOML ({e}); fix it first") from e

    def write_config(self, data: dict[str, Any]) -> None:
        text = configure_toml.dump(data)  # inf too: the shipped max_start_wait_s_no_deadline
        tomllib.loads(text)  # never leave a config the runtime cannot read
        tmp = self.config_path + ".bench-tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("# written by bench/replay.py for one scheme; restored when it exits\n" + text)
        os.replace(tmp, self.config_path)

    def daemon(self, run: bool, domain: str | None = None, timeout: float = 120) -> str:
        """Stop execgated, or (re)start it and wait until it answers; returns its domain."""
        if not run:
            _run(["systemctl", "stop", "execgated"], timeout=120)
            return ""
        p = _run(["systemctl", "restart", "execgated"], timeout=180)
        if p.returncode:
            raise BenchError(f"systemctl restart execgated failed: {p.stderr.strip()}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = _run(["execgatectl", "status", "--json"], timeout=60)
            if s.returncode == 0:
                try:
                    snap = json.loads(s.stdout)
                except json.JSONDecodeError:
                    snap = {}
                if str(snap.get("source", "")).startswith("execgated pid"):
                    got = str((snap.get("daemon") or {}).get("domain", ""))
                    if domain and got != f"cgroup {domain}":
                        self.log(f"warning: execgated reports domain {got!r}, not {domain}")
                    return got
            time.sleep(0.5)
        raise BenchError("execgated did not answer after restart (journalctl -u execgated)")

    def daemon_cpu_s(self) -> float | None:
        """execgated's CPU time so far (systemd's accounting of its unit), or None."""
        p = _run(["systemctl", "show", "-p", "CPUUsageNSec", "--value", "execgated"], timeout=30)
        value = p.stdout.strip()
        return int(value) / 1e9 if p.returncode == 0 and value.isdigit() else None

    def daemon_loop(self) -> dict[str, Any] | None:
        """execgated's loop counters (iterations, CPU by stage, the process's CPU), or None;
        with sandbox admission's steps decided with and without a fresh measure."""
        p = _run(["execgatectl", "status", "--json"], timeout=60)
        try:
            daemon = json.loads(p.stdout).get("daemon") or {}
            loop, sa = daemon.get("loop"), daemon.get("sandbox_admission") or {}
        except (json.JSONDecodeError, AttributeError):
            return None
        if not isinstance(loop, dict):
            return None
        steps = {k: sa[k] for k in ("steps_measured", "steps_unmeasured")
                 if isinstance(sa, dict) and isinstance(sa.get(k), int)}
        return {**loop, "sandbox_steps": steps} if steps else loop

    # -- the slice -----------------------------------------------------------------------------

    def docker(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return _run(["docker", *args], timeout=timeout)

    # -- containers: what the replay does to Docker (a seam: tests replace the host) ----------

    def run_sandbox(self, runtime: str, label: str, cmd: Sequence[str], shm_size: int,
                    timeout: float) -> subprocess.CompletedProcess[str]:
        """Create and start a container in the slice, as `docker run -d` does: stdout is its id
        once created, so a start that failed or timed out still names the container dockerd
        may go on starting; 124 is a timeout."""
        if self.client == "cli":
            return self.docker("run", "-d", "--runtime", runtime, "--cgroup-parent", self.slice,
                               "--label", f"{LABEL}={label}", "--shm-size", str(shm_size),
                               self.image, *cmd, timeout=timeout)
        argv = ["create+start", runtime, *cmd]
        try:
            cid = self.api.create(self.image, list(cmd), runtime, self.slice, {LABEL: label},
                                  shm_size, timeout)
        except ApiError as e:
            return _api_failed(argv, e, 125)
        try:
            self.api.start(cid, timeout)
        except ApiError as e:
            return _api_failed(argv, e, 125, cid + "\n")
        return subprocess.CompletedProcess(argv, 0, cid + "\n", "")

    def exec_call(self, cid: str, cmd: Sequence[str], env: Sequence[str],
                  timeout: float) -> subprocess.CompletedProcess[str]:
        """One tool call's exec, attached, as `docker exec` runs it: the process's exit code,
        126 when the runtime refused it, 1 when dockerd did (the container gone), 124 on
        timeout."""
        if self.client == "cli":
            flags = [x for e in env for x in ("-e", e)]
            return _run(["docker", "exec", *flags, cid, *cmd], timeout=timeout)
        argv = ["exec", cid, *cmd]
        try:
            rc, out, err = self.api.exec(cid, list(cmd), list(env), timeout)
        except ApiError as e:
            return _api_failed(argv, e, EXEC_ERROR)
        return subprocess.CompletedProcess(argv, rc, out.decode(errors="replace"),
                                           err.decode(errors="replace"))

    def remove(self, cid: str, timeout: float = 300) -> bool:
        """`docker rm -f`: whether it took (a container already gone counts)."""
        if self.client == "cli":
            return self.docker("rm", "-f", cid, timeout=timeout).returncode == 0
        try:
            self.api.remove(cid, timeout)
        except ApiError as e:
            return e.status == 404
        return True

    def exists(self, cid: str) -> bool:
        """Whether dockerd still has the container (True when it cannot tell)."""
        if self.client == "cli":
            return self.docker("inspect", "-f", "{{.Id}}", cid, timeout=60).returncode == 0
        try:
            self.api.inspect(cid)
        except ApiError as e:
            return e.status != 404
        return True

    def oom_killed(self, cid: str) -> bool:
        """Whether the container died of an OOM kill (its init was the victim)."""
        if self.client == "cli":
            p = self.docker("inspect", "-f", "{{.State.Running}} {{.State.OOMKilled}}", cid)
            return p.returncode == 0 and p.stdout.split() == ["false", "true"]
        try:
            state = self.api.inspect(cid).get("State") or {}
        except ApiError:
            return False
        return state.get("Running") is False and state.get("OOMKilled") is True

    def cleanup_containers(self) -> None:
        if self.client == "api":
            try:
                ids = self.api.ids(LABEL)
            except ApiError:
                ids = []
            for cid in ids:
                self.remove(cid)
            return
        p = self.docker("ps", "-aq", "--filter", f"label={LABEL}")
        ids = p.stdout.split()
        if ids:
            self.docker("rm", "-f", *ids, timeout=300)

    def open_slice(self, budget: int) -> None:
        """An idle anchor container keeps the slice alive between sandboxes; then the budget."""
        p = self.run_sandbox("runc", "anchor", ["sleep", "inf"], 64 << 20, timeout=180)
        if p.returncode:
            raise BenchError(f"cannot start a container in {self.slice}: {p.stderr.strip()}")
        self.anchor = p.stdout.strip()
        if not os.path.isdir(self.cgroup):
            raise BenchError(f"{self.cgroup} did not appear (is Docker's cgroup driver systemd?)")
        self.set_budget(budget)

    def set_budget(self, budget: int) -> None:
        if not _write(os.path.join(self.cgroup, "memory.max"), str(budget)):
            raise BenchError(f"cannot write {self.cgroup}/memory.max")
        # Without swap, pages beyond the budget are an OOM kill, as in the published
        # measurements; with it ("max"), they go to compressed swap first.
        if not _write(os.path.join(self.cgroup, "memory.swap.max"), self.swap_limit):
            raise BenchError(f"cannot write {self.cgroup}/memory.swap.max")

    def budget_ok(self, budget: int) -> bool:
        return (_read(os.path.join(self.cgroup, "memory.max")) == str(budget)
                and _read(os.path.join(self.cgroup, "memory.swap.max")) == self.swap_limit)

    def swap_current(self) -> int | None:
        v = _read(os.path.join(self.cgroup, "memory.swap.current"))
        return int(v) if v and v.isdigit() else None

    # -- swap --------------------------------------------------------------------------------

    def setup_swap(self, size_bytes: int, algorithm: str) -> dict[str, Any]:
        """Swap for the points that have it: the host's own, or a zram device made here."""
        try:
            self.host_swap = swap_mod.ensure(size_bytes, algorithm)
        except OSError as e:
            raise BenchError(f"cannot set up compressed swap: {e}") from e
        d = self.host_swap.describe()
        self.log(f"swap: {', '.join(x['device'] for x in d['devices'])} "
                 f"({d['algorithm'] or 'not zram'}; "
                 f"{'made by the benchmark' if d['made'] else 'the host own'})")
        return d

    def swap_stats(self) -> dict[str, int] | None:
        return self.host_swap.stats() if self.host_swap else None

    # -- what the daemon and the kernel said ---------------------------------------------------

    def start_events(self, path: str) -> None:
        """`execgatectl events` into `path` while a daemon scheme runs (best effort)."""
        try:
            with open(path, "wb") as out:
                self.events_proc = subprocess.Popen(["execgatectl", "events"], stdout=out,
                                                    stderr=subprocess.DEVNULL)
        except OSError as e:
            self.log(f"warning: execgatectl events: {e}")
            self.events_proc = None

    def stop_events(self) -> None:
        p, self.events_proc = self.events_proc, None
        if p is not None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def kernel_log(self) -> list[tuple[int, str]]:
        """The kernel's log records still in its buffer: (sequence number, message)."""
        try:
            fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return []
        out: list[tuple[int, str]] = []
        try:
            while True:
                try:
                    rec = os.read(fd, 8192).decode(errors="replace")
                except BlockingIOError:
                    break
                except BrokenPipeError:  # records overwritten while reading: go on
                    continue
                except OSError:
                    break
                head, _, msg = rec.partition(";")
                fields = head.split(",")
                if len(fields) >= 2 and fields[1].isdigit():
                    out.append((int(fields[1]), msg.split("\n", 1)[0]))
        finally:
            os.close(fd)
        return out

    def init_pid(self, cid: str) -> int | None:
        """The sandbox's init, as the kernel names it (its OOM kills say which pid died): the
        first process of the container's cgroup, or of a leaf below it (execgate's init/)."""
        scope = os.path.join(self.cgroup, f"docker-{cid}.scope")
        dirs = [scope]
        try:
            dirs += sorted(e.path for e in os.scandir(scope)
                           if e.is_dir() and not e.name.startswith("tool-"))
        except OSError:
            return None
        for d in dirs:
            pids = (_read(os.path.join(d, "cgroup.procs")) or "").split()
            if pids and pids[0].isdigit():
                return int(pids[0])
        return None

    def memory_current(self) -> int | None:
        v = _read(os.path.join(self.cgroup, "memory.current"))
        return int(v) if v and v.isdigit() else None

    def memory_counters(self) -> dict[str, float]:
        """The slice's cumulative swap traffic, anonymous refaults (memory.stat, in bytes) and
        memory stall (PSI `some`, s): what the simulator's memory model counts, for checking it."""
        page = os.sysconf("SC_PAGE_SIZE")
        stat = dict(line.split(" ", 1) for line in
                    (_read(os.path.join(self.cgroup, "memory.stat")) or "").splitlines()
                    if " " in line)
        out = {key: int(stat.get(name, "0")) * page for key, name in (
            ("refault_bytes", "workingset_refault_anon"), ("swap_out_bytes", "pswpout"),
            ("swap_in_bytes", "pswpin"))}
        some = (_read(os.path.join(self.cgroup, "memory.pressure")) or "").partition("\n")[0]
        total = some.rpartition("total=")[2]
        return {**out, "stall_s": int(total) / 1e6 if total.isdigit() else 0.0}

    def close_slice(self) -> None:
        self.cleanup_containers()
        self.anchor = None

    # -- restore ---------------------------------------------------------------------------------

    def restore(self) -> None:
        if self.restored:
            return
        self.restored = True
        self.stop_events()
        self.cleanup_containers()
        if self.host_swap is not None:
            swap_mod.remove(self.host_swap)
        if self.original_config is not None:
            tmp = self.config_path + ".bench-tmp"
            with open(tmp, "wb") as f:
                f.write(self.original_config)
            os.replace(tmp, self.config_path)
        if self.daemon_was_active is True:
            _run(["systemctl", "restart", "execgated"], timeout=180)
        elif self.daemon_was_active is False:
            _run(["systemctl", "stop", "execgated"], timeout=120)

