"""The growth gate, driven by the daemon: with admission out of the way, calls that grow past
the domain's budget together are paced so none is OOM-killed, where eager execution kills."""

from __future__ import annotations

import concurrent.futures
import contextlib
import glob
import os
import subprocess
import time

import pytest
from conftest import (
    CGROOT,
    Containers,
    container_cgroup,
    ctl_status,
    daemon_view,
    docker,
    gate,
    journal_for,
    memory_domain,
    oom_kills,
    systemctl,
    tool_cgroups,
    wait_for,
)

SLICE = "eggate.slice"
BUDGET = 512 << 20
N = 3
# Each call ramps to 200 MiB over 8 s (25 MiB/s, 2.5 MiB per 100 ms control period; about as fast
# under TCG, where page faults are slower but still far above that rate): three of them need
# 600 MiB at once, the slice has 512. memload paces itself by the wall clock, so a held call
# catches up in a burst when released - the gate has to leave room for that too. All three start
# their ramps at one instant (--start-at): docker exec under TCG takes ~1 s, unevenly, and calls
# spread by more than a second no longer overlap enough to overrun the slice even eagerly.
RAMP = ["memload", "--peak-mib", "200", "--duration", "8", "--shape", "ramp", "--peak-at",
        "0.95", "--cpu", "0.2"]
LEAD_S = 30.0  # time for the execs to be under way (concurrent execs took up to 11 s to start;
#               at 15 s, three eager ramps on a slow two-lane host no longer overran the slice)
# max_queued_s at or below the wait: every call forced in at once (no-force off).
NO_ADMISSION = "[admission]\nmax_admission_wait_s = 0.0\nmax_queued_s = 0.0\n"
HELD_NOTE = b"paused by the memory growth gate"


def ramps(cids: list[str]) -> list[subprocess.CompletedProcess[bytes]]:
    argv = [*RAMP, "--start-at", f"{time.time() + LEAD_S:.3f}"]
    with concurrent.futures.ThreadPoolExecutor(len(cids)) as pool:
        return list(pool.map(lambda c: docker("exec", c, *argv, check=False, timeout=600),
                             cids))


@pytest.mark.parametrize("gate", ["sched_ext", "freeze"])
def test_gate_paces_growth_where_eager_oom_kills(containers: Containers, gate: str) -> None:
    domain = os.path.join(CGROOT, SLICE)
    config = f'gate = "{gate}"\n' + NO_ADMISSION  # lands in the [daemon] table
    with memory_domain(containers, SLICE, BUDGET, N, config) as cids:
        snap = daemon_view()
        assert snap["growth"]["actuator"] == gate, snap["growth"]
        systemctl("stop", "execgated")
        before = oom_kills(domain)
        eager = ramps(cids)
        assert oom_kills(domain) > before, [p.returncode for p in eager]
        systemctl("start", "execgated")
        wait_for(lambda: ctl_status()["source"].startswith("execgated pid"), what="daemon")
        assert daemon_view()["growth"]["actuator"] == gate
        before = oom_kills(domain)
        gated = ramps(cids)
        # The watcher journals a call just after its stderr closes (when docker exec returns).
        managed = lambda: [[e for e in journal_for(c) if e.get("managed")] for c in cids]  # noqa: E731
        wait_for(lambda: all(managed()), timeout=30, what="journal entries")
        entries = [found[-1] for found in managed()]
        print([(e["exit_code"], e["duration"], e["held_s"], e["memory_peak"] >> 20)
               for e in entries])
        assert oom_kills(domain) == before, [p.returncode for p in gated]
        assert [p.returncode for p in gated] == [0] * N, [p.stderr for p in gated]
        assert not any(e["killed_by_execgate"] for e in entries), entries
        assert max(e["held_s"] for e in entries) > 0.5, entries  # the gate really held calls
        # A call held for a noticeable share of its run is told so on its own stderr.
        told = [HELD_NOTE in p.stderr for p in gated]
        expected = [e["held_s"] >= 0.2 * e["duration"] for e in entries]
        assert any(expected) and told == expected, (told, entries, [p.stderr for p in gated])


def _procs(cg: str) -> list[int]:
    with contextlib.suppress(OSError), open(os.path.join(cg, "cgroup.procs")) as f:
        return [int(x) for x in f.read().split()]
    return []


def _policy(pid: int) -> int | None:
    """The scheduling policy of pid (7: SCHED_EXT), None once it is gone."""
    try:
        return os.sched_getscheduler(pid)
    except OSError:
        return None


def _frozen(domain: str) -> list[str]:
    """Tool-call cgroups of the domain that are frozen right now."""
    found = []
    for cg in glob.glob(os.path.join(domain, "*", "tool-*")):
        with contextlib.suppress(OSError), open(os.path.join(cg, "cgroup.events")) as f:
            if "frozen 1" in f.read():
                found.append(cg)
    return found


def _our_scheduler() -> bool:
    """execgate's sched_ext scheduler is loaded (the kernel's own account, in sysfs)."""
    return gate.state() == "enabled" and gate.scheduler_name() == "execgate"


@pytest.mark.parametrize("gate", ["sched_ext", "freeze"])
def test_daemon_killed_mid_hold_releases_the_calls(containers: Containers, gate: str) -> None:
    """kill -9 of execgated while the gate holds calls: they run again within seconds (the
    sched_ext scheduler dies with its loader; frozen cgroups are thawed by the restarted
    daemon) and every call runs to its end. Ungated meanwhile, the ramps may overrun the slice:
    an OOM kill (137) is what failing open costs, a call left hanging would be a bug."""
    domain = os.path.join(CGROOT, SLICE)
    config = f'gate = "{gate}"\n' + NO_ADMISSION
    with memory_domain(containers, SLICE, BUDGET, N, config) as cids, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert daemon_view()["growth"]["actuator"] == gate
        calls = pool.submit(ramps, cids)
        if gate == "freeze":
            wait_for(lambda: _frozen(domain), timeout=120, interval=0.05, what="a frozen call")
        else:
            wait_for(lambda: daemon_view()["growth"]["held"], timeout=120,
                     interval=0.2, what="a held call")  # (a hold lasts min_deny_s, 1 s)
            assert _our_scheduler()
            # Parked past max_park_s (1 s), a call is frozen instead and its tasks are fair again:
            # a parked task would keep its CPU from taking the host's fair work. (A frozen call
            # stays frozen until the gate allows it, 2 s or more later: polled at 0.1 s.)
            seen: list[set[int | None]] = []

            def frozen_fair() -> bool:
                for cg in _frozen(domain):
                    seen.append({_policy(pid) for pid in _procs(cg)})
                    if seen[-1] <= {0, None}:  # (the gate alone never freezes)
                        return True
                return False

            found = wait_for(lambda: frozen_fair() or len(seen) >= 20, timeout=120,
                             interval=0.1, what="a parked call frozen instead")
            assert found is True and seen[-1] <= {0, None}, seen
        systemctl("kill", "-s", "KILL", "execgated")
        t0 = time.monotonic()
        if gate == "freeze":
            wait_for(lambda: not _frozen(domain), timeout=120, interval=0.1, what="a thaw")
        else:
            wait_for(lambda: not _our_scheduler(), timeout=30, interval=0.05,
                     what="the scheduler to go")
        released_s = time.monotonic() - t0
        done = calls.result(timeout=600)
        print(f"{gate}: held calls released {released_s:.2f} s after kill -9, exits "
              f"{[p.returncode for p in done]}")
        assert all(p.returncode in (0, 137) for p in done), [(p.returncode, p.stderr)
                                                             for p in done]
        assert released_s < (5 if gate == "sched_ext" else 60), released_s
        wait_for(lambda: ctl_status()["source"].startswith("execgated pid"), timeout=120,
                 what="systemd to restart execgated")


def _usage_s(cg: str) -> float:
    with open(os.path.join(cg, "cpu.stat")) as f:
        return int(dict(line.split() for line in f)["usage_usec"]) / 1e6


def test_call_of_a_cpu_limited_container_keeps_its_limit(containers: Containers) -> None:
    """With the daemon's sched_ext gate loaded, a tool call of a `--cpus 0.5` container stays a
    fair task (the gate's partial switch gives SCHED_EXT to held calls only), so the
    container's cpu.max holds: at most 55 % of a CPU over 5 s."""
    slice_name = "egcpu.slice"
    os.makedirs(os.path.join(CGROOT, slice_name), exist_ok=True)
    config = 'gate = "sched_ext"\n' + NO_ADMISSION
    try:
        with memory_domain(containers, slice_name, 1 << 30, 0, config):
            assert daemon_view()["growth"]["actuator"] == "sched_ext"
            assert _our_scheduler()
            cid = containers.run("--cpus", "0.5")
            cg = container_cgroup(cid)
            call = subprocess.Popen(["docker", "exec", cid, "timeout", "40", "sh", "-c",
                                     "while :; do :; done"], stderr=subprocess.PIPE)
            try:
                tool = wait_for(lambda: next((os.path.join(cg, t) for t in tool_cgroups(cg)
                                              if _procs(os.path.join(cg, t))), None),
                                timeout=60, what="the call in its tool cgroup")
                time.sleep(1.0)
                u0, t0 = _usage_s(tool), time.monotonic()
                time.sleep(5.0)
                used = (_usage_s(tool) - u0) / (time.monotonic() - t0)
                policies = {pid: os.sched_getscheduler(pid) for pid in _procs(tool)}
                print(f"--cpus 0.5 call under the loaded gate: {used:.3f} CPUs, "
                      f"policies {policies}")
                assert _our_scheduler()
                assert set(policies.values()) == {0}, policies
                assert used <= 0.55, used
            finally:
                call.kill()
                call.wait(timeout=60)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(CGROOT, slice_name))
