"""The daemon's CPU by thread kind (daemon/thread_cpu.py): what the loop's stages do not cover."""

from __future__ import annotations

import threading
import time

from execgate.daemon import thread_cpu


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_thread_gone_keeps_its_cpu_in_the_split() -> None:
    before = thread_cpu.snapshot().get("follow", 0.0)
    t = threading.Thread(target=thread_cpu.counted(_burn), args=(0.2,),
                         name="follow-tool-0123456789ab")
    t.start()
    t.join()
    assert thread_cpu.snapshot()["follow"] - before >= 0.15


def test_live_threads_are_read_from_proc() -> None:
    burned, stop = threading.Event(), threading.Event()

    def spin() -> None:
        _burn(0.2)
        burned.set()
        stop.wait()

    t = threading.Thread(target=spin, name="journal-reader")
    t.start()
    try:
        assert burned.wait(10)
        split = thread_cpu.snapshot()
        assert split["journal-reader"] >= 0.15
        assert split["MainThread"] > 0
    finally:
        stop.set()
        t.join()


def test_a_live_thread_counts_its_own_cpu_not_its_processs() -> None:
    """/proc/TID/stat counts the whole process: every live thread used to show the daemon's
    total (6 Dec: journal-reader 91.8 s = MainThread's, asyncio 383 s over four workers)."""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="idle-sleeper")
    t.start()
    try:
        _burn(0.3)  # on the main thread
        split = thread_cpu.snapshot()
        assert split["idle-sleeper"] < 0.1 and split["MainThread"] >= 0.25, split
    finally:
        stop.set()
        t.join()


def test_kinds_drop_per_call_and_per_worker_suffixes() -> None:
    assert [thread_cpu.group(n) for n in ("follow-tool-1a2b3c4d5e6f", "asyncio_0", "Thread-3",
                                          "ThreadPoolExecutor-0_1", "inside-ends", "reclaim")] \
        == ["follow", "asyncio", "Thread", "ThreadPoolExecutor", "inside-ends", "reclaim"]
