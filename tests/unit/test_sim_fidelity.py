"""What the simulator knows must be what the daemon knows, and the VM's times must not be
counted twice: two ways the burst point's simulation was off against the VM."""

from __future__ import annotations

from bench.schemes import SCHEMES, bench_config
from bench.sim.cost import fixed, observations
from bench.sim.run import SimSettings, Simulation
from bench.trace import LlmWait, MemoryProfile, Task, ToolCall
from execgate.common.units import MiB
from execgate.policy import sandbox_admission as sa


def _task(i: int) -> Task:
    peak = 120 * MiB
    return Task(f"t{i}", [LlmWait(1.0), ToolCall("python -m pytest -q", 2.0, MemoryProfile(
        peak // 4, peak, "ramp", 0.5, 0.5, 2 * MiB)), LlmWait(0.5)], 20 * MiB)


def test_a_create_carries_no_call_peak(monkeypatch) -> None:
    """The runtime's create asks before any exec: the daemon learns a call's hint with the call,
    so the simulated create must not hand sandbox admission the first call's declared peak."""
    seen: list[int | None] = []
    orig = sa.SandboxAdmission.submit

    def submit(self, req, *a, **k):  # type: ignore[no-untyped-def]
        seen.append(req.call_peak_bytes)
        return orig(self, req, *a, **k)

    monkeypatch.setattr(sa.SandboxAdmission, "submit", submit)
    scheme = SCHEMES["execgate"]
    sim = Simulation(scheme, [_task(i) for i in range(3)], [0.0, 0.1, 0.2], 400 * MiB,
                     SimSettings(cost=fixed(0.5, 0.1, 0.2)),
                     bench_config({}, scheme, domain="/sim"))
    sim.run()
    assert seen == [None, None, None]


def _run(daemon: bool, verdict: dict | None) -> dict:
    attempt = {"task_id": "t0", "attempt": 1, "start": 10.0, "end": 60.0, "ok": True}
    if verdict is not None:
        attempt["sandbox_admission"] = verdict
    return {"scheme_def": {"runtime": "execgate" if daemon else "runc", "daemon": daemon},
            "config": {"sandbox_admission": {"enabled": True}} if daemon else None,
            "metrics": {}, "attempts": [attempt], "tasks": [{"id": "t0", "end_s": 61.0}],
            "samples": {"rows": [[0.0, 0, 1, 0, 0, 0], [100.0, 0, 1, 0, 0, 0]]},
            "calls": [{"task": "t0", "attempt": 1, "call": 1, "start": 46.0, "end": 50.0,
                       "duration_s": 2.0, "exit": 0}]}


def test_a_docker_run_fit_leaves_out_the_create_wait_the_simulator_adds() -> None:
    """run = first exec - attempt start - opening LLM wait; under the daemon the create's
    sandbox-admission wait is in that gap too, and the simulator adds its own: fitted with it,
    execgate's docker run cost every wait twice."""
    tasks = {"t0": _task(0)}
    runtime = {True: "execgate", False: "runc"}
    for daemon, verdict, want in ((False, None, 35.0),
                                  (True, {"waited_s": 30.0, "verdict": "admitted"}, 5.0)):
        run = _run(daemon, verdict)
        got = observations({"runs": [run]}, tasks, runtime[daemon])["run"]
        assert got == [(1, want)]
    # A daemon run with no verdict for the create holds an unknown wait: not fitted at all.
    assert observations({"runs": [_run(True, None)]}, tasks, "execgate")["run"] == []
    # Runs from before sandbox admission (the VM sweep's) held no create: fitted whole.
    old = dict(_run(True, None), config={"admission": {}})
    assert observations({"runs": [old]}, tasks, "execgate")["run"] == [(1, 35.0)]
