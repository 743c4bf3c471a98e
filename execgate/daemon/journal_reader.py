"""The journal read ahead of the event loop, in a thread: file reads and JSON parsing off it.

The follower (journal_follow.py) reads a bounded chunk per call. In the daemon a thread makes
those calls and queues each chunk's entries with the position after them, at most DEPTH chunks
ahead (memory stays bounded: the thread waits for the loop); the loop takes chunks for a bounded
time per step (Engine.follow_journal), applies them to the engine and the store, and then saves
their position, so a restart resumes after what was applied, never after what was only read. At
the journal's end the thread looks again every PERIOD_S, or at once when poked: the daemon pokes
it after each line its own followers write (the front's calls, inside agents' calls), so only a
runtime's watcher (a process of its own) waits up to PERIOD_S to be learned from. Looking every
control period instead cost 7 s of CPU in a 6-minute VM run, a tenth of the daemon's. The thread
owns the follower once started: nothing else reads through it.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from .journal_follow import JournalFollower

log = logging.getLogger("execgated")

DEPTH = 8  # chunks read ahead (64 KiB each)
PERIOD_S = 1.0  # at the journal's end, how often the thread looks again unpoked

Chunk = tuple[list[dict[str, Any]], tuple[int, int]]


class JournalReader:
    def __init__(self, follower: JournalFollower, depth: int = DEPTH,
                 period_s: float = PERIOD_S) -> None:
        self.follower = follower
        self.period_s = period_s
        self.chunks: queue.Queue[Chunk] = queue.Queue(maxsize=depth)
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.errors = 0

    def start(self) -> None:
        self.follower.saving = False  # the loop saves what it applied
        self.thread = threading.Thread(target=self._run, name="journal-reader", daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout)

    @property
    def behind(self) -> bool:
        """Chunks are waiting for the loop, or the thread has more to read."""
        return not self.chunks.empty() or self.follower.behind

    def poke(self) -> None:
        """A line was just written to the journal: read it now (any thread)."""
        self.wake.set()

    def take(self) -> Chunk | None:
        """The next chunk read, if one is waiting (never blocks the loop)."""
        try:
            chunk = self.chunks.get_nowait()
        except queue.Empty:
            return None
        self.wake.set()  # room for the thread to read on
        return chunk

    def _run(self) -> None:
        last = self.follower.position
        while not self.stopping.is_set():
            self.wake.clear()  # before the read: a poke from here on is seen by it or the wait
            try:
                entries = self.follower.read_new()
            except Exception:
                self.errors += 1
                if self.errors == 1 or self.errors % 1000 == 0:
                    log.exception("journal: read failed (%d so far)", self.errors)
                self.stopping.wait(self.period_s)  # again next period, not in a hot loop
                continue
            position = self.follower.position
            if entries or position != last:
                last = position
                self._put((entries, position))
            if not self.follower.behind:
                self.wake.wait(self.period_s)

    def _put(self, chunk: Chunk) -> None:
        """Queue a chunk, waiting while DEPTH are ahead (until the loop takes one or stop)."""
        while not self.stopping.is_set():
            try:
                self.chunks.put(chunk, timeout=self.period_s)
                return
            except queue.Full:
                continue
