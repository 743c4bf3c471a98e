#!/usr/bin/env bash
# Regenerates the replay results of the top-level README, in the test VM:
#   bench/readme_results.sh [demo|sweep] [RESULTS_DIR]     (default: demo, results/bench-<mode>)
# demo:  every scheme on the demo's workload (bench/replay.py demo: 5 sandboxes, a burst into
#        384 MiB), in three VM boots.
# sweep: the load sweep (16 tasks arriving over ~95 s; budgets for 1x, 4x and 8.6x
#        oversubscription), in three VM boots (execgate alone: under overload its retries make
#        it the longest).
# One boot per scheme group keeps each boot short (the test bed is shared: tests/vm/run.sh queues
# boots on a lock; EXECGATE_VM_PARALLEL=1 runs the groups at once, one lock each, on a host with
# a core and 6 GiB per group). The groups replay identical traces, arrivals and budgets, and
# bench/report.py merges them into RESULTS_DIR/results.json, report.md and, with matplotlib on
# this host, the plots.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# bench/ runs from the checkout, beside the execgate package: python3 -m bench.NAME
export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}
mode=demo
if [[ ${1:-} == demo || ${1:-} == sweep ]]; then mode=$1; shift; fi
out=$(realpath -m "${1:-$repo/results/bench-$mode}")
if [[ $mode == demo ]]; then
    groups=("eager,execgate" "execgate-nogrowth,agentcgroup,execgate-noadmit" "static,reserve")
    args=(--static-k 2,3,4)
    timeout=1200
else
    groups=("eager,static-2" "execgate" "reserve,static-4")
    args=(--tasks 16 --seed 13 --speed 2 --mem-scale 6 --cpu-scale 0 --max-calls 3
          --idle-scale 0.05 --arrival poisson --mean-gap 20 --oversub 1,4,8.6
          --admission-wait 300)
    timeout=7000
fi
mkdir -p "$out"
parts=()
pids=()
for i in "${!groups[@]}"; do
    dir=$out/part-$((i + 1))
    parts+=("$dir/bench/results.json")
    run=("$here/run_bench.sh" "$mode" "$dir" -- "${args[@]}" --schemes "${groups[$i]}")
    echo "=== part $((i + 1))/${#groups[@]}: ${groups[$i]}"
    if [[ ${EXECGATE_VM_PARALLEL:-0} == 1 ]]; then
        EXECGATE_VM_LOCK=/tmp/execgate-vm-part$i.lock EXECGATE_VM_TIMEOUT=${EXECGATE_VM_TIMEOUT:-$timeout} \
            "${run[@]}" > "$out/part-$((i + 1)).log" 2>&1 &
        pids+=($!)
    else
        EXECGATE_VM_TIMEOUT=${EXECGATE_VM_TIMEOUT:-$timeout} "${run[@]}"
    fi
done
for pid in "${pids[@]}"; do wait "$pid" || echo "readme_results.sh: a part failed (see $out/part-*.log)" >&2; done
python=$repo/.venv/bin/python
[[ -x $python ]] || python=python3
"$python" -m bench.report --plots-optional --text --out "$out" "${parts[@]}"
