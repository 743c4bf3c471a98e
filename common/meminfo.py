"""/proc/meminfo as bytes (the host's side of every memory figure execgate reports)."""

from __future__ import annotations


def read() -> dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * 1024
    return out


def available() -> int | None:
    try:
        return read().get("MemAvailable")
    except (OSError, ValueError):
        return None
