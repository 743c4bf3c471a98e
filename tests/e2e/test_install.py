"""install.sh: merges into daemon.json, is idempotent, and --uninstall reverses it; sets up
compressed swap on a swapless host and removes exactly that.

The suite's install (tests/vm/guest-run.sh) passes --no-swap, so the other tests run on a host
without swap as before; so do the reinstalls here, except the swap test's own."""

from __future__ import annotations

import glob
import json
import os
import subprocess

from conftest import Containers, container_cgroup, docker

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
    p = _install("--no-swap")
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

    p = _install("--no-swap")
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


SWAP_UNIT = "/etc/systemd/system/execgate-swap.service"
SWAP_PLAN = "/var/lib/execgate/swap.json"


def _swaps() -> list[str]:
    with open("/proc/swaps") as f:
        return [line.split()[0] for line in f.read().splitlines()[1:]]


def _zram_module_loaded() -> bool:
    return os.path.isdir("/sys/module/zram")


def test_zram_swap_set_up_on_a_swapless_host_and_removed(containers: Containers) -> None:
    assert _swaps() == [], "the test bed has no swap (the suite installs with --no-swap)"
    had_module = _zram_module_loaded()
    p = _install("--swap-size", "64m")
    assert p.returncode == 0, p.stderr
    print(p.stdout)
    swaps = _swaps()
    assert len(swaps) == 1 and swaps[0].startswith("/dev/zram"), swaps
    dev = os.path.basename(swaps[0])
    with open(f"/sys/block/{dev}/comp_algorithm") as f:
        assert "[zstd]" in f.read()
    with open(f"/sys/block/{dev}/disksize") as f:
        assert int(f.read()) == 64 << 20
    assert "zram" in p.stdout and "no swap" in p.stdout, p.stdout
    with open(SWAP_PLAN) as f:
        assert json.load(f)["mode"] == "zram"
    assert subprocess.run(["systemctl", "is-enabled", "execgate-swap"],
                          capture_output=True).stdout.strip() == b"enabled"
    # Idempotent: a second install keeps the device it made (its own zram is not "the
    # host's swap", so it is not taken for a reason to use zswap).
    p = _install("--swap-size", "64m")
    assert p.returncode == 0, p.stderr
    assert _swaps() == swaps and "already set up" in p.stdout, p.stdout
    # A sandbox's idle baseline may swap: init/ gets [residency] swap_max (default "max").
    cid = containers.run()
    docker("exec", cid, "true")
    with open(os.path.join(container_cgroup(cid), "init", "memory.swap.max")) as f:
        assert f.read().strip() == "max"
    docker("rm", "-f", cid)
    containers.ids.remove(cid)

    p = _install("--uninstall")
    assert p.returncode == 0, p.stderr
    assert _swaps() == [], "uninstall removes the swap it made"
    if os.path.exists(f"/sys/block/{dev}"):  # the module stays where it was loaded before
        with open(f"/sys/block/{dev}/disksize") as f:
            assert f.read().strip() == "0", "the device is reset"
    assert _zram_module_loaded() == had_module, "zram unloaded only if install loaded it"
    assert not os.path.exists(SWAP_UNIT) and not os.path.exists(SWAP_PLAN)

    # --no-swap leaves a swapless host swapless (and the test bed as it was).
    p = _install("--no-swap")
    assert p.returncode == 0, p.stderr
    assert _swaps() == [] and not os.path.exists(SWAP_UNIT) and not os.path.exists(SWAP_PLAN)
    assert "swap" not in p.stdout, p.stdout
