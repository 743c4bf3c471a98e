"""The growth gate's kernel side on a real kernel (run as root in the test VM): the sched_ext
scheduler (bpf/gate.bpf.c) built and loaded by bpf/gate.py, and the cgroup.freeze fallback.

Plain cgroups under /sys/fs/cgroup/execgate-bpftest stand in for tool-call cgroups; a shell
busy loop moved into one stands in for a tool call, a second one outside the deny map for the
host. CPU progress is read from /proc/PID/schedstat (ns on CPU). Measurements are printed (see
-rA) and appended to $EXECGATE_RESULTS/bpf-gate.jsonl.

test_slow_hold_cap_survives_watchdog holds a task for 60 s (marked slow): deselect it with
-k 'not slow' (or -m 'not slow' once the marker is registered).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import SRC, gate

from execgate.cgroups import freeze, ids
from execgate.daemon import actuator
from execgate.daemon.growth_gate import RELOAD_AFTER_S

CGROOT = "/sys/fs/cgroup"
TEST_CG = os.path.join(CGROOT, "execgate-bpftest")
TEST_PIN = "/sys/fs/bpf/execgate-test"
BUILD_DIR = "/var/tmp/execgate-bpftest-build"
RESULTS = os.environ.get("EXECGATE_RESULTS")

# TCG runs ~10x slower than hardware: latencies are asserted with generous slack; the numbers
# themselves are recorded.
LATENCY_MAX_S = 1.5  # target: one control period (0.1 s)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(os.path.join(CGROOT, "cgroup.controllers")),
    reason="needs root and cgroup v2")

needs_scx = pytest.mark.skipif(gate.state() == "unsupported", reason="kernel has no sched_ext")


def record(test: str, **values: object) -> None:
    line = {"test": test, **values}
    print(json.dumps(line))
    if RESULTS:
        with open(os.path.join(RESULTS, "bpf-gate.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")


# -- CPU progress ---------------------------------------------------------------------------------

def cpu_s(pid: int) -> float:
    """Seconds pid has been on a CPU (its main thread; the busy loops are single-threaded)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except FileNotFoundError:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _thread_cpu() -> dict[str, float]:
    """'tid comm' -> seconds on a CPU, for every thread on the host (kernel threads too)."""
    out = {}
    for tdir in Path("/proc").glob("[0-9]*/task/[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            comm = (tdir / "comm").read_text().strip()
            out[f"{tdir.name} {comm}"] = int((tdir / "schedstat").read_text().split()[0]) / 1e9
    return out


def _cpu_lines() -> dict[str, list[int]]:
    with open("/proc/stat") as f:
        return {w[0]: [int(x) for x in w[1:9]] for w in map(str.split, f) if w[0].startswith("cpu")}


def cpu_census(window: float) -> dict[str, object]:
    """Where the CPUs' time went over `window`: per CPU user/system/idle/irq/softirq/steal
    seconds (/proc/stat), and the six threads that ran most. Printed when a CPU check fails."""
    hz = os.sysconf("SC_CLK_TCK")
    t0, c0 = _thread_cpu(), _cpu_lines()
    time.sleep(window)
    t1, c1 = _thread_cpu(), _cpu_lines()
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    cpus = {cpu: {k: round((b - a) / hz, 2) for k, a, b in
                  zip(names, c0[cpu], c1[cpu], strict=True)
                  if b != a} for cpu in c1 if cpu in c0}
    ran = sorted(((round(t1[k] - t0.get(k, 0.0), 3), k) for k in t1), reverse=True)[:6]
    return {"cpus": cpus, "top": ran}


def progress(pids: list[int], window: float) -> dict[int, float]:
    start = {p: cpu_s(p) for p in pids}
    time.sleep(window)
    return {p: round(cpu_s(p) - start[p], 4) for p in pids}


def time_until_stopped(pids: int | list[int], t0: float, quiet: float = 0.5,
                       timeout: float = 10) -> float:
    """Seconds from t0 to the last CPU progress of any of pids, once none of them made any for
    `quiet` seconds."""
    pids = [pids] if isinstance(pids, int) else pids
    last = {p: cpu_s(p) for p in pids}
    last_at = dict.fromkeys(pids, t0)
    while time.monotonic() - max(last_at.values()) < quiet:
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{pids} still running {timeout}s after deny")
        time.sleep(0.01)
        for p in pids:
            now = cpu_s(p)
            if now > last[p] + 1e-4:  # 0.1 ms: not a stray wakeup's accounting
                last[p], last_at[p] = now, time.monotonic()
    return max(0.0, max(last_at.values()) - t0)


def time_until_progress(pid: int, t0: float, amount: float = 0.02, timeout: float = 10) -> float:
    """Seconds from t0 until pid got `amount` seconds of CPU."""
    start = cpu_s(pid)
    while cpu_s(pid) - start < amount:
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"pid {pid} got no CPU for {timeout}s")
        time.sleep(0.005)
    return time.monotonic() - t0


def sched_info(pid: int) -> dict[str, str]:
    """/proc/PID/sched as key -> value: `policy` (7 = SCHED_EXT), and `ext.enabled` (on
    sched_ext's class right now) where the kernel shows it."""
    out = {}
    with open(f"/proc/{pid}/sched") as f:
        for line in f:
            key, sep, value = line.partition(":")
            if sep:
                out[key.strip()] = value.strip()
    return out


def on_fair(pid: int) -> bool:
    info = sched_info(pid)
    return info.get("policy") == "0" and info.get("ext.enabled", "0") == "0"


def held_by_scx(pid: int) -> bool:
    info = sched_info(pid)
    return info.get("policy") == "7" and info.get("ext.enabled", "1") == "1"


# -- fixtures -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scx_free() -> Iterator[None]:
    """No sched_ext scheduler loaded (stops execgated if it holds one), restored afterwards."""
    stopped = False
    if gate.state() not in ("disabled", "unsupported"):
        gate.recover(TEST_PIN, thaw=None)
    if gate.state() == "enabled" and gate.scheduler_name() == gate.SCHED_NAME:
        subprocess.run(["systemctl", "stop", "execgated"], check=False, timeout=60)
        stopped = True
        gate.recover(thaw=None)
    if gate.state() not in ("disabled", "unsupported"):
        pytest.skip(f"a sched_ext scheduler ({gate.scheduler_name()}) is loaded")
    yield
    if stopped:
        subprocess.run(["systemctl", "start", "execgated"], check=False, timeout=60)


@pytest.fixture(scope="module")
def obj(scx_free: None) -> Path:
    if gate.state() == "unsupported":
        pytest.skip("kernel has no sched_ext")
    t0 = time.monotonic()
    path = gate.build(BUILD_DIR)
    record("build", seconds=round(time.monotonic() - t0, 1), obj=str(path),
           size=path.stat().st_size)
    return path


@pytest.fixture
def loaded(obj: Path) -> Iterator:
    g = gate.load(obj, TEST_PIN)
    yield g
    g.unload()
    assert gate.state() == "disabled"


@pytest.fixture
def cgroups() -> Iterator[Callable[[str], str]]:
    """make(name) creates TEST_CG/name (parents too); all are removed at teardown."""
    made: list[str] = []

    def make(name: str) -> str:
        path = os.path.join(TEST_CG, name)
        os.makedirs(path, exist_ok=True)
        made.append(path)
        return path

    yield make
    for path in sorted(set(made), key=len, reverse=True):
        _rm_cgroup(path)
    _rm_cgroup(TEST_CG)


def _rm_cgroup(path: str) -> None:
    if not os.path.isdir(path):
        return
    for sub in sorted((e.path for e in os.scandir(path) if e.is_dir()), reverse=True):
        _rm_cgroup(sub)
    for knob, value in (("cgroup.freeze", "0"), ("cgroup.kill", "1")):
        try:
            with open(os.path.join(path, knob), "w") as f:
                f.write(value)
        except OSError:
            pass
    deadline = time.monotonic() + 20
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture
def busy() -> Iterator[Callable[[str], int]]:
    """spawn(cgroup) starts a shell busy loop that moves itself into cgroup; returns its pid."""
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(cg: str) -> int:
        p = subprocess.Popen(["/bin/sh", "-c",
                              f'echo $$ > {cg}/cgroup.procs && while :; do :; done'])
        procs.append(p)
        rel = "/" + os.path.relpath(cg, CGROOT)
        deadline = time.monotonic() + 10
        while True:
            with open(f"/proc/{p.pid}/cgroup") as f:
                if f.read().strip().endswith("::" + rel):
                    return p.pid
            assert p.poll() is None, "busy loop died"
            assert time.monotonic() < deadline, f"pid {p.pid} never reached {cg}"
            time.sleep(0.02)

    yield spawn
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(timeout=60)


def _held_call(g, cgroups, busy, name: str) -> tuple[str, int]:
    """A busy loop in TEST_CG/c1/<name>, denied by g and seen stopped: (cgroup, pid)."""
    tool = cgroups(f"c1/{name}")
    p = busy(tool)
    g.set(tool, allow=False)
    time_until_stopped(p, time.monotonic())
    return tool, p


def _free_run(pids: list[int], window: float = 2.0) -> dict[int, float]:
    free = progress(pids, window)
    for pid in pids:
        assert free[pid] > 0.1 * window, f"pid {pid} hardly ran even while allowed: {free}"
    return free


# -- tests ----------------------------------------------------------------------------------------

def test_cgroup_id_is_the_directory_inode() -> None:
    """The map key: cgroup->kn->id, as the kernel exports it in a cgroupfs file handle."""
    libc = ctypes.CDLL(None, use_errno=True)
    for path in (CGROOT, os.path.join(CGROOT, "system.slice"), ids.own_cgroup()):
        if not path or not os.path.isdir(path):
            continue
        buf = ctypes.create_string_buffer(8 + 64)
        struct.pack_into("I", buf, 0, 64)
        mount_id = ctypes.c_int()
        AT_FDCWD = -100
        rc = libc.name_to_handle_at(AT_FDCWD, os.fsencode(path), buf, ctypes.byref(mount_id), 0)
        assert rc == 0, os.strerror(ctypes.get_errno())
        nbytes = struct.unpack_from("I", buf, 0)[0]
        assert nbytes == 8
        handle_id = struct.unpack_from("Q", buf, 8)[0]
        assert handle_id == ids.cgroup_id(path) == os.stat(path).st_ino


@needs_scx
def test_build_and_load(obj: Path, loaded) -> None:
    assert gate.state() == "enabled"
    assert gate.scheduler_name() == gate.SCHED_NAME
    assert loaded.attached() and loaded.exit_reason() is None
    assert loaded.denied() == []
    # the pins the daemon and tools use
    for short in gate.MAP_NAMES:
        assert os.path.exists(os.path.join(TEST_PIN, short))
    assert not os.path.exists(os.path.join(TEST_PIN, gate.LINK_PIN)), "owned mode: no link pin"
    # build.sh: same build dir -> cached, prints the object
    out = subprocess.run([str(SRC / "execgate" / "bpf" / "build.sh"), BUILD_DIR],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(obj)
    # the system keeps working under the scheduler
    docker_checked = []
    if shutil.which("docker"):
        assert subprocess.run(["docker", "info"], capture_output=True, timeout=120).returncode == 0
        img = subprocess.run(["docker", "image", "inspect", "execgate-test:latest"],
                             capture_output=True, timeout=60)
        if img.returncode == 0:
            daemon = subprocess.run(["systemctl", "is-active", "execgated"],
                                    capture_output=True, text=True).stdout.strip()
            for runtime in ("runc", "execgate") if daemon == "active" else ("runc",):
                r = subprocess.run(["docker", "run", "--rm", "--runtime", runtime,
                                    "execgate-test:latest", "true"], capture_output=True,
                                   timeout=180)
                assert r.returncode == 0, (runtime, r.stderr)
                docker_checked.append(f"docker run --runtime {runtime}")
        docker_checked.insert(0, "docker info")
    assert loaded.attached()
    record("build_and_load", docker=docker_checked, stats=loaded.stats().__dict__)


@needs_scx
def test_deny_holds_and_allow_resumes(loaded, cgroups, busy) -> None:
    tool, host = cgroups("c1/tool-a"), cgroups("host")
    p, p2, q = busy(tool), busy(tool), busy(host)  # a call with two processes, the host
    free = _free_run([p, p2, q])

    t0 = time.monotonic()
    assert loaded.set(tool, allow=False)
    stop_latency = time_until_stopped([p, p2], t0)
    held = progress([p, p2, q], 3.0)
    assert held[p] <= 0.05 and held[p2] <= 0.05, f"denied tasks still ran: {held}"
    assert held[q] >= 0.5, f"the task outside the map was starved: {held}"
    status = json.loads(subprocess.run(
        [sys.executable, "-m", "execgate.bpf.gate", "--pin-dir", TEST_PIN, "status"],
        capture_output=True, text=True, timeout=60, check=True).stdout)
    assert status["denied"] == [os.stat(tool).st_ino] and status["attached"], status
    assert status["stats"]["held"] == 2, status
    # the partial switch: only the held call's tasks are SCHED_EXT
    assert held_by_scx(p) and held_by_scx(p2) and on_fair(q), [sched_info(x) for x in (p, q)]

    t1 = time.monotonic()
    assert loaded.set(tool, allow=True)
    assert on_fair(p) and on_fair(p2), sched_info(p)  # released: back on the fair class
    resume_latency = max(time_until_progress(p, t1), time_until_progress(p2, t1))
    resumed = progress([p, p2, q], 2.0)
    assert min(resumed.values()) > 0.2, resumed
    assert stop_latency <= LATENCY_MAX_S and resume_latency <= LATENCY_MAX_S
    st = loaded.stats()
    assert st.parked >= 1 and st.released >= 1
    assert loaded.attached()
    record("deny_allow", free=list(free.values()), held=list(held.values()),
           resumed=list(resumed.values()), stop_latency_s=round(stop_latency, 3),
           resume_latency_s=round(resume_latency, 3), stats=st.__dict__)


@needs_scx
def test_nested_cgroup_of_denied_tool_is_held(loaded, cgroups, busy) -> None:
    tool = cgroups("c1/tool-b")
    child = cgroups("c1/tool-b/sub/deeper")
    sibling = cgroups("c1/tool-c")
    p, s = busy(child), busy(sibling)
    _free_run([p, s])
    loaded.set(tool, allow=False)  # the parent only
    t0 = time.monotonic()
    stop_latency = time_until_stopped(p, t0)
    held = progress([p, s], 2.0)
    assert held[p] <= 0.05 and held[s] >= 0.3, held
    loaded.set(tool, allow=True)
    resume_latency = time_until_progress(p, time.monotonic())
    assert stop_latency <= LATENCY_MAX_S and resume_latency <= LATENCY_MAX_S
    record("nested", held=list(held.values()), stop_latency_s=round(stop_latency, 3),
           resume_latency_s=round(resume_latency, 3))


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


@needs_scx
def test_kill_9_of_a_held_task_works(loaded, cgroups, busy) -> None:
    tool = cgroups("c1/tool-k")
    p = busy(tool)
    loaded.set(tool, allow=False)
    time_until_stopped(p, time.monotonic())
    t0 = time.monotonic()
    os.kill(p, signal.SIGKILL)
    deadline = t0 + 10
    while _proc_state(p) not in ("Z", None):
        assert time.monotonic() < deadline, "SIGKILLed held task did not die"
        time.sleep(0.01)
    took = time.monotonic() - t0
    assert loaded.stats().killed >= 1
    assert took <= LATENCY_MAX_S
    record("kill_held", exit_latency_s=round(took, 3))


@needs_scx
def test_unload_releases_held_tasks(obj: Path, cgroups, busy) -> None:
    g = gate.load(obj, TEST_PIN)
    try:
        _tool, p = _held_call(g, cgroups, busy, "tool-u")
        t0 = time.monotonic()
        assert g.unload()
        unload_s = time.monotonic() - t0
        assert gate.state() == "disabled"
        assert not g.attached()
        resumed = progress([p], 1.0)
        assert resumed[p] > 0.2, resumed
        assert g.unload()  # twice is fine
        assert not os.path.exists(TEST_PIN) or not os.listdir(TEST_PIN)
        record("unload", unload_s=round(unload_s, 3), resumed=resumed[p])
    finally:
        g.unload()


@needs_scx
def test_kernel_ejection_is_noticed(obj: Path, cgroups, busy) -> None:
    """sysrq-S makes the kernel disable the BPF scheduler, as an ejection would: the gate
    notices (attached() False, exit_reason()), held tasks run, unload still cleans up."""
    g = gate.load(obj, TEST_PIN)
    try:
        tool, p = _held_call(g, cgroups, busy, "tool-e")
        t0 = time.monotonic()
        with open("/proc/sysrq-trigger", "w") as f:
            f.write("S")
        st = gate.wait_state({"disabled"}, 10)
        runs_s = time_until_progress(p, t0)
        assert st == "disabled"
        assert not g.attached()
        reason = g.exit_reason()
        assert reason and "sysrq" in reason.lower(), reason
        assert g.stats().exited
        # what the daemon does next: load a fresh gate (same pin dir), then drop the dead one
        g2 = gate.load(obj, TEST_PIN)
        try:
            assert g2.attached() and not g.attached()
            assert g.unload()  # must not touch g2's pins or scheduler
            assert g2.attached()
            g2.set(tool, allow=False)
            time_until_stopped(p, time.monotonic())
            h = gate.Gate.open(TEST_PIN)  # by its pins, as a tool would
            assert h.denied() == [os.stat(tool).st_ino]
            h.detach()
        finally:
            assert g2.unload()
        assert gate.state() == "disabled"
        record("ejection_sysrq", exit_reason=reason, runs_s=round(runs_s, 3))
    finally:
        g.unload()


def _loader(obj: Path, cg: str, *persist: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "execgate.bpf.gate", "--pin-dir", TEST_PIN,
                             "hold", str(obj), "--deny", cg, *persist], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"loader failed: {line!r} {proc.stderr.read()}")
    return proc


@needs_scx
def test_kill_9_of_the_loader_unloads(obj: Path, cgroups, busy) -> None:
    """Owned mode (the default): the loader's fd is the only reference to the link."""
    tool = cgroups("c1/tool-d")
    p = busy(tool)
    loader = _loader(obj, tool)
    try:
        assert gate.state() == "enabled"
        time_until_stopped(p, time.monotonic())
        t0 = time.monotonic()
        loader.kill()
        loader.wait(timeout=30)
        st = gate.wait_state({"disabled"}, 10)
        unloaded_s = time.monotonic() - t0
        runs_s = time_until_progress(p, t0)
        assert st == "disabled"
        assert runs_s <= 5.0
        record("loader_kill9_owned", unloaded_s=round(unloaded_s, 3), runs_s=round(runs_s, 3))
    finally:
        if loader.poll() is None:
            loader.kill()
        gate.recover(TEST_PIN, thaw=None)


@needs_scx
def test_kill_9_of_a_persistent_loader_then_recover(obj: Path, cgroups, busy) -> None:
    """persist=True: the scheduler (and its deny entries) outlive the loader until recover()."""
    tool = cgroups("c1/tool-p")
    p = busy(tool)
    loader = _loader(obj, tool, "--persist")
    try:
        time_until_stopped(p, time.monotonic())
        loader.kill()
        loader.wait(timeout=30)
        time.sleep(0.5)
        assert gate.state() == "enabled"
        still = progress([p], 1.0)
        assert still[p] <= 0.05, f"held task ran after the loader died: {still}"

        t0 = time.monotonic()
        summary = gate.recover(TEST_PIN, unload=False, thaw=None)  # clear only
        runs_s = time_until_progress(p, t0)
        assert "cleared 1 deny entry" in summary
        assert gate.state() == "enabled"
        g = gate.Gate.open(TEST_PIN)  # a restarted daemon can adopt it
        assert g.attached() and g.denied() == []
        g.set(tool, allow=False)
        time_until_stopped(p, time.monotonic())
        g.detach()

        t1 = time.monotonic()
        summary2 = gate.recover(TEST_PIN, thaw=None)  # unload
        st = gate.wait_state({"disabled"}, 10)
        runs2_s = time_until_progress(p, t1)
        assert st == "disabled", summary2
        assert runs_s <= 5.0 and runs2_s <= 5.0
        record("loader_kill9_persist", recover_clear=summary, runs_after_clear_s=round(runs_s, 3),
               recover_unload=summary2, runs_after_unload_s=round(runs2_s, 3))
    finally:
        if loader.poll() is None:
            loader.kill()
        gate.recover(TEST_PIN, thaw=None)


@needs_scx
def test_select_gate(obj: Path) -> None:
    g, reason = actuator.select_gate(BUILD_DIR, TEST_PIN, obj=obj)
    try:
        assert g.kind == "sched_ext" and g.attached(), reason
    finally:
        g.unload()
    assert gate.state() == "disabled"
    g, reason = actuator.select_gate(BUILD_DIR, TEST_PIN, obj="/nonexistent/gate.bpf.o")
    assert g.kind == "freeze" and "cgroup.freeze" in reason
    assert gate.state() == "disabled"
    record("select_gate", fallback_reason=reason)


@needs_scx
def test_partial_switch_leaves_the_host_on_fair(obj: Path, cgroups, busy) -> None:
    """With the gate loaded and a call held, a busy loop on the host and one in a plain runc
    container stay on the fair class and get the CPU they got without the gate. Each loop has
    a CPU of its own: a parked task keeps the CPU whose runqueue holds it from pulling fair
    work (test_a_parked_task_keeps_its_cpu_from_pulling_fair_work), which the daemon bounds
    by freezing what stays parked ([growth] max_park_s); this test is about the class."""
    if not shutil.which("docker"):
        pytest.skip("no docker")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    q = busy(cgroups("host"))
    cid = subprocess.run(["docker", "run", "-d", "--rm", "--runtime", "runc",
                          "execgate-test:latest", "sh", "-c", "while :; do :; done"],
                         capture_output=True, text=True, timeout=180, check=True).stdout.strip()
    try:
        c = int(subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", cid],
                               capture_output=True, text=True, timeout=60,
                               check=True).stdout)
        os.sched_setaffinity(q, {0})
        os.sched_setaffinity(c, {1})
        before = progress([q, c], 3.0)
        g = gate.load(obj, TEST_PIN)
        try:
            tool, p = _held_call(g, cgroups, busy, "tool-s")
            seen = {"host": sched_info(q), "runc": sched_info(c), "held": sched_info(p)}
            assert on_fair(q) and on_fair(c) and held_by_scx(p), seen
            # The best of three windows: under TCG a window can lose half its CPU to a
            # transient (seen once: 1.5 of 3 s for both loops); a gate that slowed fair tasks
            # would slow all three.
            windows = []
            for _ in range(3):
                windows.append(progress([q, c], 3.0))
                during = {pid: max(w[pid] for w in windows) for pid in (q, c)}
                if all(during[pid] >= 0.7 * before[pid] for pid in (q, c)):
                    break
            if not all(during[pid] >= 0.7 * before[pid] for pid in (q, c)):
                census = cpu_census(3.0)
                record("partial_switch_census", loops=[q, c], held=p, **census)
                raise AssertionError(f"fair loops slowed: before {before}, during {windows}; "
                                     f"where the CPU went: {census}")
            g.set(tool, allow=True)
            assert on_fair(p)
            time_until_progress(p, time.monotonic())
        finally:
            g.unload()
        record("partial_switch", before=list(before.values()),
               during=[list(w.values()) for w in windows],
               policies={k: [v.get("policy"), v.get("ext.enabled")] for k, v in seen.items()})
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, timeout=120)


@needs_scx
def test_a_parked_task_keeps_its_cpu_from_pulling_fair_work(obj: Path, cgroups, busy) -> None:
    """Why the daemon parks a call for at most [growth] max_park_s and then freezes it: a task
    parked on CPU 0's runqueue keeps CPU 0 from looking idle (idle_cpu() reads nr_running), so
    two fair loops stacked on CPU 1 may stay stacked while CPU 0 idles (not always: the
    periodic balance can still pull one); once the parked task is gone, CPU 0 pulls one."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    q, c = busy(cgroups("host")), busy(cgroups("host"))
    for pid in (q, c):
        os.sched_setaffinity(pid, {1})
    g = gate.load(obj, TEST_PIN)
    try:
        tool = cgroups("c1/tool-park")
        p = busy(tool)
        os.sched_setaffinity(p, {0})
        g.set(tool, allow=False)
        time_until_stopped(p, time.monotonic())
        for pid in (q, c):
            os.sched_setaffinity(pid, {0, 1})
        time.sleep(1.0)  # the balancer's chance
        parked = progress([q, c], 3.0)
        census = cpu_census(1.0)
        os.kill(p, signal.SIGKILL)  # SIGKILL releases it: it exits
        time.sleep(1.0)
        freed = [progress([q, c], 3.0) for _ in range(3)]
    finally:
        g.unload()
    best = max(sum(w.values()) for w in freed)
    record("parked_cpu", parked=list(parked.values()), freed=[list(w.values()) for w in freed],
           census=census)
    # Freed, they spread: two CPUs' worth. Parked, the balancer may or may not pull one (the
    # kernel's periodic balance does at times: 4.3 of 6 s in one CI run, 3 s in others); the
    # figures are recorded, and a cost that comes only at times is still why a park is short.
    assert best > 0.8 * 2 * 3.0, freed
    assert sum(parked.values()) <= best * 1.05, (parked, freed, census)


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


@needs_scx
def test_cpu_controls_of_sched_ext_tasks(loaded, cgroups, busy) -> None:
    """What this kernel does with cgroup CPU controls for SCHED_EXT tasks (the README's claim
    that a running call must stay on the fair class rests on it): a busy loop under cpu.max
    20 % on the fair class and as SCHED_EXT, two SCHED_EXT loops with cpu.weight 10000 and 1
    on one CPU, and a SCHED_EXT loop beside a fair one on one CPU."""
    lim, heavy, light = cgroups("lim"), cgroups("wheavy"), cgroups("wlight")
    with contextlib.suppress(OSError):  # systemd usually has it on already
        _write(os.path.join(CGROOT, "cgroup.subtree_control"), "+cpu")
    _write(os.path.join(TEST_CG, "cgroup.subtree_control"), "+cpu")
    _write(os.path.join(lim, "cpu.max"), "20000 100000")
    _write(os.path.join(heavy, "cpu.weight"), "10000")
    _write(os.path.join(light, "cpu.weight"), "1")
    window = 3.0
    p = busy(lim)
    fair_max = progress([p], window)[p]
    os.sched_setscheduler(p, 7, os.sched_param(0))
    ext_max = progress([p], window)[p]
    os.kill(p, signal.SIGKILL)
    a, b = busy(heavy), busy(light)
    for pid in (a, b):
        os.sched_setaffinity(pid, {0})
    fair_w = progress([a, b], window)
    for pid in (a, b):
        os.sched_setscheduler(pid, 7, os.sched_param(0))
    ext_w = progress([a, b], window)
    os.sched_setscheduler(a, 0, os.sched_param(0))  # a fair loop and a SCHED_EXT one, CPU 0
    mixed = progress([a, b], window)
    record("cpu_controls", window_s=window, cpu_max_20pct={"fair": fair_max, "ext": ext_max},
           weight_10000_vs_1={"fair": list(fair_w.values()), "ext": list(ext_w.values())},
           fair_vs_ext_one_cpu=list(mixed.values()))
    assert fair_max <= 0.3 * window, fair_max  # the limit works for the fair class


OTHER_SRC = Path(__file__).resolve().parent / "scx" / "other_sched.bpf.c"
OTHER_PIN = "/sys/fs/bpf/execgate-test-other"


@needs_scx
def test_another_scheduler_is_left_loaded(obj: Path) -> None:
    """Another sched_ext scheduler loaded first: execgate picks cgroup.freeze, says why, and
    leaves the other one loaded (select_gate, recover, and the daemon's status); once the other
    one unloads, the daemon's gate is sched_ext again."""
    other = gate.loader.build(BUILD_DIR, src=OTHER_SRC)
    os.makedirs(OTHER_PIN, exist_ok=True)
    gate.loader.run(["bpftool", "struct_ops", "register", str(other), OTHER_PIN], timeout=120)
    try:
        assert gate.wait_state({"enabled"}, 10) == "enabled"
        assert gate.scheduler_name() == "eg_other"
        g, reason = actuator.select_gate(BUILD_DIR, TEST_PIN, obj=obj)
        g.unload()
        assert g.kind == "freeze" and "eg_other" in reason and "leaves it loaded" in reason
        gate.recover(TEST_PIN, thaw=None)
        assert gate.state() == "enabled" and gate.scheduler_name() == "eg_other"
        with _daemon_on_auto() as status:
            frozen = status("growth gate: freeze")
            assert gate.state() == "enabled" and gate.scheduler_name() == "eg_other"
            assert "eg_other" in frozen and "once it unloads" in frozen, frozen
            _remove_other()
            t0 = time.monotonic()
            ours = status("growth gate: sched_ext", timeout=RELOAD_AFTER_S + 120)
            switched_s = time.monotonic() - t0
            assert gate.state() == "enabled" and gate.scheduler_name() == "execgate", ours
        record("another_scheduler", reason=reason, switched_s=round(switched_s, 1), status=[
            line for text in (frozen, ours) for line in text.splitlines()
            if "growth gate" in line])
    finally:
        _remove_other()
        with contextlib.suppress(OSError):
            os.rmdir(OTHER_PIN)
    assert gate.wait_state({"disabled"}, 30) == "disabled"  # the freeze test bed unloaded ours


def _remove_other() -> None:
    if os.path.isdir(OTHER_PIN):
        gate.loader.remove_pins([os.path.join(OTHER_PIN, n) for n in os.listdir(OTHER_PIN)],
                                OTHER_PIN)
    gate.wait_state({"disabled"}, 10)


@contextlib.contextmanager
def _daemon_on_auto() -> Iterator[Callable[..., str]]:
    """execgated restarted with gate = "auto" (the test bed's is "freeze"); yields
    status(want, timeout=120), which waits for `execgatectl status` to say `want`. The test
    bed's config and daemon are back afterwards."""
    if subprocess.run(["systemctl", "is-active", "execgated"], capture_output=True,
                      text=True).stdout.strip() != "active":
        pytest.skip("execgated is not running here")
    conf = "/etc/execgate/config.toml"
    shutil.copy(conf, conf + ".orig")

    def status(want: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while True:
            out = subprocess.run(["execgatectl", "status"], capture_output=True, text=True,
                                 timeout=60)
            if out.returncode == 0 and want in out.stdout:
                return out.stdout
            assert time.monotonic() < deadline, (want, out)
            time.sleep(1)

    try:
        with open(conf) as f:
            text = f.read()
        _write(conf, text.replace('gate = "freeze"', 'gate = "auto"'))
        subprocess.run(["systemctl", "restart", "execgated"], check=True, timeout=120)
        yield status
    finally:
        shutil.move(conf + ".orig", conf)
        subprocess.run(["systemctl", "restart", "execgated"], check=True, timeout=120)


@needs_scx
@pytest.mark.slow
def test_slow_hold_cap_survives_watchdog(obj: Path, cgroups, busy) -> None:
    """A call denied for 60 s (twice the watchdog timeout): the hold cap (20 s) lets it run a
    slice now and then, so the scheduler is never ejected."""
    g = gate.load(obj, TEST_PIN)
    try:
        tool, host = cgroups("c1/tool-w"), cgroups("host")
        p, q = busy(tool), busy(host)
        g.set(tool, allow=False)
        time_until_stopped(p, time.monotonic())
        held = progress([p, q], 60.0)
        st = g.stats()
        assert gate.state() == "enabled" and g.attached(), g.exit_reason()
        assert st.capped >= 2, st
        assert held[p] < 2.0, f"the held task got too much CPU: {held}"
        assert held[q] > 10.0, held
        g.set(tool, allow=True)
        time_until_progress(p, time.monotonic())
        record("hold_cap_60s", held=list(held.values()), capped=st.capped, parked=st.parked)
    finally:
        g.unload()


def test_freeze_gate_holds_and_resumes(cgroups, busy) -> None:
    g = actuator.FreezeGate()
    tool, host = cgroups("c1/tool-f"), cgroups("host")
    p, q = busy(tool), busy(host)
    _free_run([p, q])
    t0 = time.monotonic()
    assert g.set(tool, allow=False)
    stop_latency = time_until_stopped(p, t0)
    held = progress([p, q], 2.0)
    assert held[p] <= 0.01 and held[q] > 0.3, held
    t1 = time.monotonic()
    assert g.set(tool, allow=True)
    resume_latency = time_until_progress(p, t1)
    # leftovers of a dead daemon are thawed by recover()
    g.set(tool, allow=False)
    time_until_stopped(p, time.monotonic())
    assert tool in freeze.thaw_all(TEST_CG)
    time_until_progress(p, time.monotonic())
    g.unload()
    record("freeze", held=list(held.values()), stop_latency_s=round(stop_latency, 3),
           resume_latency_s=round(resume_latency, 3))


def test_packaged_module() -> None:
    """Once pyproject maps execgate.bpf, the installed package carries the C source."""
    py = "/opt/execgate/bin/python"
    if not os.path.exists(py):
        pytest.skip("execgate not installed in /opt/execgate")
    r = subprocess.run([py, "-c", "import execgate.bpf.gate as g; print(g.SRC.exists())"],
                       capture_output=True, text=True, timeout=60)
    if "ModuleNotFoundError" in r.stderr:
        pytest.skip("execgate.bpf is not packaged yet (pyproject)")
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr
