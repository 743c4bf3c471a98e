#!/usr/bin/env bash
# Installs execgate on a container host (run as root), or removes it with --uninstall.
#
#   ./install.sh [--prefix DIR] [--runtime-name NAME] [--engines LIST] [--set-as-default]
#                [--no-docker] [--no-start] [--no-swap | --swap-size SIZE]
#   ./install.sh --uninstall [--purge] [--prefix DIR] [--runtime-name NAME] [--engines LIST]
#
# Compressed swap for idle sandboxes: zram (zstd) on a host without swap, sized by --swap-size,
# else [swap] size in config.toml, else 50% of RAM; zswap over a host's existing swap;
# --no-swap leaves the host's swap alone. --uninstall removes exactly what install made, and a
# "default-runtime" naming the runtime it removes. Engines (execgatectl configure): --engines
# docker,containerd,crio,podman, or auto (the default): each of docker, crio and podman this host
# has, and containerd where there is no Docker (on a Docker host containerd is Docker's backend:
# name it for Kubernetes). Docker is reloaded; the others are told how to restart. --no-docker
# leaves Docker out; --set-as-default makes execgate each engine's default runtime.
# Idempotent. pip's own settings are honoured, so an offline install is
#   PIP_NO_INDEX=1 PIP_FIND_LINKS=/path/to/wheels ./install.sh
set -euo pipefail

src=$(cd "$(dirname "$0")" && pwd)
prefix=/opt/execgate
name=execgate
docker=1
engines=auto
set_default=
start=1
uninstall=0
purge=0
bindir=/usr/local/bin
confdir=/etc/execgate
daemon_json=${EXECGATE_DOCKER_CONFIG:-/etc/docker/daemon.json}
unit=/etc/systemd/system/execgated.service
swap_unit=/etc/systemd/system/execgate-swap.service
swap=1
swap_size=
commands=(execgate execgated execgatectl)

# The comment block at the top, and nothing after it.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit "${1:-0}"; }
die() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "install.sh: $*"; }

while [[ $# -gt 0 ]]; do
    case $1 in
        --prefix) prefix=${2:?--prefix needs a directory}; shift ;;
        --prefix=*) prefix=${1#*=} ;;
        --runtime-name) name=${2:?--runtime-name needs a name}; shift ;;
        --runtime-name=*) name=${1#*=} ;;
        --no-docker) docker=0 ;;
        --engines) engines=${2:?--engines needs a list (docker,containerd,crio,podman or auto)}; shift ;;
        --engines=*) engines=${1#*=} ;;
        --set-as-default) set_default=--set-as-default ;;
        --no-start) start=0 ;;
        --no-swap) swap=0 ;;
        --swap-size) swap_size=${2:?--swap-size needs a size (50% or 8g)}; shift ;;
        --swap-size=*) swap_size=${1#*=} ;;
        --uninstall) uninstall=1 ;;
        --purge) purge=1 ;;
        -h|--help) usage 0 ;;
        *) echo "install.sh: unknown option $1" >&2; usage 2 ;;
    esac
    shift
done
[[ $name =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]] || die "invalid runtime name '$name'"
[[ $(id -u) == 0 ]] || die "must run as root"

have_systemd() { [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; }
runtime_path=$bindir/execgate
# execgatectl configure (execgate/ctl/configure.py, stdlib only: runs before the package is in).
engine_ctl() {
    local cmd=$1 engine=$2; shift 2
    local conf=()
    [[ $engine == docker ]] && conf=(--config "$daemon_json")
    if [[ $cmd == present ]]; then
        PYTHONPATH=$src python3 -m execgate.ctl.configure present "$engine" "${conf[@]}"
    else
        PYTHONPATH=$src python3 -m execgate.ctl.configure "$cmd" "$engine" "${conf[@]}" \
            --runtime-name "$name" --runtime-path "$runtime_path" "$@"
    fi
}
prefixed() { sed "s/^/install.sh: /"; }
all_engines=(docker containerd crio podman)
if [[ $engines != auto ]]; then
    IFS=, read -r -a listed <<<"$engines"
    for e in "${listed[@]}"; do
        [[ " ${all_engines[*]} " == *" $e "* ]] || die "unknown engine '$e' (docker, containerd, crio, podman)"
    done
fi
# The engines to register with: the list given, or those this host has (auto); uninstall's auto
# is every engine (taking out what is not there changes nothing).
select_engines() {
    local picked=() e
    if [[ $engines != auto ]]; then
        picked=("${listed[@]}")
    elif [[ $uninstall == 1 ]]; then
        picked=("${all_engines[@]}")
    else
        for e in "${all_engines[@]}"; do
            [[ $e == containerd ]] && engine_ctl present docker && continue
            engine_ctl present "$e" && picked+=("$e")
        done
    fi
    for e in "${picked[@]}"; do
        [[ $e == docker && $docker == 0 ]] || echo "$e"
    done
}
# Swap setup's bookkeeping (execgate/ctl/swap.py): the plan in /var/lib/execgate/swap.json, what
# was made this boot in /run/execgate/swap-made.json; removal undoes that and nothing else.
swap_ctl() { PYTHONPATH=$src python3 -m execgate.ctl.swap "$@"; }

reload_docker() {
    # Runtimes are re-read on SIGHUP: no restart, running containers are untouched. The reload
    # is asynchronous: wait until dockerd lists the runtime as it should (or not) be.
    local want=$1
    if have_systemd && systemctl is-active --quiet docker 2>/dev/null; then
        systemctl reload docker || return 0
    elif pid=$(pidof dockerd 2>/dev/null); then
        kill -HUP $pid || return 0
    else
        return 0
    fi
    command -v docker >/dev/null || return 0
    for _ in $(seq 1 100); do
        if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q "\"$name\""; then
            [[ $want == present ]] && { say "docker reloaded: runtime '$name' available"; return 0; }
        else
            [[ $want == absent ]] && { say "docker reloaded: runtime '$name' removed"; return 0; }
        fi
        sleep 0.2
    done
    say "warning: docker did not pick up the change within 20 s (see journalctl -u docker)"
}

if [[ $uninstall == 1 ]]; then
    # Each engine's file as it was (a default runtime set with it goes too); none of ours: no-op.
    for e in $(select_engines); do
        out=$(engine_ctl unconfigure "$e") || die "$e's config left as it was"
        [[ $out == *"nothing to change"* ]] && continue
        prefixed <<<"$out"
        [[ $e == docker ]] && reload_docker absent
    done
    if have_systemd && [[ -f $unit ]]; then
        systemctl disable --now execgated.service >/dev/null 2>&1 || true
        rm -f "$unit"
        systemctl daemon-reload
    fi
    if have_systemd && [[ -f $swap_unit ]]; then
        systemctl disable execgate-swap.service >/dev/null 2>&1 || true
        rm -f "$swap_unit"
        systemctl daemon-reload
    fi
    # Only what install made (swapoff, device reset, module unloaded if we loaded it, zswap
    # restored): a host's own swap is never touched.
    if out=$(swap_ctl remove 2>&1); then
        [[ $out == "nothing to remove" ]] || say "swap: $out"
    else
        say "warning: swap not fully removed: $out"
    fi
    for c in "${commands[@]}"; do
        [[ -L $bindir/$c && $(readlink "$bindir/$c") == "$prefix/bin/$c" ]] && rm -f "$bindir/$c"
    done
    rm -rf "$prefix"
    if [[ $purge == 1 ]]; then
        rm -rf "$confdir" /var/lib/execgate
    fi
    say "execgate removed"
    exit 0
fi

command -v python3 >/dev/null || die "python3 is required"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "Python >= 3.11 is required"
python3 -c 'import venv, ensurepip' 2>/dev/null || die "python3-venv is required (apt-get install python3-venv)"
# No Docker here (no daemon.json, no /etc/docker, no dockerd): nothing to register with, and a
# daemon.json written now would surprise a later Docker install.
if [[ $docker == 1 && $engines == auto ]] && ! engine_ctl present docker; then
    say "no Docker found (no $daemon_json, no dockerd): not registering with Docker; install Docker, then run install.sh again"
fi
selected=$(select_engines | tr '\n' ' ')
# Refuse before changing anything when an engine's config cannot be merged.
for e in $selected; do
    engine_ctl configure "$e" $set_default --dry-run >/dev/null \
        || die "not registering with $e; nothing was changed"
done

# The venv sees system site-packages so Debian's python3-bpfcc (not on PyPI) is importable.
if [[ ! -x $prefix/bin/python ]]; then
    python3 -m venv --system-site-packages "$prefix"
fi
"$prefix/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "$src" \
    || die "pip install failed"
# The runtime runs on every call Docker makes. Its Python entry point (execgate-py) starts Python
# isolated and without site, the venv's site-packages put on sys.path explicitly
# (runtime/launcher.py); a compiled front (runtime/front.c), installed as execgate, execve()s the
# real runtime for every call with nothing to do and starts execgate-py only for the rest.
# Without a C compiler, execgate is the Python entry point itself.
py_entry=$prefix/bin/execgate-py
if ! "$prefix/bin/python" -m execgate.runtime.launcher "$py_entry"; then
    say "warning: execgate-py is a plain entry point (slower start-up)"
    printf '#!%s\n# execgate.runtime.main, as pip writes it\nimport sys\nfrom execgate.runtime.main import main\nsys.exit(main())\n' \
        "$prefix/bin/python" >"$py_entry.tmp" && chmod 0755 "$py_entry.tmp" && mv -f "$py_entry.tmp" "$py_entry"
fi
if "$prefix/bin/python" -m execgate.runtime.front build "$prefix/bin/execgate" "$py_entry" \
        >/dev/null 2>"$prefix/front-build.log"; then
    say "built the runtime's compiled front: Python starts only for calls with work to do"
else
    say "warning: no compiled front (see $prefix/front-build.log): every runtime call starts Python"
    install -m 0755 "$py_entry" "$prefix/bin/execgate"
fi
install -m 0644 "$src/README.md" "$prefix/README.md"
for c in "${commands[@]}"; do
    ln -sfn "$prefix/bin/$c" "$bindir/$c"
done
say "installed into $prefix; commands linked in $bindir"

install -d -m 0755 "$confdir"
if [[ ! -f $confdir/config.toml ]]; then
    install -m 0644 "$src/packaging/config.toml" "$confdir/config.toml"
    say "wrote $confdir/config.toml"
fi
install -d -m 0750 /var/lib/execgate

# The growth gate's sched_ext scheduler is built here, for this kernel (vmlinux.h from its BTF,
# then clang); without sched_ext or the toolchain the daemon falls back to cgroup.freeze.
if [[ -d /sys/kernel/sched_ext && -f /sys/kernel/btf/vmlinux ]] && command -v clang >/dev/null \
        && command -v bpftool >/dev/null; then
    if obj=$("$prefix/bin/python" -m execgate.bpf.gate build 2>"$prefix/bpf-build.log"); then
        say "built the sched_ext growth gate: $obj"
    else
        say "warning: sched_ext gate build failed (see $prefix/bpf-build.log); cgroup.freeze will be used"
    fi
else
    say "no sched_ext toolchain or kernel support: the growth gate will use cgroup.freeze"
fi

# The inside-agent probe (bpf/inside.bpf.c: an inside agent's commands followed in the kernel)
# needs BTF, clang and bpftool but not sched_ext; without it the daemon reads the proc connector.
if [[ -f /sys/kernel/btf/vmlinux ]] && command -v clang >/dev/null && command -v bpftool >/dev/null; then
    if obj=$("$prefix/bin/python" -m execgate.bpf.inside_probe build 2>>"$prefix/bpf-build.log"); then
        say "built the inside-agent probe: $obj"
    else
        say "warning: inside-agent probe build failed (see $prefix/bpf-build.log); the proc connector will be used"
    fi
fi

# Compressed swap, where idle sandboxes' memory goes (memory.reclaim needs swap to move
# anonymous memory). Applied now, and at every boot by execgate-swap.service.
if [[ $swap == 1 ]]; then
    why=$(swap_ctl plan ${swap_size:+--size "$swap_size"} 2>&1) || die "swap: $why"
    if out=$(swap_ctl start 2>&1); then
        say "swap: $out"
    else
        say "warning: swap setup failed, sandboxes' idle memory stays in RAM: $out"
    fi
    if have_systemd; then
        sed "s|@PYTHON@|$prefix/bin/python|" "$src/packaging/execgate-swap.service" >"$swap_unit"
        chmod 0644 "$swap_unit"
        systemctl daemon-reload
        systemctl enable execgate-swap.service >/dev/null 2>&1
        systemctl start execgate-swap.service || true  # set up already: marks it active
    else
        say "no systemd: swap is not set up again after a reboot (run: $prefix/bin/python -m execgate.ctl.swap start)"
    fi
fi

if have_systemd; then
    install -m 0644 "$src/packaging/execgated.service" "$unit"
    systemctl daemon-reload
    systemctl enable execgated.service >/dev/null 2>&1
    if [[ $start == 1 ]]; then
        systemctl restart execgated.service || say "warning: execgated did not start (see journalctl -u execgated)"
    fi
else
    say "no systemd: start $bindir/execgated yourself"
fi

for e in $selected; do
    out=$(engine_ctl configure "$e" $set_default) || die "registering with $e failed"
    prefixed <<<"$out"
    case $e in
        docker) reload_docker present; say "use it with: docker run --runtime $name ..." ;;
        podman) say "use it with: podman run --runtime $name ..." ;;
        *) say "$e: a Kubernetes RuntimeClass with handler '$name' (packaging/k8s/) picks it" ;;
    esac
done
[[ -n $selected ]] || say "no container engine registered (--engines to choose)"
