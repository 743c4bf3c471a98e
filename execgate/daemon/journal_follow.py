"""The journal followed into the daemon: whole new lines, a bounded chunk at a time, across
rotations.

A backlog (a daemon down for hours on a busy host: a million lines) is read a chunk per call,
never in one go: memory stays bounded by the chunk. In the daemon the reads (and their JSON)
run in a thread (journal_reader.py) and the loop only applies the chunks, a bounded time per
step (issue 20). The position (inode:offset) is kept in the store, so a restart resumes where
it left off, in a rotated file if the daemon rotated meanwhile. A writer that opened the
journal just before a rotation appends its line to the file rotated away: that file is still
read for LATE_S after the follower moved on, so no line is lost to a rotation.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from execgate.common import journal, records

from .store import Store

log = logging.getLogger("execgated")

CHUNK_BYTES = 64 << 10  # read per call: ~150 lines, a few ms of parsing
LATE_S = 10.0  # a file rotated away is still read this long (a writer that opened it before)
MAX_LINE_BYTES = 16 << 20  # no writer writes a line this long: past it, the rest is skipped


class _Left:
    """A file the follower moved on from, read for late lines until `until`."""

    def __init__(self, fd: int, offset: int, until: float) -> None:
        self.fd, self.offset, self.until = fd, offset, until


class JournalFollower:
    """Reads whole new lines of the journal and its rotated files, oldest first."""

    def __init__(self, path: str, store: Store,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.store = store
        self.clock = clock
        saved = (store.get_meta("journal_pos") or "0:0").split(":")
        self.inode, self.offset = int(saved[0]), int(saved[1])
        # The position kept in the store: where a restart resumes, and how far the lines have
        # been taken in. With a JournalReader, reads run ahead of it in a thread (saving off)
        # and the loop saves each chunk's position once it has applied the chunk.
        self.saved = (self.inode, self.offset)
        self.saving = True
        self.fd: int | None = None  # the file being read, once opened
        self.left: list[_Left] = []
        self.behind = True  # the last read stopped short of the end: call again soon
        self.skipping = False  # inside an over-long line, dropped up to its end
        self.failing = False  # the store refused the last position

    @property
    def position(self) -> tuple[int, int]:
        """(inode, offset) read up to."""
        return self.inode, self.offset

    def read_new(self, max_bytes: int = CHUNK_BYTES) -> list[dict[str, Any]]:
        """The entries of at most about max_bytes of new whole lines (one whole line at
        least); `behind` says whether more are waiting."""
        out = self._late(max_bytes)
        if self.fd is None and not self._open():
            self.behind = False
            return out
        assert self.fd is not None
        size = os.fstat(self.fd).st_size
        if size < self.offset:  # truncated: read from its start
            self._moved(self.inode, 0)
        start = self.offset
        data, end = _whole_lines(self.fd, start, max_bytes)
        if end == 0 and len(data) >= MAX_LINE_BYTES:  # no end in sight: not a writer's line
            log.warning("journal %s: a line longer than %d bytes at offset %d skipped",
                        self.path, MAX_LINE_BYTES, self.offset)
            self.skipping, end = True, len(data)
        out += self._entries(data[:end])
        if end:
            self._moved(self.inode, self.offset + end)
        self.behind = start + len(data) < size
        if not self.behind:  # at its end: if it was rotated away, on to the next file
            self.behind = self._next_file()
        return out

    def close(self) -> None:
        for fd in [x.fd for x in self.left] + ([self.fd] if self.fd is not None else []):
            os.close(fd)
        self.left, self.fd = [], None

    # -- where to read -----------------------------------------------------------------------

    def _open(self) -> bool:
        """Open the file to resume in: the one of the saved inode, else (gone, or never read)
        the oldest there is, from its start."""
        names = journal.files(self.path)
        inodes = [journal.inode(name) for name in names]
        if not names:
            return False
        chosen = names[inodes.index(self.inode)] if self.inode in inodes else names[0]
        return self._switch(chosen, keep_offset=True)

    def _next_file(self) -> bool:
        """At the end of a file that is no longer the journal (rotated, replaced): move on to
        the next newer file, leaving this one to late writers for LATE_S. True if moved."""
        if journal.inode(self.path) == self.inode:
            return False
        names = journal.files(self.path)
        inodes = [journal.inode(name) for name in names]
        if self.inode in inodes:  # rotated: the next newer file
            at = inodes.index(self.inode) + 1
            if at >= len(names):
                return False
            name = names[at]
        elif os.path.exists(self.path):  # replaced or removed (not by a rotation): the new one
            name = self.path
        else:
            return False
        assert self.fd is not None
        self.left.append(_Left(self.fd, self.offset, self.clock() + LATE_S))
        self.fd = None
        self.skipping = False
        return self._switch(name, keep_offset=False)

    def _switch(self, name: str, keep_offset: bool) -> bool:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        inode = os.fstat(fd).st_ino
        self.fd = fd
        self._moved(inode, self.offset if keep_offset and inode == self.inode else 0)
        return True

    def _late(self, max_bytes: int) -> list[dict[str, Any]]:
        """Whole lines appended to files rotated away since they were left."""
        out: list[dict[str, Any]] = []
        now = self.clock()
        for left in list(self.left):
            data, end = _whole_lines(left.fd, left.offset, max_bytes)
            out += records.journal_entries(data[:end].splitlines())
            left.offset += end
            if now >= left.until:
                os.close(left.fd)
                self.left.remove(left)
        return out

    # -- what was read -----------------------------------------------------------------------

    def _entries(self, data: bytes) -> list[dict[str, Any]]:
        if self.skipping:  # the tail of an over-long line
            cut = data.find(b"\n") + 1
            if cut == 0:
                return []
            self.skipping, data = False, data[cut:]
        return records.journal_entries(data.splitlines())

    def _moved(self, inode: int, offset: int) -> None:
        """The new position; kept in the store at once unless a reader thread reads ahead."""
        if (inode, offset) == (self.inode, self.offset) and self.inode:
            return
        self.inode, self.offset = inode, offset
        if self.saving:
            self.save((inode, offset))

    def save(self, position: tuple[int, int]) -> None:
        """Keep a position in the store (where a restart resumes); lines up to it are taken."""
        if position == self.saved and position[0]:
            return
        self.saved = position
        try:  # a full or locked store must not stop the read
            self.store.set_meta("journal_pos", f"{position[0]}:{position[1]}")
            self.failing = False
        except sqlite3.Error as e:
            if not self.failing:  # once, not every period
                log.warning("store: journal position not kept: %s", e)
            self.failing = True


def _whole_lines(fd: int, offset: int, max_bytes: int) -> tuple[bytes, int]:
    """Bytes from offset, and how many of them are whole lines: at least one line when one is
    there (read further for a line longer than max_bytes, up to MAX_LINE_BYTES)."""
    data = os.pread(fd, max_bytes, offset)
    end = data.rfind(b"\n") + 1
    while end == 0 and len(data) >= max_bytes and len(data) < MAX_LINE_BYTES:
        more = os.pread(fd, min(len(data), MAX_LINE_BYTES - len(data)), offset + len(data))
        if not more:
            break
        data += more
        end = data.rfind(b"\n") + 1
    return data, end
