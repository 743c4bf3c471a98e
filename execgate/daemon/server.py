"""The daemon's socket server: one asyncio loop, root-only Unix socket, msgpack frames.

A peer is untrusted input too: a request must arrive whole within FRAME_TIMEOUT_S of the
daemon waiting for it (an idle or trickling connection is closed, not kept forever) and be at
most MAX_REQUEST bytes (the largest real one is an admit with its argv), so no connection
holds more than that of the daemon's memory, far below the protocol's 16 MiB frame limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from execgate.common import protocol

log = logging.getLogger("execgated")

MAX_REQUEST = 1 << 20
FRAME_TIMEOUT_S = 10.0


class Conn:
    """One client connection, for handlers that answer in several frames or watch for EOF."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 max_request: int = MAX_REQUEST) -> None:
        self.reader = reader
        self.writer = writer
        self.max_request = max_request
        self.peer_pid: int | None = None  # SO_PEERCRED's, once the peer is served

    async def send(self, msg: dict[str, Any]) -> None:
        self.writer.write(protocol.encode(msg))
        await self.writer.drain()

    async def recv(self) -> dict[str, Any] | None:
        """The peer's next frame (a request, or more of a conversation); None at a clean end
        of the connection; ProtocolError for a frame that is too large or not a msgpack map,
        IncompleteReadError for one cut short."""
        try:
            header = await self.reader.readexactly(4)
        except asyncio.IncompleteReadError as e:
            if e.partial:
                raise
            return None
        n = protocol.frame_length(header)
        if n > self.max_request:
            raise protocol.ProtocolError(f"request of {n} bytes exceeds {self.max_request}")
        return protocol.decode_body(await self.reader.readexactly(n))

    async def closed(self) -> None:
        """Returns when the client hangs up (it sends nothing while it waits for an answer)."""
        while await self.reader.read(4096):
            pass


async def stop_watching(hangup: asyncio.Future[None]) -> None:
    """End a Conn.closed() watch so that the conversation can read the peer's next frame: a
    watch that is only cancelled still holds the reader until the loop runs it."""
    hangup.cancel()
    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
        await hangup


Handler = Callable[[dict[str, Any], Conn], Awaitable[dict[str, Any] | None]]


def peer_cred(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the peer, as the kernel saw them at connect (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


class Server:
    def __init__(self, path: str, handlers: dict[str, Handler], allowed_uids: set[int],
                 frame_timeout_s: float = FRAME_TIMEOUT_S, max_request: int = MAX_REQUEST,
                 refuse_peer: Callable[[int], str | None] | None = None) -> None:
        self.path = path
        self.handlers = handlers
        self.allowed_uids = allowed_uids
        # Why a peer (by pid) is refused though its uid is allowed, or None: root inside a
        # sandbox that shares the socket must not speak for the host.
        self.refuse_peer = refuse_peer
        self.frame_timeout_s = frame_timeout_s
        self.max_request = max_request
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        if self._server:
            self._server.close()
            await self._server.wait_closed()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        conn = Conn(reader, writer, self.max_request)
        try:
            pid, uid = peer_cred(sock)
            error = None
            if uid not in self.allowed_uids:
                error = "permission denied"
            elif self.refuse_peer is not None and (why := self.refuse_peer(pid)):
                error = f"permission denied: {why}"
            conn.peer_pid = pid
            if error:
                log.warning("peer pid %d uid %d refused: %s", pid, uid, error)
                writer.write(protocol.encode(protocol.reply(False, error=error)))
                await writer.drain()
                return
            while True:
                try:
                    msg = await asyncio.wait_for(conn.recv(), self.frame_timeout_s)
                except TimeoutError:
                    log.warning("client dropped: no whole request within %g s",
                                self.frame_timeout_s)
                    return
                except protocol.ProtocolError as e:
                    log.warning("client dropped: %s", e)
                    writer.write(protocol.encode(protocol.reply(False, error=str(e))))
                    await writer.drain()
                    return
                if msg is None:  # the peer hung up between requests
                    return
                answer = await self._dispatch(msg, conn)
                if answer is None:  # the handler answered (and ended) the conversation itself
                    return
                await conn.send(answer)
        except (protocol.ProtocolError, ConnectionError, asyncio.IncompleteReadError) as e:
            log.warning("client dropped: %s", e)
        except Exception:  # a bug of ours: this connection ends, the server goes on
            log.exception("client dropped")
        finally:
            writer.close()

    async def _dispatch(self, msg: dict[str, Any], conn: Conn) -> dict[str, Any] | None:
        if msg.get("v") != protocol.VERSION:
            return protocol.reply(False, error=f"unsupported protocol version {msg.get('v')!r}; "
                                               f"this daemon speaks v{protocol.VERSION}")
        handler = self.handlers.get(str(msg.get("op")))
        if handler is None:
            return protocol.reply(False, error=f"unknown op {msg.get('op')!r}")
        try:
            return await handler(msg, conn)
        except ConnectionError:
            raise  # the peer hung up mid-conversation (a front gone to Python): a drop, not a bug
        except Exception as e:
            log.exception("op %s failed", msg.get("op"))
            return protocol.reply(False, error=f"{type(e).__name__}: {e}")
