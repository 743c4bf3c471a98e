"""What `execgatectl status` shows: sizes in human units, running calls with their command,
containers by name where the host has one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from execgate.common import records
from execgate.common.config import Config
from execgate.common.units import GiB, MiB, short
from execgate.ctl import main as ctl
from execgate.daemon import names, status

CID = "4f1c2a9be0d14c6f8a7b5e3d2c1b0a99" * 2


def test_sizes_are_in_human_units() -> None:
    assert [short(n) for n in (60 * GiB, 512 * MiB, 1536 * MiB, 16 * MiB, 1024, 300, None,
                               -256 * MiB)] == \
        ["60.0G", "512M", "1.5G", "16.0M", "1.0K", "300B", "-", "-256M"]


def test_a_container_is_shown_by_its_name(tmp_path: Path) -> None:
    cri = {"io.kubernetes.cri.container-name": "agent", "io.kubernetes.cri.sandbox-name": "pod-7"}
    assert names.name_of({"id": CID, "annotations": cri}) == "pod-7/agent"
    docker = tmp_path / "docker"
    (docker / "containers" / CID).mkdir(parents=True)
    (docker / "containers" / CID / "config.v2.json").write_text(json.dumps({"Name": "/web-1"}))
    assert names.name_of({"id": CID}, str(docker)) == "web-1"
    assert names.name_of({"id": "other" + CID}, str(docker)) == ("other" + CID)[:12]
    (docker / "containers" / CID / "config.v2.json").write_text("{not json")
    assert names.name_of({"id": CID}, str(docker)) == CID[:12]


def test_docker_data_root_comes_from_daemon_json(tmp_path: Path) -> None:
    conf = tmp_path / "daemon.json"
    assert names.docker_root(str(conf)) == names.DOCKER_ROOT  # no daemon.json
    conf.write_text(json.dumps({"data-root": "/srv/docker", "runtimes": {}}))
    assert names.docker_root(str(conf)) == "/srv/docker"
    for bad in ('{"data-root": "relative"}', '{"data-root": 7}', "[1]", "{broken"):
        conf.write_text(bad)
        assert names.docker_root(str(conf)) == names.DOCKER_ROOT, bad


def test_status_shows_names_commands_and_human_sizes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cg = tmp_path / "cg"
    (cg / "tool-1").mkdir(parents=True)
    (cg / "memory.current").write_text(f"{61440 * MiB}\n")
    (cg / "tool-1" / "memory.current").write_text(f"{512 * MiB}\n")
    (cg / "tool-1" / "cgroup.procs").write_text(f"{os.getpid()}\n")  # this test's process
    state = tmp_path / "state"
    records.save_container(str(state), {
        "id": CID, "managed": True, "cgroup": str(cg),
        "annotations": {"io.kubernetes.cri.container-name": "agent"}})
    journal = tmp_path / "calls.jsonl"
    records.append_journal(str(journal), {"call": "tool-0", "container": CID,
                                          "argv": ["git", "status"], "memory_peak": GiB})
    snap = status.collect(Config(state_dir=str(state), journal=str(journal)))
    (call,) = snap["sandboxes"][0]["calls"]
    assert "python" in os.path.basename(call["argv"][0])  # read from /proc without a daemon
    ctl.print_status(snap, "disk")
    out = capsys.readouterr().out
    assert "60.0G" in out and "512M" in out and "1.0G" in out and "61440" not in out
    assert out.count("agent ") == 3  # the sandbox, its running call and its finished one
    assert "git status" in out
    snap["daemon"] = {"admission": {"running": [
        {"call_id": "tool-1", "argv": ["pytest", "-x", "\x1b[2J" + "t" * 80]}]},
        "retention": {"rotations": 2, "removed": {"journal_files": 1, "store_rows": 0}}}
    ctl.print_status(snap, "daemon")
    out = capsys.readouterr().out
    assert "retention: journal rotated 2 times; removed 1 journal files" in out
    assert "pytest -x \\x1b[2Jttt" in out and "\x1b" not in out  # as asked, escaped, cut
    assert "t" * 40 not in out and "..." in out
