"""The demand model's features are causal: a call's vector is a function of the calls that
ended before it arrived, never of itself or of later calls (issue 22)."""

import os
import random
import subprocess
import sys

import pytest

from execgate.common.units import MiB
from execgate.ctl.model_data import CallRow, causal_split, features
from execgate.policy.predictor_features import (
    N_FEATURES,
    NAMES,
    CallHistory,
    command_key,
    word_buckets,
)

CMDS = ["git status", "python -m pytest tests -x", "pip install -e .", "ls -la", "make -j4",
        "python -m pytest tests/test_core.py"]


def _rows(n: int, seed: int = 1) -> list[CallRow]:
    rng = random.Random(seed)
    rows, t = [], 0.0
    for i in range(n):
        sandbox = f"sb{rng.randrange(4)}"
        arrive = t + rng.uniform(0, 2)
        t = arrive
        rows.append(CallRow(sandbox, sandbox, ("sh", "-c", rng.choice(CMDS)), None, arrive,
                            arrive + rng.uniform(0.01, 5), rng.randrange(1, 900) * MiB,
                            None, oom_killed=i % 17 == 0))
    return rows


def test_a_vector_is_what_the_calls_ended_before_it_arrived_give() -> None:
    rows = _rows(120)
    ordered, x = features(rows)
    for k in (0, 1, 7, 40, 119):
        r = ordered[k]
        history = CallHistory()
        for done in sorted((q for q in rows if q.end <= r.arrive), key=lambda q: q.end):
            history.observe(done.sandbox, done.argv,
                            done.peak_bytes * (2 if done.oom_killed else 1), done.duration_s)
        assert x[k] == history.features(r.sandbox, r.argv), k


def test_a_call_never_sees_its_own_peak_or_a_later_one() -> None:
    rows = _rows(60)
    _, before = features(rows)
    changed = [CallRow(r.group, r.sandbox, r.argv, r.declared_bytes, r.arrive, r.end,
                       r.peak_bytes * 3 if i >= 30 else r.peak_bytes, None, r.oom_killed)
               for i, r in enumerate(rows)]
    ordered, after = features(changed)
    for k, r in enumerate(ordered):
        if r.arrive <= rows[30].arrive:  # arrived before any changed call could have ended
            assert after[k] == before[k]


def test_the_vector_has_its_names_and_a_hash_that_is_the_same_in_every_process() -> None:
    vec = CallHistory().features("s", ["pytest", "-x"])
    assert len(vec) == N_FEATURES == len(NAMES)
    # crc32, not str.__hash__ (salted per process): the trainer's buckets are the daemon's
    code = "from execgate.policy.predictor_features import word_buckets as w; print(sorted(w(" \
           "'python -m pytest tests')))"
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
            for seed in ("1", "2")}
    assert runs == {f"{sorted(word_buckets('python -m pytest tests'))}\n"}


def test_the_same_command_through_a_shell_is_the_same_command() -> None:
    assert command_key(["/bin/bash", "-lc", "pytest  -x"]) == command_key(["pytest", "-x"])
    h = CallHistory()
    h.observe("s", ["sh", "-c", "pytest -x"], 400 * MiB)
    h.observe("s", ["pytest", "-x"], 500 * MiB)
    vec = h.features("s", ["bash", "-c", "pytest -x"])
    assert vec[NAMES.index("sbcmd_calls")] == 2
    assert vec[NAMES.index("sbcmd_last")] == 500
    assert vec[NAMES.index("sbcmd_growth")] == 100  # a retry loop's growth, in MiB


def test_history_is_per_sandbox_and_a_removed_sandbox_is_forgotten() -> None:
    h = CallHistory()
    h.observe("a", ["make"], 300 * MiB)
    assert h.features("b", ["make"])[NAMES.index("sb_calls")] == 0
    assert h.features("b", ["make"])[NAMES.index("cmd_last")] == 300  # host-wide
    h.forget_sandbox("a")
    assert h.features("a", ["make"])[NAMES.index("sb_calls")] == 0


def test_a_causal_split_trains_on_the_earlier_tasks() -> None:
    rows = [CallRow(g, g, ("ls",), None, t, t + 1, MiB, None)
            for g, t in (("late", 50.0), ("early", 1.0), ("mid", 20.0), ("early", 60.0))]
    train, test = causal_split(rows, 0.67)
    assert train == {"early", "mid"} and test == {"late"}


def test_what_is_remembered_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from execgate.policy import predictor_features as pf

    monkeypatch.setattr(pf, "MAX_SANDBOXES", 3)
    monkeypatch.setattr(pf, "MAX_COMMANDS", 2)
    h = CallHistory()
    for i in range(5):
        h.observe(f"sb{i}", ["make", f"t{i}"], MiB)
        h.observe("busy", ["cat", f"f{i}"], MiB)
    assert list(h._sandboxes) == ["sb3", "sb4", "busy"]  # least recently seen forgotten
    assert len(h._commands) == 2 and len(h._sandboxes["busy"].by_command) == 2


def test_a_huge_command_line_costs_no_more_than_its_first_characters() -> None:
    import time

    from execgate.policy.predictor_features import MAX_KEY_CHARS

    argv = ["sh", "-c", " ".join(f"arg{i}" for i in range(12000))]  # ~97 KB
    assert len(command_key(argv)) == MAX_KEY_CHARS
    h = CallHistory()
    start = time.process_time()
    for _ in range(10):
        h.features("s", argv, cls="other")
    assert (time.process_time() - start) / 10 < 0.005  # ~0.5 ms here; hashing it all took 6
