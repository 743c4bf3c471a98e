#!/usr/bin/env bash
# Boots the test VM once on a payload directory and brings its results back.
#   boot.sh PAYLOAD_DIR RESULTS_DIR [TIMEOUT_SECONDS]
# The payload (with its run.sh) goes in on a second ext4 disk; the guest runs it, writes
# results/ and results/rc on that disk and powers off; debugfs reads them back without mounting.
# Exit status: the payload's own, 124 on timeout, 125 when the VM never ran the payload.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
payload=$(realpath "$1")
results=$(realpath -m "$2")
timeout_s=${3:-1800}
mem=${EXECGATE_VM_MEM:-6G}
smp=${EXECGATE_VM_SMP:-2}
# Single-threaded TCG by default: multi-threaded TCG races the guest kernel's text patching (an
# int3 oops when sched_ext loads, every time on some CI hosts); one host thread running both
# vCPUs in turn cannot, and costs only ~13 % on the suite (most of it waits on timers).
tcg_threads=${EXECGATE_VM_TCG:-single}
tries=${EXECGATE_VM_TRIES:-3}
# THP's mode, e.g. madvise (run.sh sets it for measurement boots; empty: the kernel's own,
# Debian's `always`). With `always`, khugepaged (nice 19) is preempted inside RCU read sections
# whenever the emulated CPUs are saturated, and without RCU boosting it is not run again for
# minutes: RCU stalls every ~70 s naming it in a 15x burst boot alone on the host (6 Dec), and
# times not comparable. With madvise the next such boot had none.
thp=${EXECGATE_VM_THP:-}

image=$("$here/build-image.sh") || { echo "boot.sh: building the VM image failed" >&2; exit 125; }
[[ -f $image/rootfs.img && -f $image/vmlinuz ]] \
    || { echo "boot.sh: build-image.sh gave no image directory: '$image'" >&2; exit 125; }
work=$(mktemp -d "${TMPDIR:-/tmp}/execgate-boot.XXXXXX")
trap 'rm -rf "$work"' EXIT

rm -rf "$results"
mkdir -p "$results"
for try in $(seq 1 "$tries"); do
    rm -f "$work/payload.img"
    mkfs.ext4 -q -F -L payload -d "$payload" "$work/payload.img" 8G
    console=$results/serial.log
    echo "[boot] try $try: qemu TCG ($tcg_threads-threaded), $smp vCPUs, $mem, timeout ${timeout_s}s (serial: $console)" >&2
    set +e
    timeout --kill-after=10 "$timeout_s" qemu-system-x86_64 \
        -accel "tcg,thread=$tcg_threads" -cpu max -smp "$smp" -m "$mem" \
        -kernel "$image/vmlinuz" -initrd "$image/initrd.img" \
        -append "root=/dev/vda rw console=ttyS0 panic=-1 oops=panic systemd.show_status=0 loglevel=4${thp:+ transparent_hugepage=$thp}" \
        -drive "file=$image/rootfs.img,format=raw,if=virtio,snapshot=on" \
        -drive "file=$work/payload.img,format=raw,if=virtio" \
        -nic none -no-reboot -display none -monitor none -serial "file:$console" </dev/null
    qrc=$?
    set -e
    mkdir -p "$work/out"
    debugfs -R "rdump /results $work/out" "$work/payload.img" >/dev/null 2>&1 || true
    if [[ $qrc == 124 || $qrc == 137 ]]; then
        echo "[boot] VM timed out after ${timeout_s}s" >&2
        cp -a "$work/out/results/." "$results/" 2>/dev/null || true  # what it wrote so far
        exit 124
    fi
    if [[ -f $work/out/results/rc ]]; then
        cp -a "$work/out/results/." "$results/"
        rc=$(cat "$results/rc")
        echo "[boot] payload finished with rc=$rc" >&2
        exit "$rc"
    fi
    if grep -q "EXECGATE-GUEST: booted" "$console"; then
        echo "[boot] the payload started but left no exit code; see $console" >&2
        exit 125
    fi
    # A boot that oopses (seen with multi-threaded TCG) ends qemu: panic=-1 reboots, -no-reboot exits.
    echo "[boot] VM did not reach the payload (qemu rc=$qrc); retrying" >&2
    cp "$console" "$results/serial.try$try.log" 2>/dev/null || true
done
exit 125
