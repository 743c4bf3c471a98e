"""redact_commands: the journal keeps a call's program and class, never its arguments, and the
daemon still learns by class from such lines."""

from __future__ import annotations

import json
from pathlib import Path

from test_daemon_engine import _engine

from execgate.calls import outcome
from execgate.calls.record import ToolCall
from execgate.common import config
from execgate.common.config import Config
from execgate.common.units import MiB
from execgate.policy.estimate import CallInfo

SECRET = "--token=hunter2"


class _Log:
    def warning(self, msg: str) -> None:
        raise AssertionError(msg)


def _call(redact: bool) -> ToolCall:
    call = ToolCall("tool-1", "c", "sb", "/cg/tool-1",
                    ["/usr/bin/python3", "-m", "pytest", "-q", SECRET])
    call.redact = redact
    return call


def test_a_redacted_journal_line_keeps_the_program_and_class_only(tmp_path: Path) -> None:
    journal = tmp_path / "calls.jsonl"
    outcome.record(_call(True).journal(), 0, 2.0, str(journal), _Log())
    line = journal.read_text()
    assert SECRET not in line and "pytest" not in line.replace('"test"', "")
    entry = json.loads(line)
    assert entry["argv"] == ["python3"] and entry["command_class"] == "test"
    again = ToolCall.from_journal(entry)  # a restart reads it back: still redacted
    assert again.argv == ["python3"] and again.journal()["command_class"] == "test"
    assert SECRET in json.dumps(_call(False).journal())  # off by default: the whole argv
    assert _call(True).admit_request()["argv"][-1] == SECRET  # the daemon still sees it all


def test_the_setting_is_read_and_shipped(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("redact_commands = true\n")
    assert config.load(str(path)).redact_commands is True
    assert Config().redact_commands is False


def test_the_daemon_learns_a_redacted_call_by_its_class(tmp_path: Path) -> None:
    eng, _, journal = _engine(tmp_path, budget=1 << 30, used=64 * MiB)
    entry = {**_call(True).journal(), "memory_peak": 700 * MiB, "pids_peak": 2, "duration": 3.0}
    journal.write_text(json.dumps(entry) + "\n")
    eng.follow_journal()
    demand = eng.estimator.estimate(CallInfo("tool-2", "sb", ["python3", "-m", "pytest", "x"]))
    assert demand.source.endswith(":test") and demand.peak_bytes == 700 * MiB
