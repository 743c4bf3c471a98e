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


def field(data: bytes, key: str) -> int | None:
    """One field of /proc/meminfo's raw bytes ("MemAvailable:  123 kB") in bytes, without
    parsing the rest: the daemon reads it every control period."""
    k = key.encode() + b":"
    if data.startswith(k):
        i = 0
    else:
        i = data.find(b"\n" + k)
        if i < 0:
            return None
        i += 1
    end = data.find(b"\n", i)
    fields = data[i + len(k):end if end >= 0 else len(data)].split()
    try:
        return int(fields[0]) * 1024
    except (IndexError, ValueError):
        return None
