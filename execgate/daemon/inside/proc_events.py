"""The kernel's process events (netlink proc connector): fork, exec and exit of every task.

Stdlib sockets and struct only (no pyroute2): the daemon reads these on its asyncio loop to see
the tool processes an agent spawns inside its sandbox. One datagram carries one or more netlink
messages, each a connector message (`struct cn_msg`) wrapping one `struct proc_event`:

    nlmsghdr   len u32, type u16, flags u16, seq u32, pid u32                     16 bytes
    cn_msg     id.idx u32, id.val u32, seq u32, ack u32, len u16, flags u16       20 bytes
    proc_event what u32, cpu u32, timestamp_ns u64 (aligned 8), union event_data

Kernels from 6.6 filter by event type per socket (`struct proc_input`); older ones take only the
bare multicast op and deliver everything. subscribe() tries the filtered form and falls back
when no event arrives.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import time
from collections.abc import Iterator
from typing import NamedTuple

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
NLMSG_NOOP, NLMSG_ERROR, NLMSG_DONE, NLMSG_OVERRUN = 1, 2, 3, 4
PROC_CN_MCAST_LISTEN, PROC_CN_MCAST_IGNORE = 1, 2

PROC_EVENT_NONE = 0x0  # the kernel's acknowledgement of a (un)subscribe
PROC_EVENT_FORK = 0x1
PROC_EVENT_EXEC = 0x2
PROC_EVENT_UID = 0x4
PROC_EVENT_GID = 0x40
PROC_EVENT_SID = 0x80
PROC_EVENT_PTRACE = 0x100
PROC_EVENT_COMM = 0x200
PROC_EVENT_NONZERO_EXIT = 0x20000000
PROC_EVENT_COREDUMP = 0x40000000
PROC_EVENT_EXIT = 0x80000000
WANTED = PROC_EVENT_FORK | PROC_EVENT_EXEC | PROC_EVENT_EXIT

NLMSGHDR = struct.Struct("=IHHII")
CN_MSG = struct.Struct("=IIIIHH")
EVENT_HEAD = struct.Struct("=IIQ")
_FORK = struct.Struct("=iiii")  # parent pid, parent tgid, child pid, child tgid
_EXEC = struct.Struct("=ii")  # pid, tgid
_EXIT = struct.Struct("=iiII")  # pid, tgid, exit code (a wait status), exit signal
_ACK = struct.Struct("=I")
HEADER = NLMSGHDR.size + CN_MSG.size  # 36: where struct proc_event starts


class ProcEvent(NamedTuple):
    """One event. `pid`/`tgid` name the task it is about (the child, for a fork). A named
    tuple, not a dataclass: one is built per process event on the host, and this is cheaper."""

    what: int
    cpu: int
    timestamp_ns: int  # CLOCK_MONOTONIC (ktime_get_ns) when the kernel emitted it
    pid: int = 0
    tgid: int = 0
    parent_pid: int = 0
    parent_tgid: int = 0
    exit_code: int = 0  # for EXIT: the wait status (code << 8 | signal)
    seq: int = 0  # the connector sequence number (for acks: the request's)
    err: int = 0  # for acks

    @property
    def is_thread(self) -> bool:
        """A thread (not a whole process) was created or exited."""
        return self.pid != self.tgid


def parse_event(data: bytes | memoryview, seq: int = 0) -> ProcEvent | None:
    """A `struct proc_event` (the connector payload); None for kinds this daemon ignores."""
    if len(data) < EVENT_HEAD.size:
        return None
    what, cpu, ts = EVENT_HEAD.unpack_from(data, 0)
    body = EVENT_HEAD.size
    try:
        if what == PROC_EVENT_FORK:
            ppid, ptgid, pid, tgid = _FORK.unpack_from(data, body)
            return ProcEvent(what, cpu, ts, pid, tgid, ppid, ptgid, seq=seq)
        if what == PROC_EVENT_EXEC:
            pid, tgid = _EXEC.unpack_from(data, body)
            return ProcEvent(what, cpu, ts, pid, tgid, seq=seq)
        if what == PROC_EVENT_EXIT:
            pid, tgid, code, _sig = _EXIT.unpack_from(data, body)
            return ProcEvent(what, cpu, ts, pid, tgid, exit_code=code, seq=seq)
        if what == PROC_EVENT_NONE:
            (err,) = _ACK.unpack_from(data, body)
            return ProcEvent(what, cpu, ts, seq=seq, err=err)
    except struct.error:
        return None
    return None


def parse(datagram: bytes | memoryview) -> Iterator[ProcEvent]:
    """Every proc event in one received datagram; anything malformed or foreign is skipped."""
    buf = memoryview(datagram)
    off = 0
    while off + NLMSGHDR.size <= len(buf):
        length, mtype, _flags, _seq, _pid = NLMSGHDR.unpack_from(buf, off)
        if length < NLMSGHDR.size or off + length > len(buf):
            return
        if mtype == NLMSG_DONE and length >= HEADER:
            idx, val, seq, _ack, dlen, _f = CN_MSG.unpack_from(buf, off + NLMSGHDR.size)
            start = off + HEADER
            if idx == CN_IDX_PROC and val == CN_VAL_PROC and start + dlen <= off + length:
                ev = parse_event(buf[start:start + dlen], seq)
                if ev is not None:
                    yield ev
        off += (length + 3) & ~3  # NLMSG_ALIGN


def control_message(op: int, events: int | None, seq: int, port: int = 0) -> bytes:
    """A (un)subscribe request; `events` None is the pre-6.6 form without a type filter."""
    payload = struct.pack("=I", op) if events is None else struct.pack("=II", op, events)
    cn = CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, seq, 0, len(payload), 0)
    total = NLMSGHDR.size + len(cn) + len(payload)
    return NLMSGHDR.pack(total, NLMSG_DONE, 0, seq, port) + cn + payload


class ProcConnector:
    """A non-blocking proc-connector socket (needs CAP_NET_ADMIN, i.e. the root daemon)."""

    def __init__(self, rcvbuf_bytes: int = 8 << 20) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC,
                                  NETLINK_CONNECTOR)
        try:
            # A burst of forks elsewhere on the host must not overflow us while the loop is busy.
            self.sock.setsockopt(socket.SOL_SOCKET, 33, rcvbuf_bytes)  # SO_RCVBUFFORCE
        except OSError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
        self.sock.bind((0, CN_IDX_PROC))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[0]
        self.seq = 0
        self.filtered = False
        self.listening = False
        self.overruns = 0
        self._early: list[ProcEvent] = []

    def fileno(self) -> int:
        return self.sock.fileno()

    def _send(self, op: int, events: int | None) -> None:
        self.seq += 1
        self.sock.send(control_message(op, events, self.seq, self.port))

    def _hears(self, timeout: float) -> bool:
        """Whether events reach us: spawn /bin/true and wait for any fork, exec or exit.

        (The kernel's acknowledgement is no proof: it passes the same type filter and carries
        a per-cpu sequence number, not ours.) Events read meanwhile are kept for read().
        """
        try:
            pid = os.posix_spawn("/bin/true", ["true"], {})
            os.waitpid(pid, 0)
        except OSError:
            pass
        deadline = time.monotonic() + timeout
        poller = select.poll()  # not select(): the daemon may hold more than 1024 descriptors
        poller.register(self.sock, select.POLLIN)
        while (left := deadline - time.monotonic()) > 0:
            if not poller.poll(left * 1000):
                return False
            evs = self.read()
            self._early.extend(evs)
            if any(ev.what != PROC_EVENT_NONE for ev in evs):
                return True
        return False

    def subscribe(self, events: int = WANTED) -> None:
        """Start receiving events; only `events` kinds where the kernel can filter (>= 6.6)."""
        self._send(PROC_CN_MCAST_LISTEN, events)
        self.filtered = self.listening = True
        if self._hears(0.5):
            return
        self._send(PROC_CN_MCAST_LISTEN, None)  # a kernel without per-socket filters
        self.filtered = False
        if not self._hears(1.0):
            self.unsubscribe()
            raise OSError(errno.ETIMEDOUT, "no events from the proc connector")

    def unsubscribe(self) -> None:
        """Stop the kernel building events for us (it does no work when nobody listens)."""
        if self.listening:
            try:
                self._send(PROC_CN_MCAST_IGNORE, WANTED if self.filtered else None)
            except OSError:
                pass
            self.listening = False

    def read(self, limit: int = 512) -> list[ProcEvent]:
        """Events queued now (at most `limit` datagrams). Lost events (the receive buffer
        overflowed) are counted in `self.overruns`: the reader must resynchronise."""
        out, self._early = self._early, []
        for _ in range(limit):
            try:
                data = self.sock.recv(8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise
                self.overruns += 1
                continue
            out.extend(parse(data))
        return out

    def close(self) -> None:
        self.unsubscribe()
        self.sock.close()
