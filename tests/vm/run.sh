#!/usr/bin/env bash
# Host side of the test bed: packs this checkout and the wheels it needs into a payload, boots
# the VM on it (tests/vm/boot.sh) and prints what came back.
#   tests/vm/run.sh [test|bench|cmd] [RESULTS_DIR]
#     test   the end-to-end suite (pytest inside the VM); EXECGATE_E2E_ARGS adds pytest args;
#            test paths there (src/tests/e2e/...) run instead of the whole suite
#     bench  the exec-latency benchmark
#     cmd    the shell command in $EXECGATE_VM_CMD
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
mode=${1:-test}
results=${2:-$repo/results/vm-$mode}
timeout_s=${EXECGATE_VM_TIMEOUT:-2400}
wheels_cache=${EXECGATE_WHEELS_CACHE:-/var/cache/execgate-vm/wheels}

# One VM at a time on this host (TCG is CPU-bound): later runs queue here.
exec 9>"${EXECGATE_VM_LOCK:-/tmp/execgate-vm.lock}"
if ! flock -n 9; then
    echo "[vm] another VM run holds ${EXECGATE_VM_LOCK:-/tmp/execgate-vm.lock}; waiting" >&2
    flock 9
fi

payload=$(mktemp -d "${TMPDIR:-/tmp}/execgate-payload.XXXXXX")
trap 'rm -rf "$payload"' EXIT

# The VM has no network: what pip needs inside comes from here (trixie runs Python 3.13).
# Lanes of the suite run at once (tests/run.sh): one downloads, the others wait for it.
mkdir -p "$wheels_cache"
exec 8>"$wheels_cache.lock"
flock 8
# execgate's dependencies as pyproject.toml lists them, and what pip builds it with; the
# marker names what was downloaded: a cache from before a new dependency is topped up.
mapfile -t wheels < <(python3 -c 'import sys, tomllib
print(*tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"], sep="\n")' \
    "$repo/pyproject.toml")
wheels+=("setuptools>=61" wheel)
marker=$wheels_cache/.done-$(printf '%s\n' "${wheels[@]}" | cksum | cut -d' ' -f1)
if [[ ! -f $marker ]]; then
    python3 -m pip download --quiet --disable-pip-version-check -d "$wheels_cache" \
        --only-binary=:all: --python-version 3.13 --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --implementation cp "${wheels[@]}"
    touch "$marker"
fi
exec 8>&-
mkdir -p "$payload/wheels"
cp "$wheels_cache"/*.whl "$payload/wheels/"

mkdir -p "$payload/src"
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
    # Tracked and untracked-but-not-ignored files: what a fresh clone would have, plus new work.
    git -C "$repo" ls-files -z --cached --others --exclude-standard \
        | (cd "$repo" && xargs -0 cp --parents -t "$payload/src" 2>/dev/null) || true
else
    cp -a "$repo/." "$payload/src/"
fi
cp "$here/guest-run.sh" "$payload/run.sh"
echo "$mode" >"$payload/mode"
[[ $mode == cmd ]] && printf '%s\n' "${EXECGATE_VM_CMD:?EXECGATE_VM_CMD is empty}" >"$payload/cmd"
# EXECGATE_* settings (test arguments, cycle counts, ...) follow the payload into the VM.
for v in ${!EXECGATE_@}; do printf 'export %s=%q\n' "$v" "${!v}"; done >"$payload/env"

# Measurement boots (bench, cmd) run THP for madvised memory only (boot.sh); the suite keeps
# the kernel's default until a whole suite has passed with it.
[[ $mode == test ]] || export EXECGATE_VM_THP=${EXECGATE_VM_THP-madvise}

set +e
"$here/boot.sh" "$payload" "$results" "$timeout_s"
rc=$?
set -e
echo "[vm] results in $results (rc=$rc)" >&2
exit $rc
