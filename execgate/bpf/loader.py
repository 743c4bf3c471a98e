"""Building and loading execgate's BPF programs: shared by the growth gate (gate.py) and the
inside-agent probe (inside_probe.py).

:func:`build` compiles a ``*.bpf.c`` for the running kernel: ``vmlinux.h`` from the kernel's BTF
(``bpftool btf dump ... format c``), then clang; both cached, redone when the kernel, the source
or the flags change. Loading is bpftool's (:func:`run`) into bpffs (:func:`ensure_bpffs`); the
callers open the pins through ``syscall.py`` and remove them (:func:`remove_pins`) so their file
descriptors are the only references. Stdlib only; ``bpftool`` and ``clang`` do the work.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import IO

BPFFS = "/sys/fs/bpf"
VMLINUX_BTF = "/sys/kernel/btf/vmlinux"
DEFAULT_BUILD_DIR = "/var/lib/execgate/bpf"

_TARGET_ARCH = {"x86_64": "x86", "aarch64": "arm64", "ppc64le": "powerpc", "s390x": "s390",
                "riscv64": "riscv", "loongarch64": "loongarch"}


class BpfError(RuntimeError):
    """A BPF program could not be built, loaded or driven (gate.py names it GateError)."""


class BpfUnavailable(BpfError):
    """This kernel/host cannot run it: no BTF, no bpffs, a tool missing, not root... (gate.py
    names it GateUnavailable)."""


# -- build ----------------------------------------------------------------------------------------

def clang_command(src: str | os.PathLike[str], obj: str | os.PathLike[str],
                  include_dir: str | os.PathLike[str], *, clang: str = "clang",
                  machine: str | None = None) -> list[str]:
    """The compiler command for a BPF object (-g: struct_ops needs the BTF)."""
    machine = machine or platform.machine()
    arch = _TARGET_ARCH.get(machine)
    if arch is None:
        raise BpfUnavailable(f"no BPF target arch for {machine}")
    return [clang, "-O2", "-g", "-target", "bpf", "-mcpu=v3", f"-D__TARGET_ARCH_{arch}",
            # vmlinux.h of kernels built with -fms-extensions (6.19+) embeds tagged anonymous
            # structs; without the flag clang drops those members.
            "-fms-extensions", "-Wno-microsoft-anon-tag", "-Wall",
            "-I", os.fspath(include_dir), "-c", os.fspath(src), "-o", os.fspath(obj)]


def run(cmd: list[str], *, timeout: float,
        stdout: int | IO[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs a build or load tool; its failure raises with the last lines of its log."""
    try:
        proc = subprocess.run(cmd, stdout=stdout if stdout is not None else subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise BpfUnavailable(f"{cmd[0]} not found") from e
    except subprocess.TimeoutExpired as e:
        raise BpfError(f"{cmd[0]} timed out after {timeout:.0f}s") from e
    if proc.returncode != 0:
        lines = (proc.stderr or "").strip().splitlines()
        last = lines[-1].strip() if lines else "no output"
        raise BpfError(f"{' '.join(cmd[:3])} failed ({proc.returncode}): {last}\n"
                       + "\n".join(lines[-30:]))
    return proc


def build(out_dir: str | os.PathLike[str] = DEFAULT_BUILD_DIR, *, src: str | os.PathLike[str],
          clang: str = "clang", bpftool: str = "bpftool", btf: str = VMLINUX_BTF,
          force: bool = False, timeout: float = 600.0) -> Path:
    """Builds ``src``'s object (``x.bpf.c`` -> ``x.bpf.o``) for the running kernel into
    ``out_dir``, with ``vmlinux.h`` beside it; both cached (see the module doc)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    src = Path(src)
    if not os.path.exists(btf):
        raise BpfUnavailable(f"{btf} missing: the kernel has no BTF")

    header, header_stamp = out / "vmlinux.h", out / "vmlinux.h.stamp"
    kernel_key = f"{os.uname().release} {os.stat(btf).st_size}\n"
    if force or not header.exists() or _read(header_stamp) != kernel_key:
        tmp = out / "vmlinux.h.tmp"
        with open(tmp, "w") as f:
            run([bpftool, "btf", "dump", "file", btf, "format", "c"], timeout=timeout, stdout=f)
        os.replace(tmp, header)
        header_stamp.write_text(kernel_key)

    name = src.name.removesuffix(".c") + ".o"  # gate.bpf.c -> gate.bpf.o
    obj, obj_stamp = out / name, out / f"{name}.stamp"
    cmd = clang_command(src, out / f"{name}.tmp", out, clang=clang)
    key = hashlib.sha256(src.read_bytes() + kernel_key.encode()
                         + "\0".join(cmd).encode()).hexdigest() + "\n"
    if force or not obj.exists() or _read(obj_stamp) != key:
        run(cmd, timeout=timeout)
        os.replace(out / f"{name}.tmp", obj)
        obj_stamp.write_text(key)
    return obj


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


# -- bpffs and pins -------------------------------------------------------------------------------

def bpffs_mounted(path: str = BPFFS) -> bool:
    try:
        with open("/proc/mounts") as f:
            return any(line.split()[1] == path and line.split()[2] == "bpf" for line in f)
    except OSError:
        return False


def ensure_bpffs() -> None:
    """Mounts bpffs at BPFFS unless it is there: bpftool pins what it loads."""
    if bpffs_mounted():
        return
    os.makedirs(BPFFS, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "bpf", "bpf", BPFFS], capture_output=True, text=True)
    if proc.returncode != 0 or not bpffs_mounted():
        raise BpfUnavailable(f"bpffs not mounted at {BPFFS}: {proc.stderr.strip()}")


def unlink(path: str) -> bool:
    """Removes a pin; False if it was not there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def remove_pins(paths: Iterable[str], directory: str | None = None) -> list[str]:
    """Removes these pins (and only these), then ``directory`` if it is left empty; returns the
    pins that were there."""
    gone = [p for p in paths if unlink(p)]
    if directory is not None:
        with contextlib.suppress(OSError):
            os.rmdir(directory)  # only if empty
    return gone
