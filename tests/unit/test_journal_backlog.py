"""A large journal backlog is followed in bounded chunks (issue 20): the old follower read a
1M-line backlog in one go on the event loop (76-119 s, ~780 MB). Measured here on a generated
200k-line journal, against the old read, each in a fresh interpreter (peak RSS is per process)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_daemon_engine import _engine

from execgate.common.units import MiB
from execgate.daemon import engine as engine_mod

LINES = 200_000
ROOT = Path(__file__).resolve().parents[2]

# Prints the peak RSS growth (bytes) and the longest the caller was held (s of CPU: wall time
# on a loaded test host is mostly other processes'), reading the journal argv[1] the old way
# (one read) or the new (read_new until caught up).
MEASURE = """
import os, resource, sys, time
from execgate.common import records
from execgate.daemon.journal_follow import JournalFollower
from execgate.daemon.store import Store

def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

path, how = sys.argv[1], sys.argv[2]
follower = JournalFollower(path, Store(":memory:"))
base, n, longest = rss(), 0, 0.0
if how == "old":  # the follower before issue 20: the whole backlog at once
    t = time.thread_time()
    with open(path, "rb") as f:
        data = f.read()
    end = data.rfind(b"\\n") + 1
    n = len(records.journal_entries(data[:end].splitlines()))
    longest = time.thread_time() - t
else:
    while follower.behind:
        t = time.thread_time()
        n += len(follower.read_new())
        longest = max(longest, time.thread_time() - t)
print(n, rss() - base, longest)
"""


def _journal(path: Path, lines: int) -> None:
    line = ('{"call":"tool-%016x","container":"c0ffee","sandbox":"sb%d","argv":["python3","-m",'
            '"pytest","-q","tests/test_%d.py"],"start":%d.5,"hint":{},"managed":true,'
            '"memory_peak":%d,"pids_peak":3,"duration":1.5,"oom_killed":false,"exit_code":0}\n')
    with open(path, "w") as f:
        for i in range(lines):
            f.write(line % (i, i % 500, i % 97, 1_700_000_000 + i, 100 * MiB + i))


def _measure(path: Path, how: str) -> tuple[int, int, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", MEASURE, str(path), how], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    return int(out[0]), int(out[1]), float(out[2])


def test_a_200k_line_backlog_is_read_in_bounded_chunks(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    _journal(path, LINES)
    old_n, old_rss, old_held = _measure(path, "old")
    new_n, new_rss, new_held = _measure(path, "new")
    print(f"\n{LINES} lines, {path.stat().st_size / MiB:.1f} MiB: old {old_held:.2f} s CPU in one "
          f"call, +{old_rss / MiB:.0f} MiB; new longest call {new_held * 1e3:.1f} ms CPU, "
          f"+{new_rss / MiB:.1f} MiB")
    assert old_n == new_n == LINES
    assert new_rss < 16 * MiB and new_rss * 10 < old_rss
    assert new_held < 0.05 and new_held * 20 < old_held


def test_an_engine_step_takes_a_bounded_part_of_the_backlog(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    eng, _, journal = _engine(tmp_path, budget=1 << 30, used=64 * MiB)
    _journal(journal, 3000)
    with open(journal, "a") as f:  # a value of the wrong type is skipped, never the next line
        f.write(json.dumps({"call": "bad", "memory_peak": "x", "pids_peak": 1}) + "\n")
        f.write(json.dumps({"call": "last", "memory_peak": 1, "pids_peak": 1}) + "\n")
    monkeypatch.setattr(engine_mod, "JOURNAL_STEP_S", 0.0)  # one chunk a step
    eng.follow_journal()
    first = eng.store.count() or 0
    assert 0 < first < 3000 and eng.journal.behind
    steps = 1
    while eng.journal.behind:
        eng.follow_journal()
        steps += 1
    assert eng.store.count() == 3002 and steps > 10


def test_the_control_loop_takes_the_backlog_in_steps_between_requests(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from execgate.daemon.main import Daemon

    eng, _, journal = _engine(tmp_path, budget=1 << 30, used=64 * MiB)
    _journal(journal, 3000)
    monkeypatch.setattr(engine_mod, "JOURNAL_STEP_S", 0.0)  # one chunk a step
    daemon = Daemon(eng.cfg, eng)
    turns = 0

    async def request() -> None:  # another coroutine on the loop, as a request would be
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    async def scenario() -> None:
        other = asyncio.ensure_future(request())
        await daemon.catch_up(time.monotonic() + 60)
        other.cancel()

    asyncio.run(scenario())
    assert not eng.journal.behind and eng.store.count() == 3000
    assert turns > 10  # served between the steps


def test_the_reader_thread_reads_and_parses_off_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20: the backlog followed off the event loop: the daemon's thread reads and parses,
    the loop only applies what it read (in steps, between requests) and saves the position."""
    import threading

    from execgate.daemon.journal_reader import JournalReader
    from execgate.daemon.main import Daemon

    eng, _, journal = _engine(tmp_path, budget=1 << 30, used=64 * MiB)
    _journal(journal, 3000)
    monkeypatch.setattr(engine_mod, "JOURNAL_STEP_S", 0.0)  # one chunk a step
    readers: set[str] = set()
    read = eng.journal.read_new

    def read_new(*a: object, **kw: object) -> list[dict]:
        readers.add(threading.current_thread().name)
        return read(*a, **kw)

    eng.journal.read_new = read_new  # type: ignore[method-assign]
    daemon = Daemon(eng.cfg, eng)
    eng.journal_reader = JournalReader(eng.journal, depth=2)
    eng.journal_reader.start()

    async def scenario() -> None:
        deadline = time.monotonic() + 60
        while (eng.store.count() or 0) < 3000 and time.monotonic() < deadline:
            await daemon.catch_up(time.monotonic() + 1)
            assert eng.journal_reader.chunks.qsize() <= 2  # read ahead, bounded
            await asyncio.sleep(0.01)

    try:
        asyncio.run(scenario())
    finally:
        eng.journal_reader.stop()
    assert eng.store.count() == 3000
    assert readers == {"journal-reader"}, readers  # never on the loop's thread
    end = (journal.stat().st_ino, journal.stat().st_size)
    assert eng.store.get_meta("journal_pos") == f"{end[0]}:{end[1]}"


def test_a_restart_resumes_after_what_was_applied_not_what_was_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from execgate.daemon.journal_follow import JournalFollower
    from execgate.daemon.journal_reader import JournalReader

    eng, _, journal = _engine(tmp_path, budget=1 << 30, used=64 * MiB)
    _journal(journal, 3000)
    monkeypatch.setattr(engine_mod, "JOURNAL_STEP_S", 0.0)
    reader = eng.journal_reader = JournalReader(eng.journal, depth=3)
    reader.start()
    deadline = time.monotonic() + 30
    while not reader.chunks.full():  # three chunks read ahead, none applied
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert eng.store.get_meta("journal_pos") in (None, "0:0")
    eng.follow_journal()  # one applied
    reader.stop()
    applied = eng.store.count() or 0
    assert 0 < applied < 3000
    again = JournalFollower(str(journal), eng.store)  # the restarted daemon's
    rest = 0
    while again.behind:
        rest += len(again.read_new())
    assert applied + rest == 3000  # none lost, none twice


def test_a_reader_whose_reads_fail_tries_again_each_period_not_in_a_hot_loop(
        tmp_path: Path) -> None:
    from execgate.daemon.journal_reader import JournalReader

    eng, _, _journal_path = _engine(tmp_path, budget=1 << 30, used=64 * MiB)
    calls = 0

    def broken(*a: object, **kw: object) -> list[dict]:
        nonlocal calls
        calls += 1
        raise OSError("disk gone")

    eng.journal.read_new = broken  # type: ignore[method-assign]
    eng.journal.behind = True  # more to read, as far as it knows
    reader = JournalReader(eng.journal, period_s=0.1)
    reader.start()
    time.sleep(0.55)
    reader.stop()
    assert 2 <= calls <= 8 and reader.errors == calls


def test_at_the_journals_end_the_reader_looks_once_a_second_or_when_poked(
        tmp_path: Path) -> None:
    """Looking every control period cost 7 s of a 61-s daemon's CPU in a VM run: unpoked it
    looks once a second, and a line the daemon wrote itself is read at once."""
    from execgate.daemon.journal_reader import JournalReader

    eng, _, journal = _engine(tmp_path, budget=1 << 30, used=64 * MiB)
    _journal(journal, 1)
    reads = 0
    read = eng.journal.read_new

    def counted(*a: object, **kw: object) -> list[dict]:
        nonlocal reads
        reads += 1
        return read(*a, **kw)

    eng.journal.read_new = counted  # type: ignore[method-assign]
    reader = eng.journal_reader = JournalReader(eng.journal)
    reader.start()
    try:
        deadline = time.monotonic() + 10
        while reader.take() is None:  # the first line
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(1.5)
        assert reads <= 4, reads  # every 100 ms would be ~16
        _journal_append(journal)
        eng.journal_written()
        t0 = time.monotonic()
        while (chunk := reader.take()) is None:
            assert time.monotonic() - t0 < 0.5, "a poked reader reads at once"
            time.sleep(0.01)
        assert len(chunk[0]) == 1
    finally:
        reader.stop()


def _journal_append(path: Path) -> None:
    with open(path, "a") as f:
        f.write('{"call":"tool-00000000000000ff","container":"c0ffee","sandbox":"sb1",'
                '"argv":["ls"],"start":1.5,"hint":{},"managed":true,"memory_peak":1,'
                '"pids_peak":1,"duration":0.1,"oom_killed":false,"exit_code":0}\n')
