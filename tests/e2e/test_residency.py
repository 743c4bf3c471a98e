"""Residency: under pressure, idle sandboxes give their memory back and are frozen; their next
tool call thaws them, and so does a restarted daemon after a crash."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from conftest import (
    Containers,
    container_cgroup,
    ctl_status,
    daemon_view,
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
# Sandbox admission (tests/e2e/test_sandbox_admission.py) is off: the other sandbox starts at
# once, whatever its predicted baseline.
CONFIG = (f"[pressure]\nred_fraction = 0.3\n[residency]\nidle_after_s = {IDLE_S}\n"
          "thaw_after_green_s = 0.0\n[sandbox_admission]\nenabled = false\n")


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
    with open("/proc/swaps") as f:
        swaps = f.read().splitlines()[1:]
    return (f"slice memory.current {_int(slice_cg, 'memory.current') >> 20} MiB, sandbox "
            f"{_int(cg, 'memory.current') >> 20} MiB, frozen {_frozen(cg)}; other sandbox: "
            f"{state}; host swaps {swaps}; pressure {daemon.get('pressure')}; residency "
            f"{daemon.get('residency')}")


@contextlib.contextmanager
def _diagnosed(cg: str, hog: str) -> Iterator[None]:
    """Any failure inside says what the daemon and the kernel saw then."""
    try:
        yield
    except AssertionError as e:
        raise AssertionError(f"{e}; {_diagnosis(cg, hog)}") from None


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
        hog = containers.run("--cgroup-parent", SLICE, cmd=("memhog", str(HOG_MIB), "3600"))
        t0 = time.monotonic()
        with _diagnosed(cg, hog):
            wait_for(lambda: _frozen(cg), timeout=180, interval=0.2, what="the idle sandbox frozen")
            wait_for(lambda: _int(cg, "memory.current") < before - CACHE_MIB * MiB // 2,
                     timeout=120, interval=0.2, what="its page cache reclaimed")
            after = _int(cg, "memory.current")
            print(f"residency: frozen and reclaimed {before >> 20} -> {after >> 20} MiB "
                  f"{time.monotonic() - t0:.1f} s after the other sandbox started")
            hog_frozen = _frozen(container_cgroup(hog))  # before the snapshot that counts it
            snap = ctl_status()
            assert snap["daemon"]["pressure"]["state"] == "red"
            res = snap["daemon"]["residency"]
            assert res["frozen"] >= 1 and res["reclaims"] >= 1 and res["reclaimed_bytes"] > 0, res
            box = {b["id"]: b for b in snap["sandboxes"]}[cached]
            assert box["frozen"], box
            # The other sandbox (nothing to give: anonymous memory, no swap) is frozen too,
            # or not yet.
            assert not hog_frozen or res["frozen"] >= 2, res

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
            # Its call just ended under red (the action boundary) may have frozen it again
            # before the other sandbox left; thaw_after_green_s = 0 keeps it so until a call.
            docker("rm", "-f", hog)
            containers.ids.remove(hog)
            wait_for(lambda: daemon_view()["pressure"]["state"] == "green", timeout=120,
                     what="green pressure")
            docker("exec", cached, "true")  # its next call, now under green
            time.sleep(IDLE_S + 2)  # idle past idle_after_s, its call ended: not frozen
            assert not _frozen(cg)


# -- compressed swap: where an idle sandbox's anonymous memory goes --------------------------

SWAP_SLICE = "egswap.slice"
SWAP_BUDGET = 192 << 20
HOLD_MIB = 48  # the idle sandbox's baseline: anonymous, ~3:1 under zstd (tests/e2e/programs)
SWAP_HOG_MIB = 40  # another sandbox's init: the slice turns yellow, not red
SMALL_CALL = ("-e", "AGENT_RESOURCE_HINT=memory:4m")
# Yellow while headroom (available - S, S = 24 MiB) <= 55 % of the budget: from ~62 MiB used on;
# red only under 5 % (~158 MiB used), which the test never reaches. idle_after_s is long, so
# only the action boundary (its call has ended) makes the sandbox idle within the test.
# The swap room counts as memory by default ([headroom] count_swap): the domain would stay
# green and leave the pushing to the kernel. This test is of residency's own push, so it is off.
SWAP_CONFIG = ("[pressure]\nred_fraction = 0.05\nyellow_fraction = 0.5\n"
               "[residency]\nidle_after_s = 600.0\nkeep_bytes = \"8m\"\n"
               "[headroom]\ncount_swap = false\n"
               "[sandbox_admission]\nenabled = false\n")


@contextlib.contextmanager
def _compressed_swap(tmp: str) -> Iterator[str | None]:
    """The host's swap, or a zram device (zstd) made for the test with install.sh's own code
    and removed after it; yields the zram device made (None: the host's swap was used)."""
    from execgate.ctl import swap

    host = swap.Host()
    if host.swaps():
        yield None
        return
    plan, made = os.path.join(tmp, "swap.json"), os.path.join(tmp, "made.json")
    swap.save(plan, swap.Plan("zram", "e2e", 128 << 20).__dict__)
    print(swap.start(host, plan, made))
    try:
        yield (swap.load(made) or {}).get("device")
    finally:
        left = swap.stop(host, swap.load(made) or {})
        assert not left, left


def _stat(cg: str) -> dict[str, int]:
    with open(os.path.join(cg, "memory.stat")) as f:
        return {k: int(v) for k, v in (line.split() for line in f)}


def _sum(cid: str) -> str:
    """The idle sandbox's checksum of its whole baseline, read back by a tool call (every page
    touched: whatever went to swap is faulted back in)."""
    out = docker("exec", *SMALL_CALL, cid, "sh", "-c",
                 "rm -f /tmp/holdmem.sum; kill -USR1 1; "
                 "while [ ! -f /tmp/holdmem.sum ]; do sleep 1; done; cat /tmp/holdmem.sum",
                 timeout=300)
    return out.stdout.decode().strip()


def test_idle_anonymous_memory_goes_to_compressed_swap_after_its_call(
        containers: Containers, tmp_path: object) -> None:
    with _compressed_swap(str(tmp_path)) as zram, \
            memory_domain(containers, SWAP_SLICE, SWAP_BUDGET, 1, SWAP_CONFIG):
        box = containers.run("--cgroup-parent", SWAP_SLICE, cmd=("holdmem", str(HOLD_MIB)))
        cg = container_cgroup(box)
        wait_for(lambda: docker("exec", *SMALL_CALL, box, "test", "-f", "/tmp/holdmem.ready",
                                check=False).returncode == 0,
                 timeout=120, interval=0.5, what="the baseline filled")
        # Its call (reading the checksum) ends: the action boundary, while the domain is green.
        ready = docker("exec", *SMALL_CALL, box, "cat", "/tmp/holdmem.ready").stdout.decode()
        with open(os.path.join(cg, "init", "memory.swap.max")) as f:
            assert f.read().strip() == "max", "init/ may swap ([residency] swap_max)"
        anon0 = _stat(cg)["anon"]
        assert anon0 >= HOLD_MIB * MiB * 9 // 10, anon0
        assert _int(cg, "memory.swap.current") == 0

        # Another sandbox takes the domain into yellow: the idle one's memory goes to swap.
        hog = containers.run("--cgroup-parent", SWAP_SLICE,
                             cmd=("memhog", str(SWAP_HOG_MIB), "3600"))
        t0 = time.monotonic()
        try:
            wait_for(lambda: _int(cg, "memory.swap.current") > HOLD_MIB * MiB // 2,
                     timeout=240, interval=0.5, what="the idle baseline swapped out")
            wait_for(lambda: _stat(cg)["anon"] < anon0 // 2, timeout=60, interval=0.5,
                     what="most of its anonymous memory gone from RAM")
        except AssertionError as e:
            raise AssertionError(f"{e}; {_diagnosis(cg, hog)}") from None
        took = time.monotonic() - t0
        swapped, anon = _int(cg, "memory.swap.current"), _stat(cg)["anon"]
        # the reclaim is counted once memory.reclaim has returned (it may still be at work)
        wait_for(lambda: daemon_view()["residency"]["reclaims"] >= 1, timeout=120,
                 interval=0.5, what="the reclaim counted")
        snap = ctl_status()
        entry = {b["id"]: b for b in snap["sandboxes"]}[box]
        assert entry["memory_swap_current"] > HOLD_MIB * MiB // 2, entry
        assert entry["memory_anon"] < anon0 // 2, entry
        assert not _frozen(cg), "yellow reclaims, it does not freeze"
        ratio = None
        if zram:
            from execgate.ctl import swap

            mm = swap.zram_mm_stat(swap.Host(), zram)
            assert mm and mm["compr_data_size"] > 0, mm
            ratio = mm["orig_data_size"] / mm["compr_data_size"]
            assert 1.5 < ratio < 10, f"realistic data compresses ~3:1, not {ratio:.1f}:1 ({mm})"
        print(f"swap: {anon0 >> 20} MiB anon -> {anon >> 20} MiB in RAM, {swapped >> 20} MiB "
              f"swapped, {took:.1f} s after the domain turned yellow; zram ratio "
              f"{ratio and f'{ratio:.2f}'}:1")

        # Its next call reads every page back (swap-in is lazy) and gets the same data.
        t1 = time.monotonic()
        assert _sum(box) == ready.strip()
        print(f"swap-in: checksum matched in {time.monotonic() - t1:.1f} s; anon now "
              f"{_stat(cg)['anon'] >> 20} MiB")
        assert _stat(cg)["anon"] >= HOLD_MIB * MiB * 9 // 10
        docker("rm", "-f", box, hog)  # before the swap goes: nothing left to swap back in
        containers.ids.remove(box)
        containers.ids.remove(hog)
