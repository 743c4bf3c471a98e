"""What an operator runs against the installed execgate (issue 20): --version, status's exit
status with the daemon down, config check, systemctl reload (SIGHUP) and the metrics endpoint
scraped while a tool call runs."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator

from conftest import CONFIG, Containers, daemon_up, daemon_view, docker, systemctl, wait_for

PORT = 9477


def _main_pid() -> str:
    return subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", "execgated"],
                          capture_output=True, text=True, check=True).stdout.strip()


@contextlib.contextmanager
def _config(**keys: str) -> Iterator[None]:
    """The installed config with these keys' lines set (`key = value`: the shipped file sets
    every key, and a second table of the same name is invalid TOML); restored, and the daemon
    restarted, after."""
    shutil.copy(CONFIG, CONFIG + ".orig")
    try:
        with open(CONFIG) as f:
            text = f.read()
        for key, value in keys.items():
            text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
            assert n == 1, (key, n)
        with open(CONFIG, "w") as f:
            f.write(text)
        yield
    finally:
        shutil.move(CONFIG + ".orig", CONFIG)
        systemctl("restart", "execgated")
        wait_for(daemon_up, timeout=120, what="execgated to come back")


def test_version_names_execgate_and_the_real_runtime() -> None:
    out = subprocess.run(["execgate", "--version"], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    lines = out.splitlines()
    assert lines[0].startswith("execgate version ") and lines[1].startswith("real runtime: /")
    # runc's own lines follow: dockerd reads a runtime's version from the last "version" line
    assert [line for line in lines if "version" in line][-1].startswith("runc version"), out


def test_status_exits_3_while_the_daemon_is_down() -> None:
    systemctl("stop", "execgated")
    try:
        p = subprocess.run(["execgatectl", "status"], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 3 and "not reachable" in p.stderr
    finally:
        systemctl("start", "execgated")
        wait_for(daemon_up, timeout=120, what="execgated")
    assert subprocess.run(["execgatectl", "status"], capture_output=True,
                          timeout=60).returncode == 0


def test_the_installed_config_checks_clean() -> None:
    p = subprocess.run(["execgatectl", "config", "check"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_reload_applies_live_values_without_a_restart() -> None:
    pid = _main_pid()
    with _config(max_admission_wait_s="7.0", listen=f'"127.0.0.1:{PORT}"'):
        systemctl("reload", "execgated")
        conf = wait_for(lambda: (daemon_view().get("config") or {}).get("reloads"),
                        timeout=60, what="the reload")
        assert conf >= 1 and _main_pid() == pid
        assert daemon_view()["config"]["restart_needed"] == ["[metrics] listen"]


def test_metrics_while_a_call_runs(containers: Containers) -> None:
    with _config(listen=f'"127.0.0.1:{PORT}"'):
        systemctl("restart", "execgated")
        wait_for(daemon_up, timeout=120, what="execgated")
        cid = containers.run()
        docker("exec", cid, "true")
        call = subprocess.Popen(["docker", "exec", cid, "sleep", "20"])
        try:
            def scrape() -> dict[str, float]:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics",
                                            timeout=30) as r:
                    text = r.read().decode()
                return {name: float(v) for name, v in
                        (line.rsplit(" ", 1) for line in text.splitlines()
                         if line and not line.startswith("#"))}

            # `true` ended ok (its journal line read), `sleep` runs: both admitted. The counts
            # follow the event bus a moment after the engine's state: a scrape rendered while
            # `sleep` was being admitted saw it running and one admission (VM, 6 Dec).
            ok = 'execgate_calls_finished_total{outcome="ok"}'
            waits = "execgate_admission_wait_seconds_count"
            s = wait_for(lambda: (m := scrape()).get("execgate_calls_running")
                         and m.get(ok) and m.get(waits, 0) >= 2 and m, timeout=60,
                         what="the ended and the running call in the metrics")
            assert s["execgate_budget_bytes"] > 0
            assert s.get('execgate_calls_finished_total{outcome="vanished"}', 0) == 0
            # the container's create and start went through the front: where their time went
            assert s.get('execgate_lifecycle_seconds_total{op="create",part="runc"}', 0) > 0
            assert 'execgate_lifecycle_seconds_total{op="start",part="daemon"}' in s
        finally:
            call.kill()
            call.wait()
