"""Open: admission across in-sandbox agents. In the last VM run (after the admission change of
808ef9e/7d354ab) all four 200 MiB children in a 640 MiB domain succeeded with no OOM kill, but
none waited at admission (waited_s [0.003, 0.001, 0.01, 0.001]): admission let 4 x 220 MiB start
at once and the growth gate alone kept the domain out of OOM. For `docker exec` calls (which
arrive ~1 s apart under TCG) test_daemon.py still sees them wait. Not investigated yet (the
inside path asks for admission while the child is already placed and frozen). Move back into
test_inside_agent.py when fixed."""

from __future__ import annotations

import time

from conftest import Containers, daemon_up, docker, systemctl, wait_for
from test_inside_agent import (
    CALL_MIB,
    N_BOXES,
    _burst,
    _go,
    _results,
    domain,
    inside_entries,
    report,
)

__all__ = ["domain"]  # the fixture, imported for the test below


def test_admission_across_sandboxes_prevents_oom(domain: Containers) -> None:
    # Plain runc: the burst overruns the slice and the kernel kills.
    cids = _burst(domain, "runc")
    _go(cids)
    eager = _results(cids, 300)
    assert any(r != "0" for r in eager), eager
    docker("rm", "-f", *cids)
    domain.ids.clear()
    # execgate with inside agents: later calls wait (frozen) for earlier ones; none is killed.
    cids = _burst(domain, "execgate")
    systemctl("restart", "execgated")
    wait_for(daemon_up, what="execgated")
    time.sleep(1)  # the restarted daemon reads the records of the running agents
    _go(cids)
    gated = _results(cids, 600)
    assert gated == ["0"] * N_BOXES, gated
    entries = [e for cid in cids for e in inside_entries(cid)]
    runs = [e for e in entries if e["argv"][0] in ("sh", "memhog")]
    assert len(runs) == N_BOXES and not any(e["oom_killed"] for e in runs)
    assert max(e["waited_s"] for e in runs) > 1.0, [e["waited_s"] for e in runs]
    assert all(e["hint"]["memory_bytes"] == (CALL_MIB + 20) << 20 for e in runs)
    report("admission_across_sandboxes", {
        "eager": eager, "gated": gated,
        "waited_s": [e["waited_s"] for e in runs],
        "rss_before_bytes": [e["inside"]["rss_before_bytes"] for e in runs],
        "anon_before_bytes": [e["inside"]["anon_before_bytes"] for e in runs],
        "memory_after_move": [e["inside"]["memory_after_move"] for e in runs],
        "placement_us": [e["inside"]["placement_us"] for e in runs],
        "move_us": [e["inside"]["move_us"] for e in runs],
    })
