"""The daemon's log lines, with their journald priority where journald reads them.

Under systemd the daemon's stderr goes to the journal, which takes every line at the unit's
default priority (info) unless the line starts with `<N>` (sd-daemon(3)): without it
`journalctl -p warning -u execgated` showed nothing, and an operator's alerting on priorities
missed every config error and failed reclaim. systemd sets JOURNAL_STREAM for a unit whose
stderr is the journal; anywhere else (a terminal, a test) the lines stay as they were.
"""

from __future__ import annotations

import logging
import os

# sd-daemon(3) priorities of the logging levels.
PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6,
            logging.DEBUG: 7}
FORMAT = "%(levelname)s %(name)s: %(message)s"


class JournalPriority(logging.Formatter):
    """`<N>` before each line of a record, N its level's priority (a multi-line message keeps
    its priority on every line, as journald reads each line apart)."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{PRIORITY.get(record.levelno, 6)}>"
        return "\n".join(prefix + line for line in super().format(record).splitlines())


def to_journal(fd: int = 2) -> bool:
    """Whether `fd` (stderr) is the journal: JOURNAL_STREAM names its device and inode."""
    dev_ino = os.environ.get("JOURNAL_STREAM", "")
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return dev_ino == f"{st.st_dev}:{st.st_ino}"


def setup(verbose: bool) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JournalPriority(FORMAT) if to_journal() else logging.Formatter(FORMAT))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
