"""packaging/k8s/pressure.py run as the installer pod runs it, against a local API server that
speaks what the node endpoints do (TLS with the service account's CA and token, GET, merge
PATCH with a resourceVersion check: 409 on a stale one) and a `execgatectl status` that says
what the test wants: the label and the taint follow the daemon's pressure, another writer's
taint survives a conflict, and SIGTERM takes both off (issue 19)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "packaging" / "k8s" / "pressure.py"
KEY = "execgate.io/memory-pressure"
OTHER = {"key": "example.com/maintenance", "value": "1", "effect": "NoSchedule"}

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")


class FakeAPI:
    """One node, n1, behind GET and merge-PATCH /api/v1/nodes/n1."""

    def __init__(self, tmp: Path) -> None:
        self.node: dict[str, Any] = {"metadata": {"name": "n1", "labels": {"a": "b"},
                                                  "resourceVersion": "1"},
                                     "spec": {"taints": []}}
        self.requests: list[tuple[str, str | None, str | None]] = []
        self.conflict_once = False  # another writer taints the node just before a PATCH
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_a: object) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                api.requests.append(("GET", self.headers.get("Authorization"), None))
                if self.path != "/api/v1/nodes/n1":
                    return self._send(404, {"kind": "Status"})
                with api.lock:
                    self._send(200, api.node)

            def do_PATCH(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.requests.append(("PATCH", self.headers.get("Authorization"),
                                     self.headers.get("Content-Type")))
                with api.lock:
                    meta = api.node["metadata"]
                    if api.conflict_once:
                        api.conflict_once = False
                        api.node["spec"]["taints"] = [*api.node["spec"]["taints"], OTHER]
                        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
                    if body["metadata"].get("resourceVersion") != meta["resourceVersion"]:
                        return self._send(409, {"kind": "Status", "reason": "Conflict"})
                    for k, v in (body["metadata"].get("labels") or {}).items():
                        if v is None:
                            meta["labels"].pop(k, None)
                        else:
                            meta["labels"][k] = v
                    if "spec" in body:
                        api.node["spec"]["taints"] = body["spec"]["taints"]
                    meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
                    self._send(200, api.node)

        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                        "1", "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=IP:127.0.0.1", "-keyout", str(tmp / "key.pem"),
                        "-out", str(tmp / "ca.crt")], check=True, capture_output=True)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tmp / "ca.crt", tmp / "key.pem")
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def state(self) -> tuple[str | None, list[dict[str, str]]]:
        with self.lock:
            return (self.node["metadata"]["labels"].get(KEY),
                    list(self.node["spec"]["taints"]))


def _until(cond: Any, what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_publisher_follows_the_pressure_on_a_real_api_conversation(tmp_path: Path) -> None:
    api = FakeAPI(tmp_path)
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t0ken\n")
    shutil.copy(tmp_path / "ca.crt", sa / "ca.crt")
    status = tmp_path / "status.json"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # `nsenter --target 1 --mount -- execgatectl status --json` on the host: what status.json
    # says, exit 3 (as execgatectl does) when it says the daemon did not answer.
    (bin_dir / "nsenter").write_text(
        f"#!/bin/sh\ncat {status}\ngrep -q '\"execgated pid' {status} || exit 3\n")
    (bin_dir / "nsenter").chmod(0o755)

    def say(state: str | None) -> None:
        body = ({"source": "execgated pid 42", "daemon": {"pressure": {"state": state}}}
                if state else {"source": "disk (execgated did not answer)"})
        status.write_text(json.dumps(body))

    say("red")
    api.conflict_once = True  # the first PATCH meets another writer's taint: 409, read again
    env = {**os.environ, "NODE_NAME": "n1", "EXECGATE_PRESSURE_PERIOD_S": "0.1",
           "EXECGATE_K8S_API": api.url, "EXECGATE_K8S_SA": str(sa),
           "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    p = subprocess.Popen([sys.executable, str(SCRIPT)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        _until(lambda: api.state() == ("red", [OTHER, {"key": KEY, "value": "red",
                                                        "effect": "NoSchedule"}]),
               "red: the label, the taint, and the other writer's taint kept")
        say("yellow")  # yellow keeps the taint: a node on the edge does not flap
        _until(lambda: api.state()[0] == "yellow", "yellow")
        assert len(api.state()[1]) == 2
        say("green")
        _until(lambda: api.state() == ("green", [OTHER]), "green: the taint off")
        say(None)
        _until(lambda: api.state() == ("unknown", [OTHER]), "unknown: fail open")
        say("red")
        _until(lambda: len(api.state()[1]) == 2, "red again")
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 0
    finally:
        if p.poll() is None:
            p.kill()
        api.server.shutdown()
    assert api.state() == (None, [OTHER])  # nothing of ours is left on the node
    assert {a for _m, a, _c in api.requests} == {"Bearer t0ken"}
    assert {c for m, _a, c in api.requests if m == "PATCH"} == {"application/merge-patch+json"}
    out = p.stdout.read() if p.stdout else ""
    assert "n1 is red" in out and "n1 is green" in out and "n1 is unknown" in out
