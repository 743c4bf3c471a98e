"""Binary byte units, defined once for the package, the benchmarks and the tests.

Import-free on purpose: the runtime's hot path imports it (through common/hints.py).
"""

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40


def scale(n: float) -> tuple[float, str]:
    """n bytes in the largest binary unit it reaches, as (value, prefix): (1.5, "G")."""
    for prefix, size in (("T", TiB), ("G", GiB), ("M", MiB), ("K", KiB)):
        if abs(n) >= size:
            return n / size, prefix
    return float(n), ""


def short(n: float | None) -> str:
    """Bytes for a table column, in human units: 60.0G, 512M, 1.5K, 300B; "-" if unknown."""
    if n is None:
        return "-"
    value, prefix = scale(n)
    if not prefix:
        return f"{n:.0f}B"
    return f"{value:.0f}{prefix}" if abs(value) >= 100 else f"{value:.1f}{prefix}"
