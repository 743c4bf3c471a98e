"""Docker's Engine API on its unix socket: sandboxes and tool calls without a CLI per call.

A `docker` CLI is a Go program started for every operation; under the test VM's TCG its
start-up and its runtime's idle wake-ups cost the emulated CPU the engine and the runtime
need, and the bench's unit used about as much CPU as containerd with every shim. Agent
frameworks drive the engine through this API too (docker-py, the Go SDK), so the runtime sees
the same `create`/`start`/`exec` calls either way. Only what the bench needs is here.
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
import time
from typing import Any
from urllib.parse import quote, urlencode

SOCKET = "/var/run/docker.sock"
EXEC_FAILED = 126  # what the CLI and dockerd give an exec the runtime could not start
EXIT_GRACE_S = 60.0  # how long an exec whose stream ended may take to report its exit code
STDERR = 2  # an attach stream's frame kind for stderr (1 is stdout)


class ApiError(Exception):
    """The engine said no (`status`, its `message`), or could not be reached (status 0)."""

    def __init__(self, status: int, message: str, timed_out: bool = False) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message
        self.timed_out = timed_out


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.socket_path)
        except OSError:
            s.close()
            raise
        self.sock = s


def demux(raw: bytes) -> tuple[bytes, bytes]:
    """stdout and stderr of a non-TTY attach stream: frames of an 8-byte header (stream, three
    zero bytes, big-endian length) and a payload. A truncated last frame keeps what came."""
    out, err = bytearray(), bytearray()
    i = 0
    while i + 8 <= len(raw):
        kind, size = raw[i], struct.unpack(">I", raw[i + 4:i + 8])[0]
        chunk = raw[i + 8:i + 8 + size]
        (err if kind == STDERR else out).extend(chunk)
        i += 8 + size
    return bytes(out), bytes(err)


class Client:
    """One request per connection (a hijacked exec stream ends its own)."""

    def __init__(self, path: str = SOCKET) -> None:
        self.path = path

    def request(self, method: str, url: str, body: dict[str, Any] | None = None,
                timeout: float = 180.0) -> tuple[int, bytes]:
        conn = _UnixConnection(self.path, timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, url, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except TimeoutError as e:
            raise ApiError(0, f"timed out after {timeout:g}s", timed_out=True) from e
        except (OSError, http.client.HTTPException) as e:
            raise ApiError(0, f"{method} {url}: {e}") from e
        finally:
            conn.close()

    def _json(self, method: str, url: str, body: dict[str, Any] | None = None,
              timeout: float = 180.0, ok: tuple[int, ...] = (200, 201, 204)) -> Any:
        status, data = self.request(method, url, body, timeout)
        if status not in ok:
            try:
                message = json.loads(data).get("message", "")
            except (ValueError, AttributeError):
                message = data.decode(errors="replace")
            raise ApiError(status, message.strip())
        return json.loads(data) if data.strip() else None

    def create(self, image: str, cmd: list[str], runtime: str, cgroup_parent: str,
               labels: dict[str, str], shm_size: int, timeout: float = 180.0) -> str:
        body = {"Image": image, "Cmd": cmd, "Labels": labels,
                "HostConfig": {"Runtime": runtime, "CgroupParent": cgroup_parent,
                               "ShmSize": shm_size}}
        return str(self._json("POST", "/containers/create", body, timeout)["Id"])

    def start(self, cid: str, timeout: float) -> None:
        self._json("POST", f"/containers/{quote(cid)}/start", None, timeout, ok=(204, 304))

    def exec(self, cid: str, cmd: list[str], env: list[str], timeout: float
             ) -> tuple[int, bytes, bytes]:
        """Run `cmd` in the container and wait: (exit code, stdout, stderr). An exec the
        runtime refused exits 126 with dockerd's error, which it writes into the stdout
        stream; it is returned as stderr, where the CLI shows it."""
        body = {"Cmd": cmd, "Env": env, "AttachStdout": True, "AttachStderr": True}
        eid = self._json("POST", f"/containers/{quote(cid)}/exec", body, 60.0)["Id"]
        status, raw = self.request("POST", f"/exec/{eid}/start",
                                   {"Detach": False, "Tty": False}, timeout)
        if status != 200:
            return EXEC_FAILED, b"", raw
        out, err = demux(raw)
        # The exit code is set as the stream closes, a moment later; on a starved host many
        # seconds later, so the grace backs off up to EXIT_GRACE_S in all.
        deadline, pause = time.monotonic() + EXIT_GRACE_S, 0.05
        while True:
            info = self._json("GET", f"/exec/{eid}/json", None, 60.0)
            if not info.get("Running") and info.get("ExitCode") is not None:
                code = int(info["ExitCode"])
                if code == EXEC_FAILED and not info.get("Pid"):
                    return code, b"", err + out  # never started: the error is dockerd's
                return code, out, err
            if time.monotonic() >= deadline:
                return EXEC_FAILED, out, err + b"exec still running after its stream ended"
            time.sleep(pause)
            pause = min(pause * 2, 2.0)

    def inspect(self, cid: str, timeout: float = 60.0) -> dict[str, Any]:
        return dict(self._json("GET", f"/containers/{quote(cid)}/json", None, timeout))

    def remove(self, cid: str, timeout: float = 300.0) -> None:
        self._json("DELETE", f"/containers/{quote(cid)}?force=1", None, timeout)

    def ids(self, label: str) -> list[str]:
        """Every container (running or not) that carries `label` (key or key=value)."""
        q = urlencode({"all": "1", "filters": json.dumps({"label": [label]})})
        return [str(c["Id"]) for c in self._json("GET", f"/containers/json?{q}")]
