#!/usr/bin/env bash
# The main job: install execgate and show it at work on real Docker.
# On a host running Docker on cgroup v2 it installs here (install.sh) and runs natively;
# elsewhere (no Docker engine, or a cgroup v1/hybrid host) it runs inside the test VM, which
# installs execgate with the same install.sh.
set -euo pipefail
repo=$(cd "$(dirname "$0")" && pwd)

if docker info >/dev/null 2>&1 && [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    "$repo/install.sh"
    exec python3 "$repo/bench/demo.py"
fi

echo "[demo] no local Docker on cgroup v2: running the demo inside the test VM"
set +e
EXECGATE_VM_CMD="python3 src/bench/demo.py" "$repo/tests/vm/run.sh" cmd "$repo/results/demo"
rc=$?
sed -n '/=== \[vm\] command/,$p' "$repo/results/demo/console.log" 2>/dev/null
exit $rc
