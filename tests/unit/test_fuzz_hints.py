"""Fuzz: AGENT_RESOURCE_HINT values, the one field an agent writes freely (issue 21).

Whatever the string, `hints.parse` returns a hint or a reason and never raises; a hint's
values are in range and survive the wire (to_dict/from_dict, as the daemon validates them);
clamping never lifts a declaration above the limit; and what the agent is told back is one
line of printable ASCII (no terminal escape, no line break smuggled into its stderr).
"""

from __future__ import annotations

import random

import fuzzing

from execgate.calls import feedback
from execgate.common import hints

ITEMS = ("mem", "memory", "cpu", "io", "duration", "priority", "idempotent", "bogus")
VALUES = {  # values near each key's grammar, good and bad
    "mem": ("512m", "2g", "1.5GiB", "low", "medium", "high", "1048576", "1000000000g", "0",
            "-1", "1e3", "2 g", ".5k", "9" * 25),
    "cpu": ("2", "0.5", ".25", "-1", "0", "nan", "1e9"),
    "io": ("50", "0.1", "-3", "inf"),
    "duration": ("30", "30s", "500ms", "2m", "-1s", "1h", "0"),
    "priority": ("low", "normal", "high", "urgent", ""),
}
VALUES["memory"] = VALUES["mem"]
SEPS = (":", "=", " : ", "= ", "")
JOINS = (",", " ", ", ", ",,", "\t", "\n", "")


def _hint(r: random.Random) -> str:
    if r.random() < 0.2:
        return fuzzing.text(r, 12)
    if r.random() < 0.02:
        return "mem=1g," * r.randrange(100, 300)  # past MAX_LEN
    parts = []
    for _ in range(r.choice((1, 1, 2, 3))):
        key = r.choice(ITEMS)
        key = key.upper() if r.random() < 0.1 else key
        if key == "idempotent" and r.random() < 0.8:
            parts.append(key)
            continue
        known = VALUES.get(key.lower())
        value = r.choice(known) if known and r.random() < 0.8 else fuzzing.text(r, 2)
        parts.append(key + r.choice(SEPS) + value)
    return "".join(p + r.choice(JOINS) for p in parts)


def test_any_hint_parses_to_a_hint_or_one_clear_reason() -> None:
    r = fuzzing.rng("hints")
    good = bad = 0
    for i in range(fuzzing.N):
        raw = _hint(r)
        with fuzzing.reported(i, repr(raw)):
            parsed = hints.parse(raw)
        assert parsed.hint is None or parsed.error is None
        if parsed.error is not None:
            bad += 1
            told = feedback.hint_ignored(raw, parsed.error)
            assert told.endswith("\n") and "\n" not in told[:-1], (i, raw, told)
            assert all(" " <= ch <= "~" for ch in told[:-1]), (i, raw, told)
            continue
        if parsed.hint is None:
            continue
        good += 1
        h = parsed.hint
        assert h.memory_bytes is None or 0 < h.memory_bytes <= hints.MAX_BYTES, (i, raw)
        assert hints.Hint.from_dict(h.to_dict()) == h, (i, raw)
        limit = r.choice((None, 1, 64 << 20, 1 << 40))
        cut = hints.clamp(h, priority_allowed=r.random() < 0.5, memory_limit=limit)
        if limit is not None and cut.memory_bytes is not None:
            assert cut.memory_bytes <= limit, (i, raw)
    assert good > fuzzing.N // 20 and bad > fuzzing.N // 20, (good, bad)
