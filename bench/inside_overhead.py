"""What inside-agent tracing costs an agent: N short commands, with and without the opt-in.

    sudo python3 -m bench.inside_overhead [--n 1000] [--rounds 3] [--modes queued,always]
                                          [--place-after 5,50] [--sources bpf,connector]

Needs Docker with execgate installed and execgated running (e.g. in the test VM:
`EXECGATE_VM_CMD='python3 -m bench.inside_overhead --n 200' tests/vm/run.sh cmd DIR`).
Each run starts a container whose main process (the "agent", a busybox sh loop) spawns N
`memhog 0` children (a static binary that allocates nothing: the shortest real command), timed
from inside with /proc/uptime. Variants: `plain` (execgate runtime, no opt-in: the baseline an
agent has today) and `inside:<source>:<freeze mode>/<ms>` (a child that outlives its first slice of
`place_after_ms` is placed, admitted and journaled by the daemon). Reported: the agent's time
per command, the added latency per spawned process, the slowdown, and the daemon's own figures
(placement delay after exec, memory before placement).
Changing a variant rewrites /etc/execgate/config.toml and restarts execgated; the original
config is restored at the end. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

IMAGE = "execgate-test:latest"
CONFIG = "/etc/execgate/config.toml"
JOURNAL = "/var/lib/execgate/calls.jsonl"


def sh(*argv: str, timeout: float = 120) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True,
                          timeout=timeout).stdout.strip()


def restart_daemon() -> None:
    sh("systemctl", "restart", "execgated")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        p = subprocess.run(["execgatectl", "status", "--json"], capture_output=True, text=True)
        if p.returncode == 0 and json.loads(p.stdout)["source"].startswith("execgated pid"):
            return
        time.sleep(0.5)
    raise RuntimeError("execgated did not come back")


def journal(cid: str) -> list[dict[str, Any]]:
    out = []
    with open(JOURNAL) as f:
        for line in f:
            if cid in line:
                e = json.loads(line)
                if e.get("container") == cid:
                    out.append(e)
    return out


def against_plain(variants: dict[str, list[dict[str, Any]]], n: int
                  ) -> Iterator[tuple[str, list[dict[str, Any]], dict[str, Any]]]:
    """Each variant's runs with its median agent time against the plain runs', for n
    commands each."""
    base = statistics.median(r["agent_s"] for r in variants["plain"])
    for name, runs in variants.items():
        if name != "plain":
            t = statistics.median(r["agent_s"] for r in runs)
            yield name, runs, {"agent_s": round(t, 3), "ms_per_cmd": round(t * 1000 / n, 4),
                               "added_us_per_cmd": round((t - base) * 1e6 / n, 1),
                               "slowdown_pct": round(100 * (t / base - 1), 1)}


def daemon_cpu_s() -> float:
    """execgated's CPU time so far (user + system), from /proc."""
    pid = sh("systemctl", "show", "-p", "MainPID", "--value", "execgated")
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def inside_stats() -> dict[str, Any]:
    p = subprocess.run(["execgatectl", "status", "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        return {}
    return dict(json.loads(p.stdout).get("daemon", {}).get("inside") or {})


def one_run(n: int, opt_in: bool) -> dict[str, Any]:
    script = ('sleep 2; read t0 rest < /proc/uptime; i=0; fails=0; '
              f'while [ $i -lt {n} ]; do memhog 0 || fails=$((fails+1)); i=$((i+1)); done; '
              'read t1 rest < /proc/uptime; echo "$t0 $t1 $fails" > /tmp/done; exec sleep 1000')
    args = ["docker", "run", "-d", "--runtime", "execgate"]
    if opt_in:
        args += ["--annotation", "execgate.agent=inside"]
    cid = sh(*args, IMAGE, "sh", "-c", script)
    try:
        pid = int(sh("docker", "inspect", "-f", "{{.State.Pid}}", cid))
        done = f"/proc/{pid}/root/tmp/done"
        cpu0, stats0 = daemon_cpu_s(), inside_stats()
        deadline = time.monotonic() + 120 + n
        while not os.path.exists(done):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n} commands did not finish")
            time.sleep(0.5)
        cpu1, stats1 = daemon_cpu_s(), inside_stats()
        time.sleep(0.2)
        with open(done) as f:
            t0, t1, fails = f.read().split()
        entries: list[dict[str, Any]] = []
        if opt_in:  # the daemon's journal lines for the calls it placed, once they stop coming
            wait, seen = time.monotonic() + 60, -1
            while len(entries) != seen and time.monotonic() < wait:
                seen = len(entries)
                time.sleep(2)
                entries = [e for e in journal(cid) if e.get("argv", [])[:1] == ["memhog"]]
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    # The daemon's CPU while the container ran (its start included): what the agent's
    # commands cost it, beside an agent that has the host's other CPUs to itself.
    out: dict[str, Any] = {"agent_s": float(t1) - float(t0), "fails": int(fails),
                           "daemon_cpu_ms_per_cmd": round((cpu1 - cpu0) * 1000 / n, 3)}
    for key in ("placed", "short", "missed", "failed"):
        if key in stats1:
            out[key] = stats1[key] - stats0.get(key, 0)
    if entries:
        ins = [e["inside"] for e in entries]
        place = sorted(i["placement_us"] for i in ins)
        moves = sorted(i.get("move_us") or 0 for i in ins)
        out.update(calls=len(entries), move_us_p50=moves[len(moves) // 2],
                   placement_us_p50=place[len(place) // 2],
                   placement_us_p95=place[len(place) * 95 // 100],
                   rss_before_p50=statistics.median(i.get("rss_before_bytes") or 0 for i in ins),
                   anon_before_p50=statistics.median(i.get("anon_before_bytes") or 0
                                                     for i in ins),
                   frozen=sum(1 for i in ins if i.get("frozen_s")))
    return out


def set_mode(original: str, mode: str, place_after_ms: float, source: str = "auto") -> None:
    """[inside] freeze, place_after_ms and source (the installed config has no [inside] table:
    main checks)."""
    with open(CONFIG, "w") as f:
        f.write(original + f'\n[inside]\nfreeze = "{mode}"\nplace_after_ms = {place_after_ms}\n'
                f'source = "{source}"\n')
    restart_daemon()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="commands per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="queued,always", help="freeze modes to compare")
    ap.add_argument("--place-after", default="5", help="first slices (ms) to compare")
    ap.add_argument("--sources", default="auto",
                    help="[inside] source values to compare (auto, bpf, connector)")
    ap.add_argument("--out", help="write the figures here as JSON")
    args = ap.parse_args()
    with open(CONFIG) as f:
        original = f.read()
    if re.search(r"^\s*\[inside\]", original, re.M):
        sys.exit(f"{CONFIG} has an [inside] table already; remove it first")
    shutil.copy(CONFIG, CONFIG + ".bench")
    variants: dict[str, list[dict[str, Any]]] = {}
    try:
        for src in args.sources.split(","):
            for mode in args.modes.split(","):
                for ms in (float(x) for x in args.place_after.split(",")):
                    set_mode(original, mode, ms, src)
                    for _ in range(args.rounds):  # interleaved, so drift hits both alike
                        variants.setdefault("plain", []).append(one_run(args.n, False))
                        variants.setdefault(f"inside:{src}:{mode}/{ms:g}ms", []).append(
                            one_run(args.n, True))
    finally:
        shutil.move(CONFIG + ".bench", CONFIG)
        restart_daemon()
    base = statistics.median(r["agent_s"] for r in variants["plain"])
    base_cpu = statistics.median(r["daemon_cpu_ms_per_cmd"] for r in variants["plain"])
    with open("/proc/self/mountinfo") as f:
        mount = next((ln.split(" - ")[1].strip() for ln in f if " /sys/fs/cgroup " in ln), "?")
    print(f"cgroup2 mount: {mount}")
    summary: dict[str, Any] = {"n": args.n, "rounds": args.rounds, "runs": variants,
                               "cgroup_mount": mount,
                               "plain_ms_per_cmd": round(base * 1000 / args.n, 3)}
    print(f"plain: {base:.2f} s for {args.n} commands ({base * 1000 / args.n:.2f} ms each; "
          f"daemon CPU {base_cpu:.2f} ms per command)")
    for name, runs, fig in against_plain(variants, args.n):
        fig["fails"] = sum(r["fails"] for r in runs)
        for key in ("daemon_cpu_ms_per_cmd", "placed", "short", "missed", "failed", "calls",
                    "placement_us_p50", "placement_us_p95", "move_us_p50", "rss_before_p50",
                    "anon_before_p50", "frozen"):
            vals = [r[key] for r in runs if key in r]
            if vals:
                fig[key] = statistics.median(vals)
        summary[name] = fig
        print(f"{name}: {json.dumps(fig)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
