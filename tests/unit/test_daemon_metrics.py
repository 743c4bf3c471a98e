"""Prometheus metrics: the text format, and the real endpoint scraped over loopback (in the
daemon's own loop, and from a running execgated)."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_daemon_reload import SRC, _config, _engine

from execgate.common.units import MiB
from execgate.daemon.exposition import Histogram, Scrape
from execgate.daemon.metrics import Metrics


def _samples(text: str) -> dict[str, float]:
    """name{labels} -> value of a scrape; every family has its HELP and TYPE."""
    out, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            family = name.split("{")[0]
            assert family in typed or family.rsplit("_", 1)[0] in typed, line
            out[name] = float(value)
    return out


def test_the_text_format_as_prometheus_reads_it() -> None:
    h = Histogram((0.5, 1))
    for v in (0.2, 0.5, 0.7, 3):
        h.observe(v)
    w = Scrape()
    w.counter("x_total", "a count", samples=[({"sandbox": 'a"b\\c\nd'}, 2)])
    w.gauge("empty", "no sandbox yet", samples=[])
    w.histogram("wait_seconds", "waits", h)
    body, kind = w.encode()
    assert kind.startswith("text/plain; version=0.0.4")
    assert 'x_total{sandbox="a\\"b\\\\c\\nd"} 2.0' in body.decode().splitlines()
    got = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert got["x"].type == "counter" and got["empty"].samples == []
    (x,) = got["x"].samples
    assert x.labels == {"sandbox": 'a"b\\c\nd'} and x.value == 2
    assert [(s.name, s.labels.get("le"), s.value) for s in got["wait_seconds"].samples] == [
        ("wait_seconds_bucket", "0.5", 2), ("wait_seconds_bucket", "1.0", 3),
        ("wait_seconds_bucket", "+Inf", 4), ("wait_seconds_count", None, 4),
        ("wait_seconds_sum", None, 4.4)]


def test_a_scraper_that_asks_for_openmetrics_gets_it() -> None:
    w = Scrape()
    w.counter("x_total", "a count", 3)
    body, kind = w.encode("application/openmetrics-text; version=1.0.0,text/plain;q=0.5")
    assert kind.startswith("application/openmetrics-text")
    assert body.decode().endswith("# EOF\n") and "x_total 3.0" in body.decode()


def _text(metrics: Metrics, swapped: tuple[int, int] | None = None) -> str:
    return metrics.render(swapped).encode()[0].decode()


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def _call(i: int) -> dict:
    return {"call": f"tool-{i}", "container": "c", "sandbox": "c", "cgroup": f"/nope/tool-{i}",
            "argv": ["pytest"], "hint": {"memory_bytes": 300 * MiB}}


def test_a_scrape_over_loopback_shows_the_engine(tmp_path: Path) -> None:
    async def scenario() -> None:
        _, eng = _engine(tmp_path)
        metrics = Metrics(eng)
        metrics.tap_journal()
        following = asyncio.ensure_future(metrics.follow())
        server = await metrics.serve("127.0.0.1:0")
        port = server.sockets[0].getsockname()[1]
        try:
            eng.tick()
            futs = [eng.submit(_call(i))[1] for i in range(4)]  # 3 fit in 1 GiB, 1 waits
            eng.tick()
            # a call that ran while the daemon was away, and one it admitted, in the journal
            with open(tmp_path / "calls.jsonl", "a") as f:
                f.write(json.dumps({"call": "tool-x", "container": "c", "managed": False,
                                    "argv": ["make"], "memory_peak": MiB, "exit_code": 0}) + "\n")
                f.write(json.dumps({"call": "tool-0", "container": "c", "managed": True,
                                    "argv": ["pytest"], "memory_peak": 200 * MiB,
                                    "exit_code": 0, "duration": 1.0}) + "\n")
            eng.tick()
            metrics.after_tick()
            await asyncio.sleep(0.05)  # the bus's events reach the follower
            status, kind, text = await asyncio.to_thread(
                _get, f"http://127.0.0.1:{port}/metrics")
            assert status == 200 and kind.startswith("text/plain; version=0.0.4")
            s = _samples(text)
            admitted = sum(f.done() for f in futs)
            assert 1 <= admitted < 4
            assert s["execgate_budget_bytes"] == 1 << 30
            assert s['execgate_pressure_state{state="green"}'] + \
                s['execgate_pressure_state{state="yellow"}'] + \
                s['execgate_pressure_state{state="red"}'] == 1
            assert s["execgate_calls_queued"] == 4 - admitted
            assert s["execgate_calls_running"] == admitted - 1  # tool-0 finished
            assert s["execgate_admission_wait_seconds_count"] == admitted
            assert s['execgate_admission_wait_seconds_bucket{le="+Inf"}'] == admitted
            assert s['execgate_calls_finished_total{outcome="ok"}'] == 1
            assert s["execgate_calls_unmanaged_total"] == 1
            assert s["execgate_loop_iterations_total"] == 3
            assert s["execgate_sandboxes_swap_bytes"] == 0
            assert metrics.calls()["unmanaged"] == 1
            status, _, _ = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/nothing")
            assert status == 404
            # nonsense is hung up on; the endpoint still serves
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"\x00" * 10000)
            await w.drain()
            w.close()
            status, _, _ = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
            assert status == 200
        finally:
            following.cancel()
            server.close()

    asyncio.run(scenario())


def test_holds_are_timed_from_hold_to_release(tmp_path: Path) -> None:
    async def scenario() -> None:
        _, eng = _engine(tmp_path)
        now = [100.0]
        metrics = Metrics(eng, clock=lambda: now[0])

        class Held:
            allowed = False

        eng.growth.tracked["tool-1"] = Held()  # type: ignore[assignment]
        metrics.after_tick()
        now[0] = 102.5
        metrics.after_tick()
        del eng.growth.tracked["tool-1"]
        metrics.after_tick()
        assert (metrics.holds.count, metrics.holds.sum) == (1, 2.5)

    asyncio.run(scenario())


def test_the_unix_socket_endpoint(tmp_path: Path) -> None:
    async def scenario() -> None:
        _, eng = _engine(tmp_path)
        path = str(tmp_path / "metrics.sock")
        server = await Metrics(eng).serve(path)
        try:
            assert os.stat(path).st_mode & 0o777 == 0o660
            r, w = await asyncio.open_unix_connection(path)
            w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await r.read()
            assert answer.startswith(b"HTTP/1.0 200 OK\r\n")
            assert b"\nexecgate_calls_running 0.0\n" in answer
            r, w = await asyncio.open_unix_connection(path)
            w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
                    b"Accept: application/openmetrics-text; version=1.0.0\r\n\r\n")
            answer = await r.read()
            assert b"\r\nContent-Type: application/openmetrics-text" in answer
            assert answer.endswith(b"# EOF\n")
        finally:
            server.close()

    asyncio.run(scenario())


def test_the_running_daemon_serves_metrics_on_its_configured_port(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = _config(tmp_path, f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, "-m", "execgate.daemon.main", "--config",
                             str(path)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                status, _, text = _get(f"http://127.0.0.1:{port}/metrics")
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert status == 200
        s = _samples(text)
        assert s["execgate_budget_bytes"] == 1 << 30 and s["execgate_calls_running"] == 0
        assert s["execgate_loop_iterations_total"] >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0


def test_the_example_dashboard_asks_only_for_metrics_the_daemon_serves(tmp_path: Path) -> None:
    import re

    async def names() -> set[str]:
        _, eng = _engine(tmp_path)
        eng.tick()
        return {line.split()[2] for line in _text(Metrics(eng), (0, 0)).splitlines()
                if line.startswith("# TYPE ")}

    served = asyncio.run(names())
    dashboard = json.loads((SRC / "packaging" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"]]
    asked = {re.sub(r"_(bucket|sum|count)$", "", m)
             for e in exprs for m in re.findall(r"execgate_[a-z_]+", e)}
    assert asked and asked <= served, asked - served


def test_the_runtimes_fail_open_events_are_counted_and_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 20: a call the runtime ran as plain runc without a journal line (a handler's
    error, a container never prepared) was only in that container's runc log."""
    import logging

    from execgate.common import records

    _, eng = _engine(tmp_path)
    now = [100.0]
    metrics = Metrics(eng, clock=lambda: now[0])
    state = eng.cfg.state_dir
    records.note_fail_open(state, "handler-error", "c1", "create: KeyError: 'linux'")
    records.note_fail_open(state, "not-prepared", "c2", "/sys/fs/cgroup/x lacks init/")
    with caplog.at_level(logging.WARNING, logger="execgated"):
        metrics.after_tick()  # set aside
        records.note_fail_open(state, "no-exec-cgroup", "c3", "crun has no `exec --cgroup`")
        metrics.after_tick()  # within the second: not looked at
        assert sum(metrics.fail_open.values()) == 0
        now[0] += 1
        metrics.after_tick()  # the first two counted
        now[0] += 1
        metrics.after_tick()  # the third
    s = _samples(_text(metrics))
    assert s['execgate_runtime_fail_open_total{kind="handler-error"}'] == 1
    assert s['execgate_runtime_fail_open_total{kind="not-prepared"}'] == 1
    assert s['execgate_runtime_fail_open_total{kind="no-exec-cgroup"}'] == 1
    assert s['execgate_runtime_fail_open_total{kind="other"}'] == 0
    assert metrics.calls()["fail_open"] == {"handler-error": 1, "not-prepared": 1,
                                            "no-exec-cgroup": 1}
    logged = [r.getMessage() for r in caplog.records if "failed open" in r.getMessage()]
    assert len(logged) == 3 and any("KeyError" in m and "c1" in m for m in logged)
    assert not os.listdir(state) or "fail-open.jsonl" not in os.listdir(state)
