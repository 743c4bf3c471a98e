"""The demo's short tour of execgate on real Docker (demo.sh runs it before the replay
comparison): a tool call gets a cgroup of its own, and one that blows the container's limit is
OOM-killed alone while the sandbox lives on.

Needs Docker with execgate installed as runtime `execgate` and an image with `sh`, `cat` and the
static `memhog` test program (demo.sh builds one; `tests/vm/guest-run.sh` builds
execgate-test:latest).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

IMAGE = os.environ.get("EXECGATE_DEMO_IMAGE", "execgate-test:latest")


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=check)


def say(title: str) -> None:
    print(f"\n--- {title}", flush=True)


def show(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    print("$ " + " ".join(cmd), flush=True)
    p = sh(*cmd, check=False)
    out = (p.stdout + p.stderr).rstrip()
    if out:
        print("  " + out.replace("\n", "\n  "), flush=True)
    if p.returncode:
        print(f"  (exit {p.returncode})", flush=True)
    return p


def main() -> int:
    say("tour: a sandbox (256 MiB container, runtime execgate) and its tool calls")
    sh("docker", "rm", "-f", "execgate-demo", check=False)
    cid = sh("docker", "run", "-d", "--runtime", "execgate", "--memory", "256m",
             "--memory-swap", "256m", "--name", "execgate-demo", IMAGE,
             "sh", "-c", "echo agent ready; sleep inf").stdout.strip()
    try:
        pid = json.loads(sh("docker", "inspect", cid).stdout)[0]["State"]["Pid"]
        with open(f"/proc/{pid}/cgroup") as f:
            print(f"  the container's init runs in {f.read().strip()}")
        print("  every docker exec is a tool call with a cgroup of its own:")
        show(["docker", "exec", "execgate-demo", "cat", "/proc/self/cgroup"])

        say("tour: a tool call that blows the container's limit dies alone; the sandbox lives")
        show(["docker", "exec", "execgate-demo", "memhog", "400"])
        show(["docker", "exec", "execgate-demo", "echo", "still here"])
        time.sleep(1)
        show(["execgatectl", "calls", "-n", "3"])
    finally:
        sh("docker", "rm", "-f", cid, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
