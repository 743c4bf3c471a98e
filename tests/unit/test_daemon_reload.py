"""SIGHUP: live values applied where the engine reads them, the rest logged as waiting for a
restart, bad values and unreadable files changing nothing; the real daemon survives it."""

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from execgate.common import config, protocol
from execgate.common.units import MiB
from execgate.daemon import reload, settings
from execgate.daemon.engine import Engine

SRC = Path(__file__).resolve().parents[2]


def _config(tmp: Path, extra: str = "") -> Path:
    dom = tmp / "domain"
    dom.mkdir(exist_ok=True)
    (dom / "memory.max").write_text(f"{1 << 30}\n")
    (dom / "memory.current").write_text(f"{64 * MiB}\n")
    p = tmp / "config.toml"
    p.write_text(f'socket = "{tmp / "d.sock"}"\nstate_dir = "{tmp / "state"}"\n'
                 f'journal = "{tmp / "calls.jsonl"}"\n'
                 f'[daemon]\ndomain = "{dom}"\nstore = "{tmp / "h.sqlite"}"\ngate = "off"\n'
                 f'probes = "off"\noom_record = ""\n{extra}')
    return p


def _engine(tmp: Path, extra: str = "") -> tuple[config.Config, Engine]:
    cfg = config.load(str(_config(tmp, extra)))
    s, problems = settings.load(cfg)
    assert problems == []
    return cfg, Engine(cfg, s)


def test_every_table_and_live_key_is_known() -> None:
    assert set(reload.LIVE) <= set(settings.TABLES)
    for table, live in reload.LIVE.items():
        names = {f.name for f in dataclasses.fields(settings.TABLES[table])}
        assert live is reload.ALL or live <= names, table


def test_live_values_reach_the_engine_and_the_rest_waits_for_a_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        cfg, eng = _engine(tmp_path, "[admission]\nmax_admission_wait_s = 30.0\n")
        _config(tmp_path, '[admission]\nmax_admission_wait_s = 12.0\n'
                          '[pressure]\nsafety_margin_bytes = "32m"\n'
                          '[estimate]\ngit_peak_bytes = "99m"\nhistory_window = 3\n'
                          '[residency]\nidle_after_s = 7\n[metrics]\nlisten = "127.0.0.1:9477"\n')
        (tmp_path / "config.toml").write_text((tmp_path / "config.toml").read_text()
                                              .replace('gate = "off"', 'gate = "freeze"'))
        reloader = reload.Reloader(cfg, eng)
        p = reloader()
        assert eng.admission.config.max_admission_wait_s == 12.0
        assert eng.settings.pressure.safety_margin_bytes == 32 * MiB
        assert eng.growth.controller.pressure.safety_margin_bytes == 32 * MiB
        assert eng.residency.pressure.safety_margin_bytes == 32 * MiB
        assert eng.estimator.config.git_peak_bytes == 99 * MiB
        assert eng.residency.cfg.idle_after_s == 7.0
        ticket, _ = eng.submit({"call": "tool-1", "container": "c", "sandbox": "c",
                                "cgroup": "/nope/tool-1", "argv": ["true"]})
        assert ticket["max_wait_s"] == 12.0  # what the runtime is told from now on
        # built at start: the running values stay, and are named
        assert eng.estimator.config.history_window == 8
        assert eng.settings.daemon.gate == "off" and eng.settings.metrics.listen == ""
        assert sorted(p.restart) == ["[daemon] gate", "[estimate] history_window",
                                     "[metrics] listen"]
        assert reloader.snapshot()["restart_needed"] == p.restart
        assert reloader.snapshot()["reloads"] == 1

    asyncio.run(scenario())


def test_a_bad_value_keeps_the_running_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        cfg, eng = _engine(tmp_path, "[admission]\nmax_queued_s = 100.0\n")
        _config(tmp_path, '[admission]\nmax_queued_s = "long"\nheavy_peak_bytes = "2g"\n')
        p = reload.Reloader(cfg, eng)()
        assert eng.admission.config.max_queued_s == 100.0  # not the default 600
        assert eng.admission.config.heavy_peak_bytes == 2 << 30
        assert [str(x) for x in p.problems if x.error] == [
            f"{tmp_path / 'config.toml'}:11: [admission] max_queued_s: must be a number; "
            "default kept"]

    asyncio.run(scenario())


def test_a_file_that_does_not_parse_changes_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        cfg, eng = _engine(tmp_path, "[admission]\nmax_queued_s = 100.0\n")
        before = eng.settings
        (tmp_path / "config.toml").write_text("[admission\nmax_queued_s = 5\n")
        reloader = reload.Reloader(cfg, eng)
        p = reloader()
        assert p.unread and eng.settings is before
        assert reloader.snapshot()["last_error"] == p.unread
        assert reloader.snapshot()["reloads"] == 0

    asyncio.run(scenario())


def test_live_values_that_only_fit_new_restart_ones_wait_with_them(tmp_path: Path) -> None:
    """overdue_after_s = 22 is valid only with the new max_hold_s = 25, which needs a
    restart: the growth table keeps running as it is."""
    async def scenario() -> None:
        cfg, eng = _engine(tmp_path)
        _config(tmp_path, "[growth]\nmax_hold_s = 25.0\noverdue_after_s = 22.0\n")
        p = reload.Reloader(cfg, eng)()
        assert eng.growth.controller.config == settings.GrowthConfig()
        assert "[growth] max_hold_s" in p.restart
        assert any(r.startswith("[growth] overdue_after_s (with the rest") for r in p.restart)

    asyncio.run(scenario())


def _ask(sock: Path, op: str) -> dict:
    return protocol.call(str(sock), protocol.request(op), timeout=5.0)


def test_sighup_reloads_the_running_daemon_instead_of_killing_it(tmp_path: Path) -> None:
    path = _config(tmp_path, "[admission]\nmax_admission_wait_s = 30.0\n")
    sock = tmp_path / "d.sock"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, "-m", "execgate.daemon.main", "--config",
                             str(path)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60  # a loaded host (CI beside a VM) starts it slowly
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() >= deadline:
                # Its stderr only once it is gone: reading a live daemon's pipe blocked forever.
                proc.kill()
                pytest.fail(f"the daemon did not start: {proc.communicate(timeout=10)[1]}")
            time.sleep(0.05)
        assert _ask(sock, "ping")["ok"]
        path.write_text(path.read_text().replace("= 30.0", "= 12.0"))
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while (_ask(sock, "status")["status"]["daemon"]["config"]["reloads"] < 1):
            assert proc.poll() is None, "SIGHUP killed the daemon"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        status = _ask(sock, "status")["status"]["daemon"]
        assert status["config"]["restart_needed"] == []
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0
    assert "reload of" in err and "max_admission_wait_s: 30.0 -> 12.0" in err


@pytest.mark.parametrize("bad", ["listen = 'nowhere'", "listen = ':80'", "listen = 'h:0'"])
def test_a_bad_metrics_address_is_refused(bad: str) -> None:
    import tomllib

    _, problems = settings.load(config.Config(tables={"metrics": tomllib.loads(bad)}))
    assert len(problems) == 1 and problems[0].error
