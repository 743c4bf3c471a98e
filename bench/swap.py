"""The benchmark host's swap: compressed swap (zram, zstd) for points with swap on.

Every scheme of a point runs on the same host setup, swap included (`sweep --swap`). Swap the
host already has (install.sh's zram, a swap file) is used as it is and left alone. Without any,
`ensure()` makes one zram device (modprobe zram, zstd, `size` bytes, mkswap, swapon) and
`remove()` takes it away again at the end of the run. Whether a scheme's sandboxes may swap is
the slice's memory.swap.max (`slice_limit`), written by the host for every run.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.sysfs import read as _read

SYS_BLOCK = "/sys/block"
ZRAM_CONTROL = "/sys/class/zram-control"


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(list(argv), 127, "", str(e))


def active_swaps(proc_swaps: str = "/proc/swaps") -> list[dict[str, Any]]:
    """/proc/swaps as rows: device, type, size and used bytes, priority."""
    rows = []
    for line in (_read(proc_swaps) or "").splitlines()[1:]:
        f = line.split()
        if len(f) >= 5:
            rows.append({"device": f[0], "type": f[1], "size_bytes": int(f[2]) * 1024,
                         "used_bytes": int(f[3]) * 1024, "priority": int(f[4])})
    return rows


def selected_algorithm(text: str) -> str:
    """comp_algorithm's "lzo [zstd] lz4" -> "zstd"."""
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return text.strip()


def zram_stats(device: str) -> dict[str, int] | None:
    """A zram device's mm_stat: bytes stored (orig), compressed (compr), and its memory used."""
    name = os.path.basename(device)
    f = (_read(os.path.join(SYS_BLOCK, name, "mm_stat")) or "").split()
    if len(f) < 3:
        return None
    return {"orig_bytes": int(f[0]), "compr_bytes": int(f[1]), "mem_used_bytes": int(f[2])}


@dataclass
class HostSwap:
    """What the host's swap is during the run, and what the benchmark made of it."""

    devices: list[dict[str, Any]] = field(default_factory=list)
    made: str | None = None  # the zram device the benchmark set up (removed at the end)
    hot_added: bool = False
    algorithm: str = ""
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def zram(self) -> str | None:
        """The first zram device in use (its mm_stat gives the real compression ratio)."""
        for d in self.devices:
            if os.path.basename(d["device"]).startswith("zram"):
                return d["device"]
        return None

    def stats(self) -> dict[str, int] | None:
        z = self.zram
        return zram_stats(z) if z else None


def _free_zram() -> tuple[str, bool] | None:
    """A zram device with no disk size (modprobe makes zram0), else a hot-added one."""
    for name in sorted(os.listdir(SYS_BLOCK)) if os.path.isdir(SYS_BLOCK) else []:
        if name.startswith("zram") and _read(os.path.join(SYS_BLOCK, name, "disksize")) == "0":
            return name, False
    hot = os.path.join(ZRAM_CONTROL, "hot_add")
    if os.path.exists(hot):
        n = _read(hot)  # reading hot_add creates a device and returns its number
        if n and n.isdigit():
            return f"zram{n}", True
    return None


def ensure(size_bytes: int, algorithm: str = "zstd") -> HostSwap:
    """Swap for the run: the host's own if it has any, else a zram device made here."""
    have = active_swaps()
    if have:
        sw = HostSwap(devices=have, notes=["the host's swap, used as it is"])
        z = sw.zram
        if z:
            sw.algorithm = selected_algorithm(
                _read(os.path.join(SYS_BLOCK, os.path.basename(z), "comp_algorithm")) or "")
        return sw
    p = _run("modprobe", "zram")
    if p.returncode and not os.path.isdir(ZRAM_CONTROL):
        raise OSError(f"modprobe zram failed: {p.stderr.strip()}")
    free = _free_zram()
    if free is None:
        raise OSError("no free zram device (every one has a disk size)")
    name, hot = free
    base = os.path.join(SYS_BLOCK, name)
    sw = HostSwap(made=f"/dev/{name}", hot_added=hot)
    try:
        try:
            _write(os.path.join(base, "comp_algorithm"), algorithm)
        except OSError as e:
            sw.notes.append(f"comp_algorithm {algorithm}: {e}; kept the kernel's default")
        sw.algorithm = selected_algorithm(_read(os.path.join(base, "comp_algorithm")) or "")
        _write(os.path.join(base, "disksize"), str(size_bytes))
        for argv in (("mkswap", f"/dev/{name}"), ("swapon", "-p", "100", f"/dev/{name}")):
            p = _run(*argv)
            if p.returncode:
                raise OSError(f"{' '.join(argv)}: {p.stderr.strip() or p.returncode}")
    except OSError:
        remove(sw)
        raise
    sw.devices = active_swaps()
    return sw


def remove(sw: HostSwap) -> None:
    """Take away the zram device the benchmark made (nothing else)."""
    if not sw.made:
        return
    name = os.path.basename(sw.made)
    _run("swapoff", sw.made)
    try:
        _write(os.path.join(SYS_BLOCK, name, "reset"), "1")
        if sw.hot_added:
            _write(os.path.join(ZRAM_CONTROL, "hot_remove"), name.removeprefix("zram"))
    except OSError as e:
        sw.notes.append(f"removing {sw.made}: {e}")
    sw.made = None


def slice_limit(swap: bool) -> str:
    """memory.swap.max of the benchmark's slice: every byte of swap, or none."""
    return "max" if swap else "0"
