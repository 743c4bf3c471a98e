#!/usr/bin/env bash
# Regenerates the figures of README.md, docs/benchmarks.md and docs/sim/README.md, in one command:
#   bench/figures.sh sim [OUT]    the simulator's (host, a few minutes of CPU): validation against
#                                 the VM sweep, the fleet points against the a982a58 boots,
#                                 hardware costs, 15x and 1,000 sandboxes (zram; no swap, and
#                                 no swap with creates waiting without bound)
#   bench/figures.sh vm [OUT]     the VM's (hours; one VM at a time): the fleet points (burst,
#                                 Poisson, Poisson with hot calls, the 15x burst and Poisson:
#                                 3 repeats of eager+swap and execgate, the runc baselines
#                                 once), light load, exec latency,
#                                 the load sweep, the demo
#   bench/figures.sh all [OUT]    both (default OUT: results/figures)
# What each part redoes, and where the committed copy lives, is in docs/benchmarks.md and
# docs/sim/README.md. Times are the test VM's (qemu TCG): compare ratios within a boot.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"
export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}
mode=${1:-all}
out=$(realpath -m "${2:-$repo/results/figures}")
python=$repo/.venv/bin/python
[[ -x $python ]] || python=python3
mkdir -p "$out"

sim() {
    local s=$out/sim
    mkdir -p "$s/fleet" "$s/hw"
    local poisson burst fleet w p b
    # The runs of today's runtime (the compiled front): the VM side, and the cost fit.
    poisson=$(ls "$repo"/docs/replay/fleet/poisson-a982a58/repeat-*.json.gz | paste -sd,)
    burst=$(ls "$repo"/docs/replay/fleet/burst-a982a58/repeat-*.json.gz | paste -sd,)
    fleet=$poisson,$burst
    w="--tasks 16 --seed 13 --mem-scale 6 --cpu-scale 0 --oversub 8.6 --zram-size 1g"
    p="--speed 2 --max-calls 3 --idle-scale 0.05 --arrival poisson --mean-gap 20 --admission-wait 300"
    b="--workload burst --speed 10 --admission-wait 60"
    # shellcheck disable=SC2086  # the option strings above are word lists
    {
        "$python" -m bench.sim validate docs/replay/sweep-c953629/results.json.gz --policy-rev c953629 --out "$s"
        "$python" -m bench.sim validate docs/replay/sweep/results.json.gz --policy-rev fff81fa --out "$s"
        # One VM run is one draw: each row again with operation costs drawn around their fit.
        "$python" -m bench.sim validate docs/replay/sweep-c953629/results.json.gz --policy-rev c953629 \
            --draws 20 --out "$s"
        # The same sweep at the policy of 5 Dec, night (both boots' parts merged).
        "$python" -m bench.sim validate docs/replay/sweep-ab2c26f/results.json.gz --policy-rev ab2c26f \
            --draws 20 --out "$s"
        # Light load (1x), seven repeats at the policy of 6 Dec, each in its own fit.
        for f in docs/replay/light-load-e0d3b6e/results-*.json.gz; do
            "$python" -m bench.sim validate "$f" --policy-rev e0d3b6e \
                --out "$s/validate-light-e0d3b6e/$(basename "$f" .json.gz)"
        done
        # Light load (1x) after the request cut, and with calm periods (repeats 3-4).
        for f in docs/replay/light-load-a44c17b/results-*.json.gz; do
            "$python" -m bench.sim validate "$f" --policy-rev a44c17b \
                --out "$s/validate-light-a44c17b/$(basename "$f" .json.gz)"
        done
        # Light load (1x), nine pairs in three boots, calm periods in pairs a2-a3.
        for f in docs/replay/light-load-96b11e1/results-*.json.gz; do
            "$python" -m bench.sim validate "$f" --policy-rev 96b11e1 \
                --out "$s/validate-light-96b11e1/$(basename "$f" .json.gz)"
        done
        # Light load (1x) with the bench's docker CLI clients and with its Engine API client.
        for f in docs/replay/light-load-api-6e2bd9d/*.json.gz; do
            "$python" -m bench.sim validate "$f" --policy-rev 6e2bd9d \
                --out "$s/validate-light-api-6e2bd9d/$(basename "$f" .json.gz)"
        done
        # Light load (1x) on the evening's slower host: a stalling boot (d-N) and a clean one (b-N).
        for f in docs/replay/light-load-slow-host-f622018/*.json.gz; do
            "$python" -m bench.sim validate "$f" --policy-rev f622018 \
                --out "$s/validate-light-slow-host-f622018/$(basename "$f" .json.gz)"
        done
        # Every fleet boot in its own fit and at its own policy (the directory's revision), with
        # the zram the VM had: docs/sim/README.md, "Every fleet boot, in sample".
        for f in docs/replay/fleet/*-*/repeat-*.json.gz docs/replay/sweep-*/repeat-*.json.gz; do
            d=$(basename "$(dirname "$f")")
            git cat-file -e "${d##*-}^{commit}" 2>/dev/null || continue
            "$python" -m bench.sim validate "$f" --policy-rev "${d##*-}" \
                --out "$s/validate-fleet/$d-$(basename "$f" .json.gz)"
        done
        # The static-K baselines of the 15x boot (runc only: no policy to pin).
        "$python" -m bench.sim validate docs/replay/fleet/burst15x-965244e/baselines.json.gz \
            --out "$s/validate-fleet/burst15x-965244e-baselines"
        "$python" -m bench.sim replay --cost "$fleet" --swap-bandwidth-mib 5 --out "$s/fleet" \
            --name fleet-poisson --against "$poisson" \
            -- $w --swap on $p --schemes eager+swap,execgate
        "$python" -m bench.sim replay --cost "$fleet" --swap-bandwidth-mib 5 --out "$s/fleet" \
            --name fleet-burst --against "$burst" \
            -- $w --swap on $b --schemes eager+swap,execgate
        "$python" -m bench.sim replay --cost "$fleet" --swap-bandwidth-mib 5 --out "$s/fleet" \
            --name fleet-poisson-hot -- $w --swap on $p --hot-calls --schemes eager+swap,execgate
        "$python" -m bench.sim replay --cost hw --swap-bandwidth-mib 1000 --out "$s/hw" --name burst-hw \
            -- $w --swap on $b --schemes eager+swap,execgate,reserve,static --static-k 2,4,8
        "$python" -m bench.sim replay --cost hw --swap-bandwidth-mib 1000 --out "$s/hw" \
            --name burst-hw-off -- $w --swap off $b --schemes eager,reserve,static --static-k 2,3,4,6,8
        "$python" -m bench.sim replay --cost hw --swap-bandwidth-mib 1000 --out "$s/hw" \
            --name poisson-hw -- $w --swap on $p --schemes eager+swap,execgate,reserve,static \
            --static-k 2,4,8
        "$python" -m bench.sim replay --cost hw --swap-bandwidth-mib 1000 --out "$s/hw" \
            --name burst15x-hw -- --tasks 27 --seed 34 --mem-scale 6 --cpu-scale 0 --oversub 15 \
            --zram-size 1g --swap on $b --schemes eager+swap,execgate,reserve,static \
            --static-k 8,12,16,20,24
        "$python" -m bench.sim sweep --sandboxes 64 --budget 5298m --swap --zram --static-k 4,8,16 \
            --schemes eager,static,reserve,execgate,execgate-noresidency --out "$s/hw"
        "$python" -m bench.sim sweep --sandboxes 1000 --budget 64g --swap --zram --out "$s"
        "$python" -m bench.sim sweep --sandboxes 1000 --budget 64g --out "$s/swap-off"
        # The README's figure without swap: creates wait as long as it takes (Docker, Podman).
        "$python" -m bench.sim sweep --sandboxes 1000 --budget 64g --start-wait inf \
            --schemes eager,static,reserve,execgate --static-k 50,100 --out "$s/swap-off-wait"
    } 2>&1 | tee "$out/sim.log"
}

vm() {
    REPEATS=3 bench/fleet_results.sh burst "$out/fleet-burst"
    REPEATS=3 bench/fleet_results.sh poisson "$out/fleet-poisson"
    REPEATS=3 BASELINES=0 HOT=1 bench/fleet_results.sh poisson "$out/fleet-poisson-hot"
    local x15=(env OVERSUB=15 TASKS=27 SEED=34 STATIC_K=8 REPEATS=3)
    "${x15[@]}" bench/fleet_results.sh burst "$out/fleet-burst15x"
    "${x15[@]}" bench/fleet_results.sh poisson "$out/fleet-poisson15x"
    EXECGATE_VM_CMD='for r in 1 2; do python3 -m bench.replay demo --budget 2g --out $EXECGATE_RESULTS/light-$r; done' \
        EXECGATE_VM_TIMEOUT=3600 tests/vm/run.sh cmd "$out/light-load" > "$out/light-load.log" 2>&1 \
        || echo "figures.sh: light load failed (see $out/light-load.log)" >&2
    tests/vm/run.sh bench "$out/exec-latency" > "$out/exec-latency.log" 2>&1 \
        || echo "figures.sh: exec latency failed (see $out/exec-latency.log)" >&2
    bench/readme_results.sh sweep "$out/sweep"
    bench/readme_results.sh demo "$out/demo"
}

case $mode in
    sim) sim ;;
    vm) vm ;;
    all) sim; vm ;;
    *) echo "usage: bench/figures.sh sim|vm|all [OUT]" >&2; exit 2 ;;
esac
echo "figures: $out"
