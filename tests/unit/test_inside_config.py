"""[inside] in config.toml, and the journal helpers the daemon shares with the exec watcher."""

from __future__ import annotations

import json
from pathlib import Path

from execgate.calls import outcome, tell
from execgate.calls.record import ToolCall
from execgate.common.config import Config
from execgate.daemon import settings


def test_inside_defaults() -> None:
    s, errors = settings.load(Config())
    assert errors == []
    assert s.inside == settings.InsideConfig()
    assert (s.inside.default, s.inside.rule, s.inside.freeze) == (False, "child", "queued")


def test_inside_values_and_bad_ones() -> None:
    s, errors = settings.load(Config(tables={"inside": {
        "default": True, "rule": "first-exec", "freeze": "always", "spares": 2,
        "rcvbuf_bytes": "4m"}}))
    assert errors == []
    assert (s.inside.default, s.inside.rule, s.inside.freeze, s.inside.spares,
            s.inside.rcvbuf_bytes) == (True, "first-exec", "always", 2, 4 << 20)
    s, errors = settings.load(Config(tables={"inside": {
        "default": "yes", "rule": "grandchild", "freeze": "never", "spares": 99, "x": 1}}))
    assert s.inside == settings.InsideConfig()
    assert len(errors) == 5


def _cgroup(tmp: Path, oom: int) -> Path:
    cg = tmp / "tool-1"
    cg.mkdir()
    (cg / "memory.peak").write_text("1048576\n")
    (cg / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {oom}\n"
                                      "oom_group_kill 0\n")
    (cg / "cpu.stat").write_text("usage_usec 42\n")
    (cg / "pids.peak").write_text("2\n")
    return cg


def test_conclude_and_record_build_the_journal_line(tmp_path: Path) -> None:
    cg = _cgroup(tmp_path, oom=1)
    call = ToolCall("tool-1", "c1", "c1", str(cg), ["memhog", "9"], tty=False)
    call.start, call.daemon = 10.0, {"socket": "x"}
    entry = outcome.conclude(call, 12.5, {"held_s": 0.5, "killed_by_execgate": False})
    assert "daemon" not in entry and entry["duration"] == 2.5 and entry["held_s"] == 0.5
    assert entry["oom_killed"] and entry["memory_peak"] == 1 << 20 and entry["pids_peak"] == 2
    journal = tmp_path / "calls.jsonl"
    outcome.record(entry, None, 12.5, str(journal), None)
    line = json.loads(journal.read_text())
    assert (line["exit_code"], line["signal"], line["end"]) == (137, 9, 12.5)


def test_tell_and_close_writes_feedback_once_and_closes(tmp_path: Path) -> None:
    import os

    cg = _cgroup(tmp_path, oom=1)
    call = ToolCall("tool-1", "c1", "c1", str(cg), ["memhog"], tty=False)
    call.start = 0.0
    entry = outcome.conclude(call, 1.0, None)
    r, w = os.pipe()
    tell.tell_and_close(call, entry, w)
    out = os.read(r, 65536)
    assert out.startswith(b"[execgate] Out of memory")
    assert os.read(r, 10) == b""  # our end is closed: the reader sees EOF
    os.close(r)
