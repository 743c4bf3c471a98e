#!/usr/bin/env bash
# Builds the growth gate's sched_ext scheduler for the running kernel (needs bpftool, clang and
# libbpf's headers) and prints the object's path:
#   execgate/bpf/build.sh [OUT_DIR] [--force]        (default OUT_DIR: /var/lib/execgate/bpf)
# vmlinux.h comes from this kernel's BTF; both it and the object are cached in OUT_DIR and
# rebuilt when the kernel, the source or the flags change. The steps live in loader.py's build().
set -euo pipefail
# Runs from a checkout (execgate/bpf/) and from an installed package alike.
PYTHONPATH=$(cd "$(dirname "$0")/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH} exec python3 -m execgate.bpf.gate build "$@"
