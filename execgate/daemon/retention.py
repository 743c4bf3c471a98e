"""What the host keeps of its history, bounded ([retention]): the journal rotated by size and
age, the history store pruned by rows and age, hint-warning files of sandboxes gone removed.

The daemon is the one rotator: writers (the runtime's watchers, the daemon's followers) only
append to `calls.jsonl` (O_APPEND, one write per line), so a rename never splits a line, and a
writer that opened the file just before it appends to the rotated file, which the follower
still reads (journal_follow.py). A rotated file is removed only once the follower has read it
(past `journal_keep` meanwhile), so no unread line is lost either. Each part is a few system
calls or one bounded DELETE, every PERIOD_S, in the control loop.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass

from execgate.common import hints, journal, records
from execgate.common.units import MiB

from .journal_follow import JournalFollower
from .store import Store

log = logging.getLogger("execgated")

PERIOD_S = 30.0
PRUNE_ROWS = 5000  # rows deleted per step at most: a first prune of a big store is spread out
GONE_GRACE_S = 60.0  # a sandbox's hint warnings outlive its record this long
DAY_S = 86400.0


@dataclass(frozen=True)
class RetentionConfig:
    """[retention]: how much history the host keeps (0: no limit of that kind)."""

    # calls.jsonl is rotated (to calls.jsonl.1, .2 ...) once it is this big ...
    journal_max_bytes: int = 64 * MiB
    # ... and this many rotated files are kept (at least 1: a late writer's line lands there)
    journal_keep: int = 4
    # rotated files older than this (their last line) are removed, and the current file is
    # rotated once its first line is this old
    journal_max_age_days: float = 30.0
    # calls kept in the history store (the predictor's training data): the newest ...
    store_max_rows: int = 200_000
    # ... of at most this age
    store_max_age_days: float = 90.0
    # a sandbox's record of the bad hints it was warned about is removed once the sandbox is
    # gone, or once this old (a repeated bad hint is then warned about again)
    hint_warnings_max_age_days: float = 7.0

    def __post_init__(self) -> None:
        if self.journal_keep < 1:
            raise ValueError("journal_keep must be at least 1")
        if self.journal_max_bytes and self.journal_max_bytes < MiB:
            raise ValueError("journal_max_bytes must be 0 (no limit) or at least 1m")
        for name in ("journal_max_age_days", "store_max_rows", "store_max_age_days",
                     "hint_warnings_max_age_days"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")


class Retention:
    """The [retention] limits applied every PERIOD_S (cfg is replaced on reload)."""

    def __init__(self, cfg: RetentionConfig, path: str, state_dir: str, store: Store,
                 follower: JournalFollower, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.path = path
        self.state_dir = state_dir
        self.store = store
        self.follower = follower
        self.clock = clock
        self.next = 0.0
        self.rotations = 0
        self.removed = {"journal_files": 0, "store_rows": 0, "hint_warnings": 0}
        self.failed: set[str] = set()  # parts whose failure was logged (once, until it works)

    def step(self) -> None:
        now = self.clock()
        if now < self.next:
            return
        self.next = now + PERIOD_S
        for name, part in (("journal", self.journal), ("store", self.prune_store),
                           ("hint warnings", self.hint_warnings)):
            try:
                part(now)
                self.failed.discard(name)
            except (OSError, sqlite3.Error) as e:
                if name not in self.failed:
                    log.warning("retention: %s: %s", name, e)
                self.failed.add(name)

    def snapshot(self) -> dict[str, object]:
        return {"rotations": self.rotations, "removed": dict(self.removed)}

    # -- the journal -------------------------------------------------------------------------

    def journal(self, now: float) -> None:
        """Rotate the journal when due, then remove the rotated files past keep or age that
        the follower has read."""
        c = self.cfg
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            size = 0
        too_big = c.journal_max_bytes and size >= c.journal_max_bytes
        too_old = c.journal_max_age_days and size and \
            now - _first_time(self.path, now) > c.journal_max_age_days * DAY_S
        if too_big or too_old:
            self.rotate()
        read = self._read()
        for name in journal.rotated(self.path):
            if name in read and (int(name.rsplit(".", 1)[1]) > c.journal_keep or (
                    c.journal_max_age_days and
                    now - os.stat(name).st_mtime > c.journal_max_age_days * DAY_S)):
                os.unlink(name)
                self.removed["journal_files"] += 1

    def rotate(self) -> None:
        """calls.jsonl -> .1, .1 -> .2 ...; a file that would pass journal_keep is removed
        if the follower has read it (else kept until it has: journal())."""
        read = self._read()
        for name in journal.rotated(self.path):  # oldest (highest number) first
            n = int(name.rsplit(".", 1)[1])
            if n >= self.cfg.journal_keep and name in read:
                os.unlink(name)
                self.removed["journal_files"] += 1
            else:
                os.rename(name, f"{self.path}.{n + 1}")
        os.rename(self.path, f"{self.path}.1")
        self.rotations += 1
        log.info("retention: journal %s rotated", self.path)

    def _read(self) -> set[str]:
        """The rotated files the follower is done with: those older than the one it reads
        (never that one: where it is tells it which file comes next), or all of them when it
        reads the current one."""
        names = journal.rotated(self.path)
        inodes = [journal.inode(name) for name in names]
        at = self.follower.saved[0]  # taken in, not only read ahead
        if at == journal.inode(self.path):
            return set(names)
        if at not in inodes:
            return set()
        return set(names[:inodes.index(at)])

    # -- the store and the hint warnings --------------------------------------------------------

    def prune_store(self, now: float) -> None:
        c = self.cfg
        before = now - c.store_max_age_days * DAY_S if c.store_max_age_days else None
        self.removed["store_rows"] += self.store.prune(before, c.store_max_rows, PRUNE_ROWS)

    def hint_warnings(self, now: float) -> None:
        directory = hints.warnings_dir(self.state_dir)
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            return
        if not entries:
            return
        live = {os.path.basename(hints.warnings_path(self.state_dir, str(
            r.get("sandbox") or r.get("id") or ""))) for r in records.containers(self.state_dir)}
        max_age = self.cfg.hint_warnings_max_age_days * DAY_S
        for entry in entries:
            if not entry.is_file(follow_symlinks=False):
                continue
            age = now - entry.stat(follow_symlinks=False).st_mtime
            if (max_age and age > max_age) or (entry.name not in live and age > GONE_GRACE_S):
                os.unlink(entry.path)
                self.removed["hint_warnings"] += 1


def _first_time(path: str, default: float) -> float:
    """When the journal's first line was written (its `end`, else `start`), or default."""
    try:
        with open(path, "rb") as f:
            line = f.readline(1 << 20)
        entry = json.loads(line)
        value = entry.get("end", entry.get("start")) if isinstance(entry, dict) else None
    except (OSError, ValueError):
        return default
    return float(value) if isinstance(value, int | float) else default
