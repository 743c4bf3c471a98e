"""Swap room counts as memory until the domain thrashes (policy/swap_credit.py): two calls whose
declared peaks do not fit beside an idle sandbox's memory run together where compressed swap
can take that memory (the kernel swaps it out under the calls), and one waits for the other
where swap does not count. Small volumes: zram compression is emulated under TCG."""

from __future__ import annotations

import os
import subprocess
import time

from conftest import CGROOT, Containers, journal_for, memory_domain, oom_kills, wait_for
from test_residency import _compressed_swap, _int

MiB = 1 << 20
SLICE = "egcredit.slice"
BUDGET = 128 * MiB  # S = 16 MiB: 112 MiB to hand out
FILL_MIB = 56  # an idle sandbox's memory, written once (cold)
CALL_MIB = 36  # each call's memory, declared as 40 MiB: 56 + 40 + 40 > 112
HINT = ("-e", "AGENT_RESOURCE_HINT=memory:40m")
# A call waits at most this long, then goes first in line (it still never runs into red).
CONFIG = "[admission]\nmax_admission_wait_s = 60.0\n"


def _two_calls(containers: Containers, config: str) -> tuple[list[float], int]:
    """(admission waits of the two calls, OOM kills in the slice) with an idle filler beside."""
    with memory_domain(containers, SLICE, BUDGET, 2, config) as (a, b):
        domain = os.path.join(CGROOT, SLICE)
        containers.run("--cgroup-parent", SLICE, cmd=("memhog", str(FILL_MIB), "3600"))
        wait_for(lambda: _int(domain, "memory.current") >= (FILL_MIB - 2) * MiB, timeout=120,
                 what="the filler's memory")
        time.sleep(2)  # the daemon samples the filled domain
        procs = [subprocess.Popen(["docker", "exec", *HINT, cid, "memhog", str(CALL_MIB), "15"])
                 for cid in (a, b)]
        for p in procs:
            assert p.wait(timeout=600) == 0
        waits = [float(e.get("waited_s") or 0.0) for cid in (a, b) for e in journal_for(cid)]
        return waits, oom_kills(domain)


def test_calls_run_together_on_swap_room_and_wait_without_it(
        containers: Containers, tmp_path) -> None:
    with _compressed_swap(str(tmp_path)):
        waits, kills = _two_calls(containers, CONFIG)
        assert len(waits) == 2 and kills == 0
        assert max(waits) < 5.0, f"both admitted at once on the swap room: waits {waits}"
        # Free memory only (nor what idle sandboxes could give back: the idle room).
        waits_off, kills_off = _two_calls(
            containers, CONFIG + "[headroom]\ncount_swap = false\ncount_idle = false\n")
        assert len(waits_off) == 2 and kills_off == 0
        # Without it the second waits for the first call's end (15 s of holding, under TCG more).
        assert max(waits_off) >= 10.0, f"one call waits for the other: waits {waits_off}"
    print(f"waits with the swap credit {waits}, without {waits_off}")
