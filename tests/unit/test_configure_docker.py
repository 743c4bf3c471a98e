"""Docker's daemon.json (configure_docker, moved from daemon_json): merged next to other keys and
runtimes, invalid JSON refused untouched, a default runtime naming ours taken out with it."""

import json
import os
from pathlib import Path

import pytest

from execgate.ctl import configure, configure_docker


def _write(p: Path, data: object) -> None:
    p.write_text(json.dumps(data))


def _run(cmd: str, p: Path, *args: str, path: str = "/x") -> int:
    return configure.main([cmd, "docker", "--config", str(p), "--runtime-path", path, *args])


def test_merge_keeps_other_keys_and_runtimes(tmp_path: Path) -> None:
    p = tmp_path / "daemon.json"
    _write(p, {"log-driver": "local", "runtimes": {"nvidia": {"path": "/nv", "runtimeArgs": []}}})
    assert _run("configure", p, path="/usr/local/bin/execgate") == 0
    data = json.loads(p.read_text())
    assert data["log-driver"] == "local"
    assert data["runtimes"]["nvidia"] == {"path": "/nv", "runtimeArgs": []}
    assert data["runtimes"]["execgate"] == {"path": "/usr/local/bin/execgate"}
    backups = [f for f in os.listdir(tmp_path) if ".execgate-backup-" in f]
    assert len(backups) == 1


def test_idempotent(tmp_path: Path) -> None:
    p = tmp_path / "daemon.json"
    _run("configure", p)
    before = p.read_bytes()
    _run("configure", p)
    assert p.read_bytes() == before
    assert not [f for f in os.listdir(tmp_path) if ".execgate-backup-" in f]  # new file: none


def test_remove_only_our_entry(tmp_path: Path) -> None:
    p = tmp_path / "daemon.json"
    _write(p, {"runtimes": {"execgate": {"path": "/other"}, "keep": {"path": "/k"}}})
    _run("unconfigure", p)
    assert json.loads(p.read_text())["runtimes"]["execgate"] == {"path": "/other"}
    _write(p, {"runtimes": {"execgate": {"path": "/x"}}, "debug": True})
    _run("unconfigure", p)
    assert json.loads(p.read_text()) == {"debug": True}


@pytest.mark.parametrize("text", ['{"a": ', "[1, 2]", '{"runtimes": []}'])
def test_invalid_json_is_refused_untouched(tmp_path: Path, text: str) -> None:
    p = tmp_path / "daemon.json"
    p.write_text(text)
    assert _run("configure", p) == 3
    assert p.read_text() == text
    assert os.listdir(tmp_path) == ["daemon.json"]


def test_missing_or_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "d" / "daemon.json"
    assert _run("configure", p, "--dry-run") == 0 and not p.exists()
    assert _run("configure", p, "--runtime-name", "eg") == 0
    assert json.loads(p.read_text()) == {"runtimes": {"eg": {"path": "/x"}}}


def test_remove_takes_a_default_runtime_naming_it_along(tmp_path: Path) -> None:
    """Docker refuses a daemon.json whose default-runtime is not defined (issue 20)."""
    p = tmp_path / "daemon.json"
    _write(p, {"runtimes": {"execgate": {"path": "/x"}}, "default-runtime": "execgate",
               "debug": True})
    assert _run("unconfigure", p) == 0
    assert json.loads(p.read_text()) == {"debug": True}
    # another's entry under that name is not ours: it and its default stay
    _write(p, {"runtimes": {"execgate": {"path": "/other"}}, "default-runtime": "execgate"})
    _run("unconfigure", p)
    assert json.loads(p.read_text())["default-runtime"] == "execgate"


def test_set_as_default_and_back(tmp_path: Path) -> None:
    """--set-as-default writes "default-runtime"; unconfigure puts the very bytes back."""
    p = tmp_path / "daemon.json"
    original = '{"debug":true,\n   "default-runtime": "runc"}'
    p.write_text(original)
    assert _run("configure", p, "--set-as-default") == 0
    assert json.loads(p.read_text())["default-runtime"] == "execgate"
    assert _run("unconfigure", p) == 0
    assert p.read_text() == original


def test_docker_is_present_by_its_config_directory_or_dockerd(tmp_path: Path) -> None:
    path = str(tmp_path / "etc" / "docker" / "daemon.json")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    assert not configure_docker.present(path, search=str(bin_))
    assert configure.main(["present", "docker", "--config", path]) in (0, 1)  # host's dockerd
    (bin_ / "dockerd").write_text("#!/bin/sh\n")
    (bin_ / "dockerd").chmod(0o755)
    assert configure_docker.present(path, search=str(bin_))
    (bin_ / "dockerd").unlink()
    (tmp_path / "etc" / "docker").mkdir(parents=True)
    assert configure_docker.present(path, search=str(bin_))
