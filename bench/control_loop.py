"""What execgated's control loop costs at 10, 100 and 1,000 registered sandboxes.

    sudo .venv/bin/python bench/control_loop.py [--sandboxes 10,100,1000] [--window 10]
        [--probes 300] [--out DIR]

A benchmark, not a test: it asserts nothing. For each N it starts the real daemon
(`python -m execgate.daemon.main`) with a private config under a temporary directory (state_dir,
socket, journal, history store; domain = the host; growth gate off, so nothing is ever frozen
or loaded into the kernel) and registers N synthetic sandboxes the way the runtime does:

* a container record per sandbox in state_dir (what `create`/`start` write), managed and
  prepared, its "cgroup" a plain directory with `init/` under the temporary directory;
* one running tool call per sandbox, admitted through the real protocol (`admit`, with the
  runtime's own client, runtime/admit.py), whose tool "cgroup" directory is then created with
  `memory.current`, `memory.peak`, `cpu.stat` and `cgroup.events` files, so every control
  iteration samples it exactly as it samples a real cgroup (same file reads, on tmpfs instead
  of cgroupfs) and the growth controller sees it;
* one queued call for every tenth sandbox (at least one): declared far above the budget, it
  waits in the heavy queue for the whole run (`max_admission_wait_s` is raised), its runtime's
  connection held open, so every admission step walks a queue as well.

Then it measures, with no client traffic:

(a) the daemon's CPU per control iteration: utime+stime of the whole process (all threads,
    /proc/<pid>/stat) over a --window of seconds, divided by the iterations the daemon counted
    (its `ping` answer carries the loop counters); also the CPU and wall time inside `tick()`
    as the daemon measures them itself;

and then, with probes,

(b) the admission round trip of an immediately admittable call (light, small hint, green
    domain): connect, `admit`, `queued` frame, `admitted` frame, as seen by the runtime's
    client; then its `done` round trip. --probes of them, one at a time, at random phases
    of the loop.

Results: a markdown table (printed, and DIR/control_loop.md) and DIR/control_loop.json.
Needs root (the daemon answers root only); it touches nothing outside its temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.metrics import percentile
from execgate.cgroups import container as layout
from execgate.common import meminfo, protocol, records
from execgate.common.units import MiB
from execgate.oci.runclog import RuncLog
from execgate.runtime import admit

RUNNING_HINT = 4 * MiB  # declared peak of every running call
RUNNING_CURRENT = 2 * MiB  # what each running call's memory.current says
PROBE_HINT = 1 * MiB
MAX_WAIT_S = 3600.0  # queued calls must stay queued for the whole run


# -- pure helpers (unit-tested) --------------------------------------------------------------

def parse_proc_stat_cpu(text: str) -> int:
    """utime + stime in clock ticks from a /proc/<pid>/stat line (comm may hold spaces and
    parentheses, so fields are counted after the last ')')."""
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)


def config_text(tmp: str) -> str:
    """The daemon's private config: everything under tmp, host domain, growth gate off."""
    return "\n".join([
        f'state_dir = "{tmp}/state"',
        f'journal = "{tmp}/calls.jsonl"',
        f'socket = "{tmp}/execgated.sock"',
        "",
        "[daemon]",
        'domain = "host"',
        'gate = "off"',
        f'store = "{tmp}/history.sqlite"',
        "",
        "[admission]",
        f"max_admission_wait_s = {MAX_WAIT_S}",
        "",
    ])


def queued_count(n: int) -> int:
    """Sandboxes that also have a call waiting in the heavy queue: every tenth, at least one."""
    return max(1, n // 10) if n > 0 else 0


def summarize(n: int, it: tuple[dict[str, Any], dict[str, Any]], cpu_s: float, window_s: float,
              admit_s: Sequence[float], done_s: Sequence[float], rss_bytes: int | None,
              queued: int) -> dict[str, Any]:
    """One row: loop counters before/after the window, the process CPU over it, the probes."""
    before, after = it
    iters = after["iterations"] - before["iterations"]
    tick_cpu = after["cpu_s"] - before["cpu_s"]
    tick_wall = after["wall_s"] - before["wall_s"]

    def ms(x: float) -> float | None:
        return round(1e3 * x, 3) if iters else None

    def pct(xs: Sequence[float], q: float) -> float | None:
        return round(1e3 * percentile(xs, q), 3) if xs else None

    return {
        "sandboxes": n, "running_calls": n, "queued_calls": queued,
        "window_s": round(window_s, 3), "iterations": iters,
        "iterations_per_s": round(iters / window_s, 2) if window_s > 0 else None,
        "cpu_ms_per_iteration": ms(cpu_s / iters) if iters else None,
        "cpu_percent_of_core": round(100 * cpu_s / window_s, 2) if window_s > 0 else None,
        "tick_cpu_ms": ms(tick_cpu / iters) if iters else None,
        "tick_wall_ms": ms(tick_wall / iters) if iters else None,
        "tick_wall_max_ms_since_start": round(after["max_wall_ms"], 3),
        "admit_ms": {"p50": pct(admit_s, 50), "p95": pct(admit_s, 95), "p99": pct(admit_s, 99),
                     "max": round(1e3 * max(admit_s), 3) if admit_s else None,
                     "n": len(admit_s)},
        "done_ms": {"p50": pct(done_s, 50), "p95": pct(done_s, 95), "p99": pct(done_s, 99),
                    "n": len(done_s)},
        "rss_mib": round(rss_bytes / MiB, 1) if rss_bytes is not None else None,
    }


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def render_markdown(result: dict[str, Any]) -> str:
    host = result["host"]
    lines = [
        f"Host: {host['description']}; {result['params']['window_s']:g} s window per N, "
        f"{result['params']['probes']} admission probes; control period "
        f"{result['params']['period_ms']:g} ms.",
        "",
        "| sandboxes | running + queued calls | CPU / iteration (ms) | CPU (% of a core) "
        "| tick CPU / wall (ms) | admit p50 / p95 / p99 (ms) | done p50 (ms) | RSS (MiB) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["runs"]:
        a = r["admit_ms"]
        lines.append(
            f"| {r['sandboxes']:,} | {r['running_calls']:,} + {r['queued_calls']:,} "
            f"| {_f(r['cpu_ms_per_iteration'])} | {_f(r['cpu_percent_of_core'], '{:.1f}')} "
            f"| {_f(r['tick_cpu_ms'])} / {_f(r['tick_wall_ms'])} "
            f"| {_f(a['p50'])} / {_f(a['p95'])} / {_f(a['p99'])} "
            f"| {_f(r['done_ms']['p50'])} | {_f(r['rss_mib'], '{:.0f}')} |")
    return "\n".join(lines) + "\n"


# -- the host and the daemon -----------------------------------------------------------------

def host_description() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f
                          if ln.startswith("model name")), "")
    except OSError:
        pass
    distro = ""
    try:
        with open("/etc/os-release") as f:
            distro = next((ln.split("=", 1)[1].strip().strip('"') for ln in f
                           if ln.startswith("PRETTY_NAME=")), "")
    except OSError:
        pass
    cores = os.cpu_count() or 0
    desc = f"{cores} cores ({model or 'unknown CPU'}), {distro or platform.system()}, " \
           f"kernel {platform.release()}, Python {platform.python_version()}"
    return {"cores": cores, "cpu": model, "os": distro, "kernel": platform.release(),
            "python": platform.python_version(), "description": desc}


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        return parse_proc_stat_cpu(f.read()) / os.sysconf("SC_CLK_TCK")


def proc_rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _write(path: str, name: str, text: str) -> None:
    with open(os.path.join(path, name), "w") as f:
        f.write(text)


def fake_tool_cgroup(path: str, current: int, cpu_usec: int) -> None:
    """The files a control iteration reads from a running call's cgroup (and status shows)."""
    os.makedirs(path, exist_ok=True)
    _write(path, "memory.current", f"{current}\n")
    _write(path, "memory.peak", f"{current}\n")
    _write(path, "cpu.stat", f"usage_usec {cpu_usec}\nuser_usec {cpu_usec}\nsystem_usec 0\n")
    _write(path, "cgroup.events", "populated 1\nfrozen 0\n")
    _write(path, "cgroup.procs", "")
    _write(path, "cgroup.freeze", "0\n")


class Daemon:
    """execgated with a private config, as a child process."""

    def __init__(self, tmp: str, log_path: str, profile: str | None = None) -> None:
        self.tmp = tmp
        self.config = os.path.join(tmp, "config.toml")
        self.socket = os.path.join(tmp, "execgated.sock")
        self.state_dir = os.path.join(tmp, "state")
        with open(self.config, "w") as f:
            f.write(config_text(tmp))
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        prof = ["-m", "cProfile", "-o", profile] if profile else []
        self.proc = subprocess.Popen(
            [sys.executable, *prof, "-m", "execgate.daemon.main", "--config", self.config],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=tmp)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"execgated exited with {self.proc.returncode}; see {log_path}")
            try:
                self.ping()
                return
            except (OSError, protocol.ProtocolError):
                time.sleep(0.05)
        raise RuntimeError(f"execgated did not answer within 30 s; see {log_path}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ping(self) -> dict[str, Any]:
        return protocol.call(self.socket, protocol.request("ping"), timeout=5.0)

    def loop(self) -> dict[str, Any]:
        answer = self.ping()
        if "loop" not in answer:
            raise RuntimeError("this execgated does not report its loop counters in `ping`")
        return answer["loop"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _admit_msg(box: str, cgroup_root: str, hint_bytes: int, argv: list[str]) -> dict[str, Any]:
    name = layout.new_tool_name()
    return {"call": name, "container": box, "sandbox": f"sandbox-{box}",
            "cgroup": os.path.join(cgroup_root, box, name), "argv": argv,
            "hint": {"memory_bytes": hint_bytes}}


def _hold_queued(sock_path: str, msg: dict[str, Any]) -> socket.socket:
    """Submit a call that cannot be admitted and keep its runtime's connection open."""
    daemon = protocol.Client(sock_path, 5.0)
    daemon.send(protocol.request("admit", **msg))
    first = daemon.recv()
    if not first.get("queued") or first.get("queue") != "heavy":
        raise RuntimeError(f"expected a heavy queued call, got {first}")
    return daemon.sock


def register(d: Daemon, n: int, cgroup_root: str, log: RuncLog) -> list[socket.socket]:
    """N sandboxes with one running call each, and the queued calls; returns the held sockets."""
    total = meminfo.read()["MemTotal"]
    for i in range(n):
        box = f"bench{i:05d}"
        cg = os.path.join(cgroup_root, box)
        os.makedirs(os.path.join(cg, layout.INIT), exist_ok=True)
        _write(cg, "memory.current", f"{200 * MiB}\n")
        _write(cg, "memory.max", "max\n")
        records.save_container(d.state_dir, {
            "id": box, "created": time.time(), "managed": True, "prepared": True,
            "sandbox": f"sandbox-{box}", "init_pid": os.getpid(), "cgroup": cg,
            "annotations": {}, "controllers": ["cpu", "memory", "pids"]})
        msg = _admit_msg(box, cgroup_root, RUNNING_HINT, ["python", "-m", "pytest", "-x"])
        answer = admit.request(d.socket, 5.0, msg, log)
        if answer is None or answer.get("waited_s", 0) > 1:
            raise RuntimeError(f"running call {i} was not admitted at once: {answer}")
        fake_tool_cgroup(msg["cgroup"], RUNNING_CURRENT, 1000 * (i + 1))
    held = []
    for i in range(queued_count(n)):
        box = f"bench{i * 10:05d}"
        msg = _admit_msg(box, cgroup_root, 4 * total, ["make", "-j", "all"])
        held.append(_hold_queued(d.socket, msg))
    return held


def measure(n: int, window_s: float, probes: int, out: Path, seed: int,
            profile: bool = False) -> dict[str, Any]:
    rng = random.Random(seed)
    tmp = tempfile.mkdtemp(prefix=f"execgate-loop-{n}-", dir="/dev/shm" if
                           os.path.isdir("/dev/shm") else None)
    d = Daemon(tmp, str(out / f"execgated-{n}.log"),
               str(out / f"execgated-{n}.prof") if profile else None)
    held: list[socket.socket] = []
    try:
        log = RuncLog(None, None)
        cgroup_root = os.path.join(tmp, "cgroup")
        t0 = time.monotonic()
        held = register(d, n, cgroup_root, log)
        print(f"  N={n}: registered in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        time.sleep(2.0)  # let the record scans and the first samples settle
        before, c0, w0 = d.loop(), proc_cpu_s(d.pid), time.monotonic()
        time.sleep(window_s)
        c1, w1, after = proc_cpu_s(d.pid), time.monotonic(), d.loop()
        rss = proc_rss(d.pid)
        admit_s, done_s = [], []
        for k in range(probes):
            time.sleep(rng.uniform(0.0, 0.05))  # land at random phases of the loop
            box = f"bench{rng.randrange(n):05d}" if n else "bench-probe"
            msg = _admit_msg(box, cgroup_root, PROBE_HINT, ["git", "status"])
            t = time.perf_counter()
            answer = admit.request(d.socket, 5.0, msg, log)
            admit_s.append(time.perf_counter() - t)
            if answer is None or answer.get("forced"):
                raise RuntimeError(f"probe {k} was not admitted: {answer}")
            t = time.perf_counter()
            if admit.done(d.socket, 5.0, msg["call"]) is None:
                raise RuntimeError(f"probe {k}: done failed")
            done_s.append(time.perf_counter() - t)
        return summarize(n, (before, after), c1 - c0, w1 - w0, admit_s, done_s, rss,
                         len(held))
    finally:
        for s in held:
            s.close()
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sandboxes", default="10,100,1000", help="comma-separated N values")
    p.add_argument("--window", type=float, default=10.0, help="CPU window per N, seconds")
    p.add_argument("--probes", type=int, default=300, help="admission probes per N")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="results/control-loop", help="output directory")
    p.add_argument("--profile", action="store_true",
                   help="run the daemon under cProfile (DIR/execgated-N.prof; slower numbers)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("control_loop: needs root (execgated answers root only)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ns = [int(x) for x in args.sandboxes.split(",") if x.strip()]
    result: dict[str, Any] = {
        "format": "execgate-control-loop/1", "host": host_description(),
        "params": {"sandboxes": ns, "window_s": args.window, "probes": args.probes,
                   "seed": args.seed, "period_ms": 100.0, "running_hint": RUNNING_HINT,
                   "running_current": RUNNING_CURRENT, "probe_hint": PROBE_HINT},
        "runs": [],
    }
    for n in ns:
        print(f"N={n} ...", file=sys.stderr)
        result["runs"].append(measure(n, args.window, args.probes, out, args.seed,
                                      args.profile))
        (out / "control_loop.json").write_text(json.dumps(result, indent=2) + "\n")
    table = render_markdown(result)
    (out / "control_loop.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
