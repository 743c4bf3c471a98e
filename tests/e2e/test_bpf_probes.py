"""bcc probes in execgated: a kernel OOM kill is attributed to its sandbox and tool call with a
timestamp, running calls show page-fault counts, and the daemon runs the same with probes off."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import (
    CONFIG,
    Containers,
    daemon_up,
    daemon_view,
    docker,
    journal_for,
    systemctl,
    wait_for,
)

OOM_RECORD = "/var/lib/execgate/oom-kills.jsonl"
RESULTS = os.environ.get("EXECGATE_RESULTS", "/tmp")


def probes() -> dict[str, Any]:
    return daemon_view()["probes"]


def _note(name: str, data: Any) -> None:
    with open(os.path.join(RESULTS, name), "a") as f:
        f.write(json.dumps(data) + "\n")


_backups = itertools.count()


@contextlib.contextmanager
def probes_set(value: str) -> Iterator[None]:
    """The daemon restarted with `[daemon] probes = value`; config and daemon restored after.
    (The test bed runs with probes off: bcc's ~25 s compile under TCG at every restart would
    load the other tests.)"""
    backup = f"{CONFIG}.probes-{next(_backups)}"  # these nest: the module's, then a test's
    shutil.copy(CONFIG, backup)
    try:
        with open(CONFIG) as f:
            text = f.read()
        assert "\n[daemon]\n" in text
        text = re.sub(r"(?m)^probes = .*\n", "", text)
        with open(CONFIG, "w") as f:
            f.write(text.replace("\n[daemon]\n", f"\n[daemon]\nprobes = {value}\n", 1))
        systemctl("restart", "execgated")
        yield
    finally:
        shutil.move(backup, CONFIG)
        systemctl("restart", "execgated")
        wait_for(daemon_up, timeout=120, what="execgated restored")


def _loaded() -> dict[str, Any]:
    return wait_for(lambda: (p := probes())["state"] != "loading" and p, timeout=600,
                    interval=1, what="the probes to load")


@pytest.fixture(scope="module")
def probes_on() -> Iterator[dict[str, Any]]:
    """The daemon with the default `probes = "auto"`, bcc done compiling."""
    with probes_set('"auto"'):
        wait_for(daemon_up, timeout=120, what="execgated")
        st = _loaded()
        _note("probes-status.json", st)
        assert st["state"] == "on", st
        yield st


class Events:
    """`execgatectl events` in the background, lines into a queue."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(["execgatectl", "events"], stdout=subprocess.PIPE, text=True)
        self.q: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.q.put(json.loads(line))

    def wait(self, pred: Any, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            try:
                ev = self.q.get(timeout=0.5)
            except queue.Empty:
                continue
            seen.append(ev)
            if pred(ev):
                return ev
        raise AssertionError(f"no matching event in {timeout}s; saw {seen[-10:]}")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def events() -> Iterator[Events]:
    ev = Events()
    time.sleep(1.0)  # subscribed before the exec runs
    yield ev
    ev.close()


def test_oom_kill_attributed_to_sandbox_and_call(probes_on: dict[str, Any],
                                                 containers: Containers, events: Events) -> None:
    cid = containers.run("--memory", "64m", "--memory-swap", "64m")
    t0 = time.time()
    p = docker("exec", cid, "memhog", "256", check=False, timeout=300)
    t1 = time.time()
    assert p.returncode == 137, (p.returncode, p.stderr)
    entry = wait_for(lambda: journal_for(cid), what="the journal entry")[-1]
    assert entry["oom_killed"], entry
    call, sandbox = entry["call"], entry.get("sandbox") or cid
    # memory.oom.group: the whole call is killed; the kernel's own victim (memhog) comes first
    ev = events.wait(lambda e: e.get("event") == "oom_kill" and e.get("container") == cid
                     and e.get("comm") == "memhog", timeout=30)
    _note("probes-oom-event.json", ev)
    assert ev["call"] == call and ev["sandbox"] == sandbox, (ev, entry)
    assert ev["comm"] == "memhog" and ev["anon_rss_kb"] > 32 << 10, ev
    assert ev["cgroup"].endswith("/" + call) and ev["cgroup_id"] > 0
    # µs wall-clock timestamp of the kill, inside the exec's run
    assert isinstance(ev["time_us"], int) and t0 - 1 <= ev["time_us"] / 1e6 <= t1 + 1, (t0, ev)
    assert ev["ktime_ns"] > 0
    st = probes()
    assert st["oom_kills_by_sandbox"].get(sandbox, 0) >= 1, st
    assert any(k["call"] == call for k in st["recent_oom_kills"])
    with open(OOM_RECORD) as f:
        assert any(json.loads(line)["call"] == call for line in f)
    out = subprocess.run(["execgatectl", "status"], capture_output=True, text=True, timeout=60)
    assert "OOM kills seen" in out.stdout, out.stdout


def test_running_call_shows_page_faults(probes_on: dict[str, Any],
                                        containers: Containers) -> None:
    """Fault counts per running call, and the growth gate takes them as growth evidence (a
    ramp's fault rate is a floor under its projected demand)."""
    cid = containers.run()
    seen: dict[str, dict[str, Any]] = {}
    burst: dict[str, float] = {}
    # 12 s: one `execgatectl status` takes seconds under TCG beside a second VM, and a 4 s ramp
    # was over before a poll saw its growth (burst_bps 0 in every sample, twice)
    ramp = ["memload", "--peak-mib", "96", "--duration", "12", "--shape", "ramp"]
    with subprocess.Popen(["docker", "exec", cid, *ramp]) as proc:
        while proc.poll() is None:
            daemon = daemon_view()
            for call, f in daemon["probes"]["faults"].items():
                if f["count"] >= seen.get(call, {}).get("count", -1):
                    seen[call] = f
            for call, g in (daemon["growth"]["calls"] or {}).items():
                burst[call] = max(burst.get(call, 0.0), g.get("burst_bps", 0.0))
            time.sleep(0.3)
    assert proc.returncode == 0
    call = journal_for(cid)[-1]["call"]
    _note("probes-faults.json", {"call": call, "faults": seen.get(call),
                                 "burst_bps": burst.get(call)})
    assert call in seen, seen
    # 96 MiB touched page by page (THP, if on, makes far fewer faults)
    assert seen[call]["count"] > 0, seen[call]
    assert burst.get(call, 0.0) > 0, burst


def test_daemon_runs_with_probes_off(containers: Containers) -> None:
    with probes_set("false"):
        wait_for(daemon_up, timeout=120, what="execgated with probes off")
        assert probes()["state"] == "off"
        cid = containers.run()
        assert docker("exec", cid, "echo", "ok").stdout == b"ok\n"
        assert journal_for(cid)[-1]["managed"]
    # on: the socket answers at once, bcc compiles in the background
    with probes_set('"auto"'):
        t0 = time.monotonic()
        wait_for(daemon_up, timeout=120, what="execgated")
        up_s = time.monotonic() - t0
        first = probes()["state"]
        st = _loaded()
        _note("probes-restart.json", {"daemon_up_s": round(up_s, 2), "first_state": first,
                                      "load_s": st["load_s"], "state": st["state"]})
        assert st["state"] == "on", st
        assert up_s < 30, up_s
