"""execgated's wire protocol: length-prefixed msgpack maps over a Unix stream socket.

Frame: 4-byte big-endian length, then one msgpack map. Every request carries `v` (protocol
version) and `op`; every reply carries `v` and `ok`, plus `error` when ok is false. A peer that
speaks another major version gets a clear error instead of a misread. See docs/protocol.md.
Here, in common/, because both ends speak it: the daemon, and the runtime, execgatectl and the
benchmarks as its clients (`recv_frame`, `Client`, `call`).
"""

from __future__ import annotations

import socket
import struct
import time

import msgpack

TYPE_CHECKING = False  # typing's, without importing typing on the exec path
if TYPE_CHECKING:
    from typing import Any

VERSION = 1
PROGRESS_S = 10.0  # how often a runtime asks to hear why its call waits (issue 15: every 10 s)
# Progress frames a waiting runtime lets go missing before it calls the daemon wedged and runs
# its call unmanaged. A loaded daemon is late, not dead (a dead one closes the socket): at 15x
# under TCG its frames came up to 15 s apart, and runtimes that gave up after one missed frame
# ran 9 calls unmanaged into a full host, 2 of them OOM-killed.
MISSED_FRAMES = 3
MAX_FRAME = 16 << 20
_LEN = struct.Struct(">I")


class ProtocolError(Exception):
    pass


def encode(msg: dict[str, Any]) -> bytes:
    try:
        body = msgpack.packb(msg, use_bin_type=True)
    except UnicodeEncodeError:  # a lone surrogate (JSON an agent wrote): sent escaped
        body = msgpack.packb(msg, use_bin_type=True, unicode_errors="backslashreplace")
    except (ValueError, TypeError, OverflowError) as e:  # a 2**64, a set
        raise ProtocolError(f"unencodable message: {e}") from e
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return _LEN.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        msg = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise ProtocolError(f"undecodable frame: {e}") from e
    except TypeError as e:  # a map keyed by a list or a map: no Python dict holds it
        raise ProtocolError(f"undecodable frame: a map key must be a string or number ({e})"
                            ) from e
    if not isinstance(msg, dict):
        raise ProtocolError("a frame must hold a map")
    return msg


def frame_length(header: bytes) -> int:
    (n,) = _LEN.unpack(header)
    if n > MAX_FRAME:
        raise ProtocolError(f"frame of {n} bytes exceeds {MAX_FRAME}")
    return n


def request(op: str, **fields: Any) -> dict[str, Any]:
    return {"v": VERSION, "op": op, **fields}


def reply(ok: bool = True, **fields: Any) -> dict[str, Any]:
    return {"v": VERSION, "ok": ok, **fields}


def _read(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:  # a peer trickling bytes must not stretch it, read by read
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            sock.settimeout(left)
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ProtocolError("connection closed mid-frame")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket, deadline: float | None = None) -> dict[str, Any]:
    """One frame off a blocking socket (the daemon's own asyncio side reads its own way),
    whole by `deadline` (time.monotonic()) when given, else within the socket's timeout of
    each read."""
    header = _read(sock, _LEN.size, deadline)
    return decode_body(_read(sock, frame_length(header), deadline))


def check_version(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer, if the daemon speaks our version: a peer of another never gets misread."""
    if answer.get("v") != VERSION:
        raise ProtocolError(f"daemon speaks protocol v{answer.get('v')}, we speak v{VERSION}")
    return answer


class Client:
    """One connection to the daemon: requests out, answers in, each answer's version checked.

    For the conversations of more than one frame (admit, events); `call` is the one-shot."""

    def __init__(self, path: str, timeout: float | None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self.sock.settimeout(timeout)
            self.sock.connect(path)
        except BaseException:
            self.sock.close()
            raise

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall(encode(msg))

    def recv(self, deadline: float | None = None) -> dict[str, Any]:
        """The next answer, whole by `deadline` (time.monotonic()) when given."""
        return check_version(recv_frame(self.sock, deadline))

    def settimeout(self, timeout: float) -> None:
        self.sock.settimeout(timeout)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def call(path: str, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One blocking request/reply (the CLI's and the runtime's client), all of it within
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    with Client(path, timeout) as client:
        client.send(msg)
        return client.recv(deadline)
