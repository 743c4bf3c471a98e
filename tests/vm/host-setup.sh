#!/usr/bin/env bash
# What this host needs before it builds and boots the test VM and draws the results, for every
# way in (tests/run.sh, demo.sh): the Debian packages, installed where missing, and the
# checkout's venv with the given extras. A fresh machine has none of it.
#   tests/vm/host-setup.sh [--no-vm] EXTRAS      e.g. test,bench,model
# --no-vm: only what the host's own Python needs (unit tests). EXECGATE_SETUP_DRY_RUN=1 prints
# what it would install and stops there.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
vm=1
[[ ${1:-} == --no-vm ]] && { vm=0; shift; }
extras=${1:?host-setup.sh: which extras (e.g. test,bench)}

need=()
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
if [[ $vm == 1 ]]; then
    command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
    command -v debootstrap >/dev/null || need+=(debootstrap)
    command -v debugfs >/dev/null || need+=(e2fsprogs)
fi
if [[ ${EXECGATE_SETUP_DRY_RUN:-0} == 1 ]]; then
    echo "[setup] would install host packages: ${need[*]:-none}; venv extras: $extras"
    exit 0
fi
if [[ ${#need[@]} -gt 0 ]]; then
    echo "[setup] installing host packages: ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${need[@]}" >/dev/null || { echo "[setup] apt-get failed" >&2; exit 1; }
fi
if [[ ! -x $repo/.venv/bin/python ]]; then
    python3 -m venv "$repo/.venv" || exit 1
fi
"$repo/.venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$repo[$extras]"
