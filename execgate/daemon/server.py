"""The daemon's socket server: one asyncio loop, root-only Unix socket, msgpack frames."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from execgate.common import protocol

log = logging.getLogger("execgated")


class Conn:
    """One client connection, for handlers that answer in several frames or watch for EOF."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, msg: dict[str, Any]) -> None:
        self.writer.write(protocol.encode(msg))
        await self.writer.drain()

    async def closed(self) -> None:
        """Returns when the client hangs up (it sends nothing while it waits for an answer)."""
        while await self.reader.read(4096):
            pass


Handler = Callable[[dict[str, Any], Conn], Awaitable[dict[str, Any] | None]]


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


class Server:
    def __init__(self, path: str, handlers: dict[str, Handler], allowed_uids: set[int]) -> None:
        self.path = path
        self.handlers = handlers
        self.allowed_uids = allowed_uids
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
        conn = Conn(reader, writer)
        try:
            uid = peer_uid(sock)
            if uid not in self.allowed_uids:
                writer.write(protocol.encode(protocol.reply(False, error="permission denied")))
                await writer.drain()
                return
            while True:
                try:
                    header = await reader.readexactly(4)
                except asyncio.IncompleteReadError:
                    return
                body = await reader.readexactly(protocol.frame_length(header))
                answer = await self._dispatch(protocol.decode_body(body), conn)
                if answer is None:  # the handler answered (and ended) the conversation itself
                    return
                await conn.send(answer)
        except (protocol.ProtocolError, ConnectionError, asyncio.IncompleteReadError) as e:
            log.warning("client dropped: %s", e)
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
        except Exception as e:
            log.exception("op %s failed", msg.get("op"))
            return protocol.reply(False, error=f"{type(e).__name__}: {e}")
