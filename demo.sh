#!/usr/bin/env bash
# The main job: install execgate and show what it is for, on real Docker.
#   1. a short tour: each `docker exec` gets a cgroup of its own; a call that blows the
#      container's limit is OOM-killed alone and the sandbox lives on (bench/demo.py);
#   2. the comparison: the same burst of 5 agent sandboxes into a 384 MiB budget (calibrated
#      synthetic traces, the same arrival schedule), eager (plain runc, no control) vs execgate,
#      replayed with bench/replay.py demo and printed as a table; report.md and results.json (and
#      PNG plots where matplotlib is importable) land in RESULTS_DIR.
# On a host running Docker on cgroup v2 it installs here (install.sh) and runs natively, as root;
# elsewhere (no Docker engine, or a cgroup v1/hybrid host) it runs itself inside the test VM,
# which installs execgate with the same install.sh, and draws the plots here.
#   sudo ./demo.sh [RESULTS_DIR]            (default: results/demo)
# Settings: EXECGATE_DEMO_IMAGE (default execgate-demo:latest, built if missing from
# bench/load/memload.c and tests/e2e/programs/memhog.c on busybox), EXECGATE_DEMO_TOUR=0 skips
# the tour, EXECGATE_DEMO_INSTALL=0 skips install.sh (execgate already installed),
# EXECGATE_DEMO_PLOTS=0 leaves the plots out (report.md only).
set -euo pipefail
repo=$(cd "$(dirname "$0")" && pwd)
# bench/ runs from the checkout, beside the execgate package: python3 -m bench.NAME
export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}
results=$(realpath -m "${1:-$repo/results/demo}")
image=${EXECGATE_DEMO_IMAGE:-execgate-demo:latest}

say() { printf '\n=== %s\n' "$*"; }

# A static build of the load programs on busybox: offline with a C compiler and a static busybox
# on the host (as in the test VM), else a two-stage `docker build` (pulls alpine and busybox).
build_image() {
    local tmp cc="" bb
    tmp=$(mktemp -d)
    chmod 755 "$tmp"
    mkdir -p "$tmp/bin" "$tmp/tmp" "$tmp/etc" "$tmp/proc" "$tmp/sys" "$tmp/dev"
    cp "$repo/bench/load/memload.c" "$repo/tests/e2e/programs/memhog.c" "$tmp/"
    for c in ${CC:-} cc gcc clang; do command -v "$c" >/dev/null && { cc=$c; break; }; done
    bb=$(command -v busybox || true)
    if [[ -n $cc && -n $bb ]] && ! ldd "$bb" >/dev/null 2>&1 \
            && "$cc" -O2 -static -o "$tmp/bin/memload" "$tmp/memload.c" \
            && "$cc" -O2 -static -o "$tmp/bin/memhog" "$tmp/memhog.c"; then
        cp "$bb" "$tmp/bin/busybox"
        for app in $("$bb" --list); do
            [[ -e $tmp/bin/$app ]] || ln -s busybox "$tmp/bin/$app"
        done
        echo "root:x:0:0:root:/root:/bin/sh" >"$tmp/etc/passwd"
        rm "$tmp"/*.c
        tar -C "$tmp" -c . | docker import - "$image" >/dev/null
    else
        cat >"$tmp/Dockerfile" <<'EOF'
FROM alpine:3.20 AS build
RUN apk add --no-cache build-base
COPY memload.c memhog.c /src/
RUN gcc -O2 -static -o /memload /src/memload.c && gcc -O2 -static -o /memhog /src/memhog.c
FROM busybox:stable
COPY --from=build /memload /memhog /bin/
EOF
        docker build -q -t "$image" "$tmp" >/dev/null
    fi
    rm -rf "$tmp"
}

native() {
    if [[ $EUID != 0 ]]; then
        echo "demo.sh: run it as root (sudo ./demo.sh): the replay sets a cgroup's memory.max" >&2
        exit 1
    fi
    if [[ ${EXECGATE_DEMO_INSTALL:-1} != 0 ]]; then
        say "install execgate (install.sh)"
        "$repo/install.sh"
    fi
    if ! docker image inspect "$image" >/dev/null 2>&1; then
        say "build the sandbox image $image (memload, memhog, busybox)"
        build_image
    fi
    if [[ ${EXECGATE_DEMO_TOUR:-1} != 0 ]]; then
        EXECGATE_DEMO_IMAGE=$image python3 -m bench.demo
    fi
    say "the same burst of agent sandboxes into 384 MiB: eager (runc) vs execgate"
    python3 -m bench.replay demo --dry-run | sed -n '3,4p'
    echo "(a few minutes: eager, then execgate; one line per task event)"
    python3 -m bench.replay demo --image "$image" --out "$results"
    # In the VM the host draws the plots afterwards (EXECGATE_DEMO_PLOTS=0).
    if [[ ${EXECGATE_DEMO_PLOTS:-1} == 0 ]]; then
        python3 -m bench.report --no-plots "$results/results.json" >/dev/null
        echo "report: $results/report.md"
    else
        report "$results/results.json"
    fi
}

# report.md and the PNG plots, drawn with the checkout's venv (tests/vm/host-setup.sh gives it
# matplotlib: a fresh host has none), else Markdown only.
report() {
    local py=python3
    if "$repo/tests/vm/host-setup.sh" --no-vm bench >&2; then
        py=$repo/.venv/bin/python
    fi
    "$py" -m bench.report --plots-optional "$1" | sed 's/^/report: /'
}

if docker info >/dev/null 2>&1 && [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    native
    exit 0
fi

echo "[demo] no local Docker on cgroup v2: running the demo inside the test VM"
# qemu and debootstrap to boot the VM, the checkout's venv with matplotlib to draw the plots.
"$repo/tests/vm/host-setup.sh" bench || exit 1
export EXECGATE_DEMO_INSTALL=0  # the VM's guest-run.sh has just run install.sh
export EXECGATE_DEMO_PLOTS=0  # drawn here, from the VM's results
export EXECGATE_VM_TIMEOUT=${EXECGATE_VM_TIMEOUT:-1800}
export EXECGATE_VM_CMD='bash src/demo.sh "$EXECGATE_RESULTS/demo"'
mkdir -p "$results"
rm -f "$results/serial.log"
"$repo/tests/vm/run.sh" cmd "$results" &
vm=$!
# The guest's console, from the demo's first line on (kernel messages left out), while it runs.
# (tail exits non-zero when boot.sh replaces the results directory under it: not an error.)
tail -n +1 -F --pid=$vm "$results/serial.log" 2>/dev/null \
    | awk '/=== \[vm\] command/ {on = 1} on && !/^\[ *[0-9]+\.[0-9]+\]/ {print; fflush()}' \
    || true
rc=0
wait $vm || rc=$?
if [[ -f $results/demo/results.json ]]; then
    report "$results/demo/results.json"
fi
exit $rc
