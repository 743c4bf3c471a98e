"""Repeats of one benchmark: median and spread per point and scheme (issue 16 §4).

    python3 -m bench.repeats results-1.json results-2.json results-3.json [--out FILE.md]

Each file is one replay of the same points and schemes (bench/replay.py, same command, same
seed: the traces and arrivals are identical, so what differs is the platform's noise). A row
per point and scheme gives the median of each metric and its range over the repeats, so a
claim rests on the median and its spread shows how far one run can be trusted.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# (metric key, column title, format of one value)
COLUMNS = (
    ("tasks_completed", "tasks done", "{:.0f}"),
    ("makespan_s", "makespan s", "{:.1f}"),
    ("latency_p50_s", "P50 s", "{:.1f}"),
    ("oom_kills", "OOM kills", "{:.0f}"),
    ("failed_attempts", "failed attempts", "{:.0f}"),
)


def load(path: str) -> dict[str, Any]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def point_label(results: dict[str, Any], index: int) -> str:
    points = results.get("points") or []
    if 0 <= index < len(points):
        return str(points[index].get("label", index))
    return str(index)


def collect(files: Sequence[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(point label, scheme) -> the metrics of each repeat that ran it, in file order."""
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for results in files:
        for run in results.get("runs") or []:
            key = (point_label(results, int(run.get("point", 0))), str(run["scheme"]))
            rows.setdefault(key, []).append(run.get("metrics") or {})
    return rows


def cell(values: Sequence[float], fmt: str) -> str:
    """median (min–max) over the repeats; one value alone as it is."""
    if not values:
        return "–"
    med = fmt.format(statistics.median(values))
    if len(values) == 1 or min(values) == max(values):
        return med
    return f"{med} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def table(files: Sequence[dict[str, Any]]) -> list[str]:
    rows = collect(files)
    head = ["point", "scheme", "repeats", *(title for _k, title, _f in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (point, scheme), runs in rows.items():
        cells = [cell([float(m[k]) for m in runs if m.get(k) is not None], fmt)
                 for k, _title, fmt in COLUMNS]
        total = runs[0].get("tasks_total")
        if total is not None:
            cells[0] = f"{cells[0]}/{total}"
        lines.append("| " + " | ".join([point, scheme, str(len(runs)), *cells]) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.repeats",
                                 description="median and spread of repeated replays")
    ap.add_argument("results", nargs="+", help="results.json (or .json.gz) of each repeat")
    ap.add_argument("--out", help="write the table here (Markdown) as well")
    args = ap.parse_args(argv)
    try:
        files = [load(p) for p in args.results]
    except (OSError, ValueError) as e:
        print(f"bench.repeats: {e}", file=sys.stderr)
        return 2
    lines = [f"{len(files)} repeats: median (min–max)", "", *table(files)]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
