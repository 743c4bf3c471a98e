"""A cgroup per exec, soaked through the daemon (issue 21, item 12): N managed calls handed over
by the compiled front's `exec` op, in 100 containers and one long-lived one, leave nothing
behind in the daemon: no call, charge, thread, descriptor or tool cgroup, and one journal line
each; its memory does not grow with the calls.

The daemon is `execgated`'s server, engine and exec op on a temp domain (test_daemon_admit's);
each peer is a process forked by a single-threaded factory, as the front is one process per
call, so SO_PEERCRED, pidfd_open and pidfd_getfd are the real ones. The kernel's part (dying
memory cgroups) is bench/exec_soak.py's, in the VM. EXECGATE_SOAK_N sets N (default 600; the
recorded run: docs/soak/daemon-20000.json).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from test_daemon_admit import daemon
from test_daemon_exec_op import PEER, _exec, _spec

from execgate.common import records

N = int(os.environ.get("EXECGATE_SOAK_N", "600"))
BOXES = 100
STEP = max(N // 10, 1)

# Runs the calls one after the other: a forked child per call speaks PEER's part (connect, the
# exec request, frames until the argv) and exits, as the front execs runc; a line per STEP.
FACTORY = r"""
import json, os, socket, struct, sys
import msgpack  # the peers' imports, done once: each fork inherits them
path, n, step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
requests = json.loads(sys.stdin.readline())
peer = compile(sys.stdin.read(), "peer", "exec")
failed = 0
for i in range(n):
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        sys.argv = ["peer", path, json.dumps(requests[i % len(requests)])]
        try:
            exec(peer, {"__name__": "__main__"})
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    failed += status != 0
    if (i + 1) % step == 0:
        print(json.dumps({"done": i + 1, "failed": failed}), flush=True)
"""


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _followers() -> int:
    """The daemon's follower threads (a call each; the executor's idle threads are not ours)."""
    return sum(t.name.startswith("follow-") for t in threading.enumerate())


def _journaled(journal: Path) -> list[bytes]:
    """Every journal line, the rotated parts (calls.jsonl.1, .2 ...: retention) included."""
    return [line for part in sorted(journal.parent.glob(journal.name + "*"))
            for line in part.read_bytes().splitlines()]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_n_calls_through_the_daemon_leave_nothing_behind(tmp_path: Path) -> None:
    async def scenario() -> dict[str, Any]:
        async with daemon(tmp_path) as d:
            state = d.engine.cfg.state_dir
            boxes = [d.box]
            for i in range(BOXES):
                cg = d.box.parent / f"box{i}"
                (cg / "init").mkdir(parents=True)
                records.save_container(state, {"id": f"box{i}", "sandbox": f"box{i}",
                                               "managed": True, "cgroup": str(cg)})
                boxes.append(cg)
            (d.box / "init").mkdir()
            spec = _spec(tmp_path, ["pytest", "-q"], ["AGENT_RESOURCE_HINT=mem=50m"])
            # Half the calls in the long-lived box, the rest across the hundred.
            requests = [_exec(["--detach", "--process", spec, b.name])
                        for b in [d.box] * BOXES + boxes[1:]]
            await asyncio.sleep(0.5)
            base = {"fds": _fds()}
            factory = await asyncio.create_subprocess_exec(
                sys.executable, "-c", FACTORY, d.path, str(N), str(STEP),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            assert factory.stdin is not None and factory.stdout is not None
            factory.stdin.write((json.dumps(requests) + "\n" + PEER).encode())
            factory.stdin.close()
            samples = []
            t0 = time.monotonic()
            while line := await factory.stdout.readline():
                step = json.loads(line)
                samples.append({**step, "s": round(time.monotonic() - t0, 1), "rss": _rss(),
                                "calls": len(d.engine.calls), "fds": _fds(),
                                "followers": _followers()})
            assert await factory.wait() == 0
            journal = Path(d.engine.cfg.journal)

            def drained() -> bool:
                d.engine.tick()
                return not d.engine.calls and not _followers() and \
                    len(_journaled(journal)) == N
            deadline = time.monotonic() + 60
            while not drained():
                lines = len(_journaled(journal))
                assert time.monotonic() < deadline, (
                    f"not drained: {len(d.engine.calls)} calls, {lines} journal lines, "
                    f"{_followers()} followers, "
                    f"{samples[-1] if samples else None}")
                await asyncio.sleep(0.1)
            view = await d.admission()
            left = [p.name for b in boxes for p in b.iterdir() if p.name.startswith("tool-")]
            return {"n": N, "base": base, "samples": samples, "admission": view,
                    "fds": _fds(), "followers": _followers(), "tool_cgroups": left,
                    "journal_lines": len(_journaled(journal)),
                    "calls_journaled": len({json.loads(x)["call"] for x in _journaled(journal)})}

    r = asyncio.run(scenario())
    out = os.environ.get("EXECGATE_SOAK_OUT")
    if out:
        Path(out).write_text(json.dumps(r, indent=1))
    assert all(s["failed"] == 0 for s in r["samples"]), r["samples"][-1]
    assert r["journal_lines"] == r["calls_journaled"] == N  # every call, once
    assert r["admission"] == {"queued": [], "running": []}
    assert r["tool_cgroups"] == []
    assert r["followers"] == 0
    assert r["fds"] <= r["base"]["fds"] + 2
    # Memory: what the second half of the calls added, per call (history windows are bounded).
    half = r["samples"][len(r["samples"]) // 2 - 1:]
    per_call = (half[-1]["rss"] - half[0]["rss"]) / max(half[-1]["done"] - half[0]["done"], 1)
    assert per_call < 2048, f"{per_call:.0f} bytes per call"
