"""Tool-call history in SQLite (WAL): the training data for demand prediction.

The journal (JSONL, written by each call's watcher) stays the source of truth, because it is
written even while the daemon is down; the store follows it, remembering how far it has read,
so a restarted daemon catches up on calls that ended while it was gone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("execgated")

SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    call TEXT PRIMARY KEY,
    container TEXT, sandbox TEXT, argv TEXT,
    declared_bytes INTEGER, priority TEXT,
    start REAL, duration REAL, exit_code INTEGER, oom_killed INTEGER,
    memory_peak INTEGER, memory_avg INTEGER, waited_s REAL, forced INTEGER,
    entry TEXT
);
CREATE INDEX IF NOT EXISTS calls_start ON calls(start);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


class Store:
    def __init__(self, path: str) -> None:
        if path != ":memory:":
            os.makedirs(os.path.dirname(path), exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def add(self, entry: dict[str, Any], memory_avg: int | None = None) -> None:
        hint = entry.get("hint") or {}
        self.db.execute(
            "INSERT OR REPLACE INTO calls VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (entry.get("call"), entry.get("container"), entry.get("sandbox"),
             json.dumps(entry.get("argv") or []), hint.get("memory_bytes"),
             hint.get("priority"), entry.get("start"), entry.get("duration"),
             entry.get("exit_code"), int(bool(entry.get("oom_killed"))),
             entry.get("memory_peak"), memory_avg, entry.get("waited_s"),
             int(bool(entry.get("forced"))), json.dumps(entry)))

    def recent(self, n: int) -> Iterator[tuple[dict[str, Any], int | None]]:
        """The last n calls, oldest first, to warm the estimator after a restart."""
        rows = self.db.execute(
            "SELECT entry, memory_avg FROM calls ORDER BY start DESC LIMIT ?", (n,)).fetchall()
        for entry, avg in reversed(rows):
            yield json.loads(entry), avg

    def count(self) -> int | None:
        """Calls kept; None when the store cannot say (status must not fail with it)."""
        try:
            return int(self.db.execute("SELECT COUNT(*) FROM calls").fetchone()[0])
        except sqlite3.Error:
            return None

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """One transaction for what is added inside (a journal chunk: one commit, not one per
        call). Never raises for the store's sake: the journal is followed even when the store
        refuses, as without a batch."""
        try:
            self.db.execute("BEGIN")
        except sqlite3.Error as e:
            log.warning("store: no batch: %s", e)
            yield
            return
        try:
            yield
        finally:
            try:
                self.db.execute("COMMIT")
            except sqlite3.Error as e:
                log.warning("store: batch not kept: %s", e)
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK")

    def prune(self, before: float | None, max_rows: int, limit: int) -> int:
        """Delete calls that started before `before`, then the oldest beyond max_rows (0: no
        limit), at most `limit` rows in all (a big first prune is spread over steps); how many
        were deleted."""
        deleted = 0
        if before is not None:
            deleted += self.db.execute(
                "DELETE FROM calls WHERE rowid IN (SELECT rowid FROM calls WHERE start < ? "
                "ORDER BY start LIMIT ?)", (before, limit)).rowcount
        over = (self.count() or 0) - max_rows if max_rows else 0
        if over > 0 and deleted < limit:
            deleted += self.db.execute(
                "DELETE FROM calls WHERE rowid IN (SELECT rowid FROM calls ORDER BY start "
                "LIMIT ?)", (min(over, limit - deleted),)).rowcount
        return deleted

    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?,?)", (key, value))


def open_store(path: str) -> Store:
    """The history store, never a reason not to start: a corrupt file is moved aside
    (PATH.corrupt-EPOCH, kept for a look) and a new one made; one that cannot be opened at all
    (read-only, locked, a full disk) gives way to an in-memory store. History is best effort;
    thawing what a crash left frozen and admitting calls are not (issue 21, item 9)."""
    try:
        return Store(path)
    except sqlite3.OperationalError as e:
        log.error("store %s: %s; history kept in memory until a restart", path, e)
    except sqlite3.DatabaseError as e:  # not a database: corrupt
        aside = f"{path}.corrupt-{int(time.time())}"
        try:
            os.replace(path, aside)
            for suffix in ("-wal", "-shm"):  # its WAL belongs to the old file
                if os.path.exists(path + suffix):
                    os.replace(path + suffix, aside + suffix)
            log.error("store %s: %s; moved to %s, a new store begins", path, e, aside)
            return Store(path)
        except (OSError, sqlite3.Error) as e2:
            log.error("store %s: %s (%s); history kept in memory until a restart", path, e, e2)
    except OSError as e:
        log.error("store %s: %s; history kept in memory until a restart", path, e)
    return Store(":memory:")
