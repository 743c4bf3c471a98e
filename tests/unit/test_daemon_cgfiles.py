"""The control loop's kept cgroup-file descriptors, and its iteration counters."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from execgate.common.config import Config
from execgate.common.units import MiB
from execgate.daemon import settings
from execgate.daemon.cgfiles import KeptFiles, parse_key
from execgate.daemon.engine import Engine, LoopStats


def _cgroup(tmp: Path, name: str = "tool-1", current: int = 5) -> str:
    cg = tmp / name
    cg.mkdir()
    (cg / "memory.current").write_text(f"{current}\n")
    (cg / "cpu.stat").write_text("usage_usec 700\nuser_usec 600\nsystem_usec 100\n")
    return str(cg)


def test_parse_key() -> None:
    data = b"usage_usec 700\nuser_usec 600\nsystem_usec 100\n"
    assert parse_key(data, "usage_usec") == 700
    assert parse_key(data, "system_usec") == 100
    assert parse_key(data, "usec") is None  # whole keys only
    assert parse_key(b"a 1\nb 2", "b") == 2  # no final newline
    assert parse_key(b"a x\n", "a") is None


def test_reads_through_kept_descriptors_and_sees_new_content(tmp_path: Path) -> None:
    cg = _cgroup(tmp_path)
    files = KeptFiles(max_open=8)
    assert files.read_int(cg, "memory.current") == 5
    assert files.read_key(cg, "cpu.stat", "usage_usec") == 700
    assert len(files) == 2
    (Path(cg) / "memory.current").write_text("9\n")  # same inode, as cgroupfs
    assert files.read_int(cg, "memory.current") == 9
    assert len(files) == 2  # nothing reopened
    files.forget(cg)
    assert len(files) == 0


def test_missing_files_and_the_bound(tmp_path: Path) -> None:
    cg = _cgroup(tmp_path)
    files = KeptFiles(max_open=1)
    assert files.read_int(str(tmp_path / "gone"), "memory.current") is None
    assert files.read_int(cg, "memory.current") == 5
    assert files.read_key(cg, "cpu.stat", "usage_usec") == 700  # over the bound: read, closed
    assert len(files) == 1
    # An optional file missing from a cgroup that exists is not looked for again...
    assert files.read_int(cg, "memory.swap.current", absent_for_good=True) is None
    (Path(cg) / "memory.swap.current").write_text("3\n")
    assert files.read_int(cg, "memory.swap.current", absent_for_good=True) is None
    # ... until the cgroup is forgotten; a required file is looked for every time.
    files.forget(cg)
    assert files.read_int(cg, "memory.swap.current", absent_for_good=True) == 3
    assert KeptFiles(max_open=0).read_int(cg, "memory.current") == 5


def test_a_failing_descriptor_reads_as_gone_and_is_dropped(tmp_path: Path) -> None:
    cg = _cgroup(tmp_path)
    files = KeptFiles(max_open=8)
    assert files.read_int(cg, "memory.current") == 5
    path = cg + "/memory.current"
    os.close(files._fds[path])
    # A removed cgroup's descriptor fails its reads (ENODEV); a directory's fails them too.
    files._fds[path] = os.open(tmp_path, os.O_RDONLY)
    assert files.read_int(cg, "memory.current") is None
    assert path not in files._fds
    assert files.read_int(cg, "memory.current") == 5  # reopened by path next time


def test_loop_stats() -> None:
    s = LoopStats()
    assert s.snapshot()["mean_wall_ms"] is None
    s.add(0.004, 0.003)
    s.add(0.002, 0.001)
    snap = s.snapshot()
    assert snap["iterations"] == 2
    assert abs(snap["mean_wall_ms"] - 3.0) < 1e-9 and abs(snap["mean_cpu_ms"] - 2.0) < 1e-9
    assert abs(snap["max_wall_ms"] - 4.0) < 1e-9 and abs(snap["last_wall_ms"] - 2.0) < 1e-9


def test_engine_counts_iterations_and_closes_a_finished_calls_files(tmp_path: Path) -> None:
    async def scenario() -> None:
        dom = tmp_path / "domain"
        dom.mkdir()
        (dom / "memory.max").write_text(f"{1024 * MiB}\n")
        (dom / "memory.current").write_text(f"{64 * MiB}\n")
        cfg = Config(state_dir=str(tmp_path / "state"), journal=str(tmp_path / "calls.jsonl"),
                     tables={"daemon": {"domain": str(dom), "gate": "off",
                                        "store": str(tmp_path / "h.sqlite")}})
        s, errors = settings.load(cfg)
        assert errors == []
        eng = Engine(cfg, s)
        cg = _cgroup(tmp_path, "tool-a", current=MiB)
        _, fut = eng.submit({"call": "tool-a", "container": "c", "sandbox": "c", "cgroup": cg,
                             "argv": ["git", "status"], "hint": {"memory_bytes": 8 * MiB}})
        assert fut.done()
        eng.tick()
        eng.tick()
        assert eng.snapshot()["loop"]["iterations"] == 2
        assert eng.calls["tool-a"].last_mem == MiB
        assert len(eng.files) == 2  # memory.current and cpu.stat; no swap file here
        eng.done("tool-a")
        assert len(eng.files) == 0 and "tool-a" not in eng.calls

    asyncio.run(scenario())
