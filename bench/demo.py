"""A short tour of execgate on real Docker: per-call cgroups, OOM kills that spare the sandbox,
and the operator's view. (The trace-replay comparison joins it when the benchmark lands.)

Needs Docker with execgate installed as runtime `execgate` and an image with `sh`, `sleep` and
the static `memhog` test program (`tests/vm/guest-run.sh` builds one as execgate-test:latest).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
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
    say("a sandbox: 256 MiB container, runtime execgate")
    cid = sh("docker", "run", "-d", "--runtime", "execgate", "--memory", "256m",
             "--memory-swap", "256m", "--name", "execgate-demo", IMAGE,
             "sh", "-c", "echo agent ready; sleep inf").stdout.strip()
    try:
        pid = json.loads(sh("docker", "inspect", cid).stdout)[0]["State"]["Pid"]
        with open(f"/proc/{pid}/cgroup") as f:
            print(f"  the container's init runs in {f.read().strip()}")

        say("every docker exec is a tool call with a cgroup of its own")
        for _ in range(2):
            show(["docker", "exec", "execgate-demo", "cat", "/proc/self/cgroup"])

        say("three concurrent tool calls (64 MiB each, 3 s), seen from the host")
        threads = [threading.Thread(target=sh, args=("docker", "exec", "execgate-demo",
                                                     "memhog", "64", "3")) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(2.5)
        show(["execgatectl", "status"])
        for t in threads:
            t.join()

        say("a tool call that blows the container's limit: the call dies, the sandbox lives")
        show(["docker", "exec", "execgate-demo", "memhog", "400"])
        show(["docker", "exec", "execgate-demo", "echo", "still here"])
        time.sleep(1)
        show(["execgatectl", "calls", "-n", "6"])
    finally:
        sh("docker", "rm", "-f", cid, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
