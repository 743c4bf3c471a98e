"""Binary byte units, defined once for the package, the benchmarks and the tests.

Import-free on purpose: the runtime's hot path imports it (through common/hints.py).
"""

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
