"""Pure helpers of the control-loop benchmark (bench/control_loop.py); the run itself needs root."""

from __future__ import annotations

from pathlib import Path

from bench import control_loop as cl
from execgate.common import config
from execgate.daemon import settings


def test_proc_stat_cpu_counts_fields_after_the_command_name() -> None:
    line = ("4242 (python3 (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 "
            "250 50 0 0 20 0 3 0 100 1000000 2000 18446744073709551615\n")
    assert cl.parse_proc_stat_cpu(line) == 300
    with open("/proc/self/stat") as f:
        assert cl.parse_proc_stat_cpu(f.read()) >= 0


def test_private_config_loads_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(cl.config_text(str(tmp_path)))
    cfg = config.load(str(path))
    assert cfg.errors == ()
    assert cfg.socket == f"{tmp_path}/execgated.sock" and cfg.state_dir.startswith(str(tmp_path))
    s, errors = settings.load(cfg)
    assert errors == []
    assert s.daemon.gate == "off" and s.daemon.domain == "host"
    assert s.daemon.store.startswith(str(tmp_path))
    assert s.admission.max_admission_wait_s == cl.MAX_WAIT_S


def test_queued_count() -> None:
    assert [cl.queued_count(n) for n in (0, 1, 10, 100, 1000)] == [0, 1, 1, 10, 100]


def test_fake_tool_cgroup_reads_like_a_cgroup(tmp_path: Path) -> None:
    from execgate.cgroups import v2

    cg = str(tmp_path / "tool-ab")
    cl.fake_tool_cgroup(cg, 2 << 20, 1234)
    assert v2.read_int(cg, "memory.current") == 2 << 20
    assert v2.read_keyed(cg, "cpu.stat")["usage_usec"] == 1234
    assert v2.populated(cg)


def _loop(iterations: int, cpu_s: float, wall_s: float, max_ms: float) -> dict:
    return {"iterations": iterations, "cpu_s": cpu_s, "wall_s": wall_s, "max_wall_ms": max_ms}


def test_summarize_and_render() -> None:
    row = cl.summarize(100, (_loop(10, 0.1, 0.2, 5.0), _loop(110, 0.6, 0.8, 9.0)),
                       cpu_s=0.8, window_s=10.0, admit_s=[0.001, 0.002, 0.003, 0.004],
                       done_s=[0.0005], rss_bytes=30 << 20, queued=10)
    assert row["iterations"] == 100 and row["iterations_per_s"] == 10.0
    assert row["cpu_ms_per_iteration"] == 8.0
    assert row["cpu_percent_of_core"] == 8.0
    assert row["tick_cpu_ms"] == 5.0 and row["tick_wall_ms"] == 6.0
    assert row["tick_wall_max_ms_since_start"] == 9.0
    assert row["admit_ms"]["p50"] == 2.5 and row["admit_ms"]["max"] == 4.0
    assert row["rss_mib"] == 30.0
    empty = cl.summarize(10, (_loop(5, 0, 0, 0), _loop(5, 0, 0, 0)), 0.0, 1.0, [], [], None, 1)
    assert empty["cpu_ms_per_iteration"] is None and empty["admit_ms"]["p99"] is None
    result = {"host": {"description": "2 cores, Debian 12"},
              "params": {"window_s": 10.0, "probes": 4, "period_ms": 100.0},
              "runs": [row, empty]}
    text = cl.render_markdown(result)
    assert "2 cores, Debian 12" in text
    assert "| 100 | 100 + 10 | 8.00 | 8.0 | 5.00 / 6.00 | 2.50 / 3.85 / 3.97 |" in text
    assert "| 10 | 10 + 1 | – |" in text
