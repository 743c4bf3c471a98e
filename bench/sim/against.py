"""The simulator's replay of a point beside the VM's repeats of it, with the error.

`python3 -m bench.sim replay ... --against VM.json[,VM.json...]`: the VM files are
`bench.replay sweep` results of the same command (repeats: the same tasks, arrivals and budget),
so a point's label names the same load on both sides. Per point and scheme: the VM's median and
range, the simulator's figure and its error against the median, for what both count. Issue 16
asks for exactly this table; the cost fit the simulator ran with is the caller's to state
(in-sample or not).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from bench.repeats import cell, collect
from bench.sim.validate import _err
from execgate.common.units import MiB

# (metric, column, unit it is shown in)
COLUMNS = (("tasks_completed", "done", 1), ("oom_kills", "OOM kills", 1),
           ("makespan_s", "makespan s", 1), ("latency_arrival_p50_s", "P50 s", 1),
           ("refault_bytes", "refaults MiB", MiB), ("stall_s", "stall s", 1))


def table(sim_runs: Sequence[Mapping[str, Any]],
          vm_files: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown rows: VM median (range) / sim (error) per column; '–' where the VM did not
    record it (refaults and stall are recorded since 7601a92)."""
    vm = collect(vm_files)
    head = ["point", "scheme", "VM runs", *(f"{title} VM / sim" for _k, title, _u in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in sim_runs:
        runs = vm.get((str(run["point"]), str(run["scheme"])), [])
        cells = []
        for key, _title, unit in COLUMNS:
            values = [float(m[key]) / unit for m in runs if m.get(key) is not None]
            sim = run["metrics"].get(key)
            sim_v = None if sim is None else float(sim) / unit
            shown = "–" if sim_v is None else f"{sim_v:.0f}"
            if values and sim_v is not None and key not in ("tasks_completed", "oom_kills"):
                shown += f" ({_err(statistics.median(values), sim_v)})"
            cells.append(f"{cell(values, '{:.0f}')} / {shown}")
        lines.append("| " + " | ".join([str(run["point"]), str(run["scheme"]), str(len(runs)),
                                         *cells]) + " |")
    return lines
