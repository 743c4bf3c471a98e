"""Sandbox admission (issue 15 §1): a managed container's create waits, before runc create,
until its predicted baseline and room for one call fit; a dead daemon or an expired wait lets
it through (fail open, counted); an idle sandbox's memory pushed into compressed swap makes the
room (§2)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import conftest
from conftest import (
    CGROOT,
    IMAGE,
    RUNTIME,
    Containers,
    container_cgroup,
    ctl_status,
    daemon_view,
    docker,
    memory_domain,
    oom_kills,
    systemctl,
    wait_for,
)

from execgate.common import config, protocol
from execgate.common.units import MiB

SLICE = "egsa.slice"
BUDGET = 256 * MiB  # S = 32 MiB (1/8 of it): room 224 MiB
FILL_MIB = 150  # the filler's init holds this: 150 + 64 baseline + 32 one call > 224
# A new image's baseline and a sandbox's next call before any history; residency gives nothing
# back (reclaim off), so the filler's memory is pinned ...
CONFIG = ('[sandbox_admission]\ndefault_baseline_bytes = "64m"\n'
          'default_call_peak_bytes = "32m"\nmax_start_wait_s = {wait}\n'
          "[residency]\nreclaim = {reclaim}\n")
PINNED = CONFIG.format(wait="{wait}", reclaim="false")
# ... except where the test gives it swap to go to.
FILLER = ("memload", "--peak-mib", str(FILL_MIB), "--duration", "3600", "--hold", "3600")


def _admission() -> dict:
    return daemon_view()["sandbox_admission"]


def _start_of(cid: str) -> dict:
    """How the runtime's create of cid was admitted (its record, as status shows it)."""
    [box] = [b for b in ctl_status()["sandboxes"] if b["id"] == cid]
    return box["start"] or {}


def _memory(cg: str) -> int:
    with open(os.path.join(cg, "memory.current")) as f:
        return int(f.read())


def _fill(containers: Containers) -> str:
    """A sandbox whose init holds FILL_MIB in the slice (admitted: the slice has room)."""
    filler = containers.run("--cgroup-parent", SLICE, cmd=FILLER)
    cg = container_cgroup(filler)
    wait_for(lambda: _memory(cg) >= (FILL_MIB - 10) * MiB, timeout=120, interval=0.2,
             what=f"the filler to hold {FILL_MIB} MiB")
    return filler


def _create(containers: Containers, name: str, *cmd: str,
            opts: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """`docker run` in the slice, in the background: it returns once the create is let through."""
    containers.ids.append(name)
    return subprocess.Popen(["docker", "run", "-d", "--name", name, "--runtime", RUNTIME,
                             "--cgroup-parent", SLICE, *opts, IMAGE,
                             *(cmd or ("sleep", "inf"))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen[bytes], timeout: float = 180) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, (out, err)
    return out.decode().strip()


def _waiting() -> dict | None:
    """The one create waiting, as status shows it. Not looked up by `docker inspect`: moby
    holds the container's lock through its start, so inspect waits as long as the create."""
    waiting = _admission()["waiting"]
    assert len(waiting) <= 1, waiting
    return waiting[0] if waiting else None


def test_a_create_waits_for_room_and_starts_when_a_sandbox_leaves(
        containers: Containers) -> None:
    """With no bound on the wait (`inf`, as for a Docker fleet under sustained overload)."""
    with memory_domain(containers, SLICE, BUDGET, 1, PINNED.format(wait="inf")):
        filler = _fill(containers)
        t0 = time.monotonic()
        proc = _create(containers, "egsa-second")
        w = wait_for(_waiting, timeout=120, interval=0.5, what="the second create waiting")
        print(f"waiting: {w['reason']}")
        assert "short" in w["reason"] and w["baseline_bytes"] == 64 * MiB, w
        assert "(no bound)" in w["reason"] and w["deadline"] is None, w
        assert _admission()["max_start_wait_s"] is None
        time.sleep(3)  # it keeps waiting while the filler is there
        still = _waiting()
        assert proc.poll() is None and still and still["sandbox_id"] == w["sandbox_id"], still
        docker("rm", "-f", filler)
        containers.ids.remove(filler)
        cid = _finish(proc)
        assert cid == w["sandbox_id"]
        waited = time.monotonic() - t0
        start = _start_of(cid)
        assert start["admitted"] is True and start["verdict"] == "admitted", start
        assert start["waited_s"] >= 3, start
        print(f"second create waited {start['waited_s']:.1f} s (docker run {waited:.1f} s)")
        # It runs normally.
        out = docker("exec", cid, "sh", "-c", "echo ok; echo $((6 * 7))")
        assert out.stdout == b"ok\n42\n" and out.stderr == b"", out
        sa = _admission()
        assert sa["waiting"] == [] and sa["totals"]["admitted"] >= 2, sa
        assert sa["totals"]["fail-open"] == 0, sa
        # The filler's baseline is learned for its image, the wait is in the daemon's log.
        assert sa["images"]["cmd:memload"]["baseline_bytes"] >= (FILL_MIB - 10) * MiB, sa
        logged = subprocess.run(["journalctl", "-u", "execgated", "-o", "cat", "--no-pager",
                                 "-n", "200"], capture_output=True, text=True, timeout=60)
        assert f"sandbox {cid[:12]} waited" in logged.stdout, logged.stdout[-2000:]


def test_a_live_sandbox_teaches_its_images_baseline_before_one_finished(
        containers: Containers) -> None:
    """learn_from_live: no sandbox of the image has finished, so its default (64 MiB) would
    serve; the filler, of the same image, holds 150 MiB, and that is what the next create of
    it is predicted to hold. (A create of another image keeps the default: the first test.)"""
    with memory_domain(containers, SLICE, BUDGET, 1, PINNED.format(wait="inf")):
        filler = _fill(containers)
        assert _admission()["images"] == {}, _admission()["images"]  # nothing finished
        proc = _create(containers, "egsa-same", *FILLER[:1], "--peak-mib", "8",
                       "--duration", "3600", "--hold", "3600")
        w = wait_for(_waiting, timeout=120, interval=0.5, what="the create of the same image")
        print(f"waiting: {w['reason']}")
        assert w["baseline_bytes"] >= (FILL_MIB - 10) * MiB, w
        assert w["source"] == "live sandboxes (none finished)", w
        docker("rm", "-f", filler)
        containers.ids.remove(filler)
        cid = _finish(proc)
        assert _start_of(cid)["verdict"] == "admitted"
        # The filler finished: its image's history speaks now.
        images = wait_for(lambda: _admission()["images"], timeout=60, interval=0.5,
                          what="the filler's baseline learned")
        assert images["cmd:memload"]["finished"] == 1, images


def test_a_finished_sandbox_teaches_its_images_call_load(containers: Containers) -> None:
    """A sandbox's calls, peak x duration over its life, become its image's call load: what
    each live sandbox of that image is expected to hold in calls at any moment."""
    with memory_domain(containers, SLICE, BUDGET, 1, PINNED.format(wait=100.0)):
        cid = containers.run("--cgroup-parent", SLICE)
        out = docker("exec", cid, "memload", "--peak-mib", "40", "--duration", "4", "--hold", "3")
        assert out.returncode == 0, out
        time.sleep(2)  # a life longer than its call: its load is a fraction of the peak
        docker("rm", "-f", cid)
        containers.ids.remove(cid)

        def learned() -> dict | None:
            images = _admission()["images"]
            return next((v for v in images.values() if v.get("call_load_bytes")), None)
        image = wait_for(learned, timeout=60, interval=0.5, what="the image's call load")
        print(f"learned: {image}")
        assert 0 < image["call_load_bytes"] < 40 * MiB, image


def test_a_finished_sandbox_teaches_what_it_started_with_and_what_its_calls_left(
        containers: Containers) -> None:
    """A new sandbox of the image is predicted to arrive with what this one held before its
    first call; its live ones are set aside to grow to what it held outside calls at its
    largest, what its call left in /dev/shm included (charged to the sandbox once the call's
    cgroup is gone). Until 5 Dec the daemon learned the first alone, and the policy's growth
    term, meant for the leftovers, never saw them."""
    with memory_domain(containers, SLICE, BUDGET, 1, PINNED.format(wait=100.0)):
        cid = containers.run("--cgroup-parent", SLICE, cmd=(
            "memload", "--peak-mib", "20", "--duration", "3600", "--hold", "3600"))
        cg = container_cgroup(cid)
        wait_for(lambda: _memory(cg) >= 18 * MiB, timeout=120, interval=0.2,
                 what="the sandbox to hold 20 MiB")
        # A rescan (every 2 s) sees it before its first call ...
        wait_for(lambda: _admission()["live"] >= 1, timeout=60, interval=0.5,
                 what="the daemon to find the sandbox")
        time.sleep(3)
        out = docker("exec", cid, "memload", "--peak-mib", "30", "--duration", "1",
                     "--retain-mib", "30")  # (memload refuses to retain more than its peak)
        assert out.returncode == 0, out
        time.sleep(8)  # ... and one between calls, with the 30 MiB left in /dev/shm
        held = _memory(cg)
        docker("rm", "-f", cid)
        containers.ids.remove(cid)

        def learned() -> dict | None:
            return _admission()["images"].get("cmd:memload")
        image = wait_for(learned, timeout=60, interval=0.5, what="the sandbox's baselines")
        print(f"held {held >> 20} MiB between calls; learned: {image}")
        assert image["finished"] == 1, image
        assert 16 * MiB <= image["baseline_bytes"] <= 30 * MiB, image
        assert image["grows_to_bytes"] >= image["baseline_bytes"] + 25 * MiB, image


def test_an_expired_wait_and_a_dead_daemon_let_creates_through(containers: Containers) -> None:
    """A create kubelet asked for (a CRI runtime's io.kubernetes.* annotations) waits at most
    max_start_wait_s, below kubelet's 2-minute timeout; Docker's own, which nothing times out,
    waits on (max_start_wait_s_no_deadline: inf by default), also when it came first."""
    with memory_domain(containers, SLICE, BUDGET, 1, PINNED.format(wait=10.0)):
        filler = _fill(containers)
        patient = _create(containers, "egsa-patient")
        first = wait_for(_waiting, timeout=120, interval=0.5, what="the Docker create waiting")
        assert first["caller_deadline"] is False and first["deadline"] is None, first
        assert _admission()["max_start_wait_s_no_deadline"] is None
        late = _create(containers, "egsa-late", opts=(
            "--annotation", "io.kubernetes.cri.container-type=container"))
        cid = _finish(late)
        start = _start_of(cid)
        assert start["admitted"] is True and start["verdict"] == "fail-open", start
        assert start["waited_s"] >= 9, start  # behind the Docker create, at its own bound
        assert _admission()["totals"]["fail-open"] == 1
        out = docker("exec", cid, "echo", "late")
        assert out.stdout == b"late\n", out
        # The Docker create, first in line, waits on past the kubelet bound, no fail-open ...
        still = _waiting()
        assert still and still["sandbox_id"] == first["sandbox_id"] and patient.poll() is None
        assert still["waited_s"] >= 10 and "(no bound)" in still["reason"], still
        # ... and starts, admitted, once the filler leaves.
        docker("rm", "-f", filler)
        containers.ids.remove(filler)
        cid = _finish(patient)
        start = _start_of(cid)
        assert start["admitted"] is True and start["verdict"] == "admitted", start
        assert _admission()["totals"]["fail-open"] == 1
        # A dead daemon never holds a create: it starts at once, unadmitted, and says so.
        systemctl("stop", "execgated")
        dead = containers.run("--cgroup-parent", SLICE)
        start = _start_of(dead)
        assert start["admitted"] is False and start["verdict"] == "no-daemon", start
        assert start["waited_s"] == 0.0
        out = docker("exec", dead, "echo", "alone")
        assert out.stdout == b"alone\n", out


def test_an_idle_sandbox_makes_room_for_a_create_through_compressed_swap(
        containers: Containers, tmp_path: Path) -> None:
    from test_residency import _compressed_swap

    with _compressed_swap(str(tmp_path)), \
            memory_domain(containers, SLICE, BUDGET, 1,
                          CONFIG.format(wait=100.0, reclaim="true")):
        filler = _fill(containers)
        cg = container_cgroup(filler)
        cid = _finish(_create(containers, "egsa-swapped"))
        start = _start_of(cid)
        # Admitted on what the idle filler can give back, not after the whole wait.
        assert start["verdict"] == "admitted" and start["waited_s"] < 60, start
        wait_for(lambda: _memory_swapped(cg) > 4 * MiB, timeout=180, interval=0.5,
                 what="the filler's memory pushed into swap")
        res = daemon_view()["residency"]
        print(f"create waited {start['waited_s']:.1f} s; filler swapped "
              f"{_memory_swapped(cg) >> 20} MiB; residency {res}")
        for box, word in ((cid, "new"), (filler, "idle")):  # both run normally
            out = docker("exec", box, "echo", word)
            assert out.stdout == f"{word}\n".encode(), out
        docker("rm", "-f", filler, cid)  # before the swap goes: nothing left to swap back in
        containers.ids.remove(filler)


def _memory_swapped(cg: str) -> int:
    with open(os.path.join(cg, "memory.swap.current")) as f:
        return int(f.read())


# Two calls hold 100 MiB each; a new sandbox's baseline (64 MiB) does not fit beside them in
# budget - S (1 + 200 + 64 > 224) but does once the calls may run on the swap credit (free swap
# less S: 96 MiB of the test's 128 MiB zram). The calls term counts what running calls hold
# or were charged, whichever is more (a first call's charge is its predicted average, not its
# declared peak: call admission's logical charge). Swap-out is configured slow so that what
# swap absorbs of the arriving baseline (bandwidth x start) stays small and the calls term
# decides; a live sandbox's growth toward the default baseline is not reserved (it would take
# the free swap first).
ON_SWAP = ('[sandbox_admission]\ndefault_baseline_bytes = "64m"\n'
           'default_call_peak_bytes = "32m"\nmax_start_wait_s = 300\nreserve_growth = false\n'
           'calls_on_swap = {on}\n[residency]\nreclaim = true\n'
           '[headroom]\nswap_out_bytes_per_s = "1m"\n')
CALL_MIB = 100
DECLARED = ("-e", f"AGENT_RESOURCE_HINT=memory:{CALL_MIB}m")


def _create_beside_two_calls(containers: Containers, on: bool, hold_s: int
                             ) -> tuple[dict, dict, bool, int]:
    """(the create's start record, its admission event, whether both calls still ran when its
    `docker run` returned, OOM kills in the slice)."""
    with memory_domain(containers, SLICE, BUDGET, 2,
                       ON_SWAP.format(on=str(on).lower())) as (a, b):
        domain = os.path.join(CGROOT, SLICE)
        calls = [subprocess.Popen(["docker", "exec", *DECLARED, cid, "memhog",
                                   str(CALL_MIB), str(hold_s)]) for cid in (a, b)]
        wait_for(lambda: _memory(domain) >= 2 * (CALL_MIB - 4) * MiB, timeout=120, interval=0.5,
                 what="both calls' memory")
        with protocol.Client(config.load(conftest.CONFIG).socket, timeout=600) as events:
            events.send(protocol.request("events"))
            assert events.recv().get("subscribed"), "the daemon's event stream"
            name = f"egsa-calls-{'on' if on else 'off'}-swap"
            proc = _create(containers, name)
            if not on:  # it waits for the calls, and the reason has no swap in its calls term
                w = wait_for(_waiting, timeout=120, interval=0.5, what="the create waiting")
                print(f"waiting: {w['reason']}")
                assert "short" in w["reason"] and "on swap" not in w["reason"], w
            event = events.recv()
            while (event.get("event"), event.get("of")) != ("admitted", "sandbox"):
                event = events.recv()
        cid = _finish(proc, timeout=600)
        during = all(c.poll() is None for c in calls)
        assert event["sandbox"] == cid, event
        for c in calls:
            assert c.wait(timeout=600) == 0
        assert docker("exec", cid, "echo", "ok").stdout == b"ok\n"
        result = _start_of(cid), event, during, oom_kills(domain)
        for box in (a, b, name):  # the next domain starts empty
            docker("rm", "-f", box)
            containers.ids.remove(box)
        return result


def test_a_create_starts_beside_calls_that_run_on_the_swap_credit(
        containers: Containers, tmp_path: Path) -> None:
    """calls_on_swap: call admission runs calls on the swap room; sandbox admission counts the
    same room, so a create is not held until calls end while swap has room for them."""
    from test_residency import _compressed_swap

    with _compressed_swap(str(tmp_path)):
        start, event, during, kills = _create_beside_two_calls(containers, True, 60)
        print(f"on swap: {start}; {event['reason']}")
        assert start["verdict"] == "admitted" and start["waited_s"] < 30, start
        assert "on swap" in event["reason"] and during and kills == 0, (event, during, kills)
        start, event, during, kills = _create_beside_two_calls(containers, False, 45)
        print(f"without: {start}; {event['reason']}")
        # It waited for the calls' end (45 s of holding): admitted after, not failed open.
        assert start["verdict"] == "admitted" and start["waited_s"] >= 10, start
        assert "on swap" not in event["reason"] and not during and kills == 0, (event, kills)
