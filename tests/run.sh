#!/usr/bin/env bash
# The whole test suite: unit tests on this host, then the end-to-end suite inside the test VM
# (real kernel 7.3 with sched_ext, cgroup v2, Docker, runc), built and booted on the way.
#   tests/run.sh            everything
#   tests/run.sh --unit     host unit tests only
# Exits non-zero when any test fails or the VM times out; the last line sums up both parts.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
unit_only=0
[[ ${1:-} == --unit ]] && unit_only=1
mkdir -p results

need=()
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
if [[ $unit_only == 0 ]]; then
    command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
    command -v debootstrap >/dev/null || need+=(debootstrap)
    command -v debugfs >/dev/null || need+=(e2fsprogs)
fi
if [[ ${#need[@]} -gt 0 ]]; then
    echo "[tests] installing host packages: ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${need[@]}" >/dev/null || { echo "apt-get failed"; exit 1; }
fi

if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv || exit 1
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,bench]' || exit 1

echo "[tests] unit tests (host)"
.venv/bin/python -m pytest -q -p no:cacheprovider --junitxml=results/unit-junit.xml tests/unit
unit_rc=$?

vm_rc=0
if [[ $unit_only == 0 ]]; then
    echo "[tests] end-to-end tests (VM)"
    # Under TCG the suite takes most of an hour; CI allows 90 minutes in all.
    for attempt in 1 2; do
        EXECGATE_VM_TIMEOUT=${EXECGATE_VM_TIMEOUT:-4200} tests/vm/run.sh test results/vm-test
        vm_rc=$?
        # An int3 oops of the guest kernel (TCG racing its text patching as sched_ext loads or
        # unloads; seen with multi-threaded TCG, which boot.sh no longer uses by default) is a
        # test-bed crash, not a test result: the whole suite runs once more; anything else, a
        # failing test above all, counts as is.
        [[ $vm_rc == 125 && $attempt == 1 ]] || break
        grep -q "Oops: int3" results/vm-test/serial.log 2>/dev/null || break
        cp results/vm-test/serial.log results/vm-oops-serial.log
        echo "[tests] the VM's kernel oopsed on an int3 (TCG text patching): running the suite again"
    done
    if [[ -f results/vm-test/console.log ]]; then
        sed -n '/=== \[vm\] end-to-end tests/,$p' results/vm-test/console.log | tail -n 120
    else
        tail -n 60 results/vm-test/serial.log 2>/dev/null
    fi
    [[ $vm_rc == 124 ]] && echo "[tests] the VM timed out: counted as a failure"
fi

junits=(results/unit-junit.xml)
[[ $unit_only == 0 ]] && junits+=(results/vm-test/e2e-junit.xml)
python3 - "$unit_rc" "$vm_rc" "${junits[@]}" <<'PY'
import sys
import xml.etree.ElementTree as ET

unit_rc, vm_rc, *files = sys.argv[1:]
passed = failed = skipped = 0
for path in files:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        continue
    for suite in root.iter("testsuite"):
        n, f, e, s = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
        passed += n - f - e - s
        failed += f + e
        skipped += s
if int(vm_rc) and failed == 0:
    failed = 1  # the VM died or timed out before reporting: never green
print(f"total: {passed} passed, {failed} failed, {skipped} skipped")
PY
[[ $unit_rc == 0 && $vm_rc == 0 ]]
