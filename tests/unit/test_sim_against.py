"""bench.sim.against: the simulator's row beside the VM's repeats of the same point."""

from bench.sim.against import table
from execgate.common.units import MiB


def _vm(makespan: float, refaults: int | None) -> dict:
    m = {"tasks_completed": 16, "tasks_total": 16, "oom_kills": 0, "makespan_s": makespan,
         "latency_arrival_p50_s": 50.0, "stall_s": 10.0}
    if refaults is not None:
        m["refault_bytes"] = refaults
    return {"points": [{"label": "16 tasks, x8.6"}],
            "runs": [{"point": 0, "scheme": "execgate", "metrics": m}]}


def test_median_range_and_error_per_column() -> None:
    sim = [{"point": "16 tasks, x8.6", "scheme": "execgate",
            "metrics": {"tasks_completed": 16, "oom_kills": 0, "makespan_s": 240.0,
                        "latency_arrival_p50_s": 55.0, "refault_bytes": 30 * MiB,
                        "stall_s": 12.0}}]
    # Three repeats, one from before the bench recorded refaults.
    lines = table(sim, [_vm(200.0, 10 * MiB), _vm(250.0, 20 * MiB), _vm(190.0, None)])
    row = lines[2]
    assert "| 3 |" in row
    assert "200 (190–250) / 240 (+20 %)" in row  # makespan: median of three, sim's error
    assert "15 (10–20) / 30 (+100 %)" in row  # refaults in MiB, from the two that have them
    assert "16 / 16" in row and "0 / 0" in row  # counts: no error column


def test_a_scheme_the_vm_did_not_run_shows_the_simulator_alone() -> None:
    sim = [{"point": "16 tasks, x8.6", "scheme": "reserve",
            "metrics": {"tasks_completed": 16, "makespan_s": 700.0}}]
    row = table(sim, [_vm(200.0, 0)])[2]
    assert "| 0 |" in row and "– / 700" in row and "– / –" in row
