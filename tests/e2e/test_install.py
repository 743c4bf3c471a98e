"""install.sh: merges into daemon.json, is idempotent, and --uninstall reverses it."""

from __future__ import annotations

import glob
import json
import os
import subprocess

from conftest import Containers, docker

SRC = os.environ.get("EXECGATE_SRC", "")
DAEMON_JSON = "/etc/docker/daemon.json"


def _install(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if os.environ.get("EXECGATE_WHEELS"):
        env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=os.environ["EXECGATE_WHEELS"])
    return subprocess.run([os.path.join(SRC, "install.sh"), *args], capture_output=True,
                          text=True, env=env, timeout=600)


def _runtimes() -> dict[str, object]:
    with open(DAEMON_JSON) as f:
        return json.load(f)["runtimes"]


def test_registered_next_to_existing_runtime() -> None:
    runtimes = _runtimes()
    assert runtimes["execgate"] == {"path": "/usr/local/bin/execgate"}
    # The test image's daemon.json had a "sentinel" runtime before install.sh ran.
    assert runtimes["sentinel"] == {"path": "/usr/bin/runc"}
    with open(DAEMON_JSON) as f:
        data = json.load(f)
    assert data["bridge"] == "none" and data["iptables"] is False
    info = json.loads(docker("info", "--format", "{{json .Runtimes}}").stdout)
    assert {"execgate", "sentinel", "runc"} <= set(info)
    assert glob.glob(DAEMON_JSON + ".execgate-backup-*")
    for cmd in ("execgate", "execgated", "execgatectl"):
        assert os.path.realpath(f"/usr/local/bin/{cmd}") == f"/opt/execgate/bin/{cmd}"
    assert os.path.exists("/etc/execgate/config.toml")
    assert subprocess.run(["systemctl", "is-active", "execgated"],
                          capture_output=True).stdout.strip() == b"active"


def test_idempotent_uninstall_and_reinstall(containers: Containers) -> None:
    with open(DAEMON_JSON, "rb") as f:
        before = f.read()
    backups = set(glob.glob(DAEMON_JSON + ".execgate-backup-*"))
    p = _install()
    assert p.returncode == 0, p.stderr
    with open(DAEMON_JSON, "rb") as f:
        assert f.read() == before, "a second install must not rewrite daemon.json"
    assert set(glob.glob(DAEMON_JSON + ".execgate-backup-*")) == backups

    p = _install("--uninstall")
    assert p.returncode == 0, p.stderr
    runtimes = _runtimes()
    assert "execgate" not in runtimes and runtimes["sentinel"] == {"path": "/usr/bin/runc"}
    assert not os.path.exists("/usr/local/bin/execgate")
    assert not os.path.exists("/opt/execgate")
    assert subprocess.run(["systemctl", "is-active", "execgated"],
                          capture_output=True).stdout.strip() != b"active"
    assert os.path.exists("/etc/execgate/config.toml"), "config is kept without --purge"

    p = _install()
    assert p.returncode == 0, p.stderr
    assert _runtimes()["execgate"] == {"path": "/usr/local/bin/execgate"}
    cid = containers.run()
    assert docker("exec", cid, "cat", "/proc/self/cgroup").stdout.startswith(b"0::/tool-")


def test_invalid_daemon_json_is_refused_untouched(tmp_path: object) -> None:
    bad = os.path.join(str(tmp_path), "daemon.json")
    with open(bad, "w") as f:
        f.write('{"runtimes": {"x": ')
    env = dict(os.environ, EXECGATE_DOCKER_CONFIG=bad)
    if os.environ.get("EXECGATE_WHEELS"):
        env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=os.environ["EXECGATE_WHEELS"])
    p = subprocess.run([os.path.join(SRC, "install.sh"), "--no-start"], capture_output=True,
                       text=True, env=env, timeout=600)
    assert p.returncode != 0
    assert "not valid JSON" in p.stderr and "nothing was changed" in p.stderr
    with open(bad) as f:
        assert f.read() == '{"runtimes": {"x": '
