"""The growth gate, driven by the daemon: with admission out of the way, calls that grow past
the domain's budget together are paced so none is OOM-killed, where eager execution kills."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess

import pytest
from conftest import (
    CGROOT,
    Containers,
    ctl_status,
    docker,
    journal_for,
    memory_domain,
    oom_kills,
    systemctl,
    wait_for,
)

SLICE = "eggate.slice"
BUDGET = 512 << 20
N = 3
# Each call ramps to 200 MiB over 8 s: three of them need 600 MiB at once, the slice has 512.
RAMP = ["memload", "--peak-mib", "200", "--duration", "8", "--shape", "ramp", "--peak-at",
        "0.95", "--cpu", "0.2"]
NO_ADMISSION = "[admission]\nmax_admission_wait_s = 0.0\n"


def ramps(cids: list[str]) -> list[subprocess.CompletedProcess[bytes]]:
    with concurrent.futures.ThreadPoolExecutor(len(cids)) as pool:
        return list(pool.map(lambda c: docker("exec", c, *RAMP, check=False, timeout=600),
                             cids))


@pytest.mark.parametrize("gate", ["sched_ext", "freeze"])
def test_gate_paces_growth_where_eager_oom_kills(containers: Containers, gate: str) -> None:
    domain = os.path.join(CGROOT, SLICE)
    config = f'gate = "{gate}"\n' + NO_ADMISSION  # lands in the [daemon] table
    with memory_domain(containers, SLICE, BUDGET, N, config) as cids:
        snap = ctl_status()["daemon"]
        assert snap["growth"]["actuator"] == gate, snap["growth"]
        systemctl("stop", "execgated")
        before = oom_kills(domain)
        eager = ramps(cids)
        assert oom_kills(domain) > before, [p.returncode for p in eager]
        systemctl("start", "execgated")
        wait_for(lambda: ctl_status()["source"].startswith("execgated pid"), what="daemon")
        before = oom_kills(domain)
        gated = ramps(cids)
        assert oom_kills(domain) == before, [p.returncode for p in gated]
        assert [p.returncode for p in gated] == [0] * N
        entries = [e for c in cids for e in journal_for(c) if e.get("managed")][-N:]
        assert max(e["held_s"] for e in entries) > 0.5, entries  # the gate really held calls
        held = [p for p in gated if b"[execgate]" in p.stderr]
        assert all(b"held" in p.stderr for p in held)
