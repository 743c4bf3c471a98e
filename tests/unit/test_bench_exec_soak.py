"""bench/exec_soak.py's sampling, on a temp dir laid out as a cgroup (the soak itself needs a
cgroup v2 host: the VM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import exec_soak


def test_a_sample_counts_dying_cgroups_live_tool_cgroups_and_memory(tmp_path: Path) -> None:
    (tmp_path / "cgroup.stat").write_text("nr_descendants 2\nnr_dying_descendants 7\n")
    (tmp_path / "memory.current").write_text("4096\n")
    for name in ("tool-0001", "tool-0002", "init"):
        (tmp_path / name).mkdir()
    s = exec_soak._sample(10, str(tmp_path), 0.0, None)
    assert (s["calls"], s["dying"], s["live_tool_cgroups"], s["memory_current"]) == \
        (10, 7, 2, 4096)


def test_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        exec_soak.main(["--help"])
    assert e.value.code == 0 and "churn" in capsys.readouterr().out
