"""What following an inside agent costs it on real hardware: the daemon's event path, no VM.

    sudo .venv/bin/python -m bench.inside_overhead_host [--n 1000] [--rounds 5]
        [--place-after 0,5] [--sources connector,bpf] [--command /bin/true]

The test VM's figure (`inside_overhead.py`) is dominated by emulation: under single-threaded
TCG the daemon's every wake-up is taken from the agent. This runs the daemon's own code
(`InsideAgents` with a real `Engine`, and the real BPF probe or proc connector) in this process
on the host, and an "agent" shell (a child process, playing a container's init) that runs N
`/bin/true`s, timed from here. Variants, interleaved per round: `plain` (no opted-in container:
nothing is loaded) and `inside/<source>/<ms>` (followed by that source, first slice of <ms>).
No container and no cgroup v2 are needed: the agent's record and cgroup directory live in a temp
dir, and the move into a tool cgroup is recorded, not made (with a first slice, a `/bin/true`
ends before it would be placed; the figures say how many were). Needs root (BPF, the proc
connector).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.inside_overhead import against_plain
from execgate.cgroups import v2
from execgate.common.config import Config
from execgate.common.units import MiB
from execgate.daemon import settings
from execgate.daemon.engine import Engine
from execgate.daemon.inside.agents import InsideAgents


def one_run(root: Path, n: int, place_after_ms: float | None,
            command: str = "/bin/true", source: str = "auto") -> dict[str, Any]:
    """One agent loop; place_after_ms None: the container has not opted in."""
    dom, cg, state = root / "domain", root / "box", root / "state"
    for d in (dom, cg / "init", state / "containers"):
        d.mkdir(parents=True, exist_ok=True)
    (dom / "memory.max").write_text(f"{4096 * MiB}\n")
    (dom / "memory.current").write_text(f"{64 * MiB}\n")
    agent = subprocess.Popen(["sh", "-c", f"read x; i=0; while [ $i -lt {n} ]; do {command}; "
                              "i=$((i+1)); done"], stdin=subprocess.PIPE)
    rec = {"id": "box", "managed": True, "prepared": True, "cgroup": str(cg),
           "init_pid": agent.pid,
           "annotations": {"execgate.agent": "inside"} if place_after_ms is not None else {}}
    (state / "containers" / "box.json").write_text(json.dumps(rec))
    cfg = Config(state_dir=str(state), journal=str(root / "calls.jsonl"),
                 tables={"daemon": {"domain": str(dom), "store": str(root / "h.sqlite"),
                                    "gate": "off", "probes": "off"},
                         "inside": {"place_after_ms": place_after_ms or 0.0,
                                    "source": source}})
    s, errors = settings.load(cfg)
    if errors:
        raise SystemExit(f"config: {errors}")
    agents = InsideAgents(cfg, s, Engine(cfg, s))

    async def scenario() -> dict[str, Any]:
        agents.start()
        try:
            await asyncio.sleep(0.3)
            assert agent.stdin is not None
            cpu0, t0 = time.process_time(), time.monotonic()
            agent.stdin.write(b"go\n")
            agent.stdin.flush()
            while agent.poll() is None:
                await asyncio.sleep(0.005)
            t1, cpu1 = time.monotonic(), time.process_time()
            await asyncio.sleep(0.5)  # the last events and journal lines
            journal = root / "calls.jsonl"
            before = [json.loads(line)["inside"]["rss_before_bytes"] or 0 for line in
                      journal.read_text().splitlines()] if journal.exists() else []
            return {"agent_s": t1 - t0, "daemon_cpu_ms_per_cmd": (cpu1 - cpu0) * 1000 / n,
                    "rss_before_bytes": before, **agents.snapshot()}
        finally:
            agents.stop()

    return asyncio.run(scenario())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--place-after", default="0,5", help="first slices (ms) to compare")
    ap.add_argument("--command", default="/bin/true",
                    help="what the agent runs N times (e.g. a memory hog, to see how much a "
                         "call allocates before it is placed)")
    ap.add_argument("--sources", default="connector,bpf",
                    help="event sources to compare ([inside] source: connector, bpf)")
    ap.add_argument("--out", help="write the figures here as JSON")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the recorded moves leave files rmdir cannot take
    moves: list[int] = []

    def move(pid: int, path: str) -> None:  # recorded, not made (see the docstring)
        moves.append(pid)
        Path(path, "cgroup.events").write_text("populated 0\n")

    v2.move = move  # type: ignore[assignment]
    slices = [float(x) for x in args.place_after.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="execgate-inside-") as tmp:
        variants: list[tuple[str, float | None, str]] = [("plain", None, "auto")]
        variants += [(f"inside/{src}/{ms:g}ms", ms, src) for src in args.sources.split(",")
                     for ms in slices]
        for r in range(args.rounds):
            for name, ms, src in variants:
                runs.setdefault(name, []).append(one_run(Path(tmp, f"{r}-{name}".replace(
                    "/", "-")), args.n, ms, args.command, src))
    base = statistics.median(x["agent_s"] for x in runs["plain"])
    summary: dict[str, Any] = {"n": args.n, "rounds": args.rounds, "runs": runs,
                               "plain_ms_per_cmd": round(base * 1000 / args.n, 4)}
    print(f"plain: {base * 1000 / args.n:.3f} ms per command ({args.n} commands, median of "
          f"{args.rounds})")
    for name, rs, fig in against_plain(runs, args.n):
        fig["daemon_cpu_us_per_cmd"] = round(1000 * statistics.median(
            x["daemon_cpu_ms_per_cmd"] for x in rs), 1)
        fig["placed"] = statistics.median(x["placed"] for x in rs)
        before = sorted(b for x in rs for b in x["rss_before_bytes"])
        if before:
            fig["rss_before_mib_p50"] = round(before[len(before) // 2] / MiB, 2)
            fig["rss_before_mib_max"] = round(before[-1] / MiB, 2)
        summary[name] = fig
        print(f"{name}: {json.dumps(fig)}")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
