"""execgated's wire protocol: length-prefixed msgpack maps over a Unix stream socket.

Frame: 4-byte big-endian length, then one msgpack map. Every request carries `v` (protocol
version) and `op`; every reply carries `v` and `ok`, plus `error` when ok is false. A peer that
speaks another major version gets a clear error instead of a misread. See docs/protocol.md.
"""

from __future__ import annotations

import socket
import struct

import msgpack

TYPE_CHECKING = False  # typing's, without importing typing on the exec path
if TYPE_CHECKING:
    from typing import Any

VERSION = 1
MAX_FRAME = 16 << 20
_LEN = struct.Struct(">I")


class ProtocolError(Exception):
    pass


def encode(msg: dict[str, Any]) -> bytes:
    body = msgpack.packb(msg, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return _LEN.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        msg = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise ProtocolError(f"undecodable frame: {e}") from e
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


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ProtocolError("connection closed mid-frame")
        buf += chunk
    return bytes(buf)


def call(path: str, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One blocking request/reply (the CLI's and the runtime's client)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(encode(msg))
        n = frame_length(_recv_exact(sock, _LEN.size))
        answer = decode_body(_recv_exact(sock, n))
    if answer.get("v") != VERSION:
        raise ProtocolError(f"daemon speaks protocol v{answer.get('v')}, we speak v{VERSION}")
    return answer
