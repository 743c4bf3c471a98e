#!/usr/bin/env bash
# Runs inside the test VM from the payload disk (copied there as run.sh by tests/vm/run.sh):
#   MODE=test  install execgate offline with the real install.sh, then run tests/e2e
#   MODE=bench|demo|cmd  the same install, then the benchmark, the demo, or $EXECGATE_VM_CMD
# Results go to ./results (read back by the host).
set -uo pipefail
cd "$(dirname "$0")"
mode=$(cat mode 2>/dev/null || echo test)
[[ -f env ]] && source ./env
res=$PWD/results
mkdir -p "$res"
step() { echo "=== [vm] $*"; }

step "kernel $(uname -r); sched_ext: $(cat /sys/kernel/sched_ext/state 2>/dev/null || echo absent)"
systemctl start docker.service || { journalctl -u docker --no-pager | tail -30; exit 1; }
for _ in $(seq 1 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
docker info >/dev/null || { echo "docker did not come up"; exit 1; }

step "test image: busybox + static test programs"
img=$(mktemp -d)
mkdir -p "$img/bin" "$img/tmp" "$img/proc" "$img/sys" "$img/dev" "$img/etc"
cp /usr/bin/busybox "$img/bin/busybox"
for app in $(/usr/bin/busybox --list); do
    [[ -e $img/bin/$app ]] || ln -s busybox "$img/bin/$app"
done
for c in src/tests/e2e/programs/*.c src/bench/load/*.c; do
    [[ -f $c ]] || continue
    clang -O2 -static -o "$img/bin/$(basename "$c" .c)" "$c" || exit 1
done
echo "root:x:0:0:root:/root:/bin/sh" >"$img/etc/passwd"
tar -C "$img" -c . | docker import - execgate-test:latest >/dev/null || exit 1

step "install.sh (offline: PIP_NO_INDEX, PIP_FIND_LINKS=wheels)"
cp /etc/docker/daemon.json "$res/daemon.json.before"
# --no-swap: the suite runs on a swapless host as before (test_install.py and test_residency.py
# set swap up themselves); EXECGATE_INSTALL_ARGS replaces it (e.g. "" for install.sh's zram).
PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/wheels ./src/install.sh ${EXECGATE_INSTALL_ARGS---no-swap} 2>&1 | tee "$res/install.log"
[[ ${PIPESTATUS[0]} == 0 ]] || { echo "install.sh failed"; exit 1; }
cp /etc/docker/daemon.json "$res/daemon.json.after"
# TCG runs ~10x slower than hardware: give the runtime's daemon budget the same factor.
sed -i 's/^daemon_timeout_ms = .*/daemon_timeout_ms = 2000/' /etc/execgate/config.toml
# Loading and unloading sched_ext patches kernel text, which TCG has raced (an int3 oops, with
# multi-threaded TCG): the test bed's daemon uses cgroup.freeze unless a test asks for sched_ext.
# bcc probes compile for ~25 s under TCG at every daemon start: off, but where a test asks.
# The shipped file sets every key: each edit replaces its line (a second `gate =` in [daemon]
# made the file invalid TOML, the daemon ran on its defaults, and the suite with sched_ext).
sed -i 's/^gate = .*/gate = "freeze"/; s/^probes = .*/probes = false/' /etc/execgate/config.toml
grep -q '^gate = "freeze"' /etc/execgate/config.toml || { echo "test-bed config edit failed"; exit 1; }
grep -q '^probes = false' /etc/execgate/config.toml || { echo "test-bed config edit failed"; exit 1; }
python3 -c 'import sys, tomllib; tomllib.load(open(sys.argv[1], "rb"))' /etc/execgate/config.toml \
    || { echo "test-bed config is not valid TOML"; exit 1; }
systemctl restart execgated

export EXECGATE_SRC=$PWD/src EXECGATE_WHEELS=$PWD/wheels EXECGATE_RESULTS=$res
# The checkout on the path of the guest's python3: the e2e suite and bench/ import execgate from it.
export PYTHONPATH=$PWD/src
case $mode in
    test)
        step "end-to-end tests"
        # Test paths in EXECGATE_E2E_ARGS (src/tests/e2e/...) replace the default: the suite.
        where=src/tests/e2e
        for a in ${EXECGATE_E2E_ARGS:-}; do [[ $a == src/* ]] && where=; done
        python3 -m pytest -p no:cacheprovider -v -rA --junitxml="$res/e2e-junit.xml" \
            ${EXECGATE_E2E_ARGS:-} $where
        rc=$?
        ;;
    bench)
        step "benchmarks"
        python3 -m bench.exec_latency --out "$res/bench-exec.json"
        rc=$?
        ;;
    cmd)
        step "command: $(cat cmd)"
        bash ./cmd
        rc=$?
        ;;
    *)
        echo "unknown mode $mode"; rc=2 ;;
esac
journalctl -u execgated --no-pager >"$res/execgated.log" 2>&1
# The engines' side (a create they retried or timed out, the runtime's warnings in runc's log).
journalctl -u docker -u containerd --no-pager >"$res/engines.log" 2>&1
cp /var/lib/execgate/calls.jsonl "$res/" 2>/dev/null
exit $rc
