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


def test_a_holding_watcher_hurries_then_goes_back_to_the_priority_it_inherited() -> None:
    """Raised while it waits to catch a held call, then the inherited nice again (not 0: a
    watcher forked from a niced runtime stays as niced as it was)."""
    import multiprocessing

    def child(q: multiprocessing.Queue) -> None:
        os.setpriority(os.PRIO_PROCESS, 0, 5)
        watcher._hurry(True)
        during = os.getpriority(os.PRIO_PROCESS, 0)
        watcher._hurry(False)
        q.put((during, os.getpriority(os.PRIO_PROCESS, 0)))

    q: multiprocessing.Queue = multiprocessing.get_context("fork").Queue()
    p = multiprocessing.get_context("fork").Process(target=child, args=(q,))
    p.start()
    during, after = q.get(timeout=10)
    p.join(10)
    assert after == 5
    assert during == (watcher.HOLD_NICE if os.geteuid() == 0 else 5)
