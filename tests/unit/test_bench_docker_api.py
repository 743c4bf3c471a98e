"""The bench's Engine API client against a small HTTP server on a unix socket that answers
as dockerd does (its exec stream hijacks the connection and ends it)."""

from __future__ import annotations

import json
import socketserver
import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import pytest

from bench import docker_api


def _frame(kind: int, data: bytes) -> bytes:
    return bytes([kind, 0, 0, 0]) + struct.pack(">I", len(data)) + data


class _Dockerd(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: ClassVar[dict[str, Any]] = {}

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: Any = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n)) if n else None

    def do_POST(self) -> None:
        body, st = self._body(), self.state
        if self.path == "/containers/create":
            st["created"] = body
            self._reply(201, {"Id": "c1", "Warnings": []})
        elif self.path == "/containers/c1/start":
            self._reply(204)
        elif self.path == "/containers/gone/start":
            self._reply(404, {"message": "No such container: gone"})
        elif self.path.startswith("/containers/") and self.path.endswith("/exec"):
            st["exec"] = body
            self._reply(201, {"Id": "e1"})
        elif self.path == "/exec/e1/start":
            self.close_connection = True  # hijacked: raw frames until the process ends
            self.wfile.write(b"HTTP/1.1 200 OK\r\n"
                             b"Content-Type: application/vnd.docker.raw-stream\r\n\r\n")
            if st.get("refuse"):
                # dockerd writes the start's error into the stdout stream, framed
                self.wfile.write(_frame(1, b"OCI runtime exec failed: no such cgroup\r\n"))
            else:
                self.wfile.write(_frame(1, b"out ") + _frame(2, b"[execgate] held 2s\n")
                                 + _frame(1, b"done\n"))
        else:
            self._reply(404, {"message": f"page not found: {self.path}"})

    def do_GET(self) -> None:
        st = self.state
        if self.path == "/exec/e1/json":
            st["polls"] = st.get("polls", 0) + 1
            st.setdefault("first_poll", time.monotonic())
            running = st["polls"] < 2  # the first look still sees it running
            if st.get("late_s"):  # a starved dockerd: the code comes seconds after the stream
                running = time.monotonic() - st["first_poll"] < st["late_s"]
            code = 126 if st.get("refuse") else 137
            self._reply(200, {"Running": running, "ExitCode": None if running else code})
        elif self.path.startswith("/containers/json?"):
            st["listed"] = self.path
            self._reply(200, [{"Id": "c1"}, {"Id": "c2"}])
        elif self.path == "/containers/c1/json":
            self._reply(200, {"State": {"Running": False, "OOMKilled": True}})
        else:
            self._reply(404, {"message": "nope"})

    def do_DELETE(self) -> None:
        self.state["removed"] = self.path
        self._reply(204)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[docker_api.Client]:
    _Dockerd.state = {}
    path = str(tmp_path / "docker.sock")
    server = socketserver.ThreadingUnixStreamServer(path, _Dockerd)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield docker_api.Client(path)
    server.shutdown()
    server.server_close()


def test_a_sandbox_is_created_with_its_runtime_slice_and_label_then_started(
        client: docker_api.Client) -> None:
    cid = client.create("img", ["memload", "--baseline-mib", "30"], "execgate", "egbench.slice",
                        {"execgate-bench": "eager"}, 64 << 20)
    client.start(cid, timeout=5)
    assert cid == "c1"
    assert _Dockerd.state["created"] == {
        "Image": "img", "Cmd": ["memload", "--baseline-mib", "30"],
        "Labels": {"execgate-bench": "eager"},
        "HostConfig": {"Runtime": "execgate", "CgroupParent": "egbench.slice",
                       "ShmSize": 64 << 20}}


def test_an_exec_demuxes_its_stream_and_waits_for_the_exit_code(
        client: docker_api.Client) -> None:
    rc, out, err = client.exec("c1", ["memload", "--peak-mib", "9"],
                               ["AGENT_RESOURCE_HINT=memory:9m"], timeout=5)
    assert (rc, out, err) == (137, b"out done\n", b"[execgate] held 2s\n")
    assert _Dockerd.state["exec"]["Env"] == ["AGENT_RESOURCE_HINT=memory:9m"]
    assert _Dockerd.state["polls"] == 2


def test_an_exit_code_that_comes_seconds_after_the_stream_is_waited_for(
        client: docker_api.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a starved VM dockerd set an exec's exit code more than 5 s after its stream ended;
    the bench gave up at 5 s and called a call that had run to its end failed (126)."""
    _Dockerd.state["late_s"] = 7.0
    t0 = time.monotonic()
    rc, out, _err = client.exec("c1", ["true"], [], timeout=5)
    assert rc == 137 and out == b"out done\n" and time.monotonic() - t0 >= 7.0
    assert _Dockerd.state["polls"] <= 12  # backing off, not a request every 100 ms
    monkeypatch.setattr(docker_api, "EXIT_GRACE_S", 0.3)
    _Dockerd.state.update(polls=0, first_poll=time.monotonic(), late_s=60)
    rc, _out, err = client.exec("c1", ["true"], [], timeout=5)
    assert rc == 126 and err.endswith(b"exec still running after its stream ended")


def test_an_exec_the_runtime_refused_is_126_with_dockerds_words(
        client: docker_api.Client) -> None:
    _Dockerd.state["refuse"] = True
    rc, out, err = client.exec("c1", ["true"], [], timeout=5)
    assert rc == docker_api.EXEC_FAILED and b"OCI runtime exec failed" in err and not out


def test_errors_carry_the_engines_message_and_a_dead_socket_is_status_0(
        client: docker_api.Client, tmp_path: Path) -> None:
    with pytest.raises(docker_api.ApiError) as e:
        client.start("gone", timeout=5)
    assert (e.value.status, e.value.message) == (404, "No such container: gone")
    with pytest.raises(docker_api.ApiError) as e:
        docker_api.Client(str(tmp_path / "none.sock")).inspect("c1")
    assert e.value.status == 0


def test_inspect_remove_and_list_by_label(client: docker_api.Client) -> None:
    assert client.inspect("c1")["State"]["OOMKilled"] is True
    client.remove("c1")
    assert _Dockerd.state["removed"] == "/containers/c1?force=1"
    assert client.ids("execgate-bench") == ["c1", "c2"]
    assert "label" in _Dockerd.state["listed"] and "all=1" in _Dockerd.state["listed"]


def test_demux_keeps_a_truncated_last_frame() -> None:
    raw = _frame(1, b"abc") + _frame(2, b"err") + _frame(1, b"tail")[:10]
    assert docker_api.demux(raw) == (b"abcta", b"err")
    assert docker_api.demux(raw[:-3]) == (b"abc", b"err")  # a partial header: nothing more
