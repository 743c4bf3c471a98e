#!/usr/bin/env bash
# Host side of the replay benchmark: boots the test VM, runs bench/replay.py there, and renders
# the report and plots here (the VM has no matplotlib).
#   bench/run_bench.sh demo|run|sweep [RESULTS_DIR] [-- replay.py arguments...]
# e.g. bench/run_bench.sh sweep results/bench-sweep -- --task-counts 8,16,38 --budgets 640m
# Plots need matplotlib in the host's Python (.venv/bin/pip install matplotlib).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# bench/ runs from the checkout, beside the execgate package: python3 -m bench.NAME
export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}
mode=${1:?usage: bench/run_bench.sh demo|run|sweep [RESULTS_DIR] [-- replay args...]}
shift
case $mode in demo|run|sweep) ;; *) echo "run_bench.sh: unknown mode $mode" >&2; exit 2 ;; esac
results=$repo/results/bench-$mode
if [[ $# -gt 0 && $1 != -- ]]; then results=$1; shift; fi
[[ ${1:-} == -- ]] && shift
args=$(printf ' %q' "$@")

export EXECGATE_VM_TIMEOUT=${EXECGATE_VM_TIMEOUT:-5400}
export EXECGATE_VM_CMD="python3 -m bench.replay $mode --out \$EXECGATE_RESULTS/bench$args"
"$repo/tests/vm/run.sh" cmd "$results" || echo "run_bench.sh: the VM run failed (rc=$?)" >&2

python=$repo/.venv/bin/python
[[ -x $python ]] || python=python3
if [[ -f $results/bench/results.json ]]; then
    "$python" -m bench.report "$results/bench/results.json" \
        || "$python" -m bench.report --no-plots "$results/bench/results.json"
    echo "report: $results/bench/report.md"
else
    echo "run_bench.sh: no results.json came back (see $results/serial.log)" >&2
    exit 1
fi
