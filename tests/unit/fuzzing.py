"""Seeded random inputs for the fuzz harnesses (tests/unit/test_fuzz_*.py).

Each harness feeds N inputs (10,000 by default; EXECGATE_FUZZ_N for a longer run, and
EXECGATE_FUZZ_SEED for another sequence) from one seeded generator, so a failure names the
seed and the input's index and replays exactly.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from typing import Any

N = int(os.environ.get("EXECGATE_FUZZ_N", "10000"))
SEED = int(os.environ.get("EXECGATE_FUZZ_SEED", "21"))

# Strings an attacker (or a confused model) would try: separators, escapes, huge numbers,
# units, NUL, non-ASCII, shell.
ATOMS = ["", " ", ",", "=", ":", "-", "--", ".", "0", "1", "-1", "1e9", "nan", "inf",
         "1000000000g", "999999999999999999999", "0x10", "mem", "memory", "cpu", "io",
         "duration", "priority", "idempotent", "low", "medium", "high", "normal", "512m",
         "2GiB", "1.5g", "\x00", "\x1b[31m", "\n", "\t", "é", "\U0001f600", "';touch${IFS}x;#'",
         "tool-", "/", "..", "%s", "{}", "[]", "null", "true"]


def rng(salt: str) -> random.Random:
    """One harness's generator: the seed and the harness's name (harnesses stay independent)."""
    return random.Random(f"{SEED}:{salt}")


def text(r: random.Random, max_atoms: int = 6) -> str:
    """A string of atoms and random characters."""
    parts = []
    for _ in range(r.randrange(max_atoms + 1)):
        if r.random() < 0.7:
            parts.append(r.choice(ATOMS))
        else:
            parts.append("".join(chr(r.choice((r.randrange(32, 127), r.randrange(0x110000))))
                                 for _ in range(r.randrange(1, 5))).encode(
                "utf-8", "replace").decode("utf-8", "replace"))
    return "".join(parts)


def scalar(r: random.Random) -> Any:
    return r.choice([
        None, True, False, 0, -1, 1, 2**31, 2**63, -(2**63), 2**64 + 1, 10**30, 0.5, -0.0,
        float("inf"), float("nan"), 1e308, text(r), r.randrange(-1000, 1000),
    ])


def value(r: random.Random, depth: int = 0) -> Any:
    """Any JSON/msgpack-shaped value: scalars, lists, maps (string keys), a few levels deep."""
    roll = r.random()
    if depth >= 3 or roll < 0.55:
        return scalar(r)
    if roll < 0.75:
        return [value(r, depth + 1) for _ in range(r.randrange(4))]
    return {text(r, 2): value(r, depth + 1) for _ in range(r.randrange(4))}


def depth(r: random.Random) -> int:
    """How deep a nested-past-sanity input goes (recursion limits)."""
    return r.choice((200, 2000, 100_000))


@contextlib.contextmanager
def reported(i: int, data: object, *allowed: type[Exception]) -> Iterator[None]:
    """Any exception but the allowed ones fails the harness, naming the seed and the input."""
    try:
        yield
    except allowed:
        raise
    except Exception as e:
        raise AssertionError(f"seed {SEED} input {i}: {str(data)[:300]}: {e!r}") from e
