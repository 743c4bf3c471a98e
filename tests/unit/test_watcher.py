"""The watcher on the host: what it does when the call's cgroup is already gone."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from execgate.calls.record import ToolCall
from execgate.oci.runclog import RuncLog
from execgate.runtime import watcher


def test_a_call_whose_cgroup_went_before_the_watcher_ran_is_still_journaled(
        tmp_path: Path) -> None:
    # A busy host can run the detached watcher late: by then runc has exited, the call has
    # ended and the container (with the call's cgroup) may have been deleted.
    runtime = subprocess.Popen(["true"])
    pidfd = os.pidfd_open(runtime.pid)
    runtime.wait()
    journal = tmp_path / "calls.jsonl"
    call = ToolCall("tool-0123456789ab", "c1", "c1", str(tmp_path / "gone" / "tool-0123456789ab"),
                    ["true"], tty=False)
    call.cgroup_id, call.start = 42, 1.0
    watcher.watch(call, pidfd, str(tmp_path / "no-pid-file"), str(journal),
                  RuncLog(None, None), stderr=None)
    (entry,) = [json.loads(line) for line in journal.read_text().splitlines()]
    assert entry["call"] == "tool-0123456789ab" and entry["argv"] == ["true"]
    assert entry["exit_code"] is None and entry["oom_killed"] is False
