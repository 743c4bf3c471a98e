"""execgated's log lines carry their journald priority when stderr is the journal."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from execgate.daemon import logs


def _record(level: int, msg: str) -> logging.LogRecord:
    return logging.LogRecord("execgated", level, __file__, 1, msg, None, None)


def test_each_line_has_its_level_priority() -> None:
    f = logs.JournalPriority(logs.FORMAT)
    assert f.format(_record(logging.ERROR, "config: bad")) == "<3>ERROR execgated: config: bad"
    assert f.format(_record(logging.WARNING, "w")).startswith("<4>WARNING")
    assert f.format(_record(logging.INFO, "i")).startswith("<6>INFO")
    assert f.format(_record(logging.DEBUG, "a\nb")) == "<7>DEBUG execgated: a\n<7>b"


def test_only_a_stderr_that_is_the_journal_gets_prefixes(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    with open(tmp_path / "stream", "w") as f:
        st = os.fstat(f.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert logs.to_journal(f.fileno())
        with open(tmp_path / "other", "w") as g:  # a terminal or file of its own: plain lines
            assert not logs.to_journal(g.fileno())
    monkeypatch.delenv("JOURNAL_STREAM")
    assert not logs.to_journal(0)
