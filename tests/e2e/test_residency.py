"""Residency: under pressure, idle sandboxes give their memory back and are frozen; their next
tool call thaws them, and so does a restarted daemon after a crash."""

from __future__ import annotations

import os
import time

from conftest import (
    Containers,
    container_cgroup,
    ctl_status,
    docker,
    memory_domain,
    systemctl,
    wait_for,
)

SLICE = "egres.slice"
BUDGET = 640 << 20
MiB = 1 << 20
IDLE_S = 5.0
CACHE_MIB = 200  # page cache the first sandbox keeps from its last call
HOG_MIB = 380  # the second sandbox's init holds this: the slice turns red ...
# ... and stays red once the cache is reclaimed (red while headroom <= 30 % of the budget), so
# the crash and the next call meet a frozen sandbox; frozen sandboxes stay frozen until their
# next call (no thaw on green), so the test sees what residency did.
CONFIG = (f"[pressure]\nred_fraction = 0.3\n[residency]\nidle_after_s = {IDLE_S}\n"
          "thaw_after_green_s = 0.0\n")


def _int(cg: str, name: str) -> int:
    with open(os.path.join(cg, name)) as f:
        return int(f.read().strip())


def _frozen(cg: str) -> bool:
    return _int(os.path.join(cg, "init"), "cgroup.freeze") == 1


def _diagnosis(cg: str, hog: str) -> str:
    """What the daemon and the kernel saw, for a failure message."""
    daemon = ctl_status().get("daemon") or {}
    slice_cg = os.path.dirname(cg)
    state = docker("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}",
                   hog, check=False).stdout.decode().strip()
    return (f"slice memory.current {_int(slice_cg, 'memory.current') >> 20} MiB, sandbox "
            f"{_int(cg, 'memory.current') >> 20} MiB, frozen {_frozen(cg)}; other sandbox: "
            f"{state}; pressure {daemon.get('pressure')}; residency {daemon.get('residency')}")


def test_idle_sandboxes_are_reclaimed_and_frozen_under_pressure(containers: Containers) -> None:
    with memory_domain(containers, SLICE, BUDGET, 1, CONFIG) as (cached,):
        cg = container_cgroup(cached)
        # A call leaves page cache behind (charged to the sandbox once the call is gone).
        docker("exec", cached, "sh", "-c",
               f"dd if=/dev/zero of=/cache bs=1M count={CACHE_MIB} 2>/dev/null && sync")
        before = _int(cg, "memory.current")
        assert before > CACHE_MIB * MiB * 3 // 4, before
        assert not _frozen(cg)
        # Another sandbox's resident memory takes the slice into red.
        hog = containers.run("--cgroup-parent", SLICE, cmd=(
            "memload", "--peak-mib", str(HOG_MIB), "--duration", "3600", "--hold", "3600"))
        t0 = time.monotonic()
        try:
            wait_for(lambda: _frozen(cg), timeout=180, interval=0.2,
                     what="the idle sandbox frozen")
            wait_for(lambda: _int(cg, "memory.current") < before - CACHE_MIB * MiB // 2,
                     timeout=120, interval=0.2, what="its page cache reclaimed")
        except AssertionError as e:
            raise AssertionError(f"{e}; {_diagnosis(cg, hog)}") from None
        after = _int(cg, "memory.current")
        print(f"residency: frozen and reclaimed {before >> 20} -> {after >> 20} MiB "
              f"{time.monotonic() - t0:.1f} s after the other sandbox started")
        snap = ctl_status()
        assert snap["daemon"]["pressure"]["state"] == "red", _diagnosis(cg, hog)
        res = snap["daemon"]["residency"]
        assert res["frozen"] >= 1 and res["reclaims"] >= 1 and res["reclaimed_bytes"] > 0, res
        box = {b["id"]: b for b in snap["sandboxes"]}[cached]
        assert box["frozen"], box
        assert not _frozen(container_cgroup(hog)) or res["frozen"] >= 2  # frozen too, or not yet

        # A crash never leaves a sandbox frozen: the restarted daemon thaws it.
        systemctl("kill", "-s", "KILL", "execgated")
        wait_for(lambda: not _frozen(cg), timeout=120, interval=0.05,
                 what="the restarted daemon to thaw the sandbox")

        # Frozen again (still idle, still red); its next tool call thaws it and runs normally.
        wait_for(lambda: _frozen(cg), timeout=120, interval=0.2, what="the sandbox refrozen")
        out = docker("exec", cached, "echo", "back")
        assert out.stdout == b"back\n" and out.stderr == b"", out
        assert not _frozen(cg), "the call's sandbox is thawed before the call runs"

        # Pressure gone: an idle sandbox is left alone (freezing answers pressure only).
        docker("rm", "-f", hog)
        containers.ids.remove(hog)
        wait_for(lambda: ctl_status()["daemon"]["pressure"]["state"] == "green", timeout=120,
                 what="green pressure")
        time.sleep(IDLE_S + 2)
        assert not _frozen(cg)
