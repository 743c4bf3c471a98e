"""Replay benchmark report: Markdown table and PNG plots from a small synthetic results.json."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.metrics import AttemptRecord, summarize
from execgate.common.units import MiB


def _run(scheme: str, point: int, budget: int, *, family: str | None = None, k: int | None = None,
         ooms: int = 0, stretch: float = 1.0, n_tasks: int = 3) -> dict[str, Any]:
    """A run whose tasks take 10 s each (times `stretch`), with `ooms` failed first attempts."""
    attempts = []
    for i in range(n_tasks):
        t0 = 2.0 * i
        if i < ooms:
            attempts.append({"task_id": f"t{i}", "attempt": 1, "start": t0, "end": t0 + 3,
                             "ok": False, "oom_kills": 1, "reason": "oom"})
            t0 += 3
        n = 2 if i < ooms else 1
        attempts.append({"task_id": f"t{i}", "attempt": n, "start": t0,
                         "end": t0 + 10 * stretch, "ok": True, "oom_kills": 0, "reason": ""})
    recs = [AttemptRecord(a["task_id"], a["attempt"], a["start"], a["end"], a["ok"],
                          a["oom_kills"]) for a in attempts]
    rows = [[t / 2, int(budget * (0.3 + 0.6 * abs(math.sin(t / 5)))), min(3, 1 + t // 4), 1, 0]
            for t in range(0, 60)]
    metrics = summarize(recs, [(r[0], float(r[1])) for r in rows], budget, speed=20.0)
    metrics.update(latency_arrival_p50_s=metrics["latency_p50_s"] + 1,
                   latency_arrival_p95_s=metrics["latency_p95_s"] + 2,
                   call_delay_p50_s=0.8, kernel_oom_kills=ooms)
    return {"scheme": scheme, "family": family or scheme, "k": k, "point": point,
            "scheme_def": {"name": scheme}, "metrics": metrics,
            "tasks": [{"id": f"t{i}", "ok": True, "attempts": 1 + (i < ooms)}
                      for i in range(n_tasks)],
            "attempts": attempts, "calls": [],
            "samples": {"columns": ["t", "memory_bytes", "running_tasks", "inflight_calls",
                                    "queued_tasks"], "rows": rows},
            "notes": ["a note"] if ooms else []}


@pytest.fixture
def results() -> dict[str, Any]:
    runs = []
    for point, budget in ((0, 768 * MiB), (1, 384 * MiB)):
        runs += [
            _run("eager", point, budget, ooms=1 + point),
            _run("static-1", point, budget, family="static", k=1, stretch=3.0),
            _run("static-2", point, budget, family="static", k=2, stretch=1.5),
            _run("static-3", point, budget, family="static", k=3, ooms=3),  # loses on failures
            _run("execgate", point, budget, stretch=1.2),
        ]
    # static-3 left a task failed for good at the first load.
    runs[3]["metrics"]["tasks_failed"] = 1
    runs[3]["metrics"]["tasks_completed"] = 2
    return {
        "format": "execgate-bench-results/1", "command": "bench/replay.py sweep ...",
        "host": {"kernel": "6.x", "cpus": 2},
        "params": {"seed": 1, "trace": None, "arrival": "poisson", "mean_gap_trace_s": 30.0,
                   "retry_limit": 5, "workload": {"speed": 20.0, "mem_scale": 8.0,
                                                  "cpu_scale": 0.25, "fold_bytes": 16 * MiB,
                                                  "max_calls": None}},
        "points": [{"label": "3 tasks, 768 MiB", "n_tasks": 3, "budget_bytes": 768 * MiB,
                    "oversubscription": 2.1},
                   {"label": "3 tasks, 384 MiB", "n_tasks": 3, "budget_bytes": 384 * MiB,
                    "oversubscription": 4.2}],
        "runs": runs,
    }


def test_best_static_is_the_fastest_that_completes_everything(results: dict[str, Any]) -> None:
    best = report.best_static([r for r in results["runs"] if r["point"] == 0])
    assert best is not None and best["k"] == 2
    assert report.best_static([results["runs"][0]]) is None


def test_markdown_table_has_one_row_per_scheme(results: dict[str, Any]) -> None:
    md = report.markdown(results)
    assert md.count("## ") == 2
    assert "oversubscription 2.10x" in md and "oversubscription 4.20x" in md
    section = md.split("## ")[1]
    main, why = section.split("Why (")
    rows = [line for line in main.splitlines() if line.startswith("| ")][1:]
    assert [r.split("|")[1].strip() for r in rows] == ["eager", "static (K=2)", "execgate"]
    why_rows = [line for line in why.splitlines() if line.startswith("| ")][1:]
    assert [r.split("|")[1].strip() for r in why_rows] == ["eager", "static (K=2)", "execgate"]
    eager = rows[0].split("|")
    assert eager[2].strip() == "3/3" and eager[5].strip() == "1"  # done, OOM kills
    assert "1/4 (25 %)" in eager[6]  # failed attempts and rate
    assert "Static-K sweep: K=1" in section and "K=3: 2/3 done" in section
    assert "- eager: a note" in section


def test_markdown_survives_missing_values(results: dict[str, Any]) -> None:
    results["runs"] = results["runs"][:1]
    results["runs"][0]["metrics"]["latency_arrival_p50_s"] = math.nan
    results["aborted"] = True
    md = report.markdown(results)
    assert "| eager |" in md and "–" in md and "interrupted" in md


def _png_is_drawn(path: Path) -> None:
    import matplotlib.image as mpimg

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 20_000
    img = mpimg.imread(path)
    assert img.shape[0] > 300 and img.shape[1] > 600
    assert img[..., :3].std() > 0.05  # not a blank canvas


def test_plots_are_written(results: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    src = tmp_path / "results.json"
    src.write_text(json.dumps(results))
    assert report.main([str(src)]) == 0
    for name in ("timeline-1.png", "timeline-2.png", "summary.png"):
        _png_is_drawn(tmp_path / name)
    assert (tmp_path / "report.md").read_text().startswith("# execgate trace-replay benchmark")


def test_single_load_summary_uses_bars(results: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    results["points"] = results["points"][:1]
    results["runs"] = [r for r in results["runs"] if r["point"] == 0]
    files = report.render(results, tmp_path)
    assert [f.name for f in files] == ["report.md", "timeline-1.png", "summary.png"]
    _png_is_drawn(tmp_path / "summary.png")


def test_rejects_other_files(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert report.main([str(bad)]) == 2


def _split(results: dict[str, Any], schemes: set[str]) -> dict[str, Any]:
    part = json.loads(json.dumps(results))
    part["runs"] = [r for r in part["runs"] if r["scheme"] in schemes]
    part["command"] = f"bench/replay.py run --schemes {','.join(sorted(schemes))}"
    return part


def test_merge_joins_runs_of_one_workload(results: dict[str, Any], tmp_path: Path) -> None:
    a = _split(results, {"eager", "execgate"})
    b = _split(results, {"static-1", "static-2", "static-3"})
    b["params"]["mean_gap_trace_s"] = 0.0  # irrelevant: arrivals are compared via the points
    merged = report.merge([a, b])
    assert len(merged["runs"]) == len(results["runs"])
    assert {r["part"] for r in merged["runs"] if r["scheme"] == "eager"} == {0}
    assert {r["part"] for r in merged["runs"] if r["family"] == "static"} == {1}
    assert [p["schemes"] for p in merged["merged_from"]] == [
        ["eager", "execgate"], ["static-1", "static-2", "static-3"]]
    md = report.markdown(merged)
    assert "Merged from 2 runs" in md and "--schemes eager,execgate" in md
    assert md.split("## ")[1].split("Why (")[0].count("| static (K=2) |") == 1

    src_a, src_b = tmp_path / "a.json", tmp_path / "b.json"
    src_a.write_text(json.dumps(a))
    src_b.write_text(json.dumps(b))
    out = tmp_path / "merged"
    assert report.main([str(src_a), str(src_b), "--out", str(out), "--no-plots"]) == 0
    assert report.load(out / "results.json")["merged_from"]
    assert "Merged from 2 runs" in (out / "report.md").read_text()
    with pytest.raises(SystemExit):  # merging needs an explicit --out
        report.main([str(src_a), str(src_b)])


def test_merge_refuses_other_workloads_and_repeated_schemes(results: dict[str, Any]) -> None:
    a = _split(results, {"eager"})
    b = _split(results, {"execgate"})
    b["params"]["workload"]["speed"] = 10.0
    with pytest.raises(ValueError, match="workload"):
        report.merge([a, b])
    c = _split(results, {"execgate"})
    c["points"][0]["budget_bytes"] = 512 * MiB
    with pytest.raises(ValueError, match="points"):
        report.merge([a, c])
    with pytest.raises(ValueError, match="more than one part"):
        report.merge([a, _split(results, {"eager"})])


def test_text_table_is_compact_and_aligned(results: dict[str, Any]) -> None:
    text = report.text_table(results)
    blocks = text.strip().split("\n\n")
    assert len(blocks) == 2
    lines = blocks[0].splitlines()
    assert lines[0].startswith("3 tasks, 768 MiB: 3 sandboxes, budget 768 MiB")
    assert lines[1].split() [:2] == ["scheme", "done"]
    assert [line.split()[0] for line in lines[3:]] == ["eager", "static", "execgate"]
    assert len({len(line) for line in lines[1:]}) == 1  # fixed width
    assert " 1/4 (25 %)" in lines[3]


def test_the_why_table_says_the_daemons_own_cpu(results: dict[str, Any]) -> None:
    """execgated's CPU over a run: under TCG each second of it is one the engine's starts and
    the calls did not get (15x, one boot: 7 min 46 s over an 18-minute run)."""
    run = results["runs"][4]
    run["scheme_def"]["daemon"] = True
    run["metrics"]["daemon_cpu_s"] = 466.4
    why = report.markdown(results).split("## ")[1].split("Why (")[1]
    header, *rows = [line for line in why.splitlines() if line.startswith("| ")]
    assert header.split("|")[-2].strip() == "daemon CPU s"
    cells = {r.split("|")[1].strip(): r.split("|")[-2].strip() for r in rows}
    assert cells == {"eager": "–", "static (K=2)": "–", "execgate": "466"}
    run["daemon_loop"] = {"cpu_s": 218.4, "stage_cpu_s": {"sandboxes": 101.9, "growth": 32.2}}
    why = report.markdown(results).split("## ")[1].split("Why (")[1]
    rows = [line for line in why.splitlines() if line.startswith("| ")][1:]
    assert rows[-1].split("|")[-2].strip() == "466 (loop 218; sandboxes 102)"
    run["daemon_loop"]["threads_cpu_s"] = {"MainThread": 300.0, "follow": 90.0, "reclaim": 70.0}
    why = report.markdown(results).split("## ")[1].split("Why (")[1]
    rows = [line for line in why.splitlines() if line.startswith("| ")][1:]
    assert rows[-1].split("|")[-2].strip() == \
        "466 (loop 218; sandboxes 102; requests 82; follow 90)"
    run["daemon_loop"]["periods"] = {"sample": 300, "calm": 600, "idle": 100}
    why = report.markdown(results).split("## ")[1].split("Why (")[1]
    rows = [line for line in why.splitlines() if line.startswith("| ")][1:]
    assert rows[-1].split("|")[-2].strip() == \
        "466 (loop 218; sandboxes 102; requests 82; follow 90; 60 % calm)"


def test_the_cpu_table_shows_where_the_hosts_cpu_went(results: dict[str, Any]) -> None:
    """At 1x the latency ratio follows the CPU the schemes' own parts take from the
    sandboxes under TCG; the report shows it by party for the runs that recorded it."""
    assert "Where the host's CPU went" not in report.markdown(results)
    results["runs"][4]["cpu_parties"] = {"busy": 610.2, "idle": 3.0, "sandboxes": 380.0,
                                         "engine": 130.0, "execgated": 88.0, "other": 12.2}
    part = report.markdown(results).split("## ")[1].split("Where the host's CPU went")[1]
    rows = [line for line in part.splitlines() if line.startswith("| ")]
    assert [c.strip() for c in rows[-1].split("|")[1:-1]] == \
        ["execgate", "610", "380", "130", "88", "12", "3"]
    assert len(rows) == 2  # the header and the one run with a ledger
