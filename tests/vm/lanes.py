#!/usr/bin/env python3
"""Splits the e2e suite into N lanes of about equal VM time, one line of test paths per lane.

    tests/vm/lanes.py N        (paths as the VM sees them: src/tests/e2e/test_x.py)

Longest file first onto the lightest lane, by the seconds in e2e-seconds.txt (a new file counts
DEFAULT_S until it is measured). Stdlib only: it runs on the host before the venv exists.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
E2E = HERE.parent / "e2e"
DEFAULT_S = 120.0


def seconds() -> dict[str, float]:
    out = {}
    for line in (HERE / "e2e-seconds.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            s, name = line.split()
            out[name] = float(s)
    return out


def lanes(n: int) -> list[list[str]]:
    known = seconds()
    files = sorted((p.name for p in E2E.glob("test_*.py")),
                   key=lambda f: (-known.get(f, DEFAULT_S), f))
    load = [0.0] * n
    out: list[list[str]] = [[] for _ in range(n)]
    for f in files:
        i = load.index(min(load))
        out[i].append(f"src/tests/e2e/{f}")
        load[i] += known.get(f, DEFAULT_S)
    return [lane for lane in out if lane]


if __name__ == "__main__":
    for lane in lanes(int(sys.argv[1])):
        print(" ".join(lane))
