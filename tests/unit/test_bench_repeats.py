"""bench.repeats: median and spread of repeated replays, per point and scheme."""

from __future__ import annotations

import json
from pathlib import Path

from bench import repeats


def results(makespans: dict[str, float], ooms: int = 0) -> dict:
    return {"points": [{"label": "16 tasks, x8.6"}],
            "runs": [{"scheme": s, "point": 0,
                      "metrics": {"tasks_total": 16, "tasks_completed": 16, "makespan_s": m,
                                  "latency_p50_s": m / 2, "oom_kills": ooms,
                                  "failed_attempts": ooms}}
                     for s, m in makespans.items()]}


def test_median_and_range_per_point_and_scheme(tmp_path: Path) -> None:
    runs = [results({"execgate": 380.0, "reserve": 500.0}, 0),
            results({"execgate": 400.0, "reserve": 520.0}, 2),
            results({"execgate": 390.0}, 1)]
    lines = repeats.table(runs)
    rows = {line.split(" | ")[1]: line for line in lines[2:]}
    assert rows["execgate"] == ("| 16 tasks, x8.6 | execgate | 3 | 16/16 | 390.0 (380.0–400.0) | "
                                "195.0 (190.0–200.0) | 1 (0–2) | 1 (0–2) |")
    assert "| 2 | 16/16 | 510.0 (500.0–520.0) |" in rows["reserve"]
    paths = []
    for i, r in enumerate(runs):
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps(r))
        paths.append(str(p))
    out = tmp_path / "t.md"
    assert repeats.main([*paths, "--out", str(out)]) == 0
    assert "3 repeats" in out.read_text()


def test_unreadable_file_is_a_clear_error(tmp_path: Path, capsys) -> None:
    assert repeats.main([str(tmp_path / "missing.json")]) == 2
    assert "bench.repeats:" in capsys.readouterr().err
