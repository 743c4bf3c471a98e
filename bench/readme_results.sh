#!/usr/bin/env bash
# Regenerates the replay results table of the top-level README: every scheme on the demo's
# workload (bench/replay.py demo: 5 sandboxes, a burst into 384 MiB), in the test VM.
#   bench/readme_results.sh [RESULTS_DIR]          (default: results/bench-readme)
# One VM boot per scheme group keeps each boot under ~15 minutes of TCG time (the test bed is
# shared: tests/vm/run.sh queues boots on a lock); the groups replay identical traces, arrivals
# and budget, and bench/report.py merges them into RESULTS_DIR/results.json, report.md and, with
# matplotlib on this host, the plots.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
out=$(realpath -m "${1:-$repo/results/bench-readme}")
groups=(
    "eager,execgate"
    "execgate-nogrowth,agentcgroup,execgate-noadmit"
    "static,reserve"
)
parts=()
for i in "${!groups[@]}"; do
    dir=$out/part-$((i + 1))
    echo "=== part $((i + 1))/${#groups[@]}: ${groups[$i]}"
    EXECGATE_VM_TIMEOUT=${EXECGATE_VM_TIMEOUT:-1200} "$here/run_bench.sh" demo "$dir" -- \
        --schemes "${groups[$i]}" --static-k 2,3,4
    parts+=("$dir/bench/results.json")
done
python=$repo/.venv/bin/python
[[ -x $python ]] || python=python3
"$python" "$here/report.py" --plots-optional --text --out "$out" "${parts[@]}"
