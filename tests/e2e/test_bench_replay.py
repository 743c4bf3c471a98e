"""The trace-replay benchmark end to end: a tiny replay under eager and execgate on real Docker,
checked for complete, consistent results and for the host being left as it was found.

Four tasks each hold one 250 MiB call for 6 s in a 640 MiB slice: three at once overrun it, so
eager (runc, no control) gets OOM kills as soon as three calls start within 6 s of each other,
while execgate admits the hinted calls one or two at a time and none is killed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.metrics import overlap_timeline
from execgate.common.units import MiB

SRC = Path(os.environ.get("EXECGATE_SRC") or next(
    p for p in Path(__file__).resolve().parents if (p / "bench" / "replay.py").exists()))
RESULTS = Path(os.environ.get("EXECGATE_RESULTS") or "/tmp")
CONFIG = "/etc/execgate/config.toml"
N_TASKS, CALL_MIB, HOLD_S, BUDGET = 4, 250, 6.0, "640m"
METRIC_KEYS = (
    "tasks_total", "tasks_completed", "tasks_failed", "attempts", "failed_attempts",
    "attempt_failure_rate", "oom_kills", "makespan_s", "makespan_trace_s", "latency_p50_s",
    "latency_p95_s", "latency_arrival_p50_s", "latency_arrival_p95_s", "mem_peak_util",
    "mem_mean_util", "concurrency_max", "concurrency_timeline", "oversubscription",
    "kernel_oom_kills",
)


def _task(i: int) -> dict[str, Any]:
    call = {"type": "tool", "command": "python -m pytest tests -x", "duration_s": HOLD_S,
            "memory": {"baseline_bytes": CALL_MIB * MiB, "peak_bytes": CALL_MIB * MiB,
                       "shape": "plateau", "peak_at": 1.0, "cpu_share": 0.0}}
    return {"format": "execgate-trace/1", "id": f"e2e-{i}", "baseline_bytes": 8 * MiB,
            "steps": [{"type": "llm", "duration_s": 0.5}, call,
                      {"type": "llm", "duration_s": 0.5}]}


def _daemon_active() -> str:
    return subprocess.run(["systemctl", "is-active", "execgated"], capture_output=True,
                          text=True).stdout.strip()


def _most_at_peak(calls: list[dict[str, Any]]) -> int:
    """Most calls that held their peaks at once, by memload's own timings (from first at its
    peak to letting go of it): the exec's start and end are seconds off that under load."""
    spans = [(c["ran"]["full"], c["ran"]["left"]) for c in calls if c["ran"]]
    return max((n for _, n in overlap_timeline(spans)), default=0)


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    trace = tmp_path_factory.mktemp("bench") / "tasks.jsonl"
    trace.write_text("".join(json.dumps(_task(i)) + "\n" for i in range(N_TASKS)))
    out = RESULTS / "bench-e2e"
    config_before = Path(CONFIG).read_bytes()
    daemon_before = _daemon_active()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.replay", "run", "--trace", str(trace),
         "--tasks", str(N_TASKS), "--schemes", "eager,execgate", "--speed", "1",
         "--mem-scale", "1", "--cpu-scale", "0", "--arrival", "burst", "--budget", BUDGET,
         "--admission-wait", "120", "--out", str(out)],
        timeout=900)  # progress goes to the test's output (pytest shows it on failure)
    return {"proc": proc, "out": out, "config_before": config_before,
            "daemon_before": daemon_before}


def test_replay_completes_and_restores_the_host(replay: dict[str, Any]) -> None:
    assert replay["proc"].returncode == 0
    assert Path(CONFIG).read_bytes() == replay["config_before"]
    assert _daemon_active() == replay["daemon_before"]
    left = subprocess.run(["docker", "ps", "-aq", "--filter", "label=bench"],
                          capture_output=True, text=True).stdout.split()
    assert left == [], "benchmark containers left behind"


def test_results_are_complete_and_consistent(replay: dict[str, Any]) -> None:
    out: Path = replay["out"]
    results = json.loads((out / "results.json").read_text())
    assert results["format"] == "execgate-bench-results/1"
    assert [r["scheme"] for r in results["runs"]] == ["eager", "execgate"]
    assert len(results["points"]) == 1 and results["points"][0]["budget_bytes"] == 640 * MiB
    ids = {f"e2e-{i}" for i in range(N_TASKS)}
    for run in results["runs"]:
        m = run["metrics"]
        assert set(METRIC_KEYS) <= m.keys(), set(METRIC_KEYS) - m.keys()
        assert {t["id"] for t in run["tasks"]} == ids
        assert m["tasks_total"] == N_TASKS
        assert m["tasks_completed"] + m["tasks_failed"] == N_TASKS
        assert m["attempts"] >= N_TASKS
        assert m["attempts"] == len(run["attempts"]) == sum(t["attempts"] for t in run["tasks"])
        assert m["failed_attempts"] == sum(not a["ok"] for a in run["attempts"])
        for t in run["tasks"]:  # done, or gave up after the last retry
            assert t["ok"] or t["attempts"] == results["params"]["retry_limit"] + 1, t
        assert all(a["end"] >= a["start"] for a in run["attempts"])
        assert run["samples"]["rows"], "no memory samples"
        assert 0 < m["mem_peak_util"] <= 1.05
        assert m["oversubscription"] == pytest.approx(N_TASKS * (CALL_MIB + 8) / 640, rel=0.01)
    eager, gated = results["runs"]
    assert eager["scheme_def"]["runtime"] == "runc" and gated["scheme_def"]["daemon"]
    assert all(c["hint"] == f"memory:{math.ceil(CALL_MIB * 1.05 + 2)}m" for c in gated["calls"])
    assert gated["daemon_domain"].endswith("egbench.slice")
    print(f"eager: {eager['metrics']['oom_kills']} OOM kills, makespan "
          f"{eager['metrics']['makespan_s']:.1f}s; execgate: {gated['metrics']['oom_kills']} "
          f"OOM kills, makespan {gated['metrics']['makespan_s']:.1f}s")
    # Every sandbox really got per-exec cgroups (execgate fails open to plain runc otherwise,
    # which would make this an eager run), and every call went through the runtime's journal.
    assert gated["metrics"]["sandboxes_unmanaged"] == 0, gated["notes"]
    assert gated["metrics"]["journal_calls"] == len(gated["calls"])
    # execgate admits by the hints: nothing is killed and every task completes.
    assert gated["metrics"]["oom_kills"] == 0, gated["attempts"]
    assert gated["metrics"]["tasks_completed"] == N_TASKS
    # Every call that ended on its own says when it held its peak; a killed one cannot.
    for run in results["runs"]:
        assert all(c["ran"] for c in run["calls"] if c["exit"] == 0), run["calls"]
        assert not any(c["ran"] for c in run["calls"] if c["exit"] == 137), run["calls"]
        assert all(c["start"] <= c["ran"]["start"] <= c["ran"]["full"] <= c["ran"]["left"]
                   <= c["ran"]["end"] <= c["end"] for c in run["calls"] if c["ran"])
    # Three peaks at once overrun the slice: execgate never lets them meet, and eager cannot
    # have let them meet unharmed (a third one's pages are a kill, of it or of another).
    assert _most_at_peak(gated["calls"]) <= 2, gated["calls"]
    if _most_at_peak(eager["calls"]) >= 3:
        assert eager["metrics"]["oom_kills"] >= 1
    # The results explain themselves: every gated call carries the daemon's decision, every
    # kernel OOM kill its victim (task, attempt; a sandbox's init or a call).
    assert results["points"][0]["swap"] == "off"
    assert all(r["swap"]["slice_swap_max"] == "0" for r in results["runs"])
    assert all("waited_s" in c["daemon"] for c in gated["calls"]), gated["calls"]
    for run in results["runs"]:
        assert len(run["kills"]) == run["metrics"]["kernel_oom_kills"], run["kills"]
        for k in run["kills"]:  # (the kernel rate-limits the line naming the victim's cgroup)
            assert k["victim"] in ("init", "call", "unattributed"), k
            assert k["victim"] == "unattributed" or k["task"] in ids, k
    report = (out / "report.md").read_text()
    assert "| eager |" in report and "| execgate |" in report
